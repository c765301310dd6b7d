//! A tiny virtio driver for device tests: split queues in a test guest
//! memory, chains built descriptor by descriptor, used-ring polling, and an
//! interrupt that records what it is told. (Shared with the vsock tests;
//! could move to `virtio/` for every device.)

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::virtio::{QueueEvents, VirtioInterrupt};
use crate::GuestMemoryMmap;

/// 32 MiB of guest memory at 0.
pub(crate) fn guest_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 32 << 20)]).unwrap()
}

/// An interrupt that records the queues it was asked to signal.
#[derive(Default)]
pub(crate) struct RecordingInterrupt {
    pub queues: Mutex<Vec<u16>>,
    pub config: Mutex<u32>,
}

impl RecordingInterrupt {
    pub fn new() -> Arc<RecordingInterrupt> {
        Arc::new(RecordingInterrupt::default())
    }

    pub fn count(&self, queue: u16) -> usize {
        self.queues
            .lock()
            .unwrap()
            .iter()
            .filter(|q| **q == queue)
            .count()
    }
}

impl VirtioInterrupt for RecordingInterrupt {
    fn notify_queue(&self, queue: u16) {
        self.queues.lock().unwrap().push(queue);
    }
    fn notify_config(&self) {
        *self.config.lock().unwrap() += 1;
    }
}

/// One descriptor of a chain to build.
#[derive(Clone, Debug)]
pub(crate) enum D {
    /// Device-readable, holding these bytes.
    R(Vec<u8>),
    /// Device-writable, this many bytes.
    W(u32),
    /// Raw: address, length, flags (NEXT is added as needed).
    Raw(u64, u32, u16),
}

/// The driver side of one split queue.
pub(crate) struct DriverQueue {
    mem: GuestMemoryMmap,
    size: u16,
    desc: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
    data_next: u64,
    data_end: u64,
    pub kick: EventFd,
}

/// A used-ring entry and the buffers of its chain.
#[derive(Clone, Debug)]
pub(crate) struct Used {
    pub head: u16,
    pub len: u32,
}

impl DriverQueue {
    /// A queue of `size` at `base`; its buffers come from `data..data+data_len`.
    /// (Laid out here rather than by `MockSplitQueue`, whose ring layout
    /// overlaps the avail and used rings for queues over 128 entries.)
    pub fn new(mem: &GuestMemoryMmap, base: u64, size: u16, data: u64, data_len: u64) -> Self {
        let n = u64::from(size);
        let desc = base;
        let avail = desc + 16 * n;
        let used = (avail + 6 + 2 * n).div_ceil(4) * 4;
        let end = used + 6 + 8 * n;
        assert!(
            end <= data || base >= data + data_len,
            "queue overlaps its data"
        );
        mem.write_slice(&vec![0u8; (end - base) as usize], GuestAddress(base))
            .unwrap();
        DriverQueue {
            mem: mem.clone(),
            size,
            desc: GuestAddress(desc),
            avail: GuestAddress(avail),
            used: GuestAddress(used),
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
            data_next: data,
            data_end: data + data_len,
            kick: EventFd::new(EFD_NONBLOCK).unwrap(),
        }
    }

    /// The device's view of the queue, as a transport would hand it over.
    pub fn queue_events(&self, index: u16) -> QueueEvents {
        let mut queue = Queue::new(self.size).unwrap();
        queue.try_set_size(self.size).unwrap();
        queue.try_set_desc_table_address(self.desc).unwrap();
        queue.try_set_avail_ring_address(self.avail).unwrap();
        queue.try_set_used_ring_address(self.used).unwrap();
        queue.set_ready(true);
        QueueEvents {
            index,
            queue,
            kick: self.kick.try_clone().unwrap(),
        }
    }

    fn alloc(&mut self, len: u32) -> u64 {
        let addr = self.data_next;
        self.data_next += u64::from(len).div_ceil(16) * 16 + 16;
        assert!(self.data_next <= self.data_end, "test data area exhausted");
        addr
    }

    /// Builds a chain and makes it available (without kicking). Returns the
    /// head index and the address of each descriptor's buffer.
    pub fn add(&mut self, descs: &[D]) -> (u16, Vec<u64>) {
        let head = self.next_desc;
        let mut addrs = Vec::new();
        for (i, d) in descs.iter().enumerate() {
            let index = (head + i as u16) % self.size;
            let next = (index + 1) % self.size;
            let (addr, len, mut flags) = match d {
                D::R(bytes) => {
                    let a = self.alloc(bytes.len() as u32);
                    self.mem.write_slice(bytes, GuestAddress(a)).unwrap();
                    (a, bytes.len() as u32, 0u16)
                }
                D::W(len) => {
                    let a = self.alloc(*len);
                    // Poison, so tests see what the device wrote.
                    let poison = vec![0xa5u8; *len as usize];
                    self.mem.write_slice(&poison, GuestAddress(a)).unwrap();
                    (a, *len, VRING_DESC_F_WRITE as u16)
                }
                D::Raw(a, l, f) => (*a, *l, *f),
            };
            if i + 1 < descs.len() {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            let desc = RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next));
            self.mem
                .write_obj(desc, self.desc.unchecked_add_u64(u64::from(index) * 16))
                .unwrap();
            addrs.push(addr);
        }
        self.next_desc = (head + descs.len() as u16) % self.size;
        self.publish(head);
        (head, addrs)
    }

    /// Puts `head` in the available ring (any value: tests use bad ones).
    pub fn publish(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.size);
        self.mem
            .write_obj(head, self.avail.unchecked_add_u64(4 + slot * 2))
            .unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.set_avail_idx(self.avail_idx);
    }

    /// Writes the available index (tests corrupt it on purpose).
    pub fn set_avail_idx(&mut self, idx: u16) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.mem
            .write_obj(idx, self.avail.unchecked_add_u64(2))
            .unwrap();
    }

    /// Adds a chain and kicks.
    pub fn add_kick(&mut self, descs: &[D]) -> (u16, Vec<u64>) {
        let r = self.add(descs);
        self.kick.write(1).unwrap();
        r
    }

    /// The guest memory the queue lives in.
    pub fn memory(&self) -> GuestMemoryMmap {
        self.mem.clone()
    }

    /// Writes `used_event` (VIRTIO_F_EVENT_IDX): interrupt me once the used
    /// index passes `v`.
    pub fn set_used_event(&self, v: u16) {
        let at = self.avail.unchecked_add_u64(4 + 2 * u64::from(self.size));
        self.mem.write_obj(v, at).unwrap();
    }

    /// The device's used index.
    /// The device's EVENT_IDX avail_event: the driver kicks when its avail
    /// index moves past this.
    pub fn avail_event(&self) -> u16 {
        let at = self.used.0 + 4 + 8 * u64::from(self.size);
        self.mem.read_obj(GuestAddress(at)).unwrap()
    }

    pub fn used_idx(&self) -> u16 {
        self.mem.read_obj(self.used.unchecked_add_u64(2)).unwrap()
    }

    /// The next used entry, if the device has returned one.
    pub fn next_used(&mut self) -> Option<Used> {
        if self.used_idx() == self.used_seen {
            return None;
        }
        let slot = u64::from(self.used_seen % self.size);
        let at = self.used.unchecked_add_u64(4 + slot * 8);
        let id: u32 = self.mem.read_obj(at).unwrap();
        let len: u32 = self.mem.read_obj(at.unchecked_add_u64(4)).unwrap();
        self.used_seen = self.used_seen.wrapping_add(1);
        Some(Used {
            head: id as u16,
            len,
        })
    }

    /// Waits (up to 5 s) for the next used entry.
    pub fn wait_used(&mut self) -> Used {
        self.try_wait_used(Duration::from_secs(5))
            .expect("the device did not return a buffer in time")
    }

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

    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }
}

trait AddU64 {
    fn unchecked_add_u64(self, n: u64) -> GuestAddress;
}

impl AddU64 for GuestAddress {
    fn unchecked_add_u64(self, n: u64) -> GuestAddress {
        GuestAddress(self.0 + n)
    }
}

/// Polls `f` until it is true (up to 5 s).
pub(crate) fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
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
