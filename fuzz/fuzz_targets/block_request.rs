//! Fuzzes the virtio-blk request path: the input becomes a descriptor
//! table and the bytes of guest memory, the driver offers one chain, and
//! the device parses and starts it (`process_chain`: completed at once,
//! or an I/O engine op — iovecs over the chain's guest buffers, or a
//! bounce buffer — run with the threads engine's blocking calls, then
//! finished), against an in-memory disk (bounce buffers) or an image file
//! (iovecs straight over guest memory). It must never panic, never change
//! a read-only disk, and complete with a length that fits the chain's
//! writable buffers.
//!
//! Input layout:
//! - byte 0: bit 0 read-only, bit 1 DISCARD, bit 2 WRITE_ZEROES, bit 3
//!   FLUSH negotiated, bit 4 an image file instead of the in-memory disk;
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
use std::sync::OnceLock;

use devices::virtio::block::{
    process_chain_counted, AlignedBuf, BlockConfig, DiskBackend, FileDisk, MemDisk, Outcome,
    RequestContext,
};
use devices::GuestMemoryMmap;
use virtio_queue::{Queue, QueueT};
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

fuzz_target!(|input: &[u8]| {
    if input.len() < 2 + 16 * QUEUE_SIZE as usize {
        return;
    }
    let (control, head) = (input[0], u16::from(input[1]) % QUEUE_SIZE);
    let (table, contents) = input[2..].split_at(16 * QUEUE_SIZE as usize);

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

    let mut queue = Queue::new(QUEUE_SIZE).unwrap();
    queue.set_size(QUEUE_SIZE);
    queue.set_desc_table_address(Some(DESC_TABLE as u32), Some(0));
    queue.set_avail_ring_address(Some(AVAIL as u32), Some(0));
    queue.set_used_ring_address(Some(USED as u32), Some(0));
    queue.set_ready(true);
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

    let original: Vec<u8> = (0..DISK_SIZE).map(|i| (i * 7 % 251) as u8).collect();
    let readonly = control & 1 != 0;
    let disk: Box<dyn Disk> = if control & 16 != 0 {
        let path = image_path();
        std::fs::write(path, &original).unwrap();
        let mut config = BlockConfig::new(path);
        config.readonly = readonly;
        Box::new(File(FileDisk::open(&config).unwrap()))
    } else {
        Box::new(MemDisk::from_bytes(original.clone()))
    };
    let acked = (u64::from(control & 2 != 0) << 13)
        | (u64::from(control & 4 != 0) << 14)
        | (u64::from(control & 8 != 0) << 9);
    let ctx = RequestContext {
        disk: disk.backend(),
        capacity: (DISK_SIZE / 512) as u64,
        readonly,
        acked_features: acked,
        serial: *b"fuzz-serial-00000000",
        errors: Default::default(),
    };
    let counted = process_chain_counted(chain, &mem, &ctx, &mut AlignedBuf::new(4096));
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

/// The image file of this fuzzing process.
fn image_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("hakoniwa-fuzz-{}.img", std::process::id()))
    })
}

/// Either disk, and what it holds.
trait Disk {
    fn backend(&self) -> &dyn DiskBackend;
    fn contents(&self) -> Vec<u8>;
}

impl Disk for MemDisk {
    fn backend(&self) -> &dyn DiskBackend {
        self
    }
    fn contents(&self) -> Vec<u8> {
        MemDisk::contents(self)
    }
}

struct File(FileDisk);

impl Disk for File {
    fn backend(&self) -> &dyn DiskBackend {
        &self.0
    }
    fn contents(&self) -> Vec<u8> {
        std::fs::read(self.0.path()).unwrap()
    }
}
