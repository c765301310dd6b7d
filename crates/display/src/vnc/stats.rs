//! The VNC server's cumulative counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters since the server started.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VncStats {
    /// FramebufferUpdate messages sent.
    pub updates: u64,
    /// Rectangles in those updates, all encodings.
    pub rects: u64,
    /// RFB bytes handed to client connections (handshakes included; for
    /// WebSocket clients, without the WebSocket framing).
    pub bytes_sent: u64,
    /// Time spent building updates: copying pixels out of the Screen,
    /// converting and encoding them.
    pub encode_ns: u64,
    /// Time spent in the calls that write to client sockets (the sockets
    /// never block, so waiting for a slow client is not included).
    pub send_ns: u64,
    pub rects_raw: u64,
    pub rects_copyrect: u64,
    pub rects_zrle: u64,
    /// TCP (or WebSocket) connections accepted.
    pub connections: u64,
    /// Clients that completed the RFB handshake.
    pub clients_accepted: u64,
    /// Clients turned away: authentication failure, protocol error, or
    /// too many clients.
    pub clients_refused: u64,
}

/// Which encoding a rectangle used, for the per-encoding counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RectKind {
    Raw,
    CopyRect,
    Zrle,
}

/// The live counters, shared by all threads of a server.
#[derive(Default)]
pub struct Counters {
    updates: AtomicU64,
    rects: AtomicU64,
    bytes_sent: AtomicU64,
    encode_ns: AtomicU64,
    send_ns: AtomicU64,
    rects_raw: AtomicU64,
    rects_copyrect: AtomicU64,
    rects_zrle: AtomicU64,
    connections: AtomicU64,
    clients_accepted: AtomicU64,
    clients_refused: AtomicU64,
}

fn add(c: &AtomicU64, v: u64) {
    // Counters are independent; no ordering with other memory is needed.
    c.fetch_add(v, Ordering::Relaxed);
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Counters {
    pub fn update_sent(&self) {
        add(&self.updates, 1);
    }

    pub fn rect_sent(&self, kind: RectKind) {
        add(&self.rects, 1);
        add(
            match kind {
                RectKind::Raw => &self.rects_raw,
                RectKind::CopyRect => &self.rects_copyrect,
                RectKind::Zrle => &self.rects_zrle,
            },
            1,
        );
    }

    pub fn bytes_sent(&self, n: usize) {
        add(&self.bytes_sent, n as u64);
    }

    pub fn encode_time(&self, d: Duration) {
        add(&self.encode_ns, nanos(d));
    }

    pub fn send_time(&self, d: Duration) {
        add(&self.send_ns, nanos(d));
    }

    pub fn connection(&self) {
        add(&self.connections, 1);
    }

    pub fn accepted(&self) {
        add(&self.clients_accepted, 1);
    }

    pub fn refused(&self) {
        add(&self.clients_refused, 1);
    }

    pub fn snapshot(&self) -> VncStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        VncStats {
            updates: get(&self.updates),
            rects: get(&self.rects),
            bytes_sent: get(&self.bytes_sent),
            encode_ns: get(&self.encode_ns),
            send_ns: get(&self.send_ns),
            rects_raw: get(&self.rects_raw),
            rects_copyrect: get(&self.rects_copyrect),
            rects_zrle: get(&self.rects_zrle),
            connections: get(&self.connections),
            clients_accepted: get(&self.clients_accepted),
            clients_refused: get(&self.clients_refused),
        }
    }
}
