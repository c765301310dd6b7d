//! The VNC server: RFB 3.3, 3.7 and 3.8 (RFC 6143) over TCP and, for
//! browser clients such as noVNC, over WebSocket (RFC 6455).
//!
//! Updates are pulled: each client has a region of the screen it has not
//! been sent yet, grown by [`VncServer::damage`] and [`VncServer::copy`],
//! and its own thread answers the client's FramebufferUpdateRequests from
//! that region, reading pixels from the shared [`Screen`]. Nothing a client
//! does (or fails to do) can block the caller of `damage` or `copy`.
//!
//! Security: None, or VNC Authentication when a password is set. Encodings:
//! Raw, CopyRect and ZRLE, in the client's order of preference.
//!
//! The front door ([`FrontDoor`]): a WebSocket upgrade whose `Origin` is
//! neither absent (a non-browser client), the server's own (the `Host`
//! header's) nor on the allow-list is refused with HTTP 403, so a web page
//! in the host's browser cannot type into the guest; a connection must
//! finish the RFB handshake (authentication included) within the handshake
//! timeout; and only a few connections per source address may be short of
//! it at once, so idle sockets from one place cannot take every slot.
//!
//! Module map:
//! - `server`: listener threads, client list, fan-out of screen changes.
//! - `client`: one client's pending damage and copies (shared state).
//! - `session`: one client's protocol state machine and update building.
//! - `protocol`: wire messages; `pixel_format`: formats and conversion;
//!   `auth`: VNC Authentication; `encoding`: Raw, CopyRect, ZRLE.
//! - `region`: rectangle sets; `view`: what a client's framebuffer holds.
//! - `transport`, `websocket`, `poller`: non-blocking byte streams.
//! - `stats`: counters.

mod auth;
mod client;
mod encoding;
mod pixel_format;
mod poller;
mod protocol;
mod region;
mod server;
mod session;
mod stats;
mod transport;
mod view;
mod websocket;

#[doc(hidden)]
pub mod fuzzing;

#[cfg(test)]
mod tests;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::warn;

pub use pixel_format::PixelFormat;
pub use stats::VncStats;

use crate::geometry::Rect;
use crate::input::InputSink;
use crate::screen::Screen;
use server::{Kind, Shared};

/// How to run a VNC server.
#[derive(Clone, Debug)]
pub struct VncConfig {
    /// RFB over TCP (port 0 picks a free port).
    pub listen: SocketAddr,
    /// RFB over WebSocket, for noVNC.
    pub websocket: Option<SocketAddr>,
    /// With a password only VNC Authentication is offered (only its first
    /// 8 bytes count, as the protocol's DES key is 8 bytes).
    pub password: Option<String>,
    /// The desktop name clients show.
    pub name: String,
    /// Who may come in, and for how long before authenticating.
    pub front_door: FrontDoor,
}

/// What a connection must satisfy before it is a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontDoor {
    /// WebSocket `Origin`s allowed besides the server's own (`Host`'s)
    /// and none at all, as `scheme://host[:port]`, compared without case.
    pub origins: Vec<String>,
    /// From accept to the end of the RFB handshake (WebSocket upgrade and
    /// authentication included).
    pub handshake_timeout: Duration,
    /// Connections from one source address (an IPv6 /64) that may be
    /// short of the end of the RFB handshake at once.
    pub pending_per_address: usize,
}

/// Default [`FrontDoor::handshake_timeout`]: clients that know the
/// password (noVNC given it in the URL, vncviewer with -passwd) finish in
/// milliseconds; a viewer that prompts only after connecting gives its
/// user these seconds to type, or `handshake_timeout=` more.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`FrontDoor::pending_per_address`]: a browser tab opens one or
/// two, a reconnecting client one more.
pub const DEFAULT_PENDING_PER_ADDRESS: usize = 4;

impl Default for FrontDoor {
    fn default() -> FrontDoor {
        FrontDoor {
            origins: Vec::new(),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            pending_per_address: DEFAULT_PENDING_PER_ADDRESS,
        }
    }
}

/// Says, loudly, that a listener anyone on the network can reach lets
/// them in without a password (they get the guest's keyboard and mouse).
fn warn_if_open(kind: &str, bound: SocketAddr, password: bool) {
    if !password && !bound.ip().is_loopback() {
        warn!(
            "VNC {kind} listener {bound} is reachable beyond this host and has NO PASSWORD: \
             anyone who can connect controls the guest's keyboard and mouse; \
             set password_file=PATH or listen on 127.0.0.1"
        );
    }
}

/// A running VNC server. Dropping it shuts it down.
pub struct VncServer {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    websocket_addr: Option<SocketAddr>,
    acceptors: Vec<JoinHandle<()>>,
}

fn listen(addr: SocketAddr) -> io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr)?;
    // Acceptors poll the listener together with the shutdown event.
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

impl VncServer {
    /// Binds (errors are returned, e.g. address in use), starts an acceptor
    /// thread per listener and one thread per client.
    pub fn start(
        config: VncConfig,
        screen: Arc<Screen>,
        input: Arc<dyn InputSink>,
    ) -> io::Result<VncServer> {
        let (tcp, local_addr) = listen(config.listen)?;
        let ws = config.websocket.map(listen).transpose()?;
        warn_if_open("RFB", local_addr, config.password.is_some());
        if let Some((_, bound)) = &ws {
            warn_if_open("WebSocket", *bound, config.password.is_some());
        }
        let shared = Arc::new(Shared::new(
            screen,
            input,
            config.password,
            config.name,
            config.front_door,
        )?);
        let mut server = VncServer {
            shared,
            local_addr,
            websocket_addr: ws.as_ref().map(|(_, a)| *a),
            acceptors: Vec::new(),
        };
        // On error `server` is dropped, which stops what was started.
        server.acceptors.push(server::spawn_acceptor(
            tcp,
            Kind::Tcp,
            server.shared.clone(),
        )?);
        if let Some((listener, _)) = ws {
            server.acceptors.push(server::spawn_acceptor(
                listener,
                Kind::WebSocket,
                server.shared.clone(),
            )?);
        }
        Ok(server)
    }

    /// The bound RFB address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The bound WebSocket address, if any.
    pub fn websocket_addr(&self) -> Option<SocketAddr> {
        self.websocket_addr
    }

    /// These rectangles of the Screen changed; the Screen already holds the
    /// new pixels. Never blocks on a client: it records the rectangles in
    /// each client's pending region and wakes the client's thread.
    pub fn damage(&self, rects: &[Rect]) {
        self.shared.damage(rects);
    }

    /// The pixels of `src` were moved to (`dst_x`, `dst_y`); the Screen
    /// already holds the result. Clients that take CopyRect and hold the
    /// source's current pixels get a CopyRect, the others the destination
    /// as damage. Call it right after the move, before writing the Screen
    /// again; even if that is not the case, the pixels clients end up with
    /// are checked against the Screen when the update is built.
    pub fn copy(&self, src: Rect, dst_x: u16, dst_y: u16) {
        self.shared.copy(src, dst_x, dst_y);
    }

    /// Clients connected and past the RFB handshake.
    pub fn clients(&self) -> usize {
        self.shared.active_clients()
    }

    /// Counters since start.
    pub fn stats(&self) -> VncStats {
        self.shared.stats.snapshot()
    }

    /// Stops accepting, disconnects everyone and joins all threads.
    pub fn shutdown(&mut self) {
        self.shared.signal_shutdown();
        for acceptor in self.acceptors.drain(..) {
            let _ = acceptor.join();
        }
        self.shared.join_clients();
    }
}

impl Drop for VncServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
