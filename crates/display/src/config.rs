//! `--display vnc=ADDR:PORT[,width=..,height=..][,layout=..][,dirty=..]
//! [,refresh=..][,password_file=PATH|password=..][,websocket=[ADDR:]PORT]
//! [,origins=[ORIGIN,...]][,handshake_timeout=SECONDS]
//! [,pending_per_address=N]`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use devices::options::{invalid, Options, OptionsError};

use crate::dirty::DirtyMethod;
use crate::layout::{FbGeometry, Layout};
use crate::refresh::RefreshMode;
use crate::vnc::FrontDoor;

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
    /// The password was given as `password=` on the command line, where
    /// every user of the host sees it (ps, /proc/PID/cmdline).
    pub password_on_command_line: bool,
    /// Origins, handshake timeout, pending connections per address.
    pub front_door: FrontDoor,
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
        let password_on_command_line = o.take("password");
        let password = match (o.take("password_file"), &password_on_command_line) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "password_file",
                    "(with password=)",
                    "give password_file or password, not both",
                ))
            }
            (Some(path), None) => {
                Some(read_password(&path).map_err(|e| invalid("password_file", &path, &e))?)
            }
            (None, p) => p.clone(),
        };
        if let Some(p) = &password {
            if p.is_empty() || p.len() > 8 {
                return Err(invalid(
                    "password",
                    "(hidden)",
                    "VNC passwords are 1 to 8 characters",
                ));
            }
        }
        let origins = match o.take("origins") {
            None => Vec::new(),
            Some(list) => parse_origins(&list).map_err(|e| invalid("origins", &list, &e))?,
        };
        let handshake_timeout = match o.parsed::<u64>("handshake_timeout")? {
            None => crate::vnc::DEFAULT_HANDSHAKE_TIMEOUT,
            Some(s @ 1..=600) => Duration::from_secs(s),
            Some(s) => {
                return Err(invalid(
                    "handshake_timeout",
                    &s.to_string(),
                    "1 to 600 seconds",
                ))
            }
        };
        let pending_per_address = match o.parsed::<usize>("pending_per_address")? {
            None => crate::vnc::DEFAULT_PENDING_PER_ADDRESS,
            Some(n @ 1..=64) => n,
            Some(n) => return Err(invalid("pending_per_address", &n.to_string(), "1 to 64")),
        };
        o.finish()?;
        Ok(DisplayConfig {
            listen,
            websocket,
            geometry,
            dirty,
            refresh,
            password,
            password_on_command_line: password_on_command_line.is_some(),
            front_door: FrontDoor {
                origins,
                handshake_timeout,
                pending_per_address,
            },
        })
    }
}

/// The password in the file at `path`: its first line, without the line
/// end (so `echo secret > FILE` works).
fn read_password(path: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        e.to_string()
            .split(" (os error")
            .next()
            .unwrap_or_default()
            .to_lowercase()
    })?;
    Ok(text.lines().next().unwrap_or("").to_string())
}

/// `[ORIGIN,...]` or one `ORIGIN`; each `scheme://host[:port]`.
fn parse_origins(text: &str) -> Result<Vec<String>, String> {
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    inner
        .split(',')
        .map(str::trim)
        .map(|o| o.trim_end_matches('/'))
        .filter(|o| !o.is_empty())
        .map(|o| match o.split_once("://") {
            Some((scheme, host))
                if !scheme.is_empty() && !host.is_empty() && !host.contains('/') =>
            {
                Ok(o.to_string())
            }
            _ => Err(format!("'{o}' is not scheme://host[:port]")),
        })
        .collect()
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
        assert!(c.password_on_command_line);
        assert_eq!(c.front_door, FrontDoor::default());
        assert_eq!(c.front_door.handshake_timeout, Duration::from_secs(10));
        assert_eq!(c.front_door.pending_per_address, 4);
    }

    #[test]
    fn front_door_options() {
        let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let file = dir.as_path().join("vnc.pass");
        std::fs::write(&file, "s3cret\n").unwrap();
        let c = DisplayConfig::parse(&format!(
            "vnc=:5900,password_file={},origins=[https://a.example:8443/,http://b],\
             handshake_timeout=3,pending_per_address=2",
            file.display()
        ))
        .unwrap();
        assert_eq!(c.password.as_deref(), Some("s3cret"));
        assert!(!c.password_on_command_line);
        assert_eq!(
            c.front_door,
            FrontDoor {
                origins: vec!["https://a.example:8443".into(), "http://b".into()],
                handshake_timeout: Duration::from_secs(3),
                pending_per_address: 2,
            }
        );
        let c = DisplayConfig::parse("vnc=:5900,origins=https://one.example").unwrap();
        assert_eq!(
            c.front_door.origins,
            vec!["https://one.example".to_string()]
        );

        std::fs::write(&file, "far too long\n").unwrap();
        let missing = dir.as_path().join("missing");
        for (text, needle) in [
            (
                format!("vnc=:5900,password_file={}", file.display()),
                "1 to 8".to_string(),
            ),
            (
                format!("vnc=:5900,password_file={}", missing.display()),
                "no such file".to_string(),
            ),
            (
                format!("vnc=:5900,password=a,password_file={}", file.display()),
                "not both".to_string(),
            ),
            (
                "vnc=:5900,origins=[evil.example]".into(),
                "scheme://host".into(),
            ),
            ("vnc=:5900,handshake_timeout=0".into(), "1 to 600".into()),
            ("vnc=:5900,pending_per_address=0".into(), "1 to 64".into()),
        ] {
            let e = DisplayConfig::parse(&text).unwrap_err().to_string();
            assert!(e.contains(&needle) && !e.contains('\n'), "{text}: {e}");
            assert!(
                !e.contains("far too long"),
                "the password is not shown: {e}"
            );
        }
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
