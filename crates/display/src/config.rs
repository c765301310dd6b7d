//! `--display vnc=ADDR:PORT[,width=..,height=..][,layout=..][,dirty=..]
//! [,refresh=..][,password=..][,websocket=[ADDR:]PORT]`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

use devices::options::{invalid, Options, OptionsError};

use crate::dirty::DirtyMethod;
use crate::layout::{FbGeometry, Layout};
use crate::refresh::RefreshMode;

pub const DEFAULT_WIDTH: u16 = 1024;
pub const DEFAULT_HEIGHT: u16 = 768;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DisplayConfig {
    pub listen: SocketAddr,
    pub websocket: Option<SocketAddr>,
    pub geometry: FbGeometry,
    pub dirty: DirtyMethod,
    pub refresh: RefreshMode,
    /// VNC authentication; None means security type None.
    pub password: Option<String>,
}

impl DisplayConfig {
    pub fn parse(text: &str) -> Result<DisplayConfig, OptionsError> {
        let mut o = Options::parse(text, Some("vnc"))?;
        let vnc = o.require("vnc")?;
        let listen = parse_address(&vnc).map_err(|e| invalid("vnc", &vnc, &e))?;
        let websocket = match o.take("websocket") {
            None => None,
            Some(ws) => Some(parse_address(&ws).map_err(|e| invalid("websocket", &ws, &e))?),
        };
        let width = o.parsed::<u16>("width")?.unwrap_or(DEFAULT_WIDTH);
        let height = o.parsed::<u16>("height")?.unwrap_or(DEFAULT_HEIGHT);
        let layout = o.parsed::<Layout>("layout")?.unwrap_or(Layout::Linear);
        let geometry = FbGeometry::new(width, height, layout)
            .map_err(|e| invalid("width/height", &format!("{width}x{height}"), &e))?;
        let dirty = o
            .parsed::<DirtyMethod>("dirty")?
            .unwrap_or(DirtyMethod::DirtyLog);
        let refresh = o
            .parsed::<RefreshMode>("refresh")?
            .unwrap_or(RefreshMode::Timer);
        let password = o.take("password");
        if let Some(p) = &password {
            if p.is_empty() || p.len() > 8 {
                return Err(invalid(
                    "password",
                    "(hidden)",
                    "VNC passwords are 1 to 8 characters",
                ));
            }
        }
        o.finish()?;
        Ok(DisplayConfig {
            listen,
            websocket,
            geometry,
            dirty,
            refresh,
            password,
        })
    }
}

/// `HOST:PORT`, `:PORT` or `PORT` (then on localhost: a display is not
/// exposed beyond the host unless asked for).
fn parse_address(text: &str) -> Result<SocketAddr, String> {
    let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let port_only = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::new(localhost, port));
    }
    text.to_socket_addrs()
        .map_err(|_| "expected HOST:PORT, :PORT or PORT".to_string())?
        .next()
        .ok_or_else(|| "the host name has no address".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_options() {
        let c = DisplayConfig::parse("vnc=:5901").unwrap();
        assert_eq!(c.listen, "127.0.0.1:5901".parse().unwrap());
        assert_eq!((c.geometry.width, c.geometry.height), (1024, 768));
        assert_eq!(c.geometry.layout, Layout::Linear);
        assert_eq!(c.dirty, DirtyMethod::DirtyLog);
        assert_eq!(c.refresh, RefreshMode::Timer);
        let c = DisplayConfig::parse(
            "vnc=0.0.0.0:5900,width=640,height=480,layout=tiled,dirty=wp,refresh=event,password=secret,websocket=5700",
        )
        .unwrap();
        assert_eq!(c.listen, "0.0.0.0:5900".parse().unwrap());
        assert_eq!(c.websocket, Some("127.0.0.1:5700".parse().unwrap()));
        assert_eq!(c.geometry.layout, Layout::Tiled);
        assert_eq!(c.dirty, DirtyMethod::Wp);
        assert_eq!(c.refresh, RefreshMode::Event);
        assert_eq!(c.password.as_deref(), Some("secret"));
    }

    #[test]
    fn bad_options_are_named() {
        for (text, needle) in [
            ("", "missing option 'vnc'"),
            ("vnc=:99999", "vnc=:99999"),
            ("vnc=:5900,dirty=magic", "dirty=magic"),
            ("vnc=:5900,layout=tiled,width=1000", "divisible by 32"),
            ("vnc=:5900,color=red", "unknown option 'color'"),
            ("vnc=:5900,password=123456789", "1 to 8"),
            ("vnc=:5900,width=0", "out of range"),
        ] {
            let e = DisplayConfig::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
