//! Request counters of one disk, updated lock-free by the I/O threads.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a disk's counters since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockMetrics {
    /// IN requests (guest reads).
    pub read_requests: u64,
    /// OUT requests (guest writes).
    pub write_requests: u64,
    /// FLUSH requests.
    pub flush_requests: u64,
    /// DISCARD and WRITE_ZEROES requests.
    pub discard_requests: u64,
    /// Other requests (GET_ID, unsupported types, malformed chains).
    pub other_requests: u64,
    /// Bytes read from the disk into the guest.
    pub read_bytes: u64,
    /// Bytes written by the guest to the disk.
    pub write_bytes: u64,
    /// fdatasync calls made for flushes.
    pub syncs: u64,
    /// Requests that did not complete with VIRTIO_BLK_S_OK.
    pub errors: u64,
    /// fdatasync calls that failed (the image's flushes fail from then on).
    pub failed_syncs: u64,
    /// Flushes failed without syncing because an earlier sync failed.
    pub refused_flushes: u64,
    /// Requests completed (put in the used ring).
    pub completed: u64,
    /// Sum of the time from taking each request off the available ring to
    /// completing it, in microseconds (divide by `completed`).
    pub latency_us_sum: u64,
}

/// The live counters behind [`BlockMetrics`].
#[derive(Debug, Default)]
pub struct Metrics {
    pub read_requests: AtomicU64,
    pub write_requests: AtomicU64,
    pub flush_requests: AtomicU64,
    pub discard_requests: AtomicU64,
    pub other_requests: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub syncs: AtomicU64,
    pub errors: AtomicU64,
    pub completed: AtomicU64,
    pub latency_us_sum: AtomicU64,
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Metrics {
    /// The current values.
    pub fn snapshot(&self) -> BlockMetrics {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BlockMetrics {
            read_requests: get(&self.read_requests),
            write_requests: get(&self.write_requests),
            flush_requests: get(&self.flush_requests),
            discard_requests: get(&self.discard_requests),
            other_requests: get(&self.other_requests),
            read_bytes: get(&self.read_bytes),
            write_bytes: get(&self.write_bytes),
            syncs: get(&self.syncs),
            errors: get(&self.errors),
            failed_syncs: 0,
            refused_flushes: 0,
            completed: get(&self.completed),
            latency_us_sum: get(&self.latency_us_sum),
        }
    }
}
