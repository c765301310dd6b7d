//! Entry points for the fuzz targets in `fuzz/` (not an API): a client's
//! RFB session and the WebSocket upgrade and framing, driven by the real
//! code from bytes a hostile client could send.

use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

use super::auth;
use super::client::{Client, CopyOp};
use super::server::Shared;
use super::session::Session;
use super::transport::{ReadStatus, Transport};
use super::websocket;
use super::FrontDoor;
use crate::geometry::Rect;
use crate::input::InputSink;
use crate::screen::Screen;

/// The screen a fuzzed session shows: small, so updates are cheap, and
/// not a multiple of ZRLE's 64-pixel tiles.
const WIDTH: u16 = 70;
const HEIGHT: u16 = 40;
const PASSWORD: &str = "fuzzpass";

/// Output goes nowhere; the fd is an eventfd the poller can watch.
struct NullTransport {
    fd: EventFd,
}

impl Transport for NullTransport {
    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn read_available(&mut self, _: &mut Vec<u8>, _: usize) -> io::Result<ReadStatus> {
        Ok(ReadStatus::Drained)
    }

    fn queue(&mut self, _: Vec<u8>) -> io::Result<()> {
        Ok(())
    }

    fn flush(&mut self) -> io::Result<bool> {
        Ok(true)
    }

    fn close(&mut self) {}
}

/// Counts input events and checks they stay on the screen.
#[derive(Default)]
struct CheckedInput {
    events: AtomicUsize,
}

impl InputSink for CheckedInput {
    fn key(&self, _: u32, _: bool) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    fn pointer(&self, x: u16, y: u16, _: u8) {
        assert!(
            x < WIDTH && y < HEIGHT,
            "pointer at {x},{y} is off the screen"
        );
        self.events.fetch_add(1, Ordering::Relaxed);
    }
}

/// Chunk lengths for splitting a client's bytes: from a small xorshift
/// generator, so one seed byte gives a reproducible split.
struct Splits(u32);

impl Splits {
    fn next_len(&mut self, left: usize) -> usize {
        if self.0 == 0 {
            return left;
        }
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        // Mostly short pieces (split inside messages), now and then long.
        let len = if self.0 & 0x100 != 0 {
            self.0 as usize % 8
        } else {
            self.0 as usize % 512
        };
        len.clamp(1, left)
    }
}

/// Runs one session on `input`, as a client sends it:
/// - byte 0: bit 0 the server has a password; bit 1 the client knows it
///   (then it reads the input byte by byte until the server waits for the
///   response to its challenge, and the right one arrives before the next
///   byte); bits 2-7 seed how the rest is split into reads (0: one read);
/// - the rest: the client's bytes.
///
/// Between reads, pixels change and a region is copied, so updates carry
/// Raw, ZRLE and CopyRect rectangles. Panics if a client without the
/// password gets past security or moves keyboard or pointer, or if a
/// pointer event leaves the screen. Returns how far the client got.
pub fn rfb_session(input: &[u8]) -> Reached {
    let mut reached = Reached::default();
    let Some((&control, bytes)) = input.split_first() else {
        return reached;
    };
    let with_password = control & 1 != 0;
    let knows_password = with_password && control & 2 != 0;
    let screen = Arc::new(Screen::new(WIDTH, HEIGHT));
    let sink = Arc::new(CheckedInput::default());
    let Ok(shared) = Shared::new(
        screen.clone(),
        sink.clone(),
        with_password.then(|| PASSWORD.to_string()),
        "fuzz".to_string(),
        FrontDoor::default(),
    ) else {
        return reached;
    };
    let peer = SocketAddr::from(([127, 0, 0, 1], 5900));
    let full = Rect::new(0, 0, WIDTH, HEIGHT);
    let (Ok(wake), Ok(fd)) = (
        EventFd::new(libc::EFD_NONBLOCK),
        EventFd::new(libc::EFD_NONBLOCK),
    ) else {
        return reached;
    };
    let client = Client::new(peer, wake, full);
    let Ok(mut session) = Session::start(NullTransport { fd }, &shared, &client) else {
        return reached;
    };
    let mut splits = Splits(u32::from(control >> 2) * 0x9e37);
    let mut rest = bytes;
    let mut turn = 0u16;
    // Until the client has answered, it reads byte by byte, so the
    // answer goes in right where the server asks for it.
    let mut to_answer = knows_password;
    while !rest.is_empty() {
        if to_answer {
            if let Some(challenge) = session.challenge_pending() {
                to_answer = false;
                if session.feed(&auth::response(PASSWORD, &challenge)).is_err() {
                    break;
                }
            }
        }
        let len = if to_answer {
            1
        } else {
            splits.next_len(rest.len())
        };
        let (piece, after) = rest.split_at(len);
        rest = after;
        let result = session.feed(piece);
        if with_password && !knows_password {
            assert!(
                !session.past_security(),
                "past security without the password"
            );
            assert_eq!(
                sink.events.load(Ordering::Relaxed),
                0,
                "input without the password"
            );
        }
        if result.is_err() {
            break;
        }
        turn = turn.wrapping_add(1);
        change_screen(&screen, &client, turn, piece);
    }
    reached.past_security = session.past_security();
    reached.input_events = sink.events.load(Ordering::Relaxed);
    reached
}

/// How far a fuzzed RFB client got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reached {
    /// Past security (and authenticated, with a password).
    pub past_security: bool,
    /// Key and pointer events that reached the guest's side.
    pub input_events: usize,
}

/// Paints a few pixels from `piece` and moves a strip, as a guest would.
fn change_screen(screen: &Screen, client: &Client, turn: u16, piece: &[u8]) {
    let x = turn % WIDTH;
    let y = turn % HEIGHT;
    {
        let mut fb = screen.write();
        let row = usize::from(y) * usize::from(WIDTH);
        for (i, b) in piece.iter().take(usize::from(WIDTH - x)).enumerate() {
            fb[row + usize::from(x) + i] = u32::from(*b) * 0x0001_0101;
        }
    }
    client.damage(&[Rect::new(x, y, WIDTH - x, 1)]);
    if turn.is_multiple_of(3) {
        let h = HEIGHT / 4;
        client.copy(CopyOp {
            src: Rect::new(0, y.min(HEIGHT - h), WIDTH / 2, h),
            dst: Rect::new(WIDTH / 2, (y / 2).min(HEIGHT - h), WIDTH / 2, h),
        });
    }
}

/// Runs the WebSocket upgrade (Origin check, subprotocol) and then reads
/// binary messages, as the server does for noVNC, over a loopback TCP
/// connection. `input` is what the peer sends: up to the first blank line
/// the upgrade request, sent first; the rest (the frames) once the
/// upgrade is done, then the peer closes. Returns the RFB bytes the
/// messages carried; panics if they are more than arrived.
pub fn websocket_stream(input: &[u8]) -> io::Result<Vec<u8>> {
    let (request, frames) = match input.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(end) => input.split_at(end + 4),
        None => (input, &[][..]),
    };
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    let mut peer = TcpStream::connect(listener.local_addr()?)?;
    let (stream, _) = listener.accept()?;
    // Loopback buffers take a fuzz input whole; the upgrade response (the
    // only thing written back) is small.
    peer.write_all(request)?;
    if frames.is_empty() {
        // An unfinished request fails at the end of the stream, at once.
        peer.shutdown(Shutdown::Write)?;
    }
    stream.set_nonblocking(true)?;
    let shutdown = EventFd::new(libc::EFD_NONBLOCK)?;
    // Over loopback a whole request is there at the first attempt; the
    // deadline only ends the wait of one httparse takes as unfinished
    // (say, after leading blank lines), so it is short.
    let deadline = Instant::now() + Duration::from_millis(10);
    let allowed = ["https://console.example".to_string()];
    let Ok(mut ws) = websocket::accept(stream, &shutdown, deadline, &allowed) else {
        return Ok(Vec::new());
    };
    peer.write_all(frames)?;
    peer.shutdown(Shutdown::Write)?;
    let mut rfb = Vec::new();
    while let Ok(ReadStatus::More) = ws.read_available(&mut rfb, 4096) {}
    assert!(rfb.len() <= frames.len(), "more bytes out than in");
    // The session answers through the same transport.
    let _ = ws.queue(b"RFB 003.008\n".to_vec());
    let _ = ws.flush();
    ws.close();
    Ok(rfb)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's bytes from ProtocolVersion on: `security` (the type it
    /// picks, if any), ClientInit, a key and a pointer event far off the
    /// screen.
    fn client(version: &[u8], security: &[u8]) -> Vec<u8> {
        let mut bytes = version.to_vec();
        bytes.extend_from_slice(security);
        bytes.push(1);
        bytes.extend_from_slice(&[4, 1, 0, 0, 0, 0, 0xff, 0x0d]);
        bytes.extend_from_slice(&[5, 1, 0xff, 0xff, 0xff, 0xff]);
        bytes
    }

    fn run(control: u8, bytes: &[u8]) -> Reached {
        let mut input = vec![control];
        input.extend_from_slice(bytes);
        rfb_session(&input)
    }

    #[test]
    fn sessions_reach_the_guest_only_with_the_password() {
        let both = Reached {
            past_security: true,
            input_events: 2,
        };
        // No password; whole, and split into reads of a few bytes.
        assert_eq!(run(0, &client(b"RFB 003.008\n", &[1])), both);
        assert_eq!(run(0x14, &client(b"RFB 003.008\n", &[1])), both);
        assert_eq!(run(0, &client(b"RFB 003.003\n", &[])), both);
        // A password the harness answers with.
        assert_eq!(run(0x03, &client(b"RFB 003.008\n", &[2])), both);
        assert_eq!(run(0x2b, &client(b"RFB 003.003\n", &[])), both);
        // A password the client does not know: its guess fails, and
        // picking None is refused.
        let mut guess = b"RFB 003.008\n\x02".to_vec();
        guess.extend_from_slice(&[0x55; 16]);
        guess.extend_from_slice(&client(b"", &[]));
        assert_eq!(run(0x01, &guess), Reached::default());
        assert_eq!(
            run(0x01, &client(b"RFB 003.008\n", &[1])),
            Reached::default()
        );
    }

    #[test]
    fn websocket_messages_carry_the_rfb_bytes() {
        let mut input = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:5700\r\nUpgrade: websocket\r\n\
            Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
            Sec-WebSocket-Version: 13\r\nOrigin: https://console.example\r\n\r\n"
            .to_vec();
        let mask = [1u8, 2, 3, 4];
        input.extend_from_slice(&[0x82, 0x80 | 12]);
        input.extend_from_slice(&mask);
        input.extend(
            b"RFB 003.008\n"
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ mask[i % 4]),
        );
        assert_eq!(websocket_stream(&input).unwrap(), b"RFB 003.008\n");
        // Another page's origin is refused before any message is read.
        let at = input.windows(7).position(|w| w == b"console").unwrap();
        input[at..at + 7].copy_from_slice(b"evil123");
        assert_eq!(websocket_stream(&input).unwrap(), b"");
    }
}
