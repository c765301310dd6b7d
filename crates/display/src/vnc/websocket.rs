//! RFB over WebSocket (RFC 6455), as browser clients such as noVNC speak
//! it: the RFB byte stream travels in binary messages, split anywhere. The
//! subprotocol "binary" is answered when offered (old noVNC and websockify
//! ask for it); "base64" text framing is not supported.
//!
//! A browser lets any web page open a WebSocket to any address, localhost
//! included, and says which page in `Origin`. So the upgrade is refused
//! with HTTP 403 unless `Origin` is absent (not a browser), the server's
//! own (its authority is the `Host` header: a page served from this
//! address) or on the allow-list. Our own origin counts only where `Host`
//! is an IP address or `localhost`: under DNS rebinding a hostile page's
//! name resolves to us, and its Origin matches the Host it sends; a name
//! must be listed.

use std::io::{self, ErrorKind};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tungstenite::handshake::HandshakeError;
use tungstenite::http::{HeaderValue, StatusCode};
use tungstenite::protocol::WebSocketConfig;
use tungstenite::{Message, WebSocket};
use vmm_sys_util::eventfd::EventFd;

use super::poller::Poller;
use super::transport::{ReadStatus, Transport};

/// While the upgrade response is being written the socket is polled for
/// input only, so retry at least this often in case the write was what
/// blocked.
const HANDSHAKE_RETRY: Duration = Duration::from_millis(50);

/// Largest message accepted from a client. RFB client messages are small
/// (the largest, SetEncodings, is under 256 KiB); the limit keeps a hostile
/// peer from making tungstenite buffer tens of megabytes.
const MAX_MESSAGE: usize = 1 << 20;

const SUBPROTOCOL_HEADER: &str = "Sec-WebSocket-Protocol";

/// RFB over an accepted WebSocket.
pub struct WsTransport {
    ws: WebSocket<TcpStream>,
}

/// Whether a request with `origin` (the `Origin` header, if any) to
/// `host` (the `Host` header) may upgrade; the refusal says why.
pub fn check_origin(
    origin: Option<&str>,
    host: Option<&str>,
    allowed: &[String],
) -> Result<(), String> {
    let Some(origin) = origin else {
        return Ok(());
    };
    let origin = origin.trim().trim_end_matches('/');
    let authority = origin.split_once("://").map(|(_, a)| a);
    let own = matches!((authority, host), (Some(a), Some(h))
        if a.eq_ignore_ascii_case(h.trim()) && names_no_dns(h.trim()));
    let listed = allowed
        .iter()
        .any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(origin));
    if own || listed {
        return Ok(());
    }
    // The origin is the peer's text: shown escaped, and not too much.
    let shown: String = origin.chars().take(100).collect();
    Err(format!(
        "WebSocket Origin {:?} is not allowed (HTTP 403); allow it with origins=[...]",
        shown
    ))
}

/// Whether the host part of `authority` (`host[:port]`) is an IP address
/// or `localhost`, which no DNS answer can make point elsewhere.
fn names_no_dns(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok()
}

/// Checks `Origin` and picks the subprotocol for the upgrade response.
// The signature is tungstenite's `Callback`; its error type is not ours to shrink.
#[allow(clippy::result_large_err)]
fn answer_upgrade(
    allowed: &[String],
    request: &Request,
    mut response: Response,
) -> Result<Response, ErrorResponse> {
    let header = |name| {
        request
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap_or("(not text)"))
    };
    if let Err(reason) = check_origin(header("Origin"), header("Host"), allowed) {
        let mut refusal = ErrorResponse::new(Some(reason));
        *refusal.status_mut() = StatusCode::FORBIDDEN;
        return Err(refusal);
    }
    let offers_binary = request
        .headers()
        .get_all(SUBPROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == "binary");
    if offers_binary {
        response
            .headers_mut()
            .insert(SUBPROTOCOL_HEADER, HeaderValue::from_static("binary"));
    }
    Ok(response)
}

/// Runs the server side of the HTTP upgrade on a non-blocking `stream`,
/// allowing the `Origin`s in `allowed` besides none and our own. Fails on
/// a bad request or origin, at `deadline`, or at server shutdown.
pub fn accept(
    stream: TcpStream,
    shutdown: &EventFd,
    deadline: Instant,
    allowed: &[String],
) -> Result<WsTransport, String> {
    let poller =
        Poller::new(stream.as_raw_fd(), None, shutdown).map_err(|e| format!("poll setup: {e}"))?;
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    // The signature is tungstenite's `Callback`, as for answer_upgrade.
    #[allow(clippy::result_large_err)]
    let callback = |request: &Request, response| answer_upgrade(allowed, request, response);
    let mut attempt = tungstenite::accept_hdr_with_config(stream, callback, Some(config));
    loop {
        match attempt {
            Ok(ws) => return Ok(WsTransport { ws }),
            // Our own refusal (written to the peer already): its reason.
            Err(HandshakeError::Failure(tungstenite::Error::Http(response))) => {
                let reason = response
                    .body()
                    .as_deref()
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default()
                    .into_owned();
                return Err(format!("refused: {reason}"));
            }
            Err(HandshakeError::Failure(e)) => {
                return Err(format!("WebSocket handshake failed: {e}"))
            }
            Err(HandshakeError::Interrupted(mid)) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err("handshake timed out (WebSocket upgrade)".to_string());
                }
                let ready = poller
                    .wait(Some(left.min(HANDSHAKE_RETRY)))
                    .map_err(|e| format!("poll: {e}"))?;
                if ready.shutdown {
                    return Err("server shutting down".to_string());
                }
                attempt = mid.handshake();
            }
        }
    }
}

fn io_error(e: tungstenite::Error) -> io::Error {
    match e {
        tungstenite::Error::Io(e) => e,
        other => io::Error::other(other),
    }
}

fn would_block(e: &tungstenite::Error) -> bool {
    matches!(e, tungstenite::Error::Io(io) if io.kind() == ErrorKind::WouldBlock)
}

impl Transport for WsTransport {
    fn fd(&self) -> RawFd {
        self.ws.get_ref().as_raw_fd()
    }

    fn read_available(&mut self, buf: &mut Vec<u8>, budget: usize) -> io::Result<ReadStatus> {
        let mut taken = 0;
        while taken < budget {
            match self.ws.read() {
                Ok(Message::Binary(data)) => {
                    buf.extend_from_slice(&data);
                    taken += data.len();
                }
                Ok(Message::Text(_)) => {
                    return Err(io::Error::new(
                        ErrorKind::InvalidData,
                        "text WebSocket messages (base64 framing) are not supported",
                    ))
                }
                // Pings are answered by tungstenite on the next write or
                // flush; pongs need nothing.
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
                Ok(Message::Close(_)) => return Ok(ReadStatus::Closed),
                Err(e) if would_block(&e) => return Ok(ReadStatus::Drained),
                Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                    return Ok(ReadStatus::Closed)
                }
                Err(e) => return Err(io_error(e)),
            }
        }
        Ok(ReadStatus::More)
    }

    fn queue(&mut self, data: Vec<u8>) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        match self.ws.write(Message::Binary(data.into())) {
            // A blocked write keeps the frame buffered for the next flush.
            Err(e) if would_block(&e) => Ok(()),
            other => other.map_err(io_error),
        }
    }

    fn flush(&mut self) -> io::Result<bool> {
        match self.ws.flush() {
            Ok(()) => Ok(true),
            Err(e) if would_block(&e) => Ok(false),
            Err(e) => Err(io_error(e)),
        }
    }

    fn close(&mut self) {
        // Say goodbye properly if the socket takes it right away; do not
        // wait for the peer's answer.
        let _ = self.ws.close(None);
        let _ = self.ws.get_ref().shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::check_origin;

    #[test]
    fn origins_none_own_and_listed_pass_others_are_refused() {
        let listed = vec!["https://console.example:8443".to_string()];
        // A non-browser client sends none.
        assert!(check_origin(None, Some("127.0.0.1:5700"), &[]).is_ok());
        // The page was served from this address (noVNC beside the server).
        assert!(check_origin(Some("http://127.0.0.1:5700"), Some("127.0.0.1:5700"), &[]).is_ok());
        assert!(check_origin(Some("http://LOCALHOST:5700/"), Some("localhost:5700"), &[]).is_ok());
        assert!(check_origin(Some("http://[::1]:5700"), Some("[::1]:5700"), &[]).is_ok());
        // Listed, in any case.
        assert!(check_origin(
            Some("HTTPS://console.example:8443"),
            Some("127.0.0.1:5700"),
            &listed
        )
        .is_ok());
        // Another page in the host's browser.
        for (origin, host) in [
            ("https://evil.example", Some("127.0.0.1:5700")),
            ("http://127.0.0.1:8080", Some("127.0.0.1:5700")),
            ("http://127.0.0.1:5700", None),
            ("null", Some("127.0.0.1:5700")),
            ("https://console.example:8444", Some("127.0.0.1:5700")),
            // DNS rebinding: a name that resolves to us is not our origin.
            ("http://vm.example:5700", Some("vm.example:5700")),
        ] {
            let e = check_origin(Some(origin), host, &listed).unwrap_err();
            assert!(
                e.contains("not allowed (HTTP 403)") && !e.contains('\n'),
                "{e}"
            );
        }
        let long = "x".repeat(10_000);
        let e = check_origin(Some(&long), None, &[]).unwrap_err();
        assert!(e.len() < 250, "{e}");
    }
}
