//! virtio-net (virtio 1.2 §5.1) with a Linux TAP back end.
//!
//! `--net tap=NAME[,mac=52:54:00:12:34:56][,mtu=1500][,id=net0]`
//!
//! - [`tap`]: opens (or creates, when we may) the TAP interface with
//!   `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR` and a 12-byte vnet header
//!   (`virtio_net_hdr_v1`), so the header a guest puts in front of every
//!   frame passes through the TAP unchanged and offloads (checksum, TSO)
//!   cost nothing to translate.
//! - [`device`]: the [`Net`] device: two queues (rx 0, tx 1), MAC, link
//!   status, mergeable rx buffers and the TAP offloads the driver accepts.
//! - [`handler`]: the device's worker thread (its own epoll loop: the TAP is
//!   polled edge-triggered and is not read while the guest has no rx
//!   buffers, so a stalled guest costs no CPU).
//!
//! The back end is behind the small [`NetBackend`] trait (read a frame,
//! write a frame, set offloads), so tests can stand a datagram socket pair
//! in for the TAP.

mod device;
#[doc(hidden)]
pub mod fuzzing;
mod handler;
pub mod tap;
#[cfg(test)]
mod tests;

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

pub use device::{Net, NetError, NetState};
pub use tap::{Tap, TapError};

use crate::affinity::CpuSet;
use crate::options::{invalid, Options, OptionsError};

/// Size of the virtio-net header every frame carries (`virtio_net_hdr_v1`,
/// which VIRTIO_F_VERSION_1 always uses, with or without MRG_RXBUF).
pub const NET_HDR_LEN: usize = 12;
/// Offset of `num_buffers` in the header.
const NUM_BUFFERS_OFFSET: usize = 10;
/// Largest frame accepted or delivered, vnet header included: a 64 KiB GSO
/// frame plus its Ethernet header and the vnet header (Firecracker's bound).
pub const MAX_FRAME_LEN: usize = 65562;
/// Size of each of the two queues.
pub const QUEUE_SIZE: u16 = 256;
/// Queue indices.
pub const RX_QUEUE: u16 = 0;
pub const TX_QUEUE: u16 = 1;

/// Where frames go to and come from. Each read or write moves one whole
/// frame, vnet header first. Implementations must be non-blocking
/// (`WouldBlock` when there is nothing to read / no room to write) and
/// signal readability on their fd (the worker polls it edge-triggered).
pub trait NetBackend: AsRawFd + Send + Sync {
    /// Reads one frame (vnet header + Ethernet frame) into `buf`.
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes one frame (vnet header + Ethernet frame).
    fn write_frame(&self, frame: &[u8]) -> io::Result<usize>;
    /// Sets the offloads (`TUN_F_*`) the back end may use in frames it
    /// gives us, from the features the driver accepted.
    fn set_offload(&self, _tun_flags: u32) -> io::Result<()> {
        Ok(())
    }
    /// A name for logs (the TAP interface name).
    fn name(&self) -> &str;
}

/// `--net` options, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// The TAP interface name (created if it does not exist).
    pub tap: String,
    /// The guest's MAC address; derived from the id or the TAP name if absent.
    pub mac: Option<[u8; 6]>,
    /// The MTU offered to the guest (VIRTIO_NET_F_MTU); none if absent.
    pub mtu: Option<u16>,
    /// The device id for logs and `vm.info`.
    pub id: Option<String>,
    /// The host CPUs the device's thread runs on (`iothread_affinity=[1]`);
    /// anywhere when absent.
    pub iothread_affinity: Option<CpuSet>,
}

impl NetConfig {
    /// Parses `tap=NAME[,mac=..][,mtu=..][,id=..]`; a bare value is the
    /// TAP name (`--net tap0`).
    pub fn parse(text: &str) -> Result<NetConfig, OptionsError> {
        let mut o = Options::parse(text, Some("tap"))?;
        let tap = o.require("tap")?;
        tap::validate_name(&tap).map_err(|reason| invalid("tap", &tap, reason))?;
        let mac = match o.take("mac") {
            None => None,
            Some(m) => Some(parse_mac(&m).map_err(|reason| invalid("mac", &m, reason))?),
        };
        let mtu = match o.take("mtu") {
            None => None,
            Some(m) => match m.parse::<u16>() {
                Ok(v) if v >= 68 => Some(v),
                _ => return Err(invalid("mtu", &m, "expected 68..=65535")),
            },
        };
        let id = o.take("id");
        if let Some(id) = &id {
            if id.is_empty() {
                return Err(invalid("id", id, "must not be empty"));
            }
        }
        let iothread_affinity = o.cpu_set("iothread_affinity")?;
        o.finish()?;
        Ok(NetConfig {
            tap,
            mac,
            mtu,
            id,
            iothread_affinity,
        })
    }
}

/// Parses `aa:bb:cc:dd:ee:ff` (a unicast address).
pub fn parse_mac(text: &str) -> Result<[u8; 6], &'static str> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in mac.iter_mut() {
        let part = parts
            .next()
            .ok_or("expected six hex bytes aa:bb:cc:dd:ee:ff")?;
        if part.len() != 2 {
            return Err("expected six hex bytes aa:bb:cc:dd:ee:ff");
        }
        *byte =
            u8::from_str_radix(part, 16).map_err(|_| "expected six hex bytes aa:bb:cc:dd:ee:ff")?;
    }
    if parts.next().is_some() {
        return Err("expected six hex bytes aa:bb:cc:dd:ee:ff");
    }
    if mac[0] & 1 != 0 {
        return Err("a multicast address cannot be a NIC's address");
    }
    if mac == [0; 6] {
        return Err("the all-zero address is not valid");
    }
    Ok(mac)
}

/// A stable, locally administered unicast MAC (QEMU's 52:54:00 prefix)
/// derived from `seed` (FNV-1a), so a VM keeps its address across runs.
pub fn derived_mac(seed: &str) -> [u8; 6] {
    let mut h: u32 = 0x811c_9dc5;
    for b in seed.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let b = h.to_le_bytes();
    [0x52, 0x54, 0x00, b[0], b[1], b[2] ^ b[3]]
}

/// Formats a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Counters of one net device (shared with its worker; read any time).
#[derive(Debug, Default)]
pub struct NetMetrics {
    /// Frames delivered to the guest, and their bytes (vnet header excluded).
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    /// Frames read from the back end but not delivered (too big for the
    /// guest's buffers, malformed rx chains, short frames).
    pub rx_dropped: AtomicU64,
    /// Frames the guest sent that reached the back end, and their bytes.
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Guest frames dropped (malformed chains, too big/small, write errors).
    pub tx_dropped: AtomicU64,
}

/// A point-in-time copy of [`NetMetrics`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetMetricsSnapshot {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub rx_dropped: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
}

impl NetMetrics {
    pub fn snapshot(&self) -> NetMetricsSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NetMetricsSnapshot {
            rx_frames: l(&self.rx_frames),
            rx_bytes: l(&self.rx_bytes),
            rx_dropped: l(&self.rx_dropped),
            tx_frames: l(&self.tx_frames),
            tx_bytes: l(&self.tx_bytes),
            tx_dropped: l(&self.tx_dropped),
        }
    }

    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
