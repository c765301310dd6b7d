//! What every virtio device's tests drive it with: the driver side of a
//! split virtqueue in guest memory ([`DriverQueue`]), an interrupt that
//! records what it is told ([`RecordingInterrupt`]), and waiting helpers.
//!
//! A queue is laid out as a virtio 1.x driver lays it out ([`SplitLayout`],
//! virtio 1.2 §2.7), for any size up to 32768 entries. virtio-queue's
//! `MockSplitQueue` is not used: it starts the used ring `size` bytes
//! after the available ring's entries instead of after the whole ring
//! (`2 * size` bytes of entries and `used_event`), so for every size the
//! device's used-ring writes land on the second half of the available
//! ring and on `used_event`; tests that never used more than a few
//! entries of a 16-entry queue did not notice.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{QueueEvents, VirtioInterrupt};
use crate::GuestMemoryMmap;

/// How long a test waits for a device's threads before failing.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);

/// The largest queue a split virtqueue can have.
pub(crate) const MAX_QUEUE_SIZE: u16 = 32768;

/// 32 MiB of guest memory at 0.
pub(crate) fn guest_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 32 << 20)]).unwrap()
}

/// Where the three parts of a split virtqueue of `size` entries lie
/// (virtio 1.2 §2.7, "Split Virtqueues"):
///
/// | part             | alignment | size          |
/// |------------------|-----------|---------------|
/// | descriptor table | 16        | `16 * size`   |
/// | available ring   | 2         | `6 + 2 * size`|
/// | used ring        | 4         | `6 + 8 * size`|
///
/// The available ring is `flags`, `idx`, `ring[size]`, `used_event`; the
/// used ring `flags`, `idx`, `ring[size]` of (`id`, `len`), `avail_event`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SplitLayout {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

impl SplitLayout {
    /// The three parts one after the other from `base` (16-byte aligned),
    /// each at the first address its alignment allows.
    pub fn new(base: u64, size: u16) -> SplitLayout {
        assert!(
            size.is_power_of_two() && size <= MAX_QUEUE_SIZE,
            "a split queue has a power of two of entries, at most 32768, not {size}"
        );
        assert_eq!(base % 16, 0, "the descriptor table is 16-byte aligned");
        let n = u64::from(size);
        let desc = base;
        let avail = (desc + 16 * n).next_multiple_of(2);
        let used = (avail + 6 + 2 * n).next_multiple_of(4);
        SplitLayout {
            size,
            desc,
            avail,
            used,
        }
    }

    /// The first byte past the used ring.
    pub fn end(&self) -> u64 {
        self.used + 6 + 8 * u64::from(self.size)
    }

    /// The available ring's `used_event` (EVENT_IDX).
    pub fn used_event(&self) -> u64 {
        self.avail + 4 + 2 * u64::from(self.size)
    }

    /// The used ring's `avail_event` (EVENT_IDX).
    pub fn avail_event(&self) -> u64 {
        self.used + 4 + 8 * u64::from(self.size)
    }
}

/// One descriptor of a chain to build.
#[derive(Clone, Debug)]
pub(crate) enum D {
    /// Device-readable, holding these bytes (placed in the queue's data
    /// area).
    R(Vec<u8>),
    /// Device-writable, this many bytes of the data area, filled with
    /// 0xa5 first so that a test sees what the device wrote.
    W(u32),
    /// Any buffer: address, length, flags (NEXT is added as needed).
    Raw(u64, u32, u16),
}

impl D {
    /// A device-readable buffer at `addr`, as it is in memory.
    pub fn r(addr: u64, len: u32) -> D {
        D::Raw(addr, len, 0)
    }

    /// A device-writable buffer at `addr`.
    pub fn w(addr: u64, len: u32) -> D {
        D::Raw(addr, len, VRING_DESC_F_WRITE as u16)
    }
}

/// A used-ring entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Used {
    pub head: u16,
    pub len: u32,
}

/// The driver side of one split queue.
pub(crate) struct DriverQueue {
    mem: GuestMemoryMmap,
    layout: SplitLayout,
    /// The next descriptor a chain takes (descriptors are used in turn).
    next_desc: u16,
    avail_idx: u16,
    /// The used entries read so far.
    used_seen: u16,
    data_next: u64,
    data_end: u64,
    /// The queue's notification: [`DriverQueue::queue_events`] gives the
    /// device a clone, a test writes it to kick.
    pub kick: EventFd,
}

impl DriverQueue {
    /// A queue of `size` entries laid out from `base` (zeroed); chains
    /// give their buffers' addresses ([`D::r`], [`D::w`], [`D::Raw`]).
    pub fn new(mem: &GuestMemoryMmap, base: u64, size: u16) -> DriverQueue {
        DriverQueue::with_data(mem, base, size, 0, 0)
    }

    /// A queue as [`new`](DriverQueue::new) whose [`D::R`] and [`D::W`]
    /// buffers come from `data..data + data_len`.
    pub fn with_data(
        mem: &GuestMemoryMmap,
        base: u64,
        size: u16,
        data: u64,
        data_len: u64,
    ) -> DriverQueue {
        let layout = SplitLayout::new(base, size);
        assert!(
            data_len == 0 || layout.end() <= data || base >= data + data_len,
            "queue overlaps its data"
        );
        mem.write_slice(
            &vec![0u8; (layout.end() - base) as usize],
            GuestAddress(base),
        )
        .unwrap();
        DriverQueue {
            mem: mem.clone(),
            layout,
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
            data_next: data,
            data_end: data + data_len,
            kick: EventFd::new(EFD_NONBLOCK).unwrap(),
        }
    }

    /// Where the queue lies.
    pub fn layout(&self) -> SplitLayout {
        self.layout
    }

    /// The guest memory the queue lives in.
    pub fn memory(&self) -> GuestMemoryMmap {
        self.mem.clone()
    }

    /// The device's view of the queue as a transport sets it up for a new
    /// driver (ready, at position 0, no EVENT_IDX yet).
    pub fn queue(&self) -> Queue {
        let l = self.layout;
        let mut queue = Queue::new(l.size).unwrap();
        queue.try_set_size(l.size).unwrap();
        queue
            .try_set_desc_table_address(GuestAddress(l.desc))
            .unwrap();
        queue
            .try_set_avail_ring_address(GuestAddress(l.avail))
            .unwrap();
        queue
            .try_set_used_ring_address(GuestAddress(l.used))
            .unwrap();
        queue.set_ready(true);
        queue
    }

    /// The queue as the transport hands it to a device, with a clone of
    /// [`kick`](DriverQueue::kick).
    pub fn queue_events(&self, index: u16) -> QueueEvents {
        QueueEvents {
            index,
            queue: self.queue(),
            kick: self.kick.try_clone().unwrap(),
        }
    }

    /// Writes descriptor `index` of the table.
    pub fn write_descriptor(&self, index: u16, desc: RawDescriptor) {
        let at = self.layout.desc + 16 * u64::from(index);
        self.mem.write_obj(desc, GuestAddress(at)).unwrap();
    }

    fn alloc(&mut self, len: u32) -> u64 {
        let addr = self.data_next;
        self.data_next += u64::from(len).div_ceil(16) * 16 + 16;
        assert!(self.data_next <= self.data_end, "test data area exhausted");
        addr
    }

    /// Builds a chain on the next descriptors and makes it available
    /// (without kicking). Returns the head index and the address of each
    /// descriptor's buffer.
    pub fn add(&mut self, descs: &[D]) -> (u16, Vec<u64>) {
        let size = self.layout.size;
        let head = self.next_desc;
        let mut addrs = Vec::new();
        for (i, d) in descs.iter().enumerate() {
            let index = self.next_desc;
            self.next_desc = (self.next_desc + 1) % size;
            let (addr, len, mut flags) = match d {
                D::R(bytes) => {
                    let a = self.alloc(bytes.len() as u32);
                    self.mem.write_slice(bytes, GuestAddress(a)).unwrap();
                    (a, bytes.len() as u32, 0u16)
                }
                D::W(len) => {
                    let a = self.alloc(*len);
                    let poison = vec![0xa5u8; *len as usize];
                    self.mem.write_slice(&poison, GuestAddress(a)).unwrap();
                    (a, *len, VRING_DESC_F_WRITE as u16)
                }
                D::Raw(a, l, f) => (*a, *l, *f),
            };
            let next = if i + 1 < descs.len() {
                flags |= VRING_DESC_F_NEXT as u16;
                self.next_desc
            } else {
                0
            };
            self.write_descriptor(
                index,
                RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next)),
            );
            addrs.push(addr);
        }
        self.publish(head);
        (head, addrs)
    }

    /// Builds a chain and makes it available; returns its head index.
    pub fn offer(&mut self, descs: &[D]) -> u16 {
        self.add(descs).0
    }

    /// Adds a chain and kicks.
    pub fn add_kick(&mut self, descs: &[D]) -> (u16, Vec<u64>) {
        let added = self.add(descs);
        self.kick.write(1).unwrap();
        added
    }

    /// Makes available a descriptor whose `next` is itself.
    pub fn add_looping(&mut self, addr: u64, len: u32, write: bool) -> u16 {
        let head = self.next_desc;
        self.next_desc = (self.next_desc + 1) % self.layout.size;
        let mut flags = VRING_DESC_F_NEXT as u16;
        if write {
            flags |= VRING_DESC_F_WRITE as u16;
        }
        self.write_descriptor(
            head,
            RawDescriptor::from(SplitDescriptor::new(addr, len, flags, head)),
        );
        self.publish(head);
        head
    }

    /// Makes available a head index past the end of the descriptor table.
    pub fn add_bad_head(&mut self) {
        self.publish(self.layout.size + 3);
    }

    /// Puts `head` in the available ring (any value: tests use bad ones)
    /// and moves the available index past it.
    pub fn publish(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.layout.size);
        let at = self.layout.avail + 4 + 2 * slot;
        self.mem.write_obj(head.to_le(), GuestAddress(at)).unwrap();
        self.set_avail_idx(self.avail_idx.wrapping_add(1));
    }

    /// Sets the available index (after the entries it covers: a fence),
    /// also to values a broken driver would write.
    pub fn set_avail_idx(&mut self, idx: u16) {
        self.avail_idx = idx;
        std::sync::atomic::fence(Ordering::SeqCst);
        let at = self.layout.avail + 2;
        self.mem.write_obj(idx.to_le(), GuestAddress(at)).unwrap();
    }

    /// The driver's available index.
    pub fn avail_idx(&self) -> u16 {
        self.avail_idx
    }

    /// Sets `used_event` (EVENT_IDX): interrupt once the used index
    /// passes `value`.
    pub fn set_used_event(&self, value: u16) {
        let at = self.layout.used_event();
        self.mem.write_obj(value.to_le(), GuestAddress(at)).unwrap();
    }

    /// The device's `avail_event` (EVENT_IDX): the driver kicks when its
    /// available index passes it.
    pub fn avail_event(&self) -> u16 {
        let at = self.layout.avail_event();
        u16::from_le(self.mem.read_obj(GuestAddress(at)).unwrap())
    }

    /// The device's used index.
    pub fn used_idx(&self) -> u16 {
        let at = self.layout.used + 2;
        u16::from_le(self.mem.read_obj(GuestAddress(at)).unwrap())
    }

    /// The used entry (`id`, `len`) the device wrote for its `n`th used
    /// buffer (its slot is `n % size`; nothing is waited for).
    pub fn used_entry(&self, n: u16) -> (u32, u32) {
        let slot = u64::from(n % self.layout.size);
        let at = GuestAddress(self.layout.used + 4 + 8 * slot);
        let id: u32 = u32::from_le(self.mem.read_obj(at).unwrap());
        let len: u32 = u32::from_le(self.mem.read_obj(at.unchecked_add(4)).unwrap());
        (id, len)
    }

    /// The next used entry, if the device has returned one.
    pub fn next_used(&mut self) -> Option<Used> {
        if self.used_idx() == self.used_seen {
            return None;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        let (id, len) = self.used_entry(self.used_seen);
        self.used_seen = self.used_seen.wrapping_add(1);
        Some(Used {
            head: id as u16,
            len,
        })
    }

    /// The used entries (`id`, `len`) returned since the last look.
    pub fn used(&mut self) -> Vec<(u32, u32)> {
        std::iter::from_fn(|| self.next_used())
            .map(|u| (u32::from(u.head), u.len))
            .collect()
    }

    /// Waits for the next used entry; fails the test after [`TIMEOUT`].
    pub fn wait_used(&mut self) -> Used {
        self.try_wait_used(TIMEOUT)
            .expect("the device did not return a buffer in time")
    }

    /// Waits until `n` more used entries came; returns them (`id`, `len`).
    pub fn wait_used_n(&mut self, n: usize) -> Vec<(u32, u32)> {
        let start = Instant::now();
        let mut out = Vec::new();
        while out.len() < n {
            match self.next_used() {
                Some(u) => out.push((u32::from(u.head), u.len)),
                None if start.elapsed() > TIMEOUT => {
                    panic!("only {} of {n} used entries arrived: {out:?}", out.len())
                }
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        out
    }

    /// The next used entry, if one comes within `timeout`.
    pub fn try_wait_used(&mut self, timeout: Duration) -> Option<Used> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(u) = self.next_used() {
                return Some(u);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Asserts that nothing is returned within `ms` milliseconds.
    pub fn assert_idle(&mut self, ms: u64) {
        if let Some(u) = self.try_wait_used(Duration::from_millis(ms)) {
            panic!("unexpected used buffer {u:?}");
        }
    }

    /// `len` bytes of guest memory at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }
}

/// Records the interrupts a device raises.
#[derive(Default)]
pub(crate) struct RecordingInterrupt {
    queues: Mutex<Vec<u16>>,
    config: AtomicUsize,
}

impl RecordingInterrupt {
    pub fn new() -> Arc<RecordingInterrupt> {
        Arc::new(RecordingInterrupt::default())
    }

    /// How many times queue `index` was notified.
    pub fn queue_count(&self, index: u16) -> usize {
        self.queues
            .lock()
            .unwrap()
            .iter()
            .filter(|q| **q == index)
            .count()
    }

    /// How many queue interrupts were raised, whatever the queue.
    pub fn queue_total(&self) -> usize {
        self.queues.lock().unwrap().len()
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

/// Waits until `f` holds; fails the test after [`TIMEOUT`].
pub(crate) fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > TIMEOUT {
            panic!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(1));
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

/// CPU time (clock ticks, user + system) used so far by this process's
/// threads whose name starts with `prefix` (names are cut at 15 bytes).
pub(crate) fn thread_cpu_ticks(prefix: &str) -> u64 {
    let mut total = 0;
    let mut found = false;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let path = task.path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        // Fields after the ")" that ends the name: state is field 3; utime
        // and stime are fields 14 and 15.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        total += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        found = true;
    }
    assert!(found, "no thread named {prefix}*");
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::rng::{Rng, RngConfig};
    use crate::virtio::{VirtioDevice, COMMON_FEATURES};

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap()
    }

    #[test]
    fn the_split_layout_follows_the_spec_for_every_size() {
        let mem = memory();
        for shift in 0..=15 {
            let size = 1u16 << shift;
            let n = u64::from(size);
            for base in [0, 0x10, 0x1_0000] {
                let l = SplitLayout::new(base, size);
                assert_eq!(l.desc, base);
                // Each part at its alignment, right after the one before.
                assert_eq!((l.desc % 16, l.avail % 2, l.used % 4), (0, 0, 0), "{l:?}");
                assert_eq!(l.avail, l.desc + 16 * n);
                let avail_end = l.avail + 6 + 2 * n;
                assert_eq!(l.used, avail_end.next_multiple_of(4), "{l:?}");
                assert_eq!(l.end(), l.used + 6 + 8 * n);
                // The EVENT_IDX fields end their rings.
                assert_eq!(l.used_event() + 2, avail_end);
                assert_eq!(l.avail_event() + 2, l.end());
                // virtio-queue takes the addresses (it checks their
                // alignment) and finds the queue in guest memory.
                let q = DriverQueue::new(&mem, base, size);
                assert!(q.queue().is_valid(&mem), "{l:?}");
            }
        }
        let at0 = |size| {
            let l = SplitLayout::new(0, size);
            (l.avail, l.used, l.end())
        };
        assert_eq!(at0(1), (16, 24, 38));
        assert_eq!(at0(2), (32, 44, 66));
        assert_eq!(at0(256), (0x1000, 0x1208, 0x1a0e));
        assert_eq!(at0(32768), (0x8_0000, 0x9_0008, 0xd_000e));
    }

    /// A device served through the largest queue there is, for more
    /// requests than its index counts (the ring and the u16 indices wrap):
    /// every request comes back in order in its own used entry, and the
    /// EVENT_IDX fields at the ends of the rings, where MockSplitQueue's
    /// layout put the used ring over the available ring, are where the
    /// device reads and writes them.
    #[test]
    fn a_device_serves_a_queue_of_32768_entries_through_the_driver() {
        const BATCH: u16 = 8192;
        const REQUESTS: u32 = 70_000;
        let mem = memory();
        let mut q = DriverQueue::new(&mem, 0, MAX_QUEUE_SIZE);
        let data = q.layout().end().next_multiple_of(0x1000);
        let mut rng = Rng::new(RngConfig::default());
        let irq = RecordingInterrupt::new();
        rng.activate(
            mem.clone(),
            irq.clone(),
            vec![q.queue_events(0)],
            COMMON_FEATURES,
        )
        .unwrap();
        let len_of = |n: u32| 1 + n % 64;
        let mut done = 0u32;
        let mut batches = 0;
        while done < REQUESTS {
            let count = u32::from(BATCH).min(REQUESTS - done);
            let want: Vec<(u32, u32)> = (0..count)
                .map(|i| {
                    let buf = D::w(data + 64 * u64::from(i), len_of(done + i));
                    (u32::from(q.offer(&[buf])), len_of(done + i))
                })
                .collect();
            // One interrupt, for the batch's last buffer.
            q.set_used_event(q.avail_idx().wrapping_sub(1));
            q.kick.write(1).unwrap();
            let got = q.wait_used_n(count as usize);
            if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
                let n = done + i as u32;
                panic!("request {n}: used {:?}, not {:?}", got[i], want[i]);
            }
            batches += 1;
            wait_until("the batch's interrupt", || irq.queue_count(0) == batches);
            // The device asks for a kick once the driver passes what it took.
            assert_eq!(q.avail_event(), q.avail_idx());
            done += count;
        }
        assert_eq!(q.used_idx(), (REQUESTS % 65536) as u16);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(irq.queue_count(0), batches, "interrupts beyond used_event");
        rng.reset();
    }
}
