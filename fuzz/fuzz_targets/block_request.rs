//! Fuzzes the virtio-blk request path the device's queue threads take:
//! the input becomes a descriptor table and the bytes of guest memory,
//! the driver offers one chain, and the device parses and starts it
//! (`request::begin`): completed at once, run alone (an access O_DIRECT
//! cannot take), or an I/O engine op — iovecs over the chain's guest
//! buffers, or a bounce buffer — which one of the device's engines runs
//! (the io_uring engine, the threads engine, or the threads engine's
//! blocking calls inline as `process_chain` does) before
//! `PendingIo::finish` completes it, against an in-memory disk (bounce
//! buffers) or an image file, buffered or O_DIRECT (iovecs straight over
//! guest memory). It must never panic, never change a read-only disk,
//! and complete with a length that fits the chain's writable buffers;
//! through an engine it must also do exactly what `process_chain` does on
//! an in-memory copy: the same completion and, when it succeeded, the
//! same guest memory and (DISCARD and WRITE_ZEROES not negotiated, so
//! the disks' own ways of deallocating cannot differ) the same disk.
//!
//! Input layout:
//! - byte 0: bit 0 read-only, bit 1 DISCARD, bit 2 WRITE_ZEROES, bit 3
//!   FLUSH negotiated, bit 4 an image file instead of the in-memory disk,
//!   bit 5 the file with cache=none (O_DIRECT), bits 6-7 who runs the
//!   op: 0 `process_chain`, 1 the threads engine, 2 and 3 the io_uring
//!   engine (the threads engine for the in-memory disk, as the device
//!   chooses, or where the kernel refuses io_uring);
//! - byte 1: the head descriptor index (mod 16);
//! - 16 descriptors of 16 bytes (addr, len, flags, next, little-endian),
//!   written to the descriptor table; an address or length without its
//!   top bit is folded into the guest address space to reach memory more
//!   often, with it it is taken as is;
//! - the rest: guest memory contents from 0x1000 (headers, data,
//!   indirect tables).
#![no_main]

use libfuzzer_sys::fuzz_target;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use devices::affinity::ThreadPlacement;
use devices::virtio::block::engine::threads::ThreadsEngine;
use devices::virtio::block::engine::uring::UringEngine;
use devices::virtio::block::engine::{wait_for_completions, IoEngine, KernelRings};
use devices::virtio::block::request::{begin, Completion, Started};
use devices::virtio::block::{
    process_chain, process_chain_counted, AlignedBuf, BlockConfig, CacheMode, DiskBackend,
    FileDisk, MemDisk, Outcome, Processed, RequestContext,
};
use devices::GuestMemoryMmap;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

const QUEUE_SIZE: u16 = 16;
const DESC_TABLE: u64 = 0;
const AVAIL: u64 = 0x100;
const USED: u64 = 0x200;
const DATA: u64 = 0x1000;
// Two regions with a hole, so chains can straddle and miss memory.
const REGION1_END: u64 = 0x1_0000;
const REGION2: u64 = 0x2_0000;
const REGION2_END: u64 = 0x2_4000;
const DISK_SIZE: usize = 64 * 512;
const SERIAL: [u8; 20] = *b"fuzz-serial-00000000";

fuzz_target!(|input: &[u8]| {
    if input.len() < 2 + 16 * QUEUE_SIZE as usize {
        return;
    }
    let (control, head) = (input[0], u16::from(input[1]) % QUEUE_SIZE);
    let (table, contents) = input[2..].split_at(16 * QUEUE_SIZE as usize);
    let mem = guest_memory(table, contents, head);
    let mut queue = queue();
    let Some(chain) = queue.pop_descriptor_chain(&mem) else {
        return;
    };
    // What the chain may receive: its writable buffers (walked the way the
    // device walks them, including indirect tables).
    let writable: u64 = chain
        .clone()
        .filter(|d| d.is_write_only())
        .map(|d| u64::from(d.len()))
        .sum();

    let original = original();
    let readonly = control & 1 != 0;
    let disk = if control & 16 != 0 {
        let path = image_path();
        std::fs::write(path, &original).unwrap();
        let mut config = BlockConfig::new(path);
        config.readonly = readonly;
        if control & 32 != 0 {
            config.cache = CacheMode::None;
        }
        Image::File(Arc::new(FileDisk::open(&config).unwrap()))
    } else {
        Image::Mem(Arc::new(MemDisk::from_bytes(original.clone())))
    };
    let ctx = RequestContext {
        disk: disk.backend(),
        capacity: (DISK_SIZE / 512) as u64,
        readonly,
        acked_features: acked_features(control),
        serial: SERIAL,
        errors: Default::default(),
    };
    // Who runs the op; io_uring needs the file's descriptor (and a
    // kernel that allows it), as when the device chooses.
    let engine: Option<Box<dyn IoEngine>> = match control >> 6 {
        0 => None,
        path => {
            let uring = match &disk {
                Image::File(file) if path >= 2 => {
                    UringEngine::new(&KernelRings, 4, file.clone()).ok()
                }
                _ => None,
            };
            Some(match uring {
                Some(uring) => Box::new(uring),
                None => Box::new(
                    ThreadsEngine::new("fuzz-io", 1, disk.shared(), ThreadPlacement::anywhere())
                        .unwrap(),
                ),
            })
        }
    };
    let counted = match engine {
        None => process_chain_counted(chain, &mem, &ctx, &mut AlignedBuf::new(4096)),
        Some(mut engine) => {
            let counted = through_engine(chain, &mem, &ctx, engine.as_mut());
            assert_eq!(engine.in_flight(), 0);
            drop(engine);
            same_as_process_chain(
                &counted.completion,
                &mem,
                &disk,
                control,
                table,
                contents,
                head,
            );
            counted
        }
    };
    let done = counted.completion;

    assert!(
        u64::from(done.used_len) <= writable,
        "{done:?} > {writable}"
    );
    assert_eq!(done.status.is_none(), done.used_len == 0, "{done:?}");
    if readonly {
        assert!(disk.contents() == original, "a read-only disk changed");
    }
    // What the statistics count agrees with what the guest was told.
    assert_eq!(
        done.status == Some(0),
        counted.outcome == Outcome::Ok,
        "{counted:?}"
    );
    assert!(
        counted.outcome == Outcome::Ok || counted.bytes == 0,
        "{counted:?}"
    );
    assert!(counted.bytes <= DISK_SIZE as u64, "{counted:?}");
});

/// Guest memory holding the descriptor `table` (addresses and lengths
/// folded as the input layout says), `contents` from [`DATA`] on, and an
/// available ring that offers the chain at `head`.
fn guest_memory(table: &[u8], contents: &[u8], head: u16) -> GuestMemoryMmap {
    let mem = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), REGION1_END as usize),
        (GuestAddress(REGION2), (REGION2_END - REGION2) as usize),
    ])
    .unwrap();
    for (i, d) in table.chunks_exact(16).enumerate() {
        let mut addr = u64::from_le_bytes(d[0..8].try_into().unwrap());
        let mut len = u32::from_le_bytes(d[8..12].try_into().unwrap());
        if addr >> 63 == 0 {
            addr %= REGION2_END + 0x1000;
        }
        if len >> 31 == 0 {
            len %= 0x1_0000;
        }
        let mut desc = [0u8; 16];
        desc[0..8].copy_from_slice(&addr.to_le_bytes());
        desc[8..12].copy_from_slice(&len.to_le_bytes());
        desc[12..16].copy_from_slice(&d[12..16]);
        mem.write_slice(&desc, GuestAddress(DESC_TABLE + 16 * i as u64))
            .unwrap();
    }
    let n = contents.len().min((REGION1_END - DATA) as usize);
    mem.write_slice(&contents[..n], GuestAddress(DATA)).unwrap();
    // The available ring offers one chain.
    mem.write_obj(head.to_le(), GuestAddress(AVAIL + 4))
        .unwrap();
    mem.write_obj(1u16.to_le(), GuestAddress(AVAIL + 2))
        .unwrap();
    mem
}

/// The device's queue over [`guest_memory`]'s rings.
fn queue() -> Queue {
    let mut queue = Queue::new(QUEUE_SIZE).unwrap();
    queue.set_size(QUEUE_SIZE);
    queue.set_desc_table_address(Some(DESC_TABLE as u32), Some(0));
    queue.set_avail_ring_address(Some(AVAIL as u32), Some(0));
    queue.set_used_ring_address(Some(USED as u32), Some(0));
    queue.set_ready(true);
    queue
}

/// What a queue thread does with a chain: begin it; an op goes to
/// `engine` and is finished from its completion; an access O_DIRECT
/// cannot take runs alone.
fn through_engine(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    ctx: &RequestContext,
    engine: &mut dyn IoEngine,
) -> Processed {
    match begin(chain, mem, ctx) {
        Started::Done(processed) => processed,
        Started::Io(pending, op) => {
            engine.submit(7, op);
            engine.kick();
            let mut done = Vec::new();
            while done.is_empty() {
                assert!(
                    wait_for_completions(engine, Duration::from_secs(10)),
                    "the engine never completed the op"
                );
                engine.reap(&mut done);
            }
            let done = done.pop().unwrap();
            assert_eq!(done.token, 7);
            pending.finish(done.op, done.result, mem, ctx)
        }
        Started::Alone(request) => request.execute_counted(mem, ctx, &mut AlignedBuf::new(4096)),
    }
}

/// Checks that `process_chain` on an in-memory disk, from the same input,
/// completes as the engine did (`done`, leaving `mem` and `disk`), and,
/// where that succeeded, leaves the same guest memory and disk.
fn same_as_process_chain(
    done: &Completion,
    mem: &GuestMemoryMmap,
    disk: &Image,
    control: u8,
    table: &[u8],
    contents: &[u8],
    head: u16,
) {
    let reference_mem = guest_memory(table, contents, head);
    let mut queue = queue();
    let chain = queue.pop_descriptor_chain(&reference_mem).unwrap();
    let reference_disk = MemDisk::from_bytes(original());
    let ctx = RequestContext {
        disk: &reference_disk,
        capacity: (DISK_SIZE / 512) as u64,
        readonly: control & 1 != 0,
        acked_features: acked_features(control),
        serial: SERIAL,
        errors: Default::default(),
    };
    let reference = process_chain(chain, &reference_mem, &ctx, &mut AlignedBuf::new(4096));
    assert_eq!(
        (done.status, done.used_len),
        (reference.status, reference.used_len),
        "the engine's completion differs from process_chain's"
    );
    if done.status != Some(0) {
        return;
    }
    for (start, end) in [(0, REGION1_END), (REGION2, REGION2_END)] {
        let len = (end - start) as usize;
        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
        mem.read_slice(&mut a, GuestAddress(start)).unwrap();
        reference_mem
            .read_slice(&mut b, GuestAddress(start))
            .unwrap();
        assert!(a == b, "guest memory differs from process_chain's");
    }
    if control & 6 == 0 {
        assert!(
            disk.contents() == reference_disk.contents(),
            "the disk differs from process_chain's"
        );
    }
}

/// The disk's contents before the request.
fn original() -> Vec<u8> {
    (0..DISK_SIZE).map(|i| (i * 7 % 251) as u8).collect()
}

/// The features byte 0 of the input negotiates: DISCARD (13),
/// WRITE_ZEROES (14), FLUSH (9).
fn acked_features(control: u8) -> u64 {
    (u64::from(control & 2 != 0) << 13)
        | (u64::from(control & 4 != 0) << 14)
        | (u64::from(control & 8 != 0) << 9)
}

/// The image file of this fuzzing process.
fn image_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("hakoniwa-fuzz-{}.img", std::process::id()))
    })
}

/// Either disk, shared with an engine.
enum Image {
    Mem(Arc<MemDisk>),
    File(Arc<FileDisk>),
}

impl Image {
    fn backend(&self) -> &dyn DiskBackend {
        match self {
            Image::Mem(m) => m.as_ref(),
            Image::File(f) => f.as_ref(),
        }
    }

    fn shared(&self) -> Arc<dyn DiskBackend> {
        match self {
            Image::Mem(m) => m.clone(),
            Image::File(f) => f.clone(),
        }
    }

    /// What it holds.
    fn contents(&self) -> Vec<u8> {
        match self {
            Image::Mem(m) => m.contents(),
            Image::File(f) => std::fs::read(f.path()).unwrap(),
        }
    }
}
