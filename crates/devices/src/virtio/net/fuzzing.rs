//! Entry point for the fuzz target in `fuzz/` (not an API): a guest's rx
//! and tx queues, corrupt as it likes, through the net worker's tx and rx
//! paths, with a datagram socket pair standing in for the TAP (as the
//! device's tests do: a TAP cannot be opened without privileges).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::handler::NetHandler;
use super::{NetBackend, NetMetrics, MAX_FRAME_LEN, NET_HDR_LEN, QUEUE_SIZE};
use crate::virtio::fuzzing::{
    guest_memory, write_data, CountingInterrupt, Input, Ring, RING_INPUT_LEN, RING_SIZE,
};
use crate::GuestMemoryMmap;

/// Input byte 0: the driver accepted VIRTIO_NET_F_MRG_RXBUF.
pub const MRG_RXBUF: u8 = 1;
/// Input byte 0: the driver accepted VIRTIO_RING_F_EVENT_IDX.
pub const EVENT_IDX: u8 = 2;
/// A frame length in the input that stands for a frame one byte longer
/// than the device takes (more than a u16 says).
pub const OVERSIZED: u16 = 0xffff;
/// Bytes of input for one queue.
pub const RING_BYTES: usize = RING_INPUT_LEN;

/// The back end: one datagram, one frame.
struct Dgram(UnixDatagram);

impl AsRawFd for Dgram {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl NetBackend for Dgram {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.recv(buf)
    }

    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        self.0.send(frame)
    }

    fn name(&self) -> &str {
        "fuzz"
    }
}

/// A back end of datagram sockets, and the host's end of it.
pub fn socket_backend() -> io::Result<(Arc<dyn NetBackend>, UnixDatagram)> {
    let (device_end, host) = UnixDatagram::pair()?;
    device_end.set_nonblocking(true)?;
    host.set_nonblocking(true)?;
    Ok((Arc::new(Dgram(device_end)), host))
}

/// Runs `input` through the net worker's queues. Layout:
/// - byte 0: [`MRG_RXBUF`], [`EVENT_IDX`], bits 2-4 the number of frames
///   the host sends the guest;
/// - the rx queue, then the tx queue, [`RING_BYTES`] each
///   ([`Ring::write_from`]);
/// - the host's frames: a little-endian u16 length ([`OVERSIZED`]: too
///   long a frame) and that many bytes, zero-padded past the input's end;
/// - the rest: guest memory contents from [`crate::virtio::fuzzing::DATA`].
///
/// The worker sends the guest's tx chains, then fills rx buffers with the
/// host's frames, twice over (the second round finds what the first left
/// in the rings). Panics if a frame reaching the host is shorter than the
/// vnet header or longer than the device allows, or is not counted, if
/// more frames reach the guest than the host sent, or (when no frame was
/// written into guest memory, which could hold the rings) if a used entry
/// names a chain the ring cannot have or a length other than 0. Returns
/// the host's frames.
pub fn queues(input: &[u8]) -> io::Result<Vec<Vec<u8>>> {
    let mut input = Input(input);
    let control = input.u8();
    let mem = guest_memory();
    let (rx, tx) = (Ring::nth(0), Ring::nth(1));
    rx.write_from(&mem, &mut input);
    tx.write_from(&mem, &mut input);

    let (backend, host) = socket_backend()?;
    let frames = (control >> 2) & 7;
    for _ in 0..frames {
        let len = match input.u16() {
            OVERSIZED => MAX_FRAME_LEN + 1,
            len => usize::from(len),
        };
        let mut frame = input.bytes(len).to_vec();
        frame.resize(len, 0);
        host.send(&frame)?;
    }
    write_data(&mem, &mut input);

    let event_idx = control & EVENT_IDX != 0;
    let interrupt = Arc::new(CountingInterrupt::default());
    let metrics = Arc::new(NetMetrics::default());
    let mut handler = NetHandler::new(
        mem.clone(),
        interrupt,
        rx.queue_events(0, QUEUE_SIZE, event_idx)?,
        tx.queue_events(1, QUEUE_SIZE, event_idx)?,
        backend,
        control & MRG_RXBUF != 0,
        metrics.clone(),
    );
    for _ in 0..2 {
        handler.process_tx();
        handler.process_rx();
    }

    let mut sent = Vec::new();
    let mut buf = vec![0u8; MAX_FRAME_LEN + 2];
    while let Ok(n) = host.recv(&mut buf) {
        assert!(
            (NET_HDR_LEN..=MAX_FRAME_LEN).contains(&n),
            "a {n}-byte frame reached the host"
        );
        sent.push(buf[..n].to_vec());
    }
    let tx_frames = metrics.tx_frames.load(Ordering::Relaxed);
    assert_eq!(sent.len() as u64, tx_frames);
    let delivered = metrics.rx_frames.load(Ordering::Relaxed);
    assert!(
        delivered + metrics.rx_dropped.load(Ordering::Relaxed) <= u64::from(frames),
        "more rx frames than the host sent"
    );
    // The used rings say what the device did only if no frame went into
    // guest memory: rx buffers may lie over the rings.
    if delivered == 0 {
        // Both rounds together take at most two rings' worth of chains.
        let tx_used = tx.used_idx(&mem);
        assert!(
            u64::from(tx_used) <= tx_frames + metrics.tx_dropped.load(Ordering::Relaxed),
            "{tx_used} tx chains used"
        );
        check_used(&tx, &mem, "tx");
        check_used(&rx, &mem, "rx");
    }
    Ok(sent)
}

/// A ring's used side after two rounds with nothing written to guest
/// memory: at most two rings' worth of chains, each a head of the ring
/// answered with no bytes.
fn check_used(ring: &Ring, mem: &GuestMemoryMmap, name: &str) {
    let used = ring.used_idx(mem);
    assert!(used <= 2 * RING_SIZE, "{used} {name} chains used");
    for (id, len) in ring.used_entries(mem) {
        assert!(
            id < u32::from(RING_SIZE) && len == 0,
            "{name} used ({id}, {len})"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::fuzzing::{ring_input as ring, DATA};

    #[test]
    fn frames_pass_both_ways_and_bad_chains_are_dropped() {
        const W: u16 = 2;
        let rx = ring(&[&[(0x4000, 0x800, W)], &[(0x4800, 0x800, W)]]);
        let tx = ring(&[
            // A 12-byte header and a 60-byte frame in two buffers.
            &[(DATA, 12, 0), (DATA + 12, 60, 0)],
            // Shorter than the header: dropped.
            &[(DATA, 4, 0)],
            // Writable: dropped.
            &[(DATA, 72, W)],
            // Outside guest memory: dropped.
            &[(0x1_8000, 72, 0)],
        ]);
        let mut input = vec![2 << 2];
        input.extend_from_slice(&rx);
        input.extend_from_slice(&tx);
        for len in [100u16, 20] {
            input.extend_from_slice(&len.to_le_bytes());
            input.extend(std::iter::repeat_n(0x5a, usize::from(len)));
        }
        input.extend((0..72).map(|i| i as u8));
        let sent = queues(&input).unwrap();
        assert_eq!(sent, vec![(0..72).collect::<Vec<u8>>()]);

        // A frame too long for any buffer, a chain past the ring's size.
        let mut input = vec![MRG_RXBUF | EVENT_IDX | (1 << 2)];
        input.extend_from_slice(&ring(&[&[(0x4000, 0x800, W)]]));
        let mut tx = ring(&[]);
        tx[..2].copy_from_slice(&0x8000u16.to_le_bytes());
        input.extend_from_slice(&tx);
        input.extend_from_slice(&OVERSIZED.to_le_bytes());
        assert!(queues(&input).unwrap().is_empty());
    }
}
