//! The vsock muxer: joins guest vsock streams to host Unix sockets, the
//! Firecracker "hybrid" way.
//!
//! **Host → guest.** A host program connects to the listening socket at
//! `uds` and writes `CONNECT <port>\n`. The muxer picks a host-side port
//! (from 2^30 up), sends the guest a REQUEST for `<port>`, and when the
//! guest answers RESPONSE writes `OK <host port>\n` to the program; from
//! then on the Unix stream *is* the vsock stream. If the guest answers RST
//! or not at all within [`CONNECT_TIMEOUT`], the program's socket is closed.
//!
//! **Guest → host.** A guest connecting to CID 2 port `P` is joined to the
//! Unix socket `<uds>_P` (connected without blocking); if nothing listens
//! there the guest gets RST.
//!
//! **Closing.** A host program that shuts down its write side makes the
//! guest see end-of-stream (SHUTDOWN SEND); one that closes makes the guest
//! see SHUTDOWN of both ways, to which the guest answers RST. A guest
//! SHUTDOWN SEND shuts the host socket's write side once buffered data is
//! out; SHUTDOWN of both ways is answered with RST after that flush.
//!
//! **Interface to the device.** The worker feeds guest packets to
//! [`VsockMuxer::send_to_host`], forwards epoll events of the muxer's fds
//! to [`VsockMuxer::handle_event`], and fills each rx buffer with
//! [`VsockMuxer::next_rx`] while [`VsockMuxer::has_rx`]. Control packets
//! (REQUEST, RESPONSE, RST, SHUTDOWN, credit) go first; then connections
//! with host data and guest credit take turns. Host data is read only into
//! a guest buffer at hand, so host programs see back-pressure through their
//! own socket.
//!
//! A guest agent is just a vsock listener in the guest: the
//! VMM reaches it like any host program, through `uds` and `CONNECT`
//! (the I/O tracer's hk-ioagent: crates/vmm/src/iotrace/agent.rs).

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::connection::{peer_closed, send_nosignal, ConnState, Connection};
use super::packet::*;
use super::VsockMetrics;

/// How long the guest has to answer a host-initiated REQUEST, and to
/// finish closing (Firecracker uses the same 2 s).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections (including host sockets still sending `CONNECT`) at once.
pub const MAX_CONNECTIONS: usize = 1024;
/// Control packets waiting for rx buffers before the device stops taking
/// guest packets (which may each ask for one).
pub const MAX_PENDING_CONTROL: usize = 2048;
/// First host-side port for host-initiated connections.
const FIRST_LOCAL_PORT: u32 = 1 << 30;
/// Longest `CONNECT <port>` line.
const MAX_HANDSHAKE_LINE: usize = 32;

/// Epoll token of the listening socket; streams get tokens from
/// [`FIRST_STREAM_TOKEN`] up. Tokens below are the worker's.
pub const LISTENER_TOKEN: u64 = 8;
pub const FIRST_STREAM_TOKEN: u64 = 16;

/// (host-side port, guest-side port).
type ConnKey = (u32, u32);

/// A header-only packet waiting for an rx buffer.
#[derive(Clone, Copy, Debug)]
struct Control {
    key: ConnKey,
    op: u16,
    flags: u32,
}

/// A host program that connected and has not finished its `CONNECT` line.
#[derive(Debug)]
struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
}

/// See the module documentation.
pub struct VsockMuxer {
    guest_cid: u64,
    uds_path: PathBuf,
    listener: UnixListener,
    epoll: Epoll,
    conns: HashMap<ConnKey, Connection>,
    handshakes: HashMap<u64, Handshake>,
    /// Stream token → connection.
    tokens: HashMap<u64, ConnKey>,
    next_token: u64,
    next_local_port: u32,
    control: VecDeque<Control>,
    /// Connections that may have host data for the guest, in turn order.
    ready: VecDeque<ConnKey>,
    scratch: Vec<u8>,
    metrics: Arc<VsockMetrics>,
}

const STREAM_EVENTS: EventSet = EventSet::IN
    .union(EventSet::OUT)
    .union(EventSet::READ_HANG_UP)
    .union(EventSet::EDGE_TRIGGERED);

impl VsockMuxer {
    /// A muxer for guest `guest_cid`, taking host connections on
    /// `listener` (bound at `uds_path`), registering its fds in `epoll`.
    pub fn new(
        guest_cid: u64,
        uds_path: PathBuf,
        listener: UnixListener,
        epoll: Epoll,
        metrics: Arc<VsockMetrics>,
    ) -> io::Result<VsockMuxer> {
        listener.set_nonblocking(true)?;
        epoll.ctl(
            ControlOperation::Add,
            listener.as_raw_fd(),
            EpollEvent::new(EventSet::IN | EventSet::EDGE_TRIGGERED, LISTENER_TOKEN),
        )?;
        Ok(VsockMuxer {
            guest_cid,
            uds_path,
            listener,
            epoll,
            conns: HashMap::new(),
            handshakes: HashMap::new(),
            tokens: HashMap::new(),
            next_token: FIRST_STREAM_TOKEN,
            next_local_port: FIRST_LOCAL_PORT,
            control: VecDeque::new(),
            ready: VecDeque::new(),
            scratch: vec![0; MAX_PKT_PAYLOAD],
            metrics,
        })
    }

    /// The epoll set the muxer's fds are in (the worker waits on it).
    pub fn epoll(&self) -> &Epoll {
        &self.epoll
    }

    /// Connections open now.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Whether there are packets for the guest.
    pub fn has_rx(&self) -> bool {
        !self.control.is_empty() || !self.ready.is_empty()
    }

    /// Whether so many control packets wait that the device should stop
    /// taking guest packets until the guest gives rx buffers.
    pub fn rx_backlog_full(&self) -> bool {
        self.control.len() >= MAX_PENDING_CONTROL
    }

    /// The earliest connection deadline, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    /// Kills connections whose deadline passed.
    pub fn expire(&mut self, now: Instant) {
        let expired: Vec<ConnKey> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(k, _)| *k)
            .collect();
        for key in expired {
            tracing::debug!("vsock: connection {key:?} timed out");
            self.kill(key, true);
        }
    }

    // ---- Host side ----

    /// One of the muxer's fds (token ≥ [`LISTENER_TOKEN`]) is ready.
    pub fn handle_event(&mut self, token: u64, events: EventSet) {
        if token == LISTENER_TOKEN {
            self.accept_all();
        } else if self.handshakes.contains_key(&token) {
            self.read_handshake(token);
        } else if let Some(key) = self.tokens.get(&token).copied() {
            self.stream_event(key, events);
        }
    }

    fn register(&self, fd: i32, token: u64, events: EventSet, op: ControlOperation) -> bool {
        match self.epoll.ctl(op, fd, EpollEvent::new(events, token)) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("vsock: epoll_ctl: {e}");
                false
            }
        }
    }

    fn open_count(&self) -> usize {
        self.conns.len() + self.handshakes.len()
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.open_count() >= MAX_CONNECTIONS {
                        tracing::warn!("vsock: {MAX_CONNECTIONS} connections open, refusing one");
                        continue;
                    }
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let token = self.next_token;
                    self.next_token += 1;
                    let events = EventSet::IN | EventSet::READ_HANG_UP | EventSet::EDGE_TRIGGERED;
                    if !self.register(stream.as_raw_fd(), token, events, ControlOperation::Add) {
                        continue;
                    }
                    self.handshakes.insert(
                        token,
                        Handshake {
                            stream,
                            line: Vec::new(),
                        },
                    );
                    self.read_handshake(token);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!("vsock: accept: {e}");
                    break;
                }
            }
        }
    }

    fn drop_handshake(&mut self, token: u64) {
        if let Some(h) = self.handshakes.remove(&token) {
            let _ = self.epoll.ctl(
                ControlOperation::Delete,
                h.stream.as_raw_fd(),
                EpollEvent::default(),
            );
        }
    }

    /// Reads the `CONNECT <port>\n` line a byte at a time, so that nothing
    /// after it is taken from the stream.
    fn read_handshake(&mut self, token: u64) {
        let Some(h) = self.handshakes.get_mut(&token) else {
            return;
        };
        let line = loop {
            let mut b = [0u8; 1];
            match (&h.stream).read(&mut b) {
                Ok(0) => return self.drop_handshake(token),
                Ok(_) if b[0] == b'\n' => break std::mem::take(&mut h.line),
                Ok(_) if h.line.len() >= MAX_HANDSHAKE_LINE => {
                    tracing::debug!("vsock: handshake line too long");
                    return self.drop_handshake(token);
                }
                Ok(_) => h.line.push(b[0]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => return self.drop_handshake(token),
            }
        };
        let port = std::str::from_utf8(&line)
            .ok()
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .and_then(|l| l.strip_prefix("CONNECT "))
            .and_then(|p| p.trim().parse::<u32>().ok());
        let Some(port) = port else {
            tracing::debug!("vsock: bad handshake {:?}", String::from_utf8_lossy(&line));
            return self.drop_handshake(token);
        };
        let Some(h) = self.handshakes.remove(&token) else {
            return;
        };
        let local_port = self.alloc_local_port();
        let key = (local_port, port);
        if !self.register(
            h.stream.as_raw_fd(),
            token,
            STREAM_EVENTS,
            ControlOperation::Modify,
        ) {
            return;
        }
        let mut conn = Connection::new(h.stream, token, local_port, port, ConnState::LocalInit);
        conn.deadline = Some(Instant::now() + CONNECT_TIMEOUT);
        // Data may follow the line already; we have consumed its edge.
        conn.readable = true;
        self.insert(key, conn);
        self.push_control(key, OP_REQUEST, 0);
    }

    fn alloc_local_port(&mut self) -> u32 {
        loop {
            let port = self.next_local_port;
            self.next_local_port = match port.checked_add(1) {
                Some(p) => p,
                None => FIRST_LOCAL_PORT,
            };
            if !self.conns.keys().any(|(local, _)| *local == port) {
                return port;
            }
        }
    }

    fn insert(&mut self, key: ConnKey, conn: Connection) {
        self.tokens.insert(conn.token, key);
        self.conns.insert(key, conn);
        self.metrics
            .connections_opened
            .fetch_add(1, Ordering::Relaxed);
        self.metrics
            .connections
            .store(self.conns.len() as u64, Ordering::Relaxed);
    }

    /// Removes a connection (closing the host stream), RST to the guest if
    /// asked.
    fn kill(&mut self, key: ConnKey, rst: bool) {
        if let Some(conn) = self.conns.remove(&key) {
            self.tokens.remove(&conn.token);
            let _ = self.epoll.ctl(
                ControlOperation::Delete,
                conn.stream.as_raw_fd(),
                EpollEvent::default(),
            );
            self.metrics
                .connections
                .store(self.conns.len() as u64, Ordering::Relaxed);
        }
        if rst {
            self.push_control(key, OP_RST, 0);
        }
    }

    fn stream_event(&mut self, key: ConnKey, events: EventSet) {
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        let gone = events.intersects(EventSet::HANG_UP | EventSet::ERROR);
        if events.intersects(EventSet::IN | EventSet::READ_HANG_UP) || gone {
            conn.readable = true;
        }
        if conn.state == ConnState::LocalInit {
            if gone {
                // The host program gave up before the guest answered.
                self.kill(key, true);
            }
            return;
        }
        if gone && conn.host_eof && conn.state == ConnState::Established {
            // Half-closed before, now closed: nothing can reach the host.
            return self.host_closed(key);
        }
        if events.contains(EventSet::OUT) || gone {
            if conn.flush_to_host().is_err() {
                return self.kill(key, true);
            }
            self.after_host_write(key);
        }
        self.mark_ready(key);
    }

    /// Queues `key` for host → guest data if it can send.
    fn mark_ready(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.get_mut(&key) {
            // Readable with no credit: still queued, so `next_rx` can ask
            // the guest for credit.
            let eligible = conn.state == ConnState::Established && conn.readable && !conn.host_eof;
            if eligible && !conn.queued {
                conn.queued = true;
                self.ready.push_back(key);
            }
        }
    }

    /// After guest data went to the host: finish shutdowns, tell the guest
    /// about freed buffer space.
    fn after_host_write(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        if conn.to_host.is_empty() {
            if conn.guest_shutdown & SHUTDOWN_SEND != 0 && !conn.host_write_shut {
                let _ = conn.stream.shutdown(std::net::Shutdown::Write);
                conn.host_write_shut = true;
            }
            if conn.state == ConnState::GuestClosed {
                return self.kill(key, true);
            }
        }
        if conn.state == ConnState::Established
            && conn.wants_credit_update()
            && !conn.credit_update_queued
        {
            conn.credit_update_queued = true;
            self.push_control(key, OP_CREDIT_UPDATE, 0);
        }
    }

    /// The host closed (or shut down the write side of) its stream.
    fn host_eof(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        conn.host_eof = true;
        conn.readable = false;
        if peer_closed(&conn.stream) {
            self.host_closed(key);
        } else {
            self.push_control(key, OP_SHUTDOWN, SHUTDOWN_SEND);
        }
    }

    /// The host closed its stream: nothing can reach it any more. Tell the
    /// guest both ways are shut and wait for its RST.
    fn host_closed(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        conn.state = ConnState::HostClosed;
        conn.to_host.clear();
        conn.deadline = Some(Instant::now() + CONNECT_TIMEOUT);
        self.push_control(key, OP_SHUTDOWN, SHUTDOWN_BOTH);
    }

    // ---- Guest side ----

    fn push_control(&mut self, key: ConnKey, op: u16, flags: u32) {
        if op == OP_RST {
            self.metrics.resets.fetch_add(1, Ordering::Relaxed);
        }
        self.control.push_back(Control { key, op, flags });
    }

    /// A packet from the guest (tx queue). `payload` is its `len` bytes,
    /// already checked against the chain.
    pub fn send_to_host(&mut self, hdr: &VsockHeader, payload: &[u8]) {
        self.metrics.tx_packets.fetch_add(1, Ordering::Relaxed);
        if hdr.src_cid != self.guest_cid || hdr.dst_cid != HOST_CID {
            tracing::debug!(
                "vsock: dropped {} from cid {} to cid {}",
                op_name(hdr.op),
                hdr.src_cid,
                hdr.dst_cid
            );
            self.metrics.tx_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let key = (hdr.dst_port, hdr.src_port);
        if hdr.type_ != TYPE_STREAM {
            self.metrics.tx_dropped.fetch_add(1, Ordering::Relaxed);
            let known = self.conns.contains_key(&key);
            if hdr.op != OP_RST {
                self.kill(key, true);
            } else if known {
                self.kill(key, false);
            }
            return;
        }
        let Some(conn) = self.conns.get_mut(&key) else {
            match hdr.op {
                OP_REQUEST => self.guest_connect(hdr),
                OP_RST => {}
                _ => self.push_control(key, OP_RST, 0),
            }
            return;
        };
        conn.update_peer_credit(hdr);
        match (conn.state, hdr.op) {
            (_, OP_RST) => self.kill(key, false),
            (ConnState::LocalInit, OP_RESPONSE) => {
                let ok = format!("OK {}\n", conn.local_port);
                match send_nosignal(&conn.stream, ok.as_bytes()) {
                    Ok(n) if n == ok.len() => {
                        conn.state = ConnState::Established;
                        conn.deadline = None;
                    }
                    _ => self.kill(key, true),
                }
            }
            (ConnState::Established | ConnState::GuestClosed, OP_RW) => {
                if conn.guest_shutdown & SHUTDOWN_SEND != 0 {
                    return self.kill(key, true);
                }
                if payload.len() + conn.to_host.len() > super::connection::BUF_ALLOC as usize {
                    tracing::debug!("vsock: guest overran our credit on {key:?}");
                    return self.kill(key, true);
                }
                self.metrics
                    .tx_bytes
                    .fetch_add(payload.len() as u64, Ordering::Relaxed);
                if conn.send_to_host(payload).is_err() {
                    return self.kill(key, true);
                }
                self.after_host_write(key);
            }
            (ConnState::Established, OP_CREDIT_UPDATE) => {}
            (ConnState::Established, OP_CREDIT_REQUEST) => {
                if !conn.credit_update_queued {
                    conn.credit_update_queued = true;
                    self.push_control(key, OP_CREDIT_UPDATE, 0);
                }
            }
            (ConnState::Established, OP_SHUTDOWN) => {
                conn.guest_shutdown |= hdr.flags & SHUTDOWN_BOTH;
                if conn.guest_shutdown == SHUTDOWN_BOTH {
                    conn.state = ConnState::GuestClosed;
                    conn.deadline = Some(Instant::now() + CONNECT_TIMEOUT);
                }
                self.after_host_write(key);
            }
            // Closing already: late credit and shutdown news change nothing.
            (
                ConnState::HostClosed | ConnState::GuestClosed,
                OP_CREDIT_UPDATE | OP_CREDIT_REQUEST | OP_SHUTDOWN,
            ) => {}
            // Data for a host that is gone: dropped.
            (ConnState::HostClosed, OP_RW) => {}
            (state, op) => {
                tracing::debug!("vsock: {} in state {state:?} on {key:?}", op_name(op));
                self.kill(key, true);
            }
        }
        // Every guest packet carries credit: the connection may send again.
        self.mark_ready(key);
    }

    /// Counts a guest packet dropped before it could be parsed.
    pub fn count_dropped(&self) {
        self.metrics.tx_packets.fetch_add(1, Ordering::Relaxed);
        self.metrics.tx_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// A malformed packet (bad length) from the guest: reset its connection.
    pub fn reset_from_guest(&mut self, hdr: &VsockHeader) {
        self.count_dropped();
        if hdr.src_cid == self.guest_cid && hdr.dst_cid == HOST_CID && hdr.op != OP_RST {
            self.kill((hdr.dst_port, hdr.src_port), true);
        }
    }

    /// The guest connects to host port `hdr.dst_port`: `<uds>_<port>`.
    fn guest_connect(&mut self, hdr: &VsockHeader) {
        let key = (hdr.dst_port, hdr.src_port);
        if self.open_count() >= MAX_CONNECTIONS {
            tracing::warn!("vsock: {MAX_CONNECTIONS} connections open, refusing one");
            return self.push_control(key, OP_RST, 0);
        }
        let mut path = OsString::from(self.uds_path.as_os_str());
        path.push(format!("_{}", hdr.dst_port));
        let stream = match connect_nonblocking(Path::new(&path)) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(
                    "vsock: guest connect to {}: {e}",
                    Path::new(&path).display()
                );
                return self.push_control(key, OP_RST, 0);
            }
        };
        let token = self.next_token;
        self.next_token += 1;
        if !self.register(
            stream.as_raw_fd(),
            token,
            STREAM_EVENTS,
            ControlOperation::Add,
        ) {
            return self.push_control(key, OP_RST, 0);
        }
        let mut conn = Connection::new(stream, token, key.0, key.1, ConnState::Established);
        conn.update_peer_credit(hdr);
        self.insert(key, conn);
        self.push_control(key, OP_RESPONSE, 0);
    }

    /// The next packet for the guest, its payload at most `max_payload`
    /// bytes; `None` if there is nothing to send now.
    pub fn next_rx(&mut self, max_payload: usize) -> Option<(VsockHeader, &[u8])> {
        loop {
            if let Some(c) = self.control.pop_front() {
                let mut hdr = self.header(c.key, c.op);
                hdr.flags = c.flags;
                if let Some(conn) = self.conns.get_mut(&c.key) {
                    conn.fill_credit(&mut hdr);
                    if c.op == OP_CREDIT_UPDATE {
                        conn.credit_update_queued = false;
                    }
                }
                self.metrics.rx_packets.fetch_add(1, Ordering::Relaxed);
                return Some((hdr, &[]));
            }
            let key = self.ready.pop_front()?;
            let Some(conn) = self.conns.get_mut(&key) else {
                continue;
            };
            conn.queued = false;
            if !conn.can_send_data() {
                if conn.state == ConnState::Established
                    && conn.readable
                    && !conn.host_eof
                    && conn.peer_credit() == 0
                    && !conn.credit_requested
                {
                    conn.credit_requested = true;
                    self.push_control(key, OP_CREDIT_REQUEST, 0);
                }
                continue;
            }
            if max_payload == 0 {
                // A header-only buffer cannot carry data; keep our turn.
                conn.queued = true;
                self.ready.push_front(key);
                return None;
            }
            let n = max_payload
                .min(conn.peer_credit() as usize)
                .min(self.scratch.len());
            match (&conn.stream).read(&mut self.scratch[..n]) {
                Ok(0) => self.host_eof(key),
                Ok(k) => {
                    conn.rx_cnt += std::num::Wrapping(k as u32);
                    let mut hdr = VsockHeader {
                        src_cid: HOST_CID,
                        dst_cid: self.guest_cid,
                        src_port: key.0,
                        dst_port: key.1,
                        len: k as u32,
                        type_: TYPE_STREAM,
                        op: OP_RW,
                        ..Default::default()
                    };
                    conn.fill_credit(&mut hdr);
                    self.mark_ready(key);
                    self.metrics.rx_packets.fetch_add(1, Ordering::Relaxed);
                    self.metrics.rx_bytes.fetch_add(k as u64, Ordering::Relaxed);
                    return Some((hdr, &self.scratch[..k]));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => conn.readable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => self.mark_ready(key),
                Err(_) => self.kill(key, true),
            }
        }
    }

    fn header(&self, key: ConnKey, op: u16) -> VsockHeader {
        VsockHeader {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: key.0,
            dst_port: key.1,
            len: 0,
            type_: TYPE_STREAM,
            op,
            ..Default::default()
        }
    }
}

/// Connects to the Unix stream socket at `path` without blocking (a full
/// backlog is an error, not a wait).
pub fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
    // SAFETY: sockaddr_un is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path too long",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new socket nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `addr` is a sockaddr_un of the size given, alive for the call.
    let ret = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}
