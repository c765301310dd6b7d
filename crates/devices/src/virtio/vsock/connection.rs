//! One vsock stream: a guest port joined to a host Unix stream, with the
//! credit accounting of virtio 1.2 §5.10.6.3.
//!
//! Two directions, two budgets:
//! - guest → host: we advertise `buf_alloc` ([`BUF_ALLOC`]) and count in
//!   `fwd_cnt` the bytes we have passed on to the host socket. What the
//!   host socket does not take yet waits in `to_host`, which a driver that
//!   respects our credit can never grow past `buf_alloc` (one that does not
//!   is reset).
//! - host → guest: the guest advertises `peer_buf_alloc`/`peer_fwd_cnt` in
//!   every packet; we never have more than `peer_buf_alloc` bytes in flight
//!   (`rx_cnt - peer_fwd_cnt`), and read the host socket only when there is
//!   both credit and an rx buffer, so host data waits in the host socket.

use std::collections::VecDeque;
use std::io;
use std::num::Wrapping;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use super::packet::{VsockHeader, SHUTDOWN_RCV};

/// Receive buffer we advertise per connection (guest → host bytes that may
/// be in flight), as Linux does by default.
pub const BUF_ALLOC: u32 = 256 * 1024;

/// Send a CREDIT_UPDATE once this many bytes were forwarded since the
/// guest last heard our `fwd_cnt`.
pub const CREDIT_UPDATE_THRESHOLD: u32 = BUF_ALLOC / 4;

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Host-initiated: REQUEST sent to the guest, waiting for RESPONSE.
    LocalInit,
    /// Connected both ways.
    Established,
    /// The host closed its socket: SHUTDOWN sent, waiting for the guest's
    /// RST (or the timeout).
    HostClosed,
    /// The guest shut down both ways: flushing what the host has not taken
    /// yet, then RST.
    GuestClosed,
}

/// A connection's state; the muxer owns and drives it.
#[derive(Debug)]
pub struct Connection {
    pub stream: UnixStream,
    /// The epoll token of `stream`.
    pub token: u64,
    /// The host-side port (the guest's peer port).
    pub local_port: u32,
    /// The guest-side port.
    pub peer_port: u32,
    pub state: ConnState,
    /// Guest bytes passed on to the host socket (our side of the credit).
    pub fwd_cnt: Wrapping<u32>,
    /// The `fwd_cnt` the guest last heard from us.
    pub last_fwd_cnt_sent: Wrapping<u32>,
    /// The guest's receive buffer and how much of it it has consumed.
    pub peer_buf_alloc: u32,
    pub peer_fwd_cnt: Wrapping<u32>,
    /// Payload bytes sent to the guest.
    pub rx_cnt: Wrapping<u32>,
    /// Guest data the host socket has not taken yet.
    pub to_host: VecDeque<u8>,
    /// The host socket may have data (edge-triggered readiness).
    pub readable: bool,
    /// The host will send nothing more (read returned 0).
    pub host_eof: bool,
    /// We shut down the host socket's write side (guest sent SHUTDOWN SEND).
    pub host_write_shut: bool,
    /// SHUTDOWN flags the guest sent.
    pub guest_shutdown: u32,
    /// In the muxer's list of connections with data for the guest.
    pub queued: bool,
    pub credit_update_queued: bool,
    /// We asked the guest for credit and have not heard back.
    pub credit_requested: bool,
    /// When the connection is killed if it is still in this state.
    pub deadline: Option<Instant>,
}

impl Connection {
    pub fn new(
        stream: UnixStream,
        token: u64,
        local_port: u32,
        peer_port: u32,
        state: ConnState,
    ) -> Connection {
        Connection {
            stream,
            token,
            local_port,
            peer_port,
            state,
            fwd_cnt: Wrapping(0),
            last_fwd_cnt_sent: Wrapping(0),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            rx_cnt: Wrapping(0),
            to_host: VecDeque::new(),
            readable: false,
            host_eof: false,
            host_write_shut: false,
            guest_shutdown: 0,
            queued: false,
            credit_update_queued: false,
            credit_requested: false,
            deadline: None,
        }
    }

    /// Bytes the guest can take now.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Records the credit information every guest packet carries.
    pub fn update_peer_credit(&mut self, hdr: &VsockHeader) {
        self.peer_buf_alloc = hdr.buf_alloc;
        self.peer_fwd_cnt = Wrapping(hdr.fwd_cnt);
        self.credit_requested = false;
    }

    /// Whether host data may be read and sent to the guest now.
    pub fn can_send_data(&self) -> bool {
        self.state == ConnState::Established
            && self.readable
            && !self.host_eof
            && self.guest_shutdown & SHUTDOWN_RCV == 0
            && self.peer_credit() > 0
    }

    /// Puts our credit information in a header going to the guest.
    pub fn fill_credit(&mut self, hdr: &mut VsockHeader) {
        hdr.buf_alloc = BUF_ALLOC;
        hdr.fwd_cnt = self.fwd_cnt.0;
        self.last_fwd_cnt_sent = self.fwd_cnt;
    }

    /// Whether the guest should hear about freed buffer space.
    pub fn wants_credit_update(&self) -> bool {
        (self.fwd_cnt - self.last_fwd_cnt_sent).0 >= CREDIT_UPDATE_THRESHOLD
    }

    /// Passes guest data to the host socket, keeping what it does not take.
    /// An error means the host side is gone.
    pub fn send_to_host(&mut self, data: &[u8]) -> io::Result<()> {
        let mut data = data;
        if self.to_host.is_empty() {
            let n = send_nosignal(&self.stream, data)?;
            self.fwd_cnt += Wrapping(n as u32);
            data = &data[n..];
        }
        self.to_host.extend(data);
        Ok(())
    }

    /// Writes buffered guest data to the host socket until it would block.
    pub fn flush_to_host(&mut self) -> io::Result<()> {
        while !self.to_host.is_empty() {
            let (front, _) = self.to_host.as_slices();
            let n = send_nosignal(&self.stream, front)?;
            if n == 0 {
                break;
            }
            self.to_host.drain(..n);
            self.fwd_cnt += Wrapping(n as u32);
        }
        Ok(())
    }
}

/// `send(2)` without SIGPIPE; `Ok(0)` when the socket buffer is full.
pub fn send_nosignal(stream: &UnixStream, data: &[u8]) -> io::Result<usize> {
    loop {
        if data.is_empty() {
            return Ok(0);
        }
        // SAFETY: `data` is valid for reads of its length for the call; the
        // fd belongs to `stream`, which outlives the call.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(e),
        }
    }
}

/// Whether the peer of `stream` has closed it completely (POLLHUP), as
/// opposed to only shutting down its write side.
pub fn peer_closed(stream: &UnixStream) -> bool {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call; a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0
}
