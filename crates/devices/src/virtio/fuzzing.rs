//! What the virtio devices' `fuzzing` modules share (not an API): a small
//! guest memory with a hole, split virtqueues laid out in it from fuzz
//! input, and a reader that takes the input apart.

use std::sync::atomic::{AtomicUsize, Ordering};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{QueueEvents, VirtioInterrupt};
use crate::GuestMemoryMmap;

/// The first region of guest memory: 0 to here (rings and data).
pub const REGION1_END: u64 = 0x1_0000;
/// The second region, after a hole, so buffers can straddle and miss
/// memory.
pub const REGION2: u64 = 0x2_0000;
pub const REGION2_END: u64 = 0x2_4000;
/// Where fuzzed guest memory contents start (below: the rings).
pub const DATA: u64 = 0x1000;

/// 64 KiB at 0 and 16 KiB at 128 KiB.
pub fn guest_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), REGION1_END as usize),
        (GuestAddress(REGION2), (REGION2_END - REGION2) as usize),
    ])
    .expect("a 80 KiB guest memory")
}

/// Takes fuzz input apart; past its end every read is zero.
pub struct Input<'a>(pub &'a [u8]);

impl<'a> Input<'a> {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    pub fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }

    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }

    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

/// Where one split queue of [`RING_SIZE`] entries lies.
#[derive(Clone, Copy, Debug)]
pub struct Ring {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

/// The size the driver gives every fuzzed queue.
pub const RING_SIZE: u16 = 16;
/// Bytes of input [`Ring::write_from`] takes: the available ring's index,
/// its entries, then the descriptor table.
pub const RING_INPUT_LEN: usize = 2 + 2 * RING_SIZE as usize + 16 * RING_SIZE as usize;

impl Ring {
    /// The `n`th of the rings that lie one after the other from 0, each in
    /// 0x400 bytes (descriptors, available ring, used ring).
    pub fn nth(n: u64) -> Ring {
        let base = n * 0x400;
        Ring {
            desc: base,
            avail: base + 0x100,
            used: base + 0x200,
        }
    }

    /// Writes the ring from `input` as a driver (a broken one) would: the
    /// available index, the heads it offers and the descriptors. A head
    /// without its top bit is taken modulo the size, as is a descriptor's
    /// `next`, to reach chains more often; an address or length without
    /// its top bit is folded into the guest address space, with it it is
    /// taken as is.
    pub fn write_from(&self, mem: &GuestMemoryMmap, input: &mut Input) {
        let avail_idx = input.u16();
        for i in 0..u64::from(RING_SIZE) {
            let mut head = input.u16();
            if head >> 15 == 0 {
                head %= RING_SIZE;
            }
            let _ = mem.write_obj(head.to_le(), GuestAddress(self.avail + 4 + 2 * i));
        }
        let _ = mem.write_obj(avail_idx.to_le(), GuestAddress(self.avail + 2));
        for i in 0..u64::from(RING_SIZE) {
            let mut addr = input.u64();
            let mut len = input.u32();
            let flags = input.u16();
            let mut next = input.u16();
            if addr >> 63 == 0 {
                addr %= REGION2_END + 0x1000;
            }
            if len >> 31 == 0 {
                len %= 0x1_0000;
            }
            if next >> 15 == 0 {
                next %= RING_SIZE;
            }
            let mut desc = [0u8; 16];
            desc[0..8].copy_from_slice(&addr.to_le_bytes());
            desc[8..12].copy_from_slice(&len.to_le_bytes());
            desc[12..14].copy_from_slice(&flags.to_le_bytes());
            desc[14..16].copy_from_slice(&next.to_le_bytes());
            let _ = mem.write_slice(&desc, GuestAddress(self.desc + 16 * i));
        }
    }

    /// The device's side of the ring, ready, with a maximum size of `max`.
    pub fn queue(&self, max: u16, event_idx: bool) -> Queue {
        let mut queue = Queue::new(max).expect("a valid maximum queue size");
        queue.set_size(RING_SIZE);
        queue.set_desc_table_address(Some(self.desc as u32), Some(0));
        queue.set_avail_ring_address(Some(self.avail as u32), Some(0));
        queue.set_used_ring_address(Some(self.used as u32), Some(0));
        queue.set_event_idx(event_idx);
        queue.set_ready(true);
        queue
    }

    /// The ring as a device's queue `index` (its side, with
    /// [`Self::queue`], and a kick eventfd), as activation hands it over.
    pub fn queue_events(
        &self,
        index: u16,
        max: u16,
        event_idx: bool,
    ) -> std::io::Result<QueueEvents> {
        Ok(QueueEvents {
            index,
            queue: self.queue(max, event_idx),
            kick: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// The used ring's index.
    pub fn used_idx(&self, mem: &GuestMemoryMmap) -> u16 {
        mem.read_obj::<u16>(GuestAddress(self.used + 2))
            .map(u16::from_le)
            .unwrap_or(0)
    }

    /// Entry `n` (modulo the size) of the used ring: (id, len).
    pub fn used_entry(&self, mem: &GuestMemoryMmap, n: u16) -> (u32, u32) {
        let at = self.used + 4 + 8 * u64::from(n % RING_SIZE);
        let id = mem.read_obj::<u32>(GuestAddress(at)).unwrap_or(0);
        let len = mem.read_obj::<u32>(GuestAddress(at + 4)).unwrap_or(0);
        (u32::from_le(id), u32::from_le(len))
    }

    /// The used ring's entries as far as its index says, at most a ring's
    /// worth (an index past the size has wrapped over the first ones).
    pub fn used_entries<'a>(
        &'a self,
        mem: &'a GuestMemoryMmap,
    ) -> impl Iterator<Item = (u32, u32)> + 'a {
        (0..self.used_idx(mem).min(RING_SIZE)).map(move |n| self.used_entry(mem, n))
    }
}

/// The first `N` rings ([`Ring::nth`]), written from `input` in turn
/// ([`Ring::write_from`]): a device's queues, in index order.
pub fn rings_from<const N: usize>(mem: &GuestMemoryMmap, input: &mut Input) -> [Ring; N] {
    std::array::from_fn(|n| {
        let ring = Ring::nth(n as u64);
        ring.write_from(mem, input);
        ring
    })
}

/// Input for [`Ring::write_from`] offering `chains`, each a list of
/// (address, length, flags) descriptors chained in table order (for
/// seeds and tests).
pub fn ring_input(chains: &[&[(u64, u32, u16)]]) -> Vec<u8> {
    let mut heads = Vec::new();
    let mut table = Vec::new();
    for chain in chains {
        heads.push(table.len() as u16);
        for (i, &(addr, len, flags)) in chain.iter().enumerate() {
            let next = u16::from(i + 1 < chain.len());
            table.push((addr, len, flags | next, table.len() as u16 + 1));
        }
    }
    let mut out = (heads.len() as u16).to_le_bytes().to_vec();
    for i in 0..usize::from(RING_SIZE) {
        out.extend_from_slice(&heads.get(i).copied().unwrap_or(0).to_le_bytes());
    }
    for i in 0..usize::from(RING_SIZE) {
        let (addr, len, flags, next) = table.get(i).copied().unwrap_or_default();
        out.extend_from_slice(&addr.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&next.to_le_bytes());
    }
    debug_assert_eq!(out.len(), RING_INPUT_LEN);
    out
}

/// Writes the rest of the input into guest memory from [`DATA`].
pub fn write_data(mem: &GuestMemoryMmap, input: &mut Input) {
    let n = input.0.len().min((REGION1_END - DATA) as usize);
    let _ = mem.write_slice(input.bytes(n), GuestAddress(DATA));
}

/// Counts the interrupts a device raises.
#[derive(Default)]
pub struct CountingInterrupt {
    pub queue: AtomicUsize,
    pub config: AtomicUsize,
}

impl VirtioInterrupt for CountingInterrupt {
    fn notify_queue(&self, _queue: u16) {
        self.queue.fetch_add(1, Ordering::Relaxed);
    }

    fn notify_config(&self) {
        self.config.fetch_add(1, Ordering::Relaxed);
    }
}
