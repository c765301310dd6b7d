//! Latency histograms whose bucket boundaries can change at run time
//! (QEMU's `block-latency-histogram-set`), recorded from the I/O path
//! without a lock.
//!
//! The arithmetic is pure ([`bucket_of`], [`HistogramSnapshot`]); the live
//! histogram ([`AtomicHistogram`]) keeps two slots of boundaries and bins.
//! Recorders count into the active one; a change of boundaries fills the
//! other (after any recorder still inside it left), then makes it active,
//! so a sample is never counted against boundaries it was not sorted by,
//! nor lost, and recorders never wait.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use choices::MAX_BOUNDARIES;
use serde::{Deserialize, Serialize};

/// The bin of `value` among `boundaries` (increasing): how many boundaries
/// are at or below it. Bin `i` holds `boundaries[i-1] <= value <
/// boundaries[i]`.
pub fn bucket_of(boundaries: &[u64], value: u64) -> usize {
    boundaries.partition_point(|&b| b <= value)
}

/// A histogram as read: its boundaries (ns) and one more bin than
/// boundaries (QEMU's `BlockLatencyHistogramInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramSnapshot {
    pub boundaries: Vec<u64>,
    pub bins: Vec<u64>,
}

impl HistogramSnapshot {
    /// No samples yet.
    pub fn empty(boundaries: &[u64]) -> HistogramSnapshot {
        HistogramSnapshot {
            boundaries: boundaries.to_vec(),
            bins: vec![0; boundaries.len() + 1],
        }
    }

    /// Counts one sample.
    pub fn add(&mut self, value: u64) {
        let bin = bucket_of(&self.boundaries, value);
        self.bins[bin] += 1;
    }

    /// Samples counted.
    pub fn count(&self) -> u64 {
        self.bins.iter().sum()
    }

    /// Adds `other`'s bins (another queue's share of the same histogram).
    /// Histograms with other boundaries cannot be added: false, and
    /// nothing changes.
    pub fn merge(&mut self, other: &HistogramSnapshot) -> bool {
        if other.boundaries != self.boundaries || other.bins.len() != self.bins.len() {
            return false;
        }
        for (mine, theirs) in self.bins.iter_mut().zip(&other.bins) {
            *mine += theirs;
        }
        true
    }

    /// The upper bound of the bin where the `q`-quantile (0..=1) lies, in
    /// ns; None without samples or when it lies in the last (unbounded)
    /// bin.
    pub fn quantile_bound(&self, q: f64) -> Option<u64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.bins.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return self.boundaries.get(i).copied();
            }
        }
        None
    }
}

/// One set of boundaries and its bins.
struct Slot {
    /// Recorders inside this slot now.
    users: AtomicUsize,
    len: AtomicUsize,
    boundaries: [AtomicU64; MAX_BOUNDARIES],
    bins: [AtomicU64; MAX_BOUNDARIES + 1],
}

impl Slot {
    fn new() -> Slot {
        Slot {
            users: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            boundaries: std::array::from_fn(|_| AtomicU64::new(0)),
            bins: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Only while no recorder can be inside (see [`AtomicHistogram::set`]).
    fn fill(&self, boundaries: &[u64]) {
        for (cell, &b) in self.boundaries.iter().zip(boundaries) {
            cell.store(b, Ordering::Relaxed);
        }
        self.len.store(boundaries.len(), Ordering::Relaxed);
        for bin in &self.bins {
            bin.store(0, Ordering::Relaxed);
        }
    }

    /// [`bucket_of`] over the atomic boundaries.
    fn bucket(&self, value: u64) -> usize {
        let (mut low, mut high) = (0, self.len.load(Ordering::Relaxed).min(MAX_BOUNDARIES));
        while low < high {
            let mid = (low + high) / 2;
            if self.boundaries[mid].load(Ordering::Relaxed) <= value {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    fn snapshot(&self) -> HistogramSnapshot {
        let len = self.len.load(Ordering::Relaxed).min(MAX_BOUNDARIES);
        HistogramSnapshot {
            boundaries: self.boundaries[..len]
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            bins: self.bins[..=len]
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

/// A live histogram: recorded from any thread without a lock, its
/// boundaries replaced (and its bins zeroed, as QEMU does) at run time.
pub struct AtomicHistogram {
    /// The slot recorders use: 0 or 1.
    active: AtomicUsize,
    slots: [Slot; 2],
    /// Serialises [`set`](Self::set) and [`snapshot`](Self::snapshot)
    /// (never taken by recorders).
    control: Mutex<()>,
}

impl AtomicHistogram {
    /// `boundaries`: increasing, at most [`MAX_BOUNDARIES`] (checked by
    /// `choices::Boundaries`; more are cut).
    pub fn new(boundaries: &[u64]) -> AtomicHistogram {
        let h = AtomicHistogram {
            active: AtomicUsize::new(0),
            slots: [Slot::new(), Slot::new()],
            control: Mutex::new(()),
        };
        h.slots[0].fill(&boundaries[..boundaries.len().min(MAX_BOUNDARIES)]);
        h
    }

    /// Counts one sample.
    pub fn record(&self, value: u64) {
        loop {
            let index = self.active.load(Ordering::SeqCst);
            let slot = &self.slots[index];
            slot.users.fetch_add(1, Ordering::SeqCst);
            // Entered, then checked still active: a `set` that swapped
            // meanwhile may be refilling this slot; leave and use the new
            // one. A `set` that checks `users` after this increment waits.
            if self.active.load(Ordering::SeqCst) == index {
                let bin = slot.bucket(value);
                slot.bins[bin].fetch_add(1, Ordering::Relaxed);
                slot.users.fetch_sub(1, Ordering::Release);
                return;
            }
            slot.users.fetch_sub(1, Ordering::Release);
        }
    }

    /// New boundaries (increasing, at most [`MAX_BOUNDARIES`]), all bins
    /// zero.
    pub fn set(&self, boundaries: &[u64]) {
        let _control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let next = 1 - self.active.load(Ordering::SeqCst);
        let slot = &self.slots[next];
        // A recorder that took this slot before the last swap is leaving
        // (it re-checks `active` right after entering); no new one stays.
        while slot.users.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        slot.fill(&boundaries[..boundaries.len().min(MAX_BOUNDARIES)]);
        self.active.store(next, Ordering::SeqCst);
    }

    /// The boundaries and bins now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let _control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        self.slots[self.active.load(Ordering::SeqCst)].snapshot()
    }
}

impl std::fmt::Debug for AtomicHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.snapshot().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn values_fall_in_half_open_bins() {
        let b = [10, 20, 50];
        assert_eq!(bucket_of(&b, 0), 0);
        assert_eq!(bucket_of(&b, 9), 0);
        assert_eq!(bucket_of(&b, 10), 1);
        assert_eq!(bucket_of(&b, 19), 1);
        assert_eq!(bucket_of(&b, 20), 2);
        assert_eq!(bucket_of(&b, 49), 2);
        assert_eq!(bucket_of(&b, 50), 3);
        assert_eq!(bucket_of(&b, u64::MAX), 3);
        assert_eq!(bucket_of(&[], 7), 0);
    }

    #[test]
    fn the_atomic_search_agrees_with_the_pure_one() {
        let boundaries: Vec<u64> = choices::DEFAULT_BOUNDARIES_NS.to_vec();
        let h = AtomicHistogram::new(&boundaries);
        let mut expected = HistogramSnapshot::empty(&boundaries);
        let mut value = 1u64;
        for i in 0..5000u64 {
            // Every boundary, its neighbours, and values in between.
            value = (value * 3 + i) % 3_000_000_000;
            for v in [value, value.saturating_sub(1), value + 1] {
                h.record(v);
                expected.add(v);
            }
        }
        for &b in &boundaries {
            for v in [b - 1, b, b + 1] {
                h.record(v);
                expected.add(v);
            }
        }
        assert_eq!(h.snapshot(), expected);
        assert_eq!(expected.count(), 15000 + 3 * boundaries.len() as u64);
    }

    #[test]
    fn setting_boundaries_empties_the_bins() {
        let h = AtomicHistogram::new(&[10, 20]);
        h.record(5);
        h.record(15);
        h.record(25);
        assert_eq!(h.snapshot().bins, [1, 1, 1]);
        h.set(&[100]);
        assert_eq!(h.snapshot(), HistogramSnapshot::empty(&[100]));
        h.record(150);
        h.set(&[1, 2, 3]);
        h.record(2);
        assert_eq!(h.snapshot().bins, [0, 0, 1, 0]);
    }

    #[test]
    fn no_sample_is_misfiled_while_boundaries_change() {
        // Recorders hammer the histogram while boundaries flip between two
        // sets; each set sorts the value 50 into a different bin. Every
        // snapshot must hold only the bin a sample can be in under its own
        // boundaries.
        let h = Arc::new(AtomicHistogram::new(&[10, 100]));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let recorded = Arc::new(AtomicU64::new(0));
        let recorders: Vec<_> = (0..3)
            .map(|_| {
                let (h, stop, recorded) = (h.clone(), stop.clone(), recorded.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        h.record(50);
                        recorded.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // Enough flips, and enough samples among them, however busy the
        // machine is.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut round = 0u64;
        while round < 2000 || recorded.load(Ordering::Relaxed) < 200_000 {
            assert!(
                std::time::Instant::now() < deadline,
                "the recorders did not run"
            );
            let boundaries: &[u64] = if round.is_multiple_of(2) {
                &[60]
            } else {
                &[10, 100]
            };
            h.set(boundaries);
            let s = h.snapshot();
            let expected_bin = bucket_of(&s.boundaries, 50);
            for (i, &n) in s.bins.iter().enumerate() {
                assert!(i == expected_bin || n == 0, "{s:?}");
            }
            round += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for r in recorders {
            r.join().unwrap();
        }
        // Once the recorders are done, every sample is where it belongs.
        h.set(&[60]);
        for _ in 0..1000 {
            h.record(50);
        }
        assert_eq!(h.snapshot().bins, [1000, 0]);
    }

    #[test]
    fn merging_adds_bins_of_the_same_boundaries_only() {
        let mut a = HistogramSnapshot::empty(&[10, 20]);
        let mut b = HistogramSnapshot::empty(&[10, 20]);
        a.add(5);
        b.add(5);
        b.add(30);
        assert!(a.merge(&b));
        assert_eq!(a.bins, [2, 0, 1]);
        let other = HistogramSnapshot::empty(&[10]);
        assert!(!a.merge(&other));
        assert_eq!(a.bins, [2, 0, 1]);
    }

    #[test]
    fn quantiles_name_the_bin_bound() {
        let mut h = HistogramSnapshot::empty(&[10, 20, 50]);
        assert_eq!(h.quantile_bound(0.5), None);
        for v in [1, 2, 3, 15, 15, 30, 30, 30, 40, 99] {
            h.add(v);
        }
        assert_eq!(h.quantile_bound(0.3), Some(10));
        assert_eq!(h.quantile_bound(0.5), Some(20));
        assert_eq!(h.quantile_bound(0.9), Some(50));
        // The slowest sample is past the last boundary.
        assert_eq!(h.quantile_bound(1.0), None);
        assert_eq!(h.quantile_bound(0.0), Some(10));
    }
}
