//! Test helpers shared by the rng, balloon and input tests: a minimal
//! driver side of a split virtqueue and an interrupt that records what it
//! is told.
//!
//! virtio-queue's `MockSplitQueue` is not used for the layout: it places
//! the used ring `size` bytes after the start of the available ring instead
//! of `2 * size + 6`, so the device's used-ring writes land on the
//! available ring's entries and `used_event`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::virtio::{QueueEvents, VirtioInterrupt};
use crate::GuestMemoryMmap;

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;

/// How long a test waits for the device's worker before failing.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);

/// One buffer of a chain.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub addr: u64,
    pub len: u32,
    pub write: bool,
}

impl Seg {
    /// A device-readable buffer.
    pub fn r(addr: u64, len: u32) -> Seg {
        Seg {
            addr,
            len,
            write: false,
        }
    }

    /// A device-writable buffer.
    pub fn w(addr: u64, len: u32) -> Seg {
        Seg {
            addr,
            len,
            write: true,
        }
    }
}

/// The driver side of one split queue.
pub(crate) struct Driver<'a> {
    mem: &'a GuestMemoryMmap,
    desc_table: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    size: u16,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
}

impl<'a> Driver<'a> {
    /// A queue of `size` entries laid out from `base` (zeroed).
    pub fn new(mem: &'a GuestMemoryMmap, base: GuestAddress, size: u16) -> Driver<'a> {
        let size64 = u64::from(size);
        let avail = base.unchecked_add(16 * size64);
        // flags, idx, ring[size], used_event; the used ring is 4-aligned.
        let used = GuestAddress((avail.raw_value() + 6 + 2 * size64 + 3) & !3);
        let end = used.raw_value() + 6 + 8 * size64;
        let zeros = vec![0u8; (end - base.raw_value()) as usize];
        mem.write_slice(&zeros, base).unwrap();
        Driver {
            mem,
            desc_table: base,
            avail,
            used,
            size,
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    /// The device side of the queue, as the transport would hand it over,
    /// and a clone of its kick eventfd.
    pub fn queue_events(&self, index: u16) -> (QueueEvents, EventFd) {
        let mut queue = Queue::new(self.size).unwrap();
        queue.set_size(self.size);
        let split = |a: GuestAddress| (Some(a.0 as u32), Some((a.0 >> 32) as u32));
        let (lo, hi) = split(self.desc_table);
        queue.set_desc_table_address(lo, hi);
        let (lo, hi) = split(self.avail);
        queue.set_avail_ring_address(lo, hi);
        let (lo, hi) = split(self.used);
        queue.set_used_ring_address(lo, hi);
        queue.set_ready(true);
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let test_kick = kick.try_clone().unwrap();
        (QueueEvents { index, queue, kick }, test_kick)
    }

    fn write_desc(&self, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = self.desc_table.unchecked_add(16 * u64::from(index));
        self.mem.write_obj(addr.to_le(), at).unwrap();
        self.mem
            .write_obj(len.to_le(), at.unchecked_add(8))
            .unwrap();
        self.mem
            .write_obj(flags.to_le(), at.unchecked_add(12))
            .unwrap();
        self.mem
            .write_obj(next.to_le(), at.unchecked_add(14))
            .unwrap();
    }

    fn publish(&mut self, head: u16) {
        let avail = self.avail;
        let slot = avail.unchecked_add(4 + 2 * u64::from(self.avail_idx % self.size));
        self.mem.write_obj(head.to_le(), slot).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.mem
            .write_obj(self.avail_idx.to_le(), avail.unchecked_add(2))
            .unwrap();
    }

    /// Makes a chain of `segs` available; returns its head index.
    pub fn add(&mut self, segs: &[Seg]) -> u16 {
        let head = self.next_desc;
        for (i, seg) in segs.iter().enumerate() {
            let index = self.next_desc;
            self.next_desc = (self.next_desc + 1) % self.size;
            let last = i + 1 == segs.len();
            let mut flags = if seg.write { F_WRITE } else { 0 };
            if !last {
                flags |= F_NEXT;
            }
            let next = if last { 0 } else { self.next_desc };
            self.write_desc(index, seg.addr, seg.len, flags, next);
        }
        self.publish(head);
        head
    }

    /// Makes available a descriptor whose `next` is itself.
    pub fn add_looping(&mut self, addr: u64, len: u32, write: bool) -> u16 {
        let head = self.next_desc;
        self.next_desc = (self.next_desc + 1) % self.size;
        let flags = if write { F_WRITE | F_NEXT } else { F_NEXT };
        self.write_desc(head, addr, len, flags, head);
        self.publish(head);
        head
    }

    /// Makes available a head index past the end of the descriptor table.
    pub fn add_bad_head(&mut self) {
        let head = self.size + 3;
        self.publish(head);
    }

    /// Overwrites the driver's available index (a broken driver).
    pub fn set_avail_idx(&mut self, idx: u16) {
        self.avail_idx = idx;
        self.mem
            .write_obj(idx.to_le(), self.avail.unchecked_add(2))
            .unwrap();
    }

    /// Sets `used_event` (EVENT_IDX): interrupt once the used index passes it.
    pub fn set_used_event(&self, value: u16) {
        let at = self.avail.unchecked_add(4 + 2 * u64::from(self.size));
        self.mem.write_obj(value.to_le(), at).unwrap();
    }

    /// The used-ring entries (id, len) added since the last call.
    pub fn used(&mut self) -> Vec<(u32, u32)> {
        let used = self.used;
        let idx: u16 = u16::from_le(self.mem.read_obj(used.unchecked_add(2)).unwrap());
        let mut out = Vec::new();
        while self.used_seen != idx {
            let at = used.unchecked_add(4 + 8 * u64::from(self.used_seen % self.size));
            let id: u32 = u32::from_le(self.mem.read_obj(at).unwrap());
            let len: u32 = u32::from_le(self.mem.read_obj(at.unchecked_add(4)).unwrap());
            out.push((id, len));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }

    /// Waits until `n` used entries arrived; fails the test on timeout.
    pub fn wait_used(&mut self, n: usize) -> Vec<(u32, u32)> {
        let start = Instant::now();
        let mut out = Vec::new();
        while out.len() < n {
            out.extend(self.used());
            if start.elapsed() > TIMEOUT {
                panic!("only {} of {n} used entries arrived: {out:?}", out.len());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        out
    }
}

/// Runs `f` (e.g. a device reset, which joins its worker) on another
/// thread and fails the test if it does not finish in time.
pub(crate) fn finishes<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(TIMEOUT)
        .unwrap_or_else(|_| panic!("{what} did not finish"))
}

/// Waits until `f` holds; fails the test on timeout.
pub(crate) fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > TIMEOUT {
            panic!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Records the interrupts a device raises.
#[derive(Default)]
pub(crate) struct RecordingInterrupt {
    queues: Mutex<Vec<u16>>,
    config: AtomicUsize,
}

impl RecordingInterrupt {
    /// How many times queue `index` was notified.
    pub fn queue_count(&self, index: u16) -> usize {
        self.queues
            .lock()
            .unwrap()
            .iter()
            .filter(|q| **q == index)
            .count()
    }

    /// How many configuration-change interrupts were raised.
    pub fn config_count(&self) -> usize {
        self.config.load(Ordering::SeqCst)
    }
}

impl VirtioInterrupt for RecordingInterrupt {
    fn notify_queue(&self, queue: u16) {
        self.queues.lock().unwrap().push(queue);
    }

    fn notify_config(&self) {
        self.config.fetch_add(1, Ordering::SeqCst);
    }
}
