//! Minimal HTTP/1.1 framing on top of `httparse`, shared by server and client.
//!
//! `httparse` does the tokenising; this module only adds what it leaves to
//! the caller: buffering with size limits, deadlines so a slow peer cannot
//! hold a thread forever, `Content-Length` bodies, and response writing. It
//! deliberately supports only what the API needs (no chunked encoding, no
//! trailers, no upgrades) and refuses the rest with a clear status.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Most headers accepted in one message; real clients send fewer than 10.
const MAX_HEADERS: usize = 64;

/// Size of each `read` call.
const READ_CHUNK: usize = 8192;

/// A parsed request, body included.
#[derive(Debug)]
pub(crate) struct Request {
    pub method: String,
    /// Path without query string or fragment.
    pub path: String,
    pub body: Vec<u8>,
    /// Whether the client wants the connection kept open afterwards.
    pub keep_alive: bool,
}

/// Why no request could be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The peer closed the connection cleanly between requests.
    Closed,
    /// The peer stalled past the deadline with a request half sent.
    TimedOut,
    /// The connection broke (reset, EOF mid-request, idle timeout, ...);
    /// nothing useful can be sent back.
    Broken,
    /// The request is unacceptable; answer with this status, then close,
    /// because the framing of whatever follows cannot be trusted.
    Reject { status: u16, message: String },
}

impl ReadError {
    fn reject(status: u16, message: impl Into<String>) -> Self {
        ReadError::Reject {
            status,
            message: message.into(),
        }
    }
}

/// Limits applied while reading a request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_header_bytes: usize,
    pub max_body_bytes: usize,
    pub timeout: Duration,
}

/// A connection plus the bytes read past the end of the previous message
/// (pipelined requests).
pub(crate) struct Connection {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl Connection {
    pub fn new(stream: UnixStream) -> Self {
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    /// Reads one request. The whole request (headers and body) must arrive
    /// within `limits.timeout` of the call, so a client trickling one byte at
    /// a time cannot keep a thread busy indefinitely.
    pub fn read_request(&mut self, limits: &Limits) -> Result<Request, ReadError> {
        let deadline = Instant::now() + limits.timeout;
        let (head_len, head) = loop {
            match parse_request_head(&self.buf) {
                Ok(Some(parsed)) => break parsed,
                Ok(None) => {}
                Err(e) => return Err(e),
            }
            if self.buf.len() >= limits.max_header_bytes {
                return Err(ReadError::reject(
                    431,
                    format!("request header exceeds {} bytes", limits.max_header_bytes),
                ));
            }
            match read_more(&mut self.stream, &mut self.buf, deadline) {
                Ok(0) if self.buf.is_empty() => return Err(ReadError::Closed),
                // The client gave up mid-request.
                Ok(0) => return Err(ReadError::Broken),
                Ok(_) => {}
                Err(e) if is_timeout(&e) && !self.buf.is_empty() => {
                    return Err(ReadError::TimedOut)
                }
                Err(_) => return Err(ReadError::Broken),
            }
        };

        if head.chunked {
            return Err(ReadError::reject(
                411,
                "Transfer-Encoding is not supported; send the body with a Content-Length",
            ));
        }
        let body_len = head.content_length.unwrap_or(0);
        if body_len > limits.max_body_bytes {
            return Err(ReadError::reject(
                413,
                format!(
                    "request body of {body_len} bytes exceeds the limit of {} bytes",
                    limits.max_body_bytes
                ),
            ));
        }

        self.buf.drain(..head_len);
        if head.expect_continue && body_len > self.buf.len() {
            // curl waits (about a second) for this before sending larger
            // bodies; answering promptly keeps requests fast.
            let _ = write_all_by(&mut self.stream, b"HTTP/1.1 100 Continue\r\n\r\n", deadline);
        }
        while self.buf.len() < body_len {
            match read_more(&mut self.stream, &mut self.buf, deadline) {
                // The client gave up before sending the whole body.
                Ok(0) => return Err(ReadError::Broken),
                Ok(_) => {}
                Err(e) if is_timeout(&e) => return Err(ReadError::TimedOut),
                Err(_) => return Err(ReadError::Broken),
            }
        }
        let rest = self.buf.split_off(body_len);
        let body = std::mem::replace(&mut self.buf, rest);

        Ok(Request {
            method: head.method,
            path: head.path,
            body,
            keep_alive: head.keep_alive,
        })
    }

    /// Writes a complete response; the whole write must finish within
    /// `timeout` so a client that stops reading cannot block the thread.
    pub fn write_response(&mut self, response: &Response, timeout: Duration) -> io::Result<()> {
        let bytes = response.to_bytes();
        write_all_by(&mut self.stream, &bytes, Instant::now() + timeout)
    }
}

/// The interesting parts of a request head.
struct RequestHead {
    method: String,
    path: String,
    content_length: Option<usize>,
    chunked: bool,
    keep_alive: bool,
    expect_continue: bool,
}

/// Parses the request head in `buf`. `Ok(None)` means more bytes are needed.
fn parse_request_head(buf: &[u8]) -> Result<Option<(usize, RequestHead)>, ReadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(ReadError::reject(431, "too many request headers"))
        }
        Err(e) => {
            return Err(ReadError::reject(
                400,
                format!("malformed HTTP request: {e}"),
            ))
        }
    };
    // `Complete` guarantees these are present.
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(ReadError::reject(400, "malformed HTTP request line"));
    };

    let mut head = RequestHead {
        method: method.to_owned(),
        path: strip_query(target).to_owned(),
        content_length: None,
        chunked: false,
        // HTTP/1.1 defaults to persistent connections, HTTP/1.0 does not.
        keep_alive: version >= 1,
        expect_continue: false,
    };
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let len = parse_content_length(h.value)
                .ok_or_else(|| ReadError::reject(400, "invalid Content-Length header"))?;
            if head.content_length.is_some_and(|prev| prev != len) {
                return Err(ReadError::reject(400, "conflicting Content-Length headers"));
            }
            head.content_length = Some(len);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = true;
        } else if name.eq_ignore_ascii_case("connection") {
            // Only `close` matters: HTTP/1.1 is persistent by default, and
            // HTTP/1.0 keep-alive is a legacy extension a control socket
            // does not need.
            if String::from_utf8_lossy(h.value)
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("close"))
            {
                head.keep_alive = false;
            }
        } else if name.eq_ignore_ascii_case("expect") {
            if h.value.eq_ignore_ascii_case(b"100-continue") {
                head.expect_continue = true;
            } else {
                return Err(ReadError::reject(417, "unsupported Expect header"));
            }
        }
    }
    Ok(Some((head_len, head)))
}

/// Strict `Content-Length` parsing: digits only (no sign, no spaces inside),
/// as RFC 9110 requires; anything else is a smuggling risk.
fn parse_content_length(value: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(value).ok()?.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn strip_query(target: &str) -> &str {
    let end = target.find(['?', '#']).unwrap_or(target.len());
    &target[..end]
}

/// A response to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Response {
    pub status: u16,
    /// JSON body; `None` for 204.
    pub body: Option<String>,
    /// Value of the `Allow` header for 405 answers.
    pub allow: Option<&'static str>,
    pub keep_alive: bool,
}

impl Response {
    fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nServer: hakoniwa\r\n",
            self.status,
            reason_phrase(self.status)
        );
        if let Some(allow) = self.allow {
            out.push_str(&format!("Allow: {allow}\r\n"));
        }
        out.push_str(if self.keep_alive {
            "Connection: keep-alive\r\n"
        } else {
            "Connection: close\r\n"
        });
        // RFC 9110 forbids Content-Length on 204 responses.
        if self.status != 204 {
            let body = self.body.as_deref().unwrap_or("");
            if !body.is_empty() {
                out.push_str("Content-Type: application/json\r\n");
            }
            out.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        } else {
            out.push_str("\r\n");
        }
        out.into_bytes()
    }
}

/// Standard reason phrases for the statuses the API produces; clients must
/// not depend on them, but they make raw transcripts readable.
pub(crate) fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => match status / 100 {
            2 => "Success",
            4 => "Client Error",
            5 => "Server Error",
            _ => "Unknown",
        },
    }
}

/// Timeouts on Unix sockets surface as `WouldBlock` (EAGAIN) from `read`.
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
    } else {
        Ok(left)
    }
}

/// Appends at most one chunk to `buf`, waiting no later than `deadline`.
/// Returns the number of bytes read (0 at end of stream).
pub(crate) fn read_more(
    stream: &mut UnixStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> io::Result<usize> {
    let mut chunk = [0u8; READ_CHUNK];
    loop {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        match stream.read(&mut chunk) {
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `write_all` that gives up at `deadline`.
pub(crate) fn write_all_by(
    stream: &mut UnixStream,
    mut data: &[u8],
    deadline: Instant,
) -> io::Result<()> {
    while !data.is_empty() {
        stream.set_write_timeout(Some(remaining(deadline)?))?;
        match stream.write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A parsed response head (client side).
#[derive(Debug)]
pub(crate) struct ResponseHead {
    pub status: u16,
    pub head_len: usize,
    pub content_length: Option<usize>,
    pub chunked: bool,
}

/// Parses a response head; `Ok(None)` means more bytes are needed.
pub(crate) fn parse_response_head(buf: &[u8]) -> Result<Option<ResponseHead>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("invalid HTTP response: {e}")),
    };
    let status = resp
        .code
        .ok_or_else(|| "HTTP response without a status code".to_owned())?;
    let mut head = ResponseHead {
        status,
        head_len,
        content_length: None,
        chunked: false,
    };
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            head.content_length = Some(
                parse_content_length(h.value)
                    .ok_or_else(|| "invalid Content-Length in response".to_owned())?,
            );
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = true;
        }
    }
    Ok(Some(head))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Result<Option<(usize, RequestHead)>, ReadError> {
        parse_request_head(raw.as_bytes())
    }

    #[test]
    fn partial_head_needs_more() {
        assert!(matches!(
            head("GET /api/v1/vm.info HTTP/1.1\r\nHo"),
            Ok(None)
        ));
    }

    #[test]
    fn parses_method_path_and_framing() {
        let (n, h) = head(
            "PUT /api/v1/vm.pause?x=1 HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.method, "PUT");
        assert_eq!(h.path, "/api/v1/vm.pause");
        assert_eq!(h.content_length, Some(2));
        assert!(!h.keep_alive);
        assert_eq!(
            n,
            "PUT /api/v1/vm.pause?x=1 HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
                .len()
        );
    }

    #[test]
    fn http10_defaults_to_close_and_11_to_keep_alive() {
        assert!(
            !head("GET / HTTP/1.0\r\n\r\n")
                .unwrap()
                .unwrap()
                .1
                .keep_alive
        );
        assert!(
            head("GET / HTTP/1.1\r\n\r\n")
                .unwrap()
                .unwrap()
                .1
                .keep_alive
        );
    }

    #[test]
    fn rejects_bad_content_length() {
        for raw in [
            "PUT / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "PUT / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n",
            "PUT / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            "PUT / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        ] {
            assert!(
                matches!(head(raw), Err(ReadError::Reject { status: 400, .. })),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn garbage_is_400() {
        assert!(matches!(
            head("\x01\x02 nonsense\r\n\r\n"),
            Err(ReadError::Reject { status: 400, .. })
        ));
    }

    #[test]
    fn response_204_has_no_length_and_errors_have_json() {
        let r = Response {
            status: 204,
            body: None,
            allow: None,
            keep_alive: false,
        };
        let s = String::from_utf8(r.to_bytes()).unwrap();
        assert!(s.starts_with("HTTP/1.1 204 No Content\r\n"));
        assert!(!s.contains("Content-Length"));
        assert!(s.ends_with("\r\n\r\n"));

        let r = Response {
            status: 405,
            body: Some("{\"error\":\"x\"}".into()),
            allow: Some("GET"),
            keep_alive: true,
        };
        let s = String::from_utf8(r.to_bytes()).unwrap();
        assert!(s.contains("Allow: GET\r\n"));
        assert!(s.contains("Content-Length: 13\r\n"));
        assert!(s.contains("Connection: keep-alive\r\n"));
        assert!(s.ends_with("\r\n\r\n{\"error\":\"x\"}"));
    }

    #[test]
    fn parses_response_heads() {
        let h = parse_response_head(b"HTTP/1.1 409 Conflict\r\nContent-Length: 5\r\n\r\nabcde")
            .unwrap()
            .unwrap();
        assert_eq!(h.status, 409);
        assert_eq!(h.content_length, Some(5));
        assert_eq!(
            h.head_len,
            b"HTTP/1.1 409 Conflict\r\nContent-Length: 5\r\n\r\n".len()
        );
        assert!(parse_response_head(b"HTTP/1.1 20").unwrap().is_none());
        assert!(parse_response_head(b"SSH-2.0\r\n\r\n").is_err());
    }
}
