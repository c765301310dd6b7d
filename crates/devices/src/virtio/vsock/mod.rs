//! virtio-vsock (virtio 1.2 §5.10) with a Firecracker-style "hybrid"
//! back end: guest vsock streams joined to host Unix sockets.
//!
//! `--vsock cid=3,uds=/path/vsock.sock[,id=vsock0]`
//!
//! - Host → guest port P: connect to `uds`, write `CONNECT P\n`, read
//!   `OK <host port>\n`, then the socket is the stream.
//! - Guest → host (CID 2) port P: the device connects to `<uds>_P`; nothing
//!   listening there means the guest gets a reset (ECONNRESET/ECONNREFUSED).
//!
//! Files:
//! - [`packet`]: the 44-byte header, ops and flags;
//! - [`connection`]: one stream and its credit accounting;
//! - [`muxer`]: the connection table, the host listener, the `CONNECT`
//!   handshake, and the order packets go to the guest (see its docs — it is
//!   the piece later guest-agent work builds on);
//! - [`device`]: the [`Vsock`] device (queues rx 0, tx 1, event 2; config:
//!   the guest CID);
//! - `handler`: the worker thread moving packets between the queues and the
//!   muxer (its own epoll loop, since host connections come and go).
//!
//! Only stream sockets (no SEQPACKET, no DGRAM). Every queue buffer the
//! guest gives is bounded; each connection buffers at most what our credit
//! (`buf_alloc` = 256 KiB) allows; at most 1024 connections.

pub mod connection;
mod device;
#[doc(hidden)]
pub mod fuzzing;
mod handler;
pub mod muxer;
pub mod packet;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

pub use device::{Vsock, VsockError, VsockState};
pub use muxer::VsockMuxer;

use crate::options::{invalid, Options, OptionsError};

/// Queue indices and size.
pub const RX_QUEUE: u16 = 0;
pub const TX_QUEUE: u16 = 1;
pub const EVENT_QUEUE: u16 = 2;
pub const QUEUE_SIZE: u16 = 256;

/// `--vsock` options, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VsockConfig {
    /// The guest's CID (3 ..= 0xffff_fffe).
    pub cid: u64,
    /// The host Unix socket; guest-initiated connections go to `<uds>_<port>`.
    pub uds: PathBuf,
    pub id: Option<String>,
}

impl VsockConfig {
    /// Parses `cid=N,uds=PATH[,id=NAME]`.
    pub fn parse(text: &str) -> Result<VsockConfig, OptionsError> {
        let mut o = Options::parse(text, None)?;
        let cid_text = o.require("cid")?;
        let cid = match cid_text.parse::<u64>() {
            Ok(c) if (3..=0xffff_fffe).contains(&c) => c,
            Ok(_) => {
                return Err(invalid(
                    "cid",
                    &cid_text,
                    "0, 1 and 2 are reserved; CIDs are 32-bit (3..=4294967294)",
                ))
            }
            Err(e) => return Err(invalid("cid", &cid_text, &e.to_string())),
        };
        let uds = o.require("uds")?;
        if uds.is_empty() {
            return Err(invalid("uds", &uds, "must not be empty"));
        }
        // sun_path holds 107 bytes and a NUL.
        if uds.len() > 107 {
            return Err(invalid(
                "uds",
                &uds,
                "a Unix socket path holds at most 107 bytes",
            ));
        }
        let id = o.take("id");
        if id.as_deref() == Some("") {
            return Err(invalid("id", "", "must not be empty"));
        }
        o.finish()?;
        Ok(VsockConfig {
            cid,
            uds: PathBuf::from(uds),
            id,
        })
    }
}

/// Counters of one vsock device.
#[derive(Debug, Default)]
pub struct VsockMetrics {
    /// Packets and payload bytes given to the guest.
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    /// Packets and payload bytes taken from the guest.
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Guest packets dropped as malformed or misaddressed.
    pub tx_dropped: AtomicU64,
    /// RSTs sent to the guest.
    pub resets: AtomicU64,
    /// Connections established or being established, ever.
    pub connections_opened: AtomicU64,
    /// Connections open now.
    pub connections: AtomicU64,
}

/// A copy of [`VsockMetrics`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VsockMetricsSnapshot {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
    pub resets: u64,
    pub connections_opened: u64,
    pub connections: u64,
}

impl VsockMetrics {
    pub fn snapshot(&self) -> VsockMetricsSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        VsockMetricsSnapshot {
            rx_packets: l(&self.rx_packets),
            rx_bytes: l(&self.rx_bytes),
            tx_packets: l(&self.tx_packets),
            tx_bytes: l(&self.tx_bytes),
            tx_dropped: l(&self.tx_dropped),
            resets: l(&self.resets),
            connections_opened: l(&self.connections_opened),
            connections: l(&self.connections),
        }
    }
}
