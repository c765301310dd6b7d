//! One client's RFB session, from the version handshake to disconnect, over
//! any [`Transport`] (TCP or WebSocket).
//!
//! The session is a small state machine fed by whatever bytes have arrived:
//! each step parses a complete message from the input buffer or waits for
//! more. Around it, one loop per client thread reads input, answers
//! outstanding update requests when the client has something pending and
//! our output queue is empty (so at most one update is ever queued per
//! client, however slow it reads), and writes output as the socket takes
//! it.

use std::io;
use std::time::{Duration, Instant};

use tracing::info;

use super::auth;
use super::client::{Client, UpdateWork};
use super::encoding::zrle::ZrleEncoder;
use super::encoding::{copyrect, raw, PixelEncoding};
use super::pixel_format::{PixelConverter, PixelFormat};
use super::poller::Poller;
use super::protocol::{self, encoding, security, ClientMessage, Version};
use super::region::disjoint;
use super::server::Shared;
use super::stats::RectKind;
use super::transport::{ReadStatus, Transport};
use super::view::{read_rect, ClientView};
use crate::geometry::Rect;

/// After refusing a client, how long to try to deliver the reason.
const LINGER: Duration = Duration::from_secs(2);

/// Input bytes taken per read before the loop handles them, so one busy
/// client cannot make us buffer without limit.
const READ_BUDGET: usize = 64 * 1024;

/// Longest ClientCutText accepted. The text is discarded as it arrives,
/// but a client claiming gigabytes is broken or hostile.
const MAX_CUT_TEXT: u32 = 1 << 20;

/// Why a session ended.
#[derive(Debug)]
pub enum End {
    /// The client left, the connection failed, or the server shut down.
    Closed(String),
    /// The client broke the protocol or failed authentication.
    Refused(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Version,
    SecurityType,
    AuthResponse,
    ClientInit,
    Normal,
}

/// The update requests received and not yet answered, merged.
struct Request {
    area: Rect,
    /// A non-incremental request is among them: answer even if empty.
    must_answer: bool,
}

pub(super) struct Session<'a, T: Transport> {
    transport: T,
    poller: Poller,
    server: &'a Shared,
    client: &'a Client,
    /// Received bytes not yet parsed.
    input: Vec<u8>,
    /// Bytes of ClientCutText text still to skip.
    discard: usize,
    /// Bytes have been queued and not all written.
    output_queued: bool,
    phase: Phase,
    version: Version,
    challenge: [u8; auth::CHALLENGE_LEN],
    converter: PixelConverter,
    encoding: PixelEncoding,
    /// Created on first use; lives as long as the connection, as ZRLE's
    /// zlib stream must.
    zrle: Option<ZrleEncoder>,
    request: Option<Request>,
    view: ClientView,
}

/// Runs a session to its end and closes the transport. The RFB handshake
/// must be over by `deadline` (the front door's timeout from accept): a
/// connection that never finishes it would hold a thread and a slot.
pub fn run<T: Transport>(transport: T, server: &Shared, client: &Client, deadline: Instant) -> End {
    let mut session = match Session::new(transport, server, client) {
        Ok(s) => s,
        Err(end) => return end,
    };
    let end = session.serve(deadline);
    if matches!(end, End::Refused(_)) {
        session.linger();
    }
    session.transport.close();
    end
}

impl<'a, T: Transport> Session<'a, T> {
    /// A session at its start, before the server's ProtocolVersion.
    fn new(transport: T, server: &'a Shared, client: &'a Client) -> Result<Session<'a, T>, End> {
        let poller = Poller::new(transport.fd(), Some(&client.wake), &server.shutdown)
            .map_err(|e| End::Closed(format!("poll setup failed: {e}")))?;
        let screen = &server.screen;
        Ok(Session {
            transport,
            poller,
            server,
            client,
            input: Vec::new(),
            discard: 0,
            output_queued: false,
            phase: Phase::Version,
            version: Version::V3_8,
            challenge: [0; auth::CHALLENGE_LEN],
            converter: PixelConverter::new(&PixelFormat::SERVER),
            encoding: PixelEncoding::Raw,
            zrle: None,
            request: None,
            view: ClientView::new(screen.width(), screen.height()),
        })
    }
}

/// Driving a session without its socket loop, for `super::fuzzing`: the
/// same steps `serve` takes, on bytes handed in rather than read.
impl<'a, T: Transport> Session<'a, T> {
    /// A session that has sent its ProtocolVersion.
    pub(super) fn start(
        transport: T,
        server: &'a Shared,
        client: &'a Client,
    ) -> Result<Session<'a, T>, End> {
        let mut session = Session::new(transport, server, client)?;
        session.reply(protocol::SERVER_VERSION.to_vec())?;
        Ok(session)
    }

    /// Takes `bytes` as if just read, then handles input, updates and
    /// output as one turn of `serve`'s loop does.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Result<(), End> {
        self.input.extend_from_slice(bytes);
        self.process_input()?;
        let write_failed = |e: io::Error| End::Closed(format!("write failed: {e}"));
        self.flush().map_err(write_failed)?;
        self.maybe_update()?;
        self.flush().map_err(write_failed)
    }

    /// The challenge, while the session waits for its response.
    pub(super) fn challenge_pending(&self) -> Option<[u8; auth::CHALLENGE_LEN]> {
        (self.phase == Phase::AuthResponse).then_some(self.challenge)
    }

    /// Whether the client got past security (authenticated, if a password
    /// is set).
    pub(super) fn past_security(&self) -> bool {
        matches!(self.phase, Phase::ClientInit | Phase::Normal)
    }
}

impl<T: Transport> Session<'_, T> {
    fn screen_rect(&self) -> Rect {
        Rect::new(
            0,
            0,
            self.server.screen.width(),
            self.server.screen.height(),
        )
    }

    fn serve(&mut self, deadline: Instant) -> End {
        if let Err(e) = self.send(protocol::SERVER_VERSION.to_vec()) {
            return End::Closed(format!("write failed: {e}"));
        }
        let mut more_input = false;
        loop {
            if let Err(end) = self.process_input() {
                return end;
            }
            // Flush before and after: an update is only built once the
            // previous one is fully written.
            if let Err(e) = self.flush() {
                return End::Closed(format!("write failed: {e}"));
            }
            if let Err(end) = self.maybe_update() {
                return end;
            }
            if let Err(e) = self.flush() {
                return End::Closed(format!("write failed: {e}"));
            }

            let timeout = if more_input {
                Some(Duration::ZERO)
            } else if self.phase != Phase::Normal {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return End::Refused("handshake timed out".to_string());
                }
                Some(left)
            } else {
                None
            };
            let ready = match self.poller.wait(timeout) {
                Ok(r) => r,
                Err(e) => return End::Closed(format!("poll failed: {e}")),
            };
            if ready.shutdown {
                return End::Closed("server shutting down".to_string());
            }
            if ready.woken {
                // Only clears the wake-up; the news is in the shared state.
                let _ = self.client.wake.read();
            }
            if ready.readable || more_input {
                match self.transport.read_available(&mut self.input, READ_BUDGET) {
                    Ok(ReadStatus::Drained) => more_input = false,
                    Ok(ReadStatus::More) => more_input = true,
                    Ok(ReadStatus::Closed) => {
                        // Act on what the client said before leaving (a
                        // protocol error is still an error).
                        return match self.process_input() {
                            Err(end) => end,
                            Ok(()) => End::Closed("client closed the connection".to_string()),
                        };
                    }
                    Err(e) => return End::Closed(format!("read failed: {e}")),
                }
            }
        }
    }

    /// Queues bytes for the client.
    fn send(&mut self, data: Vec<u8>) -> io::Result<()> {
        self.server.stats.bytes_sent(data.len());
        let started = Instant::now();
        let result = self.transport.queue(data);
        self.server.stats.send_time(started.elapsed());
        self.output_queued = true;
        result
    }

    /// Writes what the socket takes now; asks to be woken when it can take
    /// more.
    fn flush(&mut self) -> io::Result<()> {
        if !self.output_queued {
            return Ok(());
        }
        let started = Instant::now();
        let done = self.transport.flush()?;
        self.server.stats.send_time(started.elapsed());
        self.output_queued = !done;
        self.poller.want_writable(!done)
    }

    /// Tries for a while to deliver queued output (a refusal's reason)
    /// before the connection is closed. Input is drained and dropped
    /// meanwhile, or pending input would keep the poll busy.
    fn linger(&mut self) {
        let deadline = Instant::now() + LINGER;
        let mut scratch = Vec::new();
        while self.output_queued {
            if self.flush().is_err() || !self.output_queued {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(ready) = self.poller.wait(Some(left)) else {
                return;
            };
            if ready.shutdown || left.is_zero() {
                return;
            }
            if ready.woken {
                let _ = self.client.wake.read();
            }
            if ready.readable {
                scratch.clear();
                match self.transport.read_available(&mut scratch, READ_BUDGET) {
                    Ok(ReadStatus::Closed) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        }
    }

    /// Handles every complete message in the input buffer.
    fn process_input(&mut self) -> Result<(), End> {
        let input = std::mem::take(&mut self.input);
        let mut pos = 0;
        let result = loop {
            if self.discard > 0 {
                let n = self.discard.min(input.len() - pos);
                pos += n;
                self.discard -= n;
                if self.discard > 0 {
                    break Ok(());
                }
            }
            let rest = &input[pos..];
            let used = match self.phase {
                Phase::Version => self.on_version(rest),
                Phase::SecurityType => self.on_security_type(rest),
                Phase::AuthResponse => self.on_auth_response(rest),
                Phase::ClientInit => self.on_client_init(rest),
                Phase::Normal => self.on_message(rest),
            };
            match used {
                Ok(0) => break Ok(()),
                Ok(n) => pos += n,
                Err(end) => break Err(end),
            }
        };
        self.input = input;
        self.input.drain(..pos);
        result
    }

    /// Queues handshake bytes; a failure here is a broken connection.
    fn reply(&mut self, data: Vec<u8>) -> Result<(), End> {
        self.send(data)
            .map_err(|e| End::Closed(format!("write failed: {e}")))
    }

    fn start_vnc_auth(&mut self) -> Result<Vec<u8>, End> {
        self.challenge =
            auth::new_challenge().map_err(|e| End::Closed(format!("no random challenge: {e}")))?;
        self.phase = Phase::AuthResponse;
        Ok(self.challenge.to_vec())
    }

    /// ProtocolVersion (RFC 6143 7.1.1), then the security offer.
    fn on_version(&mut self, buf: &[u8]) -> Result<usize, End> {
        let Some(bytes) = buf.first_chunk::<{ protocol::VERSION_LEN }>() else {
            return Ok(0);
        };
        let Some(version) = protocol::parse_version(bytes) else {
            return Err(End::Refused(format!(
                "not an RFB 3.x client: {:?}",
                String::from_utf8_lossy(bytes)
            )));
        };
        self.version = version;
        let with_password = self.server.password.is_some();
        let mut out = Vec::new();
        if version == Version::V3_3 {
            // 3.3: the server chooses and says which, as a u32.
            if with_password {
                out.extend_from_slice(&u32::from(security::VNC_AUTH).to_be_bytes());
                out.extend(self.start_vnc_auth()?);
            } else {
                out.extend_from_slice(&u32::from(security::NONE).to_be_bytes());
                self.phase = Phase::ClientInit;
            }
        } else {
            // 3.7 and 3.8: offer one type. A password must not be
            // bypassable, so None is offered only without one.
            let offered = if with_password {
                security::VNC_AUTH
            } else {
                security::NONE
            };
            out.extend_from_slice(&[1, offered]);
            self.phase = Phase::SecurityType;
        }
        self.reply(out)?;
        Ok(protocol::VERSION_LEN)
    }

    /// The client's pick among the offered security types (3.7, 3.8).
    fn on_security_type(&mut self, buf: &[u8]) -> Result<usize, End> {
        let Some(&chosen) = buf.first() else {
            return Ok(0);
        };
        let offered = if self.server.password.is_some() {
            security::VNC_AUTH
        } else {
            security::NONE
        };
        if chosen != offered {
            let reason = format!("security type {chosen} was not offered");
            if self.version == Version::V3_8 {
                let mut out = protocol::SECURITY_FAILED.to_be_bytes().to_vec();
                protocol::put_string(&mut out, &reason);
                self.reply(out)?;
            }
            return Err(End::Refused(reason));
        }
        if chosen == security::VNC_AUTH {
            let challenge = self.start_vnc_auth()?;
            self.reply(challenge)?;
        } else {
            // 3.7 goes straight on after None; 3.8 confirms it.
            if self.version == Version::V3_8 {
                self.reply(protocol::SECURITY_OK.to_be_bytes().to_vec())?;
            }
            self.phase = Phase::ClientInit;
        }
        Ok(1)
    }

    /// The 16-byte DES response to our challenge.
    fn on_auth_response(&mut self, buf: &[u8]) -> Result<usize, End> {
        let Some(answer) = buf.first_chunk::<{ auth::CHALLENGE_LEN }>() else {
            return Ok(0);
        };
        let password = self.server.password.as_deref().unwrap_or_default();
        if auth::verify(password, &self.challenge, answer) {
            self.reply(protocol::SECURITY_OK.to_be_bytes().to_vec())?;
            self.phase = Phase::ClientInit;
            return Ok(auth::CHALLENGE_LEN);
        }
        let reason = "authentication failed";
        let mut out = protocol::SECURITY_FAILED.to_be_bytes().to_vec();
        // Only 3.8 carries a reason (RFC 6143 7.1.3).
        if self.version == Version::V3_8 {
            protocol::put_string(&mut out, reason);
        }
        self.reply(out)?;
        Err(End::Refused(reason.to_string()))
    }

    /// ClientInit's shared flag, answered with ServerInit.
    fn on_client_init(&mut self, buf: &[u8]) -> Result<usize, End> {
        if buf.is_empty() {
            return Ok(0);
        }
        // The flag is ignored: every connection is shared, a new client
        // never disconnects the others.
        let screen = &self.server.screen;
        let mut out = Vec::new();
        protocol::put_server_init(
            &mut out,
            screen.width(),
            screen.height(),
            &PixelFormat::SERVER,
            &self.server.name,
        );
        self.reply(out)?;
        self.phase = Phase::Normal;
        self.client.set_active();
        self.server.end_pending(&self.client.peer);
        self.server.stats.accepted();
        info!(peer = %self.client.peer, version = %self.version, "VNC client ready");
        Ok(1)
    }

    /// A normal client-to-server message (RFC 6143 7.5).
    fn on_message(&mut self, buf: &[u8]) -> Result<usize, End> {
        let Some((message, used)) = protocol::parse_client_message(buf).map_err(End::Refused)?
        else {
            return Ok(0);
        };
        match message {
            ClientMessage::SetPixelFormat(format) => {
                format
                    .check_supported()
                    .map_err(|e| End::Refused(format!("SetPixelFormat: {e}")))?;
                self.converter = PixelConverter::new(&format);
            }
            ClientMessage::SetEncodings(list) => {
                self.encoding = PixelEncoding::preferred(&list);
                self.client
                    .set_copyrect(list.contains(&encoding::COPY_RECT));
            }
            ClientMessage::FramebufferUpdateRequest { incremental, area } => {
                let area = area.intersect(&self.screen_rect());
                if !incremental {
                    self.client.damage(&[area]);
                }
                let request = self.request.get_or_insert(Request {
                    area: Rect::default(),
                    must_answer: false,
                });
                request.area = request.area.union(&area);
                request.must_answer |= !incremental;
            }
            ClientMessage::KeyEvent { down, keysym } => self.server.input.key(keysym, down),
            ClientMessage::PointerEvent { buttons, x, y } => {
                let screen = &self.server.screen;
                let x = x.min(screen.width().saturating_sub(1));
                let y = y.min(screen.height().saturating_sub(1));
                self.server.input.pointer(x, y, buttons);
            }
            ClientMessage::ClientCutText { len } => {
                if len > MAX_CUT_TEXT {
                    return Err(End::Refused(format!("ClientCutText of {len} bytes")));
                }
                // The guest has no clipboard channel: skip the text.
                self.discard = len as usize;
            }
        }
        Ok(used)
    }

    /// Sends an update if a request is waiting, there is something to
    /// send (or the request insists), and nothing is still queued.
    fn maybe_update(&mut self) -> Result<(), End> {
        if self.phase != Phase::Normal || self.output_queued {
            return Ok(());
        }
        let Some(request) = &self.request else {
            return Ok(());
        };
        let Some(work) = self.client.take_update(&request.area, request.must_answer) else {
            return Ok(());
        };
        self.request = None;
        let started = Instant::now();
        let message = self
            .build_update(work)
            .map_err(|e| End::Closed(format!("encoding failed: {e}")))?;
        self.server.stats.encode_time(started.elapsed());
        self.server.stats.update_sent();
        self.send(message)
            .map_err(|e| End::Closed(format!("write failed: {e}")))
    }

    /// Encodes a FramebufferUpdate: the CopyRects first (the client must
    /// move pixels before the rectangles drawn over them), then the
    /// rectangles read from the Screen.
    fn build_update(&mut self, work: UpdateWork) -> io::Result<Vec<u8>> {
        let screen = &self.server.screen;
        let stride = usize::from(screen.width());
        let mut rects = work.rects;
        let pixels: Vec<Vec<u32>> = {
            let fb = screen.read();
            for op in &work.copies {
                self.view.apply_copy(op);
            }
            let wrong: Vec<Rect> = work
                .copies
                .iter()
                .filter_map(|op| self.view.mismatch(&fb, &op.dst))
                .collect();
            if !wrong.is_empty() {
                rects.extend(wrong);
                rects = disjoint(&rects);
            }
            rects
                .iter()
                .map(|r| {
                    let px = read_rect(&fb, stride, r);
                    self.view.store(r, &px);
                    px
                })
                .collect()
        };

        let count = u16::try_from(work.copies.len() + rects.len())
            .map_err(|_| io::Error::other("too many rectangles for one update"))?;
        let bytes_per_pixel = self.converter.bytes_per_pixel();
        let estimate: usize = rects
            .iter()
            .map(|r| r.area() as usize * bytes_per_pixel + 16)
            .sum();
        let mut out = Vec::with_capacity(4 + estimate.min(64 << 20));
        protocol::put_update_header(&mut out, count);
        for op in &work.copies {
            protocol::put_rect_header(&mut out, &op.dst, encoding::COPY_RECT);
            copyrect::encode(op.src.x, op.src.y, &mut out);
            self.server.stats.rect_sent(RectKind::CopyRect);
        }
        for (r, px) in rects.iter().zip(&pixels) {
            protocol::put_rect_header(&mut out, r, self.encoding.number());
            match self.encoding {
                PixelEncoding::Raw => {
                    raw::encode(px, &self.converter, &mut out);
                    self.server.stats.rect_sent(RectKind::Raw);
                }
                PixelEncoding::Zrle => {
                    let zrle = self.zrle.get_or_insert_with(ZrleEncoder::new);
                    zrle.encode(
                        px,
                        usize::from(r.w),
                        usize::from(r.h),
                        &self.converter,
                        &mut out,
                    )?;
                    self.server.stats.rect_sent(RectKind::Zrle);
                }
            }
        }
        Ok(out)
    }
}
