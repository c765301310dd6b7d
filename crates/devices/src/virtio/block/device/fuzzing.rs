//! Entry point for the fuzz target in `fuzz/` (not an API): virtio-blk as
//! a whole device — one or two queues, each served by the device's own
//! queue handler and I/O engine (threads over an in-memory disk, or either
//! engine over an image file opened with cache=none) — fed corrupt rings:
//! available index jumps and rewrites between kicks, heads and descriptors
//! anywhere, loops, chains into the hole.

use std::sync::Arc;
use std::time::Duration;

use vmm_sys_util::epoll::EventSet;

use super::{ActiveQueues, Block, QueueDevice, DONE_TOKEN, KICK_TOKEN, RETRY_TOKEN};
use crate::virtio::block::{
    BlockConfig, CacheMode, DiskBackend, EngineKind, Locking, MemDisk, SERIAL_LEN,
};
use crate::virtio::fuzzing::{
    guest_memory, rings_from, write_data, CountingInterrupt, Input, Ring, RING_INPUT_LEN, RING_SIZE,
};
use crate::virtio::worker::WorkerHandler;
use crate::virtio::COMMON_FEATURES;
use vm_memory::{Bytes, GuestAddress};

/// Input byte 0: the disk is read-only.
pub const READONLY: u8 = 1;
/// Input byte 0: the driver accepted VIRTIO_RING_F_EVENT_IDX.
pub const EVENT_IDX: u8 = 2;
/// Input byte 0: the driver accepted FLUSH, DISCARD, WRITE_ZEROES.
pub const FLUSH: u8 = 4;
pub const DISCARD: u8 = 8;
pub const WRITE_ZEROES: u8 = 16;
/// Input byte 0: the disk has two queues.
pub const TWO_QUEUES: u8 = 32;
/// Input byte 0: the disk is an image file opened with cache=none, so that
/// requests O_DIRECT can take go straight to the host's disk and the rest
/// through the page cache, under the [`DirectGate`](super::super::gate)
/// that keeps the two apart. Needs a temporary directory whose file system
/// takes O_DIRECT (not tmpfs); without one the input does nothing.
pub const FILE_DIRECT: u8 = 64;
/// Input byte 0, with [`FILE_DIRECT`]: io_uring serves the file, rather
/// than threads.
pub const URING: u8 = 128;
/// Bytes of input for one queue.
pub const RING_BYTES: usize = RING_INPUT_LEN;
/// Ops (see [`device`]); bit 0 of an op byte picks the queue.
pub const OP_KICK: u8 = 0;
pub const OP_REAP: u8 = 2;
pub const OP_DRAIN: u8 = 4;
pub const OP_AVAIL_IDX: u8 = 6;
pub const OP_RETRY: u8 = 8;
/// The disk: 64 sectors.
pub const DISK_SIZE: usize = 64 * 512;
/// How long a drain waits for the engine.
const DRAIN: Duration = Duration::from_secs(5);

/// Runs `input` through a block device's queue handlers. Layout:
/// - byte 0: [`READONLY`], [`EVENT_IDX`], [`FLUSH`], [`DISCARD`],
///   [`WRITE_ZEROES`], [`TWO_QUEUES`], [`FILE_DIRECT`], [`URING`];
/// - queue 0's ring, then queue 1's, [`RING_BYTES`] each
///   ([`Ring::write_from`]);
/// - a byte n (mod 32), then n ops, each a byte (bit 0: the queue; bits
///   1-3: [`OP_KICK`], [`OP_REAP`] the engine's completions,
///   [`OP_DRAIN`] wait for every request with the engine,
///   [`OP_AVAIL_IDX`] the driver sets the available index to the next
///   two bytes, [`OP_RETRY`] the retry event);
/// - the rest: guest memory contents from [`crate::virtio::fuzzing::DATA`].
///
/// At the end every queue is drained. Panics if a request taken off a
/// ring is never answered, if a read-only disk changed, or if an image
/// file's direct gate is still held. Returns whether the device ran (an
/// image file the host cannot open with O_DIRECT leaves nothing to do).
pub fn device(input: &[u8]) -> std::io::Result<bool> {
    let mut input = Input(input);
    let control = input.u8();
    let mem = guest_memory();
    let rings: [Ring; 2] = rings_from(&mem, &mut input);
    let n = usize::from(input.u8() % 32);
    let ops: Vec<(u8, u16)> = (0..n)
        .map(|_| {
            let op = input.u8();
            let arg = if op & 0xe == OP_AVAIL_IDX {
                input.u16()
            } else {
                0
            };
            (op, arg)
        })
        .collect();
    write_data(&mem, &mut input);

    let original: Vec<u8> = (0..DISK_SIZE).map(|i| (i * 7 % 251) as u8).collect();
    let image = if control & FILE_DIRECT != 0 {
        Some(ScratchImage::new(&original)?)
    } else {
        None
    };
    let disk = Arc::new(MemDisk::from_bytes(original.clone()));
    let mut config = BlockConfig::new(
        image
            .as_ref()
            .map_or("fuzz.img".as_ref(), |i| i.0.as_path()),
    );
    config.readonly = control & READONLY != 0;
    config.num_queues = Some(if control & TWO_QUEUES != 0 { 2 } else { 1 });
    config.queue_size = RING_SIZE;
    let mut block = match &image {
        Some(_) => {
            config.cache = CacheMode::None;
            config.engine = if control & URING != 0 {
                EngineKind::IoUring
            } else {
                EngineKind::Threads
            };
            // No O_DIRECT here (tmpfs), or no io_uring: nothing to fuzz.
            let Ok(block) = Block::open(config, Locking::Now) else {
                return Ok(false);
            };
            block
        }
        None => Block::from_backend(config, disk.clone(), DISK_SIZE as u64, [b'f'; SERIAL_LEN]),
    };

    let mut acked = COMMON_FEATURES;
    if control & EVENT_IDX == 0 {
        acked &= !(1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX);
    }
    for (bit, feature) in [
        (FLUSH, virtio_bindings::virtio_blk::VIRTIO_BLK_F_FLUSH),
        (DISCARD, virtio_bindings::virtio_blk::VIRTIO_BLK_F_DISCARD),
        (
            WRITE_ZEROES,
            virtio_bindings::virtio_blk::VIRTIO_BLK_F_WRITE_ZEROES,
        ),
    ] {
        if control & bit != 0 {
            acked |= 1 << feature;
        }
    }
    let queue_count = usize::from(block.config.queues());
    let mut queues = Vec::new();
    for (index, ring) in rings.iter().enumerate().take(queue_count) {
        queues.push(ring.queue_events(index as u16, RING_SIZE, control & EVENT_IDX != 0)?);
    }
    let mut loops = block
        .serve_each(
            ActiveQueues {
                memory: mem.clone(),
                interrupt: Arc::new(CountingInterrupt::default()),
                queues,
                acked_features: acked,
            },
            None,
        )
        .map_err(|e| std::io::Error::other(e.to_string()))?;

    for (op, arg) in ops {
        let q = usize::from(op & 1) % loops.len();
        let handler = loops[q].handler_mut();
        match op & 0xe {
            OP_KICK => handler.handle(KICK_TOKEN, EventSet::IN),
            OP_REAP => handler.handle(DONE_TOKEN, EventSet::IN),
            OP_DRAIN => {
                assert!(handler.drain(DRAIN).is_ok(), "the engine never finished");
            }
            OP_AVAIL_IDX => {
                let _ = mem.write_obj(arg.to_le(), GuestAddress(rings[q].avail + 2));
            }
            _ => handler.handle(RETRY_TOKEN, EventSet::IN),
        }
    }
    for body in &mut loops {
        let handler = body.handler_mut();
        assert!(handler.drain(DRAIN).is_ok(), "the engine never finished");
        // (The used rings prove nothing: reads may have written over them.)
        assert_eq!(handler.in_flight, 0, "a request was never answered");
    }
    drop(loops);
    if let Some(file) = &block.file {
        let gate = file.direct_gate().expect("cache=none has a gate");
        assert!(gate.is_idle(), "the direct gate is still held");
    }
    if control & READONLY != 0 {
        let now = match &image {
            Some(image) => std::fs::read(&image.0)?,
            None => disk.contents(),
        };
        assert!(now == original, "a read-only disk changed");
    }
    Ok(true)
}

/// An image file in the temporary directory, removed when dropped.
struct ScratchImage(std::path::PathBuf);

impl ScratchImage {
    fn new(bytes: &[u8]) -> std::io::Result<ScratchImage> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "hakoniwa-fuzz-block-{}-{n}.img",
            std::process::id()
        ));
        std::fs::write(&path, bytes)?;
        Ok(ScratchImage(path))
    }
}

impl Drop for ScratchImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::fuzzing::{ring_input, DATA};
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn requests_on_a_jumping_ring_are_all_answered() {
        const W: u16 = 2;
        // A read of sector 1 (header, data, status), a write to a
        // read-only disk, and a chain into the hole.
        let mut input = vec![READONLY | TWO_QUEUES];
        input.extend_from_slice(&ring_input(&[
            &[(DATA, 16, 0), (DATA + 0x100, 512, W), (DATA + 0x400, 1, W)],
            &[
                (DATA + 0x20, 16, 0),
                (DATA + 0x200, 512, 0),
                (DATA + 0x401, 1, W),
            ],
            &[(0x1_8000, 16, 0), (DATA + 0x402, 1, W)],
        ]));
        input.extend_from_slice(&ring_input(&[]));
        // Kick, reap, then the index jumps past the ring; kick again.
        input.extend_from_slice(&[5, OP_KICK, OP_REAP, OP_AVAIL_IDX, 0xff, 0x7f, OP_KICK]);
        input.push(OP_KICK | 1);
        let mut mem = vec![0u8; 0x30];
        mem[8] = 1; // sector 1
        mem[0x20] = 1; // VIRTIO_BLK_T_OUT
        mem[0x28] = 2;
        input.extend_from_slice(&mem);
        device(&input).unwrap();
    }

    /// An image file with cache=none, both engines: on queue 0 a read
    /// into a buffer O_DIRECT cannot take (the page cache's way, under
    /// the gate alone), on queue 1 an aligned write (O_DIRECT), kicked in
    /// turn. Every request is answered and the gate is left idle.
    #[test]
    fn direct_and_buffered_requests_on_an_image_file_leave_the_gate_idle() {
        const W: u16 = 2;
        for engine in [0, URING] {
            let mut input = vec![FILE_DIRECT | TWO_QUEUES | engine];
            input.extend_from_slice(&ring_input(&[&[
                (DATA, 16, 0),
                (DATA + 0x201, 512, W),
                (DATA + 0x1000, 1, W),
            ]]));
            input.extend_from_slice(&ring_input(&[&[
                (DATA + 0x20, 16, 0),
                (DATA + 0x400, 512, 0),
                (DATA + 0x1001, 1, W),
            ]]));
            input.extend_from_slice(&[4, OP_KICK, OP_KICK | 1, OP_REAP, OP_REAP | 1]);
            let mut mem = vec![0u8; 0x30];
            mem[8] = 1; // read sector 1
            mem[0x20] = 1; // VIRTIO_BLK_T_OUT
            mem[0x28] = 2; // sector 2
            input.extend_from_slice(&mem);
            let ran = device(&input).unwrap();
            // It must have run wherever the temporary directory takes
            // O_DIRECT (not on tmpfs).
            let probe = std::env::temp_dir().join("hakoniwa-fuzz-block-probe");
            std::fs::write(&probe, [0u8; 512]).unwrap();
            let direct = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&probe)
                .is_ok();
            let _ = std::fs::remove_file(&probe);
            assert_eq!(ran, direct, "engine {engine}");
        }
    }

    #[test]
    fn a_head_offered_twice_while_in_flight_is_answered_once() {
        const W: u16 = 2;
        // A read of sector 1 through the engine, its head offered twice
        // in one kick: the second must not replace the first in flight
        // (the handler's in-flight count must come back to 0).
        let mut ring =
            ring_input(&[&[(DATA, 16, 0), (DATA + 0x100, 512, W), (DATA + 0x400, 1, W)]]);
        ring[..2].copy_from_slice(&2u16.to_le_bytes());
        let mut input = vec![0];
        input.extend_from_slice(&ring);
        input.extend_from_slice(&ring_input(&[]));
        input.extend_from_slice(&[1, OP_KICK]);
        let mut mem = vec![0u8; 0x10];
        mem[8] = 1;
        input.extend_from_slice(&mem);
        device(&input).unwrap();
    }
}
