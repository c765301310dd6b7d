//! RFB over WebSocket (RFC 6455), as browser clients such as noVNC speak
//! it: the RFB byte stream travels in binary messages, split anywhere. The
//! subprotocol "binary" is answered when offered (old noVNC and websockify
//! ask for it); "base64" text framing is not supported.

use std::io::{self, ErrorKind};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tungstenite::handshake::HandshakeError;
use tungstenite::http::HeaderValue;
use tungstenite::protocol::WebSocketConfig;
use tungstenite::{Message, WebSocket};
use vmm_sys_util::eventfd::EventFd;

use super::poller::Poller;
use super::transport::{ReadStatus, Transport};

/// The HTTP upgrade must finish within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Picks the subprotocol for the upgrade response.
// The signature is tungstenite's `Callback`; its error type is not ours to shrink.
#[allow(clippy::result_large_err)]
fn choose_subprotocol(
    request: &Request,
    mut response: Response,
) -> Result<Response, ErrorResponse> {
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

/// Runs the server side of the HTTP upgrade on a non-blocking `stream`.
/// Fails on a bad request, a timeout or server shutdown.
pub fn accept(stream: TcpStream, shutdown: &EventFd) -> Result<WsTransport, String> {
    let poller =
        Poller::new(stream.as_raw_fd(), None, shutdown).map_err(|e| format!("poll setup: {e}"))?;
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    let mut attempt = tungstenite::accept_hdr_with_config(stream, choose_subprotocol, Some(config));
    loop {
        match attempt {
            Ok(ws) => return Ok(WsTransport { ws }),
            Err(HandshakeError::Failure(e)) => {
                return Err(format!("WebSocket handshake failed: {e}"))
            }
            Err(HandshakeError::Interrupted(mid)) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err("WebSocket handshake timed out".to_string());
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
