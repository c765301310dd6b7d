//! A disk's live statistics: each request, once in the used ring, is
//! counted by kind and stage into its queue's share with atomics (no lock
//! on the I/O path); reading them adds the queues' shares up
//! ([`DiskCounters::merge_queue`]). The image's syncs are counted apart,
//! in a [`SyncStats`] the image's sticky flush state feeds.
//!
//! A request carries a [`StageTimes`] from the kick that woke its queue
//! thread to the interrupt that told the guest: five stamps of the
//! monotonic clock, 40 bytes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use choices::{Boundaries, LatencyHistogram};

use super::counters::{
    DiskCounters, KindCounters, Outcome, RequestKind, Stage, StageCounters, SyncCounters,
};
use super::histogram::HistogramSet;

/// Now on CLOCK_MONOTONIC, ns: one clock for every thread of the VMM, so
/// stamps taken on different threads subtract.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives on
    // this stack frame; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// When one request passed each stage, [`now_ns`] values (0: not yet).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageTimes {
    /// The queue thread woke on the queue's ioeventfd (the kick that
    /// found this request; later requests taken in the same pass share it).
    pub kick: u64,
    /// Taken off the available ring.
    pub dequeue: u64,
    /// Handed to the host (an I/O thread started it).
    pub submit: u64,
    /// The host completed it.
    pub complete: u64,
    /// In the used ring and the interrupt injected (or suppressed by
    /// EVENT_IDX).
    pub interrupt: u64,
}

impl StageTimes {
    /// Stamped at the kick that woke the queue thread.
    pub fn kicked_at(kick: u64) -> StageTimes {
        StageTimes {
            kick,
            ..StageTimes::default()
        }
    }

    /// Each stage's duration, by [`Stage::ALL`]. A stamp missing (0) or
    /// out of order counts as 0 rather than wrapping.
    pub fn durations(&self) -> [u64; 4] {
        let span = |from: u64, to: u64| {
            if from == 0 || to == 0 {
                0
            } else {
                to.saturating_sub(from)
            }
        };
        [
            span(self.kick, self.dequeue),
            span(self.dequeue, self.submit),
            span(self.submit, self.complete),
            span(self.complete, self.interrupt),
        ]
    }

    /// Dequeue → host completion: the request's time in the device, what
    /// the per-kind figures count (QEMU's `rd_total_time_ns` span).
    pub fn service_ns(&self) -> u64 {
        if self.dequeue == 0 || self.complete == 0 {
            0
        } else {
            self.complete.saturating_sub(self.dequeue)
        }
    }
}

/// One finished request, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    pub kind: RequestKind,
    pub outcome: Outcome,
    /// Bytes moved (counted only when `outcome` is Ok).
    pub bytes: u64,
    pub times: StageTimes,
}

#[derive(Default)]
struct KindCells {
    ops: AtomicU64,
    bytes: AtomicU64,
    failed: AtomicU64,
    invalid: AtomicU64,
    total_ns: AtomicU64,
    /// u64::MAX until the first request.
    min_ns: AtomicU64,
    max_ns: AtomicU64,
}

#[derive(Default)]
struct StageCells {
    total_ns: AtomicU64,
    max_ns: AtomicU64,
}

/// One queue's share.
struct QueueShare {
    kinds: [KindCells; 6],
    stages: [StageCells; 4],
    /// Requests counted: every stage's count.
    requests: AtomicU64,
    /// By `LatencyHistogram::ALL`.
    histograms: HistogramSet,
}

impl QueueShare {
    fn new(boundaries: &[u64]) -> QueueShare {
        let kinds: [KindCells; 6] = Default::default();
        for k in &kinds {
            k.min_ns.store(u64::MAX, Ordering::Relaxed);
        }
        QueueShare {
            kinds,
            stages: Default::default(),
            requests: AtomicU64::new(0),
            histograms: HistogramSet::new(LatencyHistogram::ALL.len(), boundaries),
        }
    }

    fn record(&self, r: &RequestRecord) {
        let add = |c: &AtomicU64, n: u64| {
            c.fetch_add(n, Ordering::Relaxed);
        };
        let k = &self.kinds[r.kind.index()];
        let service = r.times.service_ns();
        add(&k.ops, 1);
        match r.outcome {
            Outcome::Ok => add(&k.bytes, r.bytes),
            Outcome::Failed => add(&k.failed, 1),
            Outcome::Invalid => add(&k.invalid, 1),
        }
        add(&k.total_ns, service);
        lower_to(&k.min_ns, service);
        raise_to(&k.max_ns, service);
        add(&self.requests, 1);
        // One sample per stage, and the kind's (Other has no histogram:
        // its slot is past the end and skipped).
        let mut samples = [(usize::MAX, 0); 5];
        for (i, (stage, ns)) in Stage::ALL.iter().zip(r.times.durations()).enumerate() {
            let s = &self.stages[*stage as usize];
            add(&s.total_ns, ns);
            raise_to(&s.max_ns, ns);
            samples[i] = (histogram_index(stage.histogram()), ns);
        }
        if let Some(h) = r.kind.histogram() {
            samples[4] = (histogram_index(h), service);
        }
        self.histograms.record(&samples);
    }

    fn snapshot(&self) -> DiskCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let kind = |kind: RequestKind| {
            let k = &self.kinds[kind.index()];
            let ops = get(&k.ops);
            KindCounters {
                ops,
                bytes: get(&k.bytes),
                failed: get(&k.failed),
                invalid: get(&k.invalid),
                total_time_ns: get(&k.total_ns),
                min_ns: if ops == 0 { 0 } else { get(&k.min_ns) },
                max_ns: get(&k.max_ns),
                histogram: kind
                    .histogram()
                    .map(|h| self.histograms.snapshot(histogram_index(h))),
            }
        };
        let stage = |stage: Stage| {
            let s = &self.stages[stage as usize];
            StageCounters {
                count: get(&self.requests),
                total_ns: get(&s.total_ns),
                max_ns: get(&s.max_ns),
                histogram: self.histograms.snapshot(histogram_index(stage.histogram())),
            }
        };
        DiskCounters {
            kinds: RequestKind::ALL.map(kind),
            stages: Stage::ALL.map(stage),
            in_flight: 0,
            max_queue_depth: 0,
            syncs: SyncCounters::default(),
        }
    }
}

fn histogram_index(which: LatencyHistogram) -> usize {
    which as usize
}

/// `max` of a counter and `value`: a plain load first, since most samples
/// are not a new maximum (no locked instruction then).
fn raise_to(cell: &AtomicU64, value: u64) {
    if value > cell.load(Ordering::Relaxed) {
        cell.fetch_max(value, Ordering::Relaxed);
    }
}

/// `min` likewise.
fn lower_to(cell: &AtomicU64, value: u64) {
    if value < cell.load(Ordering::Relaxed) {
        cell.fetch_min(value, Ordering::Relaxed);
    }
}

/// The live counters behind [`SyncCounters`]: one per image, held by its
/// sticky flush state (which every sync passes, whichever queue, engine
/// or VMM task runs it) and read by the disk's [`DiskStats`].
#[derive(Debug, Default)]
pub struct SyncStats {
    ops: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
}

impl SyncStats {
    /// A sync ran; `ok` says whether it succeeded.
    pub fn ran(&self, ok: bool) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A sync was refused because an earlier one failed.
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// The figures now.
    pub fn snapshot(&self) -> SyncCounters {
        SyncCounters {
            ops: self.ops.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

/// A disk's statistics, shared by its queue threads (which record) and
/// the VMM (which reads them and sets histogram boundaries).
pub struct DiskStats {
    queues: Vec<QueueShare>,
    in_flight: AtomicU64,
    max_queue_depth: AtomicU64,
    /// The image's syncs, counted by its sticky flush state.
    syncs: Arc<SyncStats>,
    /// Serialises boundary changes against reads, so a read never sees
    /// queues with different boundaries (recorders never take it).
    control: Mutex<()>,
}

impl DiskStats {
    /// Statistics for a disk of `queues` queues (at least one), every
    /// histogram with the default boundaries, whose image counts no syncs
    /// (a back end without a sticky flush state).
    pub fn new(queues: usize) -> DiskStats {
        DiskStats::with_syncs(queues, Arc::default())
    }

    /// [`DiskStats::new`] for an image whose syncs `syncs` counts.
    pub fn with_syncs(queues: usize, syncs: Arc<SyncStats>) -> DiskStats {
        let defaults = Boundaries::default_set();
        DiskStats {
            queues: (0..queues.max(1))
                .map(|_| QueueShare::new(defaults.as_ns()))
                .collect(),
            in_flight: AtomicU64::new(0),
            max_queue_depth: AtomicU64::new(0),
            syncs,
            control: Mutex::new(()),
        }
    }

    /// A request was taken off the available ring.
    pub fn dequeued(&self) {
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        raise_to(&self.max_queue_depth, now);
    }

    /// A request taken off queue `queue`'s ring is in the used ring: count
    /// it.
    pub fn completed(&self, queue: u16, record: &RequestRecord) {
        // Never below zero, even for a request dequeued before a restore.
        let _ = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        self.queues[usize::from(queue) % self.queues.len()].record(record);
    }

    /// `n` requests in flight were dropped unanswered (a device reset).
    pub fn abandoned(&self, n: u64) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(now.saturating_sub(n))
            });
    }

    /// New boundaries for one histogram, or (None) all of them; their bins
    /// start again from zero.
    pub fn set_boundaries(&self, which: Option<LatencyHistogram>, boundaries: &Boundaries) {
        let _control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        for queue in &self.queues {
            queue
                .histograms
                .set(which.map(histogram_index), boundaries.as_ns());
        }
    }

    /// The figures now, every queue added up.
    pub fn snapshot(&self) -> DiskCounters {
        let _control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let mut queues = self.queues.iter().map(QueueShare::snapshot);
        let mut total = queues.next().unwrap_or_default();
        for share in queues {
            total.merge_queue(&share);
        }
        total.in_flight = self.in_flight.load(Ordering::Relaxed);
        total.max_queue_depth = self.max_queue_depth.load(Ordering::Relaxed);
        total.syncs = self.syncs.snapshot();
        total
    }
}

impl std::fmt::Debug for DiskStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskStats")
            .field("queues", &self.queues.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(base: u64, steps: [u64; 4]) -> StageTimes {
        let mut t = StageTimes::kicked_at(base);
        t.dequeue = t.kick + steps[0];
        t.submit = t.dequeue + steps[1];
        t.complete = t.submit + steps[2];
        t.interrupt = t.complete + steps[3];
        t
    }

    fn record(kind: RequestKind, outcome: Outcome, bytes: u64, steps: [u64; 4]) -> RequestRecord {
        RequestRecord {
            kind,
            outcome,
            bytes,
            times: times(1_000_000, steps),
        }
    }

    #[test]
    fn stages_span_consecutive_stamps() {
        let t = times(5, [1, 20, 300, 4000]);
        assert_eq!(t.durations(), [1, 20, 300, 4000]);
        assert_eq!(t.service_ns(), 320);
        // Missing or backwards stamps count as 0, never as a huge value.
        let mut t = t;
        t.kick = 0;
        t.complete = t.submit - 1;
        assert_eq!(t.durations(), [0, 20, 0, 4301]);
        assert_eq!(StageTimes::default().service_ns(), 0);
    }

    #[test]
    fn requests_are_counted_by_kind_outcome_and_stage() {
        let stats = DiskStats::new(2);
        let reads = [
            record(
                RequestKind::Read,
                Outcome::Ok,
                4096,
                [1_000, 2_000, 30_000, 500],
            ),
            record(
                RequestKind::Read,
                Outcome::Ok,
                8192,
                [1_000, 2_000, 300_000, 500],
            ),
            record(
                RequestKind::Read,
                Outcome::Failed,
                4096,
                [1_000, 2_000, 3_000, 500],
            ),
        ];
        for (i, r) in reads.iter().enumerate() {
            stats.dequeued();
            stats.completed(i as u16, r);
        }
        stats.dequeued();
        stats.completed(
            1,
            &record(RequestKind::Flush, Outcome::Invalid, 0, [0, 0, 0, 0]),
        );
        stats.dequeued();
        stats.dequeued();
        let c = stats.snapshot();
        let read = c.kind(RequestKind::Read);
        assert_eq!(read.ops, 3);
        assert_eq!(read.bytes, 12288, "the failed read moved nothing");
        assert_eq!((read.failed, read.invalid), (1, 0));
        assert_eq!(read.total_time_ns, 32_000 + 302_000 + 5_000);
        assert_eq!((read.min_ns, read.max_ns), (5_000, 302_000));
        let h = read.histogram.as_ref().unwrap();
        assert_eq!(h.count(), 3);
        assert_eq!(
            h.bins[crate::virtio::block::histogram::bucket_of(&h.boundaries, 302_000)],
            1
        );
        let flush = c.kind(RequestKind::Flush);
        assert_eq!((flush.ops, flush.invalid, flush.bytes), (1, 1, 0));
        assert!(c.kind(RequestKind::Other).histogram.is_none());
        // Stages: every request, whatever its kind.
        let s = c.stage(Stage::SubmitToComplete);
        assert_eq!((s.count, s.total_ns, s.max_ns), (4, 333_000, 300_000));
        assert_eq!(s.histogram.count(), 4);
        let total: u64 = c.stages.iter().map(|s| s.total_ns).sum();
        assert_eq!(total, 3 * 3_500 + 30_000 + 300_000 + 3_000);
        assert_eq!(c.in_flight, 2);
        assert_eq!(c.max_queue_depth, 2);
    }

    #[test]
    fn setting_boundaries_reaches_every_queue_and_only_the_named_histogram() {
        let stats = DiskStats::new(3);
        for q in 0..3 {
            stats.completed(
                q,
                &record(RequestKind::Write, Outcome::Ok, 512, [1, 1, 1, 1]),
            );
            stats.completed(
                q,
                &record(RequestKind::Read, Outcome::Ok, 512, [1, 1, 1, 1]),
            );
        }
        let b: Boundaries = "10us,1ms".parse().unwrap();
        stats.set_boundaries(Some(LatencyHistogram::Write), &b);
        let c = stats.snapshot();
        let w = c.kind(RequestKind::Write).histogram.clone().unwrap();
        assert_eq!(w.boundaries, [10_000, 1_000_000]);
        assert_eq!(w.count(), 0, "setting starts the bins again");
        assert_eq!(c.kind(RequestKind::Write).ops, 3, "but not the counters");
        let r = c.kind(RequestKind::Read).histogram.clone().unwrap();
        assert_eq!(r.boundaries, choices::DEFAULT_BOUNDARIES_NS);
        assert_eq!(r.count(), 3);
        stats.set_boundaries(None, &b);
        let c = stats.snapshot();
        for s in &c.stages {
            assert_eq!(s.histogram.boundaries, [10_000, 1_000_000]);
        }
    }

    #[test]
    fn histograms_are_indexed_in_their_listed_order() {
        for (i, h) in LatencyHistogram::ALL.iter().enumerate() {
            assert_eq!(histogram_index(*h), i);
        }
    }

    #[test]
    fn the_images_syncs_are_read_with_the_disk_once_not_per_queue() {
        let syncs = Arc::new(SyncStats::default());
        let stats = DiskStats::with_syncs(3, syncs.clone());
        syncs.ran(true);
        syncs.ran(false);
        syncs.refused();
        syncs.refused();
        let want = SyncCounters {
            ops: 2,
            failed: 1,
            refused: 2,
        };
        assert_eq!(stats.snapshot().syncs, want);
        assert_eq!(DiskStats::new(2).snapshot().syncs, SyncCounters::default());
    }

    #[test]
    fn in_flight_never_goes_below_zero() {
        let stats = DiskStats::new(1);
        stats.completed(0, &record(RequestKind::Other, Outcome::Invalid, 0, [0; 4]));
        assert_eq!(stats.snapshot().in_flight, 0);
    }

    #[test]
    fn the_clock_moves_forward() {
        let a = now_ns();
        let b = now_ns();
        assert!(a > 0 && b >= a);
    }
}
