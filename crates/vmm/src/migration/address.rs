//! A migration address: `tcp:HOST:PORT` and how the stream is
//! authenticated, `,tls=DIR[,tls-name=NAME]` or an explicit `,auth=none`.
//! `run --incoming`, `ctl migrate --to` and the API's `to` all take this
//! one form, parsed and printed here, so both sides say the same line for
//! the same mistake.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How the migration stream proves who is at the other end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigrationAuth {
    /// `auth=none`: plain TCP; anyone who reaches the port is taken.
    None,
    /// `tls=DIR`: TLS 1.3, both sides presenting a certificate that the
    /// other verifies against DIR/ca-cert.pem (QEMU's tls-creds-x509 with
    /// verify-peer). `name`: the name the destination's certificate must
    /// carry (`tls-name=`; default: the host of the address).
    Tls { dir: PathBuf, name: Option<String> },
}

/// `tcp:HOST:PORT` with its authentication.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationAddress {
    /// As written: a name, an IPv4 address or a bracketed IPv6 address.
    pub host: String,
    pub port: u16,
    pub auth: MigrationAuth,
}

/// What the error says when neither `tls=` nor `auth=none` is given.
const CHOOSE: &str = "add ,tls=DIR (certificates, docs/migration.md) or ,auth=none (anyone who reaches the port can send or take a VM)";

impl MigrationAddress {
    /// `HOST:PORT`, for connecting and binding.
    pub fn host_port(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The name the destination's certificate must carry: `tls-name=`, or
    /// the host of the address (an IPv6 address without its brackets).
    pub fn server_name(&self) -> String {
        match &self.auth {
            MigrationAuth::Tls {
                name: Some(name), ..
            } => name.clone(),
            _ => self
                .host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        }
    }

    /// The same address with a relative `tls=` directory made absolute
    /// from `base` (`ctl` hands the address to a VMM whose working
    /// directory is not ours).
    pub fn with_dir_under(mut self, base: &Path) -> MigrationAddress {
        if let MigrationAuth::Tls { dir, .. } = &mut self.auth {
            if dir.is_relative() {
                *dir = base.join(&*dir);
            }
        }
        self
    }
}

impl FromStr for MigrationAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<MigrationAddress, String> {
        let mut parts = text.split(',');
        let address = parts.next().unwrap_or_default();
        let rest = address
            .strip_prefix("tcp:")
            .ok_or_else(|| format!("'{text}' is not tcp:HOST:PORT"))?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("'{text}' is not tcp:HOST:PORT"))?;
        if host.is_empty() {
            return Err(format!("'{text}' has no host (tcp:HOST:PORT)"));
        }
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("'{text}': '{port}' is not a port number"))?;
        let (mut tls, mut name, mut none) = (None, None, false);
        for option in parts {
            match option.split_once('=') {
                Some(("tls", dir)) if !dir.is_empty() => tls = Some(PathBuf::from(dir)),
                Some(("tls-name", n)) if !n.is_empty() => name = Some(n.to_string()),
                Some(("auth", "none")) => none = true,
                Some(("auth", other)) => {
                    return Err(format!(
                        "'{text}': auth={other}: the only auth= is none (certificates: tls=DIR)"
                    ))
                }
                _ => {
                    return Err(format!(
                        "'{text}': '{option}' is not tls=DIR, tls-name=NAME or auth=none"
                    ))
                }
            }
        }
        let auth = match (tls, none) {
            (Some(_), true) => {
                return Err(format!(
                    "'{text}': tls= and auth=none contradict each other"
                ))
            }
            (Some(dir), false) => MigrationAuth::Tls { dir, name },
            (None, true) if name.is_none() => MigrationAuth::None,
            (None, true) => return Err(format!("'{text}': tls-name= needs tls=DIR")),
            (None, false) => {
                return Err(format!(
                    "'{text}' does not say how the migration is authenticated: {CHOOSE}"
                ))
            }
        };
        Ok(MigrationAddress {
            host: host.to_string(),
            port,
            auth,
        })
    }
}

impl fmt::Display for MigrationAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tcp:{}:{}", self.host, self.port)?;
        match &self.auth {
            MigrationAuth::None => write!(f, ",auth=none"),
            MigrationAuth::Tls { dir, name } => {
                write!(f, ",tls={}", dir.display())?;
                match name {
                    Some(name) => write!(f, ",tls-name={name}"),
                    None => Ok(()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<MigrationAddress, String> {
        text.parse()
    }

    #[test]
    fn addresses_with_their_authentication_parse_and_print_back() {
        for text in [
            "tcp:127.0.0.1:4444,auth=none",
            "tcp:127.0.0.1:4444,tls=/etc/hk",
            "tcp:[::1]:4444,tls=certs,tls-name=dst.example",
        ] {
            assert_eq!(parse(text).unwrap().to_string(), text);
        }
        let a = parse("tcp:[::1]:4444,tls=certs").unwrap();
        assert_eq!(a.host_port(), "[::1]:4444");
        assert_eq!(a.server_name(), "::1");
        let a = parse("tcp:h:1,tls=certs,tls-name=other").unwrap();
        assert_eq!(a.server_name(), "other");
        assert_eq!(
            a.with_dir_under(Path::new("/home/u")).auth,
            MigrationAuth::Tls {
                dir: "/home/u/certs".into(),
                name: Some("other".into())
            }
        );
    }

    #[test]
    fn an_address_without_a_choice_of_authentication_says_how_to_fix_it() {
        let err = parse("tcp:127.0.0.1:4444").unwrap_err();
        assert!(
            err.contains(",tls=DIR") && err.contains(",auth=none"),
            "{err}"
        );
        assert!(!err.contains('\n'));
        for (text, says) in [
            ("127.0.0.1:4444,auth=none", "tcp:HOST:PORT"),
            ("tcp:host,auth=none", "tcp:HOST:PORT"),
            ("tcp::4444,auth=none", "no host"),
            ("tcp:h:99999,auth=none", "not a port"),
            ("tcp:h:1,auth=psk", "the only auth= is none"),
            ("tcp:h:1,tls=d,auth=none", "contradict"),
            ("tcp:h:1,auth=none,tls-name=x", "needs tls=DIR"),
            ("tcp:h:1,tls=", "is not tls=DIR"),
            ("tcp:h:1,verify=yes", "is not tls=DIR"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
