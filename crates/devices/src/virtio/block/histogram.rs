//! Latency histograms whose bucket boundaries can change at run time
//! (QEMU's `block-latency-histogram-set`), recorded from the I/O path
//! without a lock.
//!
//! The arithmetic is pure ([`bucket_of`], [`HistogramSnapshot`]); the live
//! histograms ([`HistogramSet`]) keep two slots of boundaries and bins.
//! Recorders count into the active one; a change of boundaries fills the
//! other (after any recorder still inside it left: the histograms not
//! changed get the bins counted so far), makes it active, then adds what
//! recorders still in the old slot counted there. So a sample is never
//! counted against boundaries it was not sorted by, nor lost, and
//! recorders never wait.

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

/// One histogram's boundaries and bins in one slot.
struct Cells {
    len: AtomicUsize,
    boundaries: [AtomicU64; MAX_BOUNDARIES],
    bins: [AtomicU64; MAX_BOUNDARIES + 1],
}

impl Cells {
    fn new() -> Cells {
        Cells {
            len: AtomicUsize::new(0),
            boundaries: std::array::from_fn(|_| AtomicU64::new(0)),
            bins: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed).min(MAX_BOUNDARIES)
    }

    /// New boundaries, bins zero. Only while no recorder can be inside.
    fn fill(&self, boundaries: &[u64]) {
        let boundaries = &boundaries[..boundaries.len().min(MAX_BOUNDARIES)];
        for (cell, &b) in self.boundaries.iter().zip(boundaries) {
            cell.store(b, Ordering::Relaxed);
        }
        self.len.store(boundaries.len(), Ordering::Relaxed);
        for bin in &self.bins {
            bin.store(0, Ordering::Relaxed);
        }
    }

    /// `other`'s boundaries and its bins as they are now (returned).
    /// Only while no recorder can be inside `self`.
    fn copy_from(&self, other: &Cells) -> Vec<u64> {
        let len = other.len();
        for (mine, theirs) in self.boundaries.iter().zip(&other.boundaries[..len]) {
            mine.store(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.len.store(len, Ordering::Relaxed);
        let mut copied = Vec::with_capacity(len + 1);
        for (mine, theirs) in self.bins.iter().zip(&other.bins) {
            let n = theirs.load(Ordering::Relaxed);
            mine.store(n, Ordering::Relaxed);
            copied.push(n);
        }
        copied
    }

    /// Adds what `other` counted since [`copy_from`](Self::copy_from)
    /// returned `copied`.
    fn catch_up(&self, other: &Cells, copied: &[u64]) {
        for ((mine, theirs), before) in self.bins.iter().zip(&other.bins).zip(copied) {
            let late = theirs.load(Ordering::Relaxed).saturating_sub(*before);
            if late > 0 {
                mine.fetch_add(late, Ordering::Relaxed);
            }
        }
    }

    /// [`bucket_of`] over the atomic boundaries.
    fn bucket(&self, value: u64) -> usize {
        let (mut low, mut high) = (0, self.len());
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

    fn add(&self, value: u64) {
        self.bins[self.bucket(value)].fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        let len = self.len();
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

/// Every histogram of the set, in one slot.
struct Slot {
    /// Recorders inside this slot now.
    users: AtomicUsize,
    histograms: Vec<Cells>,
}

/// A fixed number of live histograms recorded together: from any thread
/// without a lock, one request's samples at once (entering a slot once for
/// all of them); each one's boundaries replaceable at run time (its bins
/// then start from zero, as QEMU's do).
pub struct HistogramSet {
    /// The slot recorders use: 0 or 1.
    active: AtomicUsize,
    slots: [Slot; 2],
    /// Serialises [`set`](Self::set) and [`snapshot`](Self::snapshot)
    /// (never taken by recorders).
    control: Mutex<()>,
}

impl HistogramSet {
    /// `count` histograms with `boundaries` (increasing, at most
    /// [`MAX_BOUNDARIES`]: checked by `choices::Boundaries`; more are cut).
    pub fn new(count: usize, boundaries: &[u64]) -> HistogramSet {
        let slot = || Slot {
            users: AtomicUsize::new(0),
            histograms: (0..count).map(|_| Cells::new()).collect(),
        };
        let set = HistogramSet {
            active: AtomicUsize::new(0),
            slots: [slot(), slot()],
            control: Mutex::new(()),
        };
        for h in &set.slots[0].histograms {
            h.fill(boundaries);
        }
        set
    }

    /// Counts `(histogram, value)` samples.
    pub fn record(&self, samples: &[(usize, u64)]) {
        loop {
            let index = self.active.load(Ordering::SeqCst);
            let slot = &self.slots[index];
            slot.users.fetch_add(1, Ordering::SeqCst);
            // Entered, then checked still active: a `set` that swapped
            // meanwhile may be refilling this slot; leave and use the new
            // one. A `set` that checks `users` after this increment waits.
            if self.active.load(Ordering::SeqCst) == index {
                for &(h, value) in samples {
                    if let Some(cells) = slot.histograms.get(h) {
                        cells.add(value);
                    }
                }
                slot.users.fetch_sub(1, Ordering::Release);
                return;
            }
            slot.users.fetch_sub(1, Ordering::Release);
        }
    }

    /// New boundaries for histogram `which` (or every one), its bins
    /// zero; the others keep theirs and every sample they counted.
    pub fn set(&self, which: Option<usize>, boundaries: &[u64]) {
        let _control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.active.load(Ordering::SeqCst);
        let (now, next) = (&self.slots[current], &self.slots[1 - current]);
        // A recorder that took `next` before the last swap is leaving (it
        // re-checks `active` right after entering); no new one stays.
        wait_empty(next);
        let mut copied = Vec::new();
        for (i, (mine, theirs)) in next.histograms.iter().zip(&now.histograms).enumerate() {
            if which.is_none_or(|w| w == i) {
                mine.fill(boundaries);
                copied.push(None);
            } else {
                copied.push(Some(mine.copy_from(theirs)));
            }
        }
        self.active.store(1 - current, Ordering::SeqCst);
        // Recorders still in the old slot finish there: carry what they
        // added over once they are out.
        wait_empty(now);
        for ((mine, theirs), copied) in next.histograms.iter().zip(&now.histograms).zip(&copied) {
            if let Some(copied) = copied {
                mine.catch_up(theirs, copied);
            }
        }
    }

    /// Histogram `which` now (empty if there is no such one).
    pub fn snapshot(&self, which: usize) -> HistogramSnapshot {
        let _control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        self.slots[self.active.load(Ordering::SeqCst)]
            .histograms
            .get(which)
            .map(Cells::snapshot)
            .unwrap_or_default()
    }
}

fn wait_empty(slot: &Slot) {
    while slot.users.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
}

impl std::fmt::Debug for HistogramSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistogramSet")
            .field("histograms", &self.slots[0].histograms.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A set of one, for the single-histogram tests.
    struct One(HistogramSet);

    impl One {
        fn new(boundaries: &[u64]) -> One {
            One(HistogramSet::new(1, boundaries))
        }
        fn record(&self, value: u64) {
            self.0.record(&[(0, value)]);
        }
        fn set(&self, boundaries: &[u64]) {
            self.0.set(Some(0), boundaries);
        }
        fn snapshot(&self) -> HistogramSnapshot {
            self.0.snapshot(0)
        }
    }

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
        let h = One::new(&boundaries);
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
        let h = One::new(&[10, 20]);
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
    fn setting_one_histogram_keeps_the_others() {
        let set = HistogramSet::new(3, &[10, 20]);
        set.record(&[(0, 5), (1, 15), (2, 25), (7, 1)]);
        set.set(Some(1), &[100]);
        set.record(&[(0, 15), (1, 150)]);
        assert_eq!(set.snapshot(0).bins, [1, 1, 0]);
        assert_eq!(
            set.snapshot(1),
            HistogramSnapshot {
                boundaries: vec![100],
                bins: vec![0, 1]
            }
        );
        assert_eq!(set.snapshot(2).bins, [0, 0, 1]);
        set.set(Some(2), &[1]);
        set.set(None, &[50]);
        assert_eq!(set.snapshot(0), HistogramSnapshot::empty(&[50]));
        assert_eq!(set.snapshot(9), HistogramSnapshot::default());
    }

    #[test]
    fn no_sample_is_lost_or_misfiled_while_boundaries_change() {
        // Recorders hammer two histograms while the second one's boundaries
        // flip between two sets, each sorting the value 50 into another
        // bin. Every snapshot holds only the bin a sample can be in under
        // its own boundaries; the first histogram, never set, loses no
        // sample across the swaps.
        let set = Arc::new(HistogramSet::new(2, &[10, 100]));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let recorded = Arc::new(AtomicU64::new(0));
        let recorders: Vec<_> = (0..3)
            .map(|_| {
                let (set, stop, recorded) = (set.clone(), stop.clone(), recorded.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        set.record(&[(0, 50), (1, 50)]);
                        recorded.fetch_add(1, Ordering::Relaxed);
                        n += 1;
                    }
                    n
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
            set.set(Some(1), boundaries);
            let s = set.snapshot(1);
            let expected_bin = bucket_of(&s.boundaries, 50);
            for (i, &n) in s.bins.iter().enumerate() {
                assert!(i == expected_bin || n == 0, "{s:?}");
            }
            round += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let total: u64 = recorders.into_iter().map(|r| r.join().unwrap()).sum();
        assert_eq!(set.snapshot(0).bins, [0, total, 0]);
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
