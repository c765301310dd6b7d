//! Test helpers shared by the rng, balloon and input tests: a minimal
//! driver side of a split virtqueue (built on virtio-queue's
//! `MockSplitQueue` layout) and an interrupt that records what it is told.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
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
    mock: MockSplitQueue<'a, GuestMemoryMmap>,
    size: u16,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
}

impl<'a> Driver<'a> {
    /// A queue of `size` entries laid out from `base`.
    pub fn new(mem: &'a GuestMemoryMmap, base: GuestAddress, size: u16) -> Driver<'a> {
        Driver {
            mem,
            mock: MockSplitQueue::create(mem, base, size),
            size,
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    /// The device side of the queue, as the transport would hand it over,
    /// and a clone of its kick eventfd.
    pub fn queue_events(&self, index: u16) -> (QueueEvents, EventFd) {
        let queue: Queue = self.mock.create_queue().unwrap();
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let test_kick = kick.try_clone().unwrap();
        (QueueEvents { index, queue, kick }, test_kick)
    }

    fn write_desc(&self, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = self
            .mock
            .desc_table_addr()
            .unchecked_add(16 * u64::from(index));
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
        let avail = self.mock.avail_addr();
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

    /// Makes available a writable descriptor whose `next` is itself.
    pub fn add_looping(&mut self, addr: u64, len: u32) -> u16 {
        let head = self.next_desc;
        self.next_desc = (self.next_desc + 1) % self.size;
        self.write_desc(head, addr, len, F_WRITE | F_NEXT, head);
        self.publish(head);
        head
    }

    /// Makes available a head index past the end of the descriptor table.
    pub fn add_bad_head(&mut self) {
        let head = self.size + 3;
        self.publish(head);
    }

    /// The used-ring entries (id, len) added since the last call.
    pub fn used(&mut self) -> Vec<(u32, u32)> {
        let used = self.mock.used_addr();
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
