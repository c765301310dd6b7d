//! The server's threads and shared state: one acceptor thread per
//! listening socket, one thread per client, and the fan-out of screen
//! changes to every client.

use std::collections::HashMap;
use std::io::{self, ErrorKind};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tracing::{info, warn};
use vmm_sys_util::eventfd::EventFd;

use super::client::{Client, CopyOp};
use super::poller::Poller;
use super::session::{self, End};
use super::stats::Counters;
use super::transport::TcpTransport;
use super::websocket;
use super::FrontDoor;
use crate::geometry::Rect;
use crate::input::InputSink;
use crate::screen::Screen;

/// Connections beyond this many are turned away: each costs a thread and
/// a copy of the screen.
const MAX_CLIENTS: usize = 64;

/// Pause after a failed accept (e.g. out of file descriptors): the
/// listener stays ready, so retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Which protocol a listener speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Tcp,
    WebSocket,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Tcp => "tcp",
            Kind::WebSocket => "websocket",
        }
    }
}

/// State every server thread shares.
pub struct Shared {
    pub screen: Arc<Screen>,
    pub input: Arc<dyn InputSink>,
    pub password: Option<String>,
    pub name: String,
    pub stats: Counters,
    pub front_door: FrontDoor,
    /// Written once at shutdown and never read: stays ready for all.
    pub shutdown: EventFd,
    clients: Mutex<Vec<Arc<Client>>>,
    /// Connections per source (`source_key`) not yet past the handshake.
    pending: Mutex<HashMap<IpAddr, usize>>,
    /// Client threads, joined at shutdown.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Lists of handles stay valid whatever a panicking holder was doing.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(
        screen: Arc<Screen>,
        input: Arc<dyn InputSink>,
        password: Option<String>,
        name: String,
        front_door: FrontDoor,
    ) -> io::Result<Shared> {
        Ok(Shared {
            screen,
            input,
            password,
            name,
            stats: Counters::default(),
            front_door,
            shutdown: EventFd::new(libc::EFD_NONBLOCK)?,
            clients: Mutex::new(Vec::new()),
            pending: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
        })
    }

    fn screen_rect(&self) -> Rect {
        Rect::new(0, 0, self.screen.width(), self.screen.height())
    }

    pub fn damage(&self, rects: &[Rect]) {
        let screen = self.screen_rect();
        let clipped: Vec<Rect> = rects
            .iter()
            .map(|r| r.intersect(&screen))
            .filter(|r| !r.is_empty())
            .collect();
        if clipped.is_empty() {
            return;
        }
        for client in lock(&self.clients).iter() {
            client.damage(&clipped);
        }
    }

    pub fn copy(&self, src: Rect, dst_x: u16, dst_y: u16) {
        let Some(op) = clip_copy(&self.screen_rect(), src, dst_x, dst_y) else {
            return;
        };
        for client in lock(&self.clients).iter() {
            client.copy(op);
        }
    }

    /// Counts a new connection from `peer` as pending; false (and not
    /// counted) when its source already has as many as allowed.
    fn begin_pending(&self, peer: &SocketAddr) -> bool {
        let mut pending = lock(&self.pending);
        let n = pending.entry(source_key(peer.ip())).or_insert(0);
        if *n >= self.front_door.pending_per_address {
            return false;
        }
        *n += 1;
        true
    }

    /// A pending connection from `peer` finished the handshake or ended.
    pub fn end_pending(&self, peer: &SocketAddr) {
        let mut pending = lock(&self.pending);
        let key = source_key(peer.ip());
        if let Some(n) = pending.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                pending.remove(&key);
            }
        }
    }

    pub fn active_clients(&self) -> usize {
        lock(&self.clients).iter().filter(|c| c.is_active()).count()
    }

    /// Tells every thread to stop (idempotent).
    pub fn signal_shutdown(&self) {
        let _ = self.shutdown.write(1);
    }

    /// Waits for every client thread; call after the acceptors are joined
    /// so no new ones appear.
    pub fn join_clients(&self) {
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Clips a move to the screen: source and destination shrink together so
/// they keep the same size and offset. `None` when nothing visible moves.
fn clip_copy(screen: &Rect, src: Rect, dst_x: u16, dst_y: u16) -> Option<CopyOp> {
    let dx = i64::from(dst_x) - i64::from(src.x);
    let dy = i64::from(dst_y) - i64::from(src.y);
    if dx == 0 && dy == 0 {
        return None;
    }
    let src = src.intersect(screen);
    let shift = |r: &Rect, dx: i64, dy: i64| -> Option<Rect> {
        // Clip in wide integers: the shifted rectangle may start off screen.
        let x0 = (i64::from(r.x) + dx).max(i64::from(screen.x));
        let y0 = (i64::from(r.y) + dy).max(i64::from(screen.y));
        let x1 = (i64::from(r.right()) + dx).min(i64::from(screen.right()));
        let y1 = (i64::from(r.bottom()) + dy).min(i64::from(screen.bottom()));
        (x1 > x0 && y1 > y0)
            .then(|| Rect::new(x0 as u16, y0 as u16, (x1 - x0) as u16, (y1 - y0) as u16))
    };
    let dst = shift(&src, dx, dy)?;
    let src = shift(&dst, -dx, -dy)?;
    Some(CopyOp { src, dst })
}

/// Where a connection comes from, for the per-source limit: an IPv4
/// address, or an IPv6 address's /64 (one host usually has all of it).
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

/// Starts the thread accepting connections on `listener` (non-blocking).
pub fn spawn_acceptor(
    listener: TcpListener,
    kind: Kind,
    shared: Arc<Shared>,
) -> io::Result<JoinHandle<()>> {
    thread::Builder::new()
        .name(format!("vnc-accept-{}", kind.name()))
        .spawn(move || {
            sandbox::enter_or_exit(sandbox::ThreadKind::VncAccept);
            accept_loop(&listener, kind, &shared)
        })
}

fn accept_loop(listener: &TcpListener, kind: Kind, shared: &Arc<Shared>) {
    let poller = match Poller::new(listener.as_raw_fd(), None, &shared.shutdown) {
        Ok(p) => p,
        Err(e) => {
            warn!(error = %e, "VNC acceptor cannot poll; not accepting {} clients", kind.name());
            return;
        }
    };
    loop {
        match poller.wait(None) {
            Ok(ready) if ready.shutdown => return,
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, "VNC acceptor poll failed");
                thread::sleep(ACCEPT_BACKOFF);
                continue;
            }
        }
        loop {
            match listener.accept() {
                Ok((stream, peer)) => start_client(stream, peer, kind, shared),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    warn!(error = %e, "VNC accept failed");
                    thread::sleep(ACCEPT_BACKOFF);
                    break;
                }
            }
        }
    }
}

fn start_client(stream: TcpStream, peer: SocketAddr, kind: Kind, shared: &Arc<Shared>) {
    shared.stats.connection();
    info!(%peer, transport = kind.name(), "VNC client connected");
    let refuse = |reason: &str| {
        shared.stats.refused();
        info!(%peer, reason, "VNC client disconnected");
    };
    // The handshake's clock starts now, WebSocket upgrade included.
    let deadline = Instant::now() + shared.front_door.handshake_timeout;
    if lock(&shared.clients).len() >= MAX_CLIENTS {
        return refuse("too many clients");
    }
    if !shared.begin_pending(&peer) {
        return refuse("too many connections from this address still in the handshake");
    }
    // Sessions rely on never blocking; Nagle would delay small replies
    // (handshake steps) behind the previous ones.
    if let Err(e) = stream
        .set_nonblocking(true)
        .and_then(|()| stream.set_nodelay(true))
    {
        shared.end_pending(&peer);
        return refuse(&format!("socket setup failed: {e}"));
    }
    let wake = match EventFd::new(libc::EFD_NONBLOCK) {
        Ok(w) => w,
        Err(e) => {
            shared.end_pending(&peer);
            return refuse(&format!("eventfd failed: {e}"));
        }
    };
    let client = Arc::new(Client::new(peer, wake, shared.screen_rect()));
    lock(&shared.clients).push(client.clone());

    let thread_shared = shared.clone();
    let thread_client = client.clone();
    let spawned = thread::Builder::new()
        .name("vnc-client".to_string())
        .spawn(move || {
            sandbox::enter_or_exit(sandbox::ThreadKind::VncClient);
            serve_client(stream, kind, deadline, &thread_shared, &thread_client)
        });
    match spawned {
        Ok(handle) => {
            let mut threads = lock(&shared.threads);
            // Forget threads that already ended so the list stays short.
            threads.retain(|t| !t.is_finished());
            threads.push(handle);
        }
        Err(e) => {
            unregister(shared, &client);
            shared.end_pending(&peer);
            refuse(&format!("thread spawn failed: {e}"));
        }
    }
}

fn unregister(shared: &Shared, client: &Arc<Client>) {
    lock(&shared.clients).retain(|c| !Arc::ptr_eq(c, client));
}

fn serve_client(
    stream: TcpStream,
    kind: Kind,
    deadline: Instant,
    shared: &Shared,
    client: &Arc<Client>,
) {
    let end = match kind {
        Kind::Tcp => session::run(TcpTransport::new(stream), shared, client, deadline),
        Kind::WebSocket => {
            match websocket::accept(
                stream,
                &shared.shutdown,
                deadline,
                &shared.front_door.origins,
            ) {
                Ok(ws) => session::run(ws, shared, client, deadline),
                Err(reason) => End::Refused(reason),
            }
        }
    };
    unregister(shared, client);
    if !client.is_active() {
        // Still counted as pending: the session ended before ClientInit.
        shared.end_pending(&client.peer);
    }
    let reason = match &end {
        End::Closed(reason) => reason,
        End::Refused(reason) => {
            shared.stats.refused();
            reason
        }
    };
    info!(peer = %client.peer, reason = %reason, "VNC client disconnected");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_addresses_or_ipv6_64s() {
        let key = |s: &str| source_key(s.parse().unwrap());
        assert_eq!(key("192.0.2.7"), key("192.0.2.7"));
        assert_ne!(key("192.0.2.7"), key("192.0.2.8"));
        assert_eq!(key("::ffff:192.0.2.7"), key("192.0.2.7"));
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
    }

    #[test]
    fn copies_are_clipped_together() {
        let screen = Rect::new(0, 0, 100, 100);
        // Fully on screen.
        assert_eq!(
            clip_copy(&screen, Rect::new(0, 10, 100, 90), 0, 0),
            Some(CopyOp {
                src: Rect::new(0, 10, 100, 90),
                dst: Rect::new(0, 0, 100, 90)
            })
        );
        // Destination runs off the right edge: both shrink.
        assert_eq!(
            clip_copy(&screen, Rect::new(50, 0, 40, 10), 80, 0),
            Some(CopyOp {
                src: Rect::new(50, 0, 20, 10),
                dst: Rect::new(80, 0, 20, 10)
            })
        );
        // Source partly off screen.
        assert_eq!(
            clip_copy(&screen, Rect::new(90, 0, 40, 10), 0, 0),
            Some(CopyOp {
                src: Rect::new(90, 0, 10, 10),
                dst: Rect::new(0, 0, 10, 10)
            })
        );
        assert_eq!(clip_copy(&screen, Rect::new(0, 0, 10, 10), 0, 0), None);
        assert_eq!(clip_copy(&screen, Rect::new(0, 0, 10, 10), 200, 0), None);
        assert_eq!(clip_copy(&screen, Rect::new(65535, 0, 10, 10), 0, 0), None);
    }
}
