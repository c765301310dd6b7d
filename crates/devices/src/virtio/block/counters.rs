//! What a disk's statistics say, as read (pure values): per request kind,
//! per stage, the queue depth, the image's syncs; and how each queue's
//! share adds up to the disk's. Recorded by [`super::stats`]; shown by `vm.counters`
//! (docs/devices.md, "Counters").

use serde::{Deserialize, Serialize};

use super::histogram::HistogramSnapshot;

/// What a request was, for the statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestKind {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
    /// GET_ID, unsupported types, and chains too malformed to say.
    Other,
}

impl RequestKind {
    /// Every kind, in the order of [`DiskCounters::kinds`].
    pub const ALL: [RequestKind; 6] = [
        RequestKind::Read,
        RequestKind::Write,
        RequestKind::Flush,
        RequestKind::Discard,
        RequestKind::WriteZeroes,
        RequestKind::Other,
    ];

    /// Its place in [`RequestKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The prefix of its fields in `vm.counters` (`read_ops`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Read => "read",
            RequestKind::Write => "write",
            RequestKind::Flush => "flush",
            RequestKind::Discard => "discard",
            RequestKind::WriteZeroes => "write_zeroes",
            RequestKind::Other => "other",
        }
    }

    /// Its latency histogram (every kind but `Other` has one).
    pub fn histogram(self) -> Option<choices::LatencyHistogram> {
        use choices::LatencyHistogram as H;
        match self {
            RequestKind::Read => Some(H::Read),
            RequestKind::Write => Some(H::Write),
            RequestKind::Flush => Some(H::Flush),
            RequestKind::Discard => Some(H::Discard),
            RequestKind::WriteZeroes => Some(H::WriteZeroes),
            RequestKind::Other => None,
        }
    }
}

/// How a request ended, in QEMU's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    /// The host failed it (an I/O error): QEMU's `failed_*`.
    Failed,
    /// Refused before reaching the disk (out of range, misaligned,
    /// read-only, malformed, unsupported): QEMU's `invalid_*`.
    Invalid,
}

/// The stages of a request, in order: each one's duration is the time
/// between two of its stamps (see [`super::stats::StageTimes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    KickToDequeue,
    DequeueToSubmit,
    SubmitToComplete,
    CompleteToInterrupt,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 4] = [
        Stage::KickToDequeue,
        Stage::DequeueToSubmit,
        Stage::SubmitToComplete,
        Stage::CompleteToInterrupt,
    ];

    /// Its histogram's name, also its key in `vm.counters`.
    pub fn histogram(self) -> choices::LatencyHistogram {
        use choices::LatencyHistogram as H;
        match self {
            Stage::KickToDequeue => H::KickToDequeue,
            Stage::DequeueToSubmit => H::DequeueToSubmit,
            Stage::SubmitToComplete => H::SubmitToComplete,
            Stage::CompleteToInterrupt => H::CompleteToInterrupt,
        }
    }
}

/// One kind of request's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindCounters {
    /// Requests completed (whatever their status).
    pub ops: u64,
    /// Bytes moved by the ones that succeeded (DISCARD and WRITE_ZEROES:
    /// bytes of the range).
    pub bytes: u64,
    pub failed: u64,
    pub invalid: u64,
    /// Sum over the requests of dequeue → host completion, ns.
    pub total_time_ns: u64,
    /// Shortest and longest of those, ns (0 without requests).
    pub min_ns: u64,
    pub max_ns: u64,
    /// The same times as a histogram (none for `Other`).
    pub histogram: Option<HistogramSnapshot>,
}

impl KindCounters {
    /// Adds another queue's share.
    pub fn merge(&mut self, other: &KindCounters) {
        self.min_ns = match (self.ops, other.ops) {
            (0, _) => other.min_ns,
            (_, 0) => self.min_ns,
            _ => self.min_ns.min(other.min_ns),
        };
        self.ops += other.ops;
        self.bytes += other.bytes;
        self.failed += other.failed;
        self.invalid += other.invalid;
        self.total_time_ns += other.total_time_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
        merge_histogram(&mut self.histogram, &other.histogram);
    }

    /// Mean time per request, ns (0 without requests).
    pub fn avg_ns(&self) -> u64 {
        self.total_time_ns.checked_div(self.ops).unwrap_or(0)
    }
}

/// One stage's figures over every request that passed it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageCounters {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub histogram: HistogramSnapshot,
}

impl StageCounters {
    /// Adds another queue's share.
    pub fn merge(&mut self, other: &StageCounters) {
        self.count += other.count;
        self.total_ns += other.total_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
        let mut mine = Some(std::mem::take(&mut self.histogram));
        merge_histogram(&mut mine, &Some(other.histogram.clone()));
        self.histogram = mine.unwrap_or_default();
    }
}

/// The syncs of a disk's image: the host calls that make its data durable
/// (an `fdatasync`, an io_uring fsync, a write with RWF_DSYNC) for the
/// guest's flushes, its write-through writes when it did not negotiate
/// FLUSH, and the VMM's own flushes (migration, snapshot). Counted by the
/// image's sticky flush state, which every sync passes (see
/// [`super::sticky`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncCounters {
    /// Syncs run, whatever their outcome.
    pub ops: u64,
    /// Syncs that failed: from the first one on, the image's flushes fail.
    pub failed: u64,
    /// Syncs not run because an earlier one had failed: the flush or
    /// write-through write that needed one failed without reaching the
    /// host.
    pub refused: u64,
}

/// A disk's statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskCounters {
    /// By [`RequestKind::ALL`].
    pub kinds: [KindCounters; 6],
    /// By [`Stage::ALL`].
    pub stages: [StageCounters; 4],
    /// Requests off the ring and not yet in the used ring, now.
    pub in_flight: u64,
    /// The most there have been at once.
    pub max_queue_depth: u64,
    /// The image's syncs (the disk's own, like the queue depth).
    pub syncs: SyncCounters,
}

impl DiskCounters {
    /// One kind's figures.
    pub fn kind(&self, kind: RequestKind) -> &KindCounters {
        &self.kinds[kind.index()]
    }

    /// One stage's figures.
    pub fn stage(&self, stage: Stage) -> &StageCounters {
        &self.stages[stage as usize]
    }

    /// Adds another queue's share; the queue depth and the syncs are the
    /// disk's own (kept once, not per queue), so they are not added.
    pub fn merge_queue(&mut self, other: &DiskCounters) {
        for (mine, theirs) in self.kinds.iter_mut().zip(&other.kinds) {
            mine.merge(theirs);
        }
        for (mine, theirs) in self.stages.iter_mut().zip(&other.stages) {
            mine.merge(theirs);
        }
    }

    /// Requests completed, every kind.
    pub fn ops(&self) -> u64 {
        self.kinds.iter().map(|k| k.ops).sum()
    }

    /// Requests completed with an error status (failed or invalid), every
    /// kind.
    pub fn errors(&self) -> u64 {
        self.kinds.iter().map(|k| k.failed + k.invalid).sum()
    }
}

/// Adds `other` into `mine`. Two queues' shares always have the same
/// boundaries (they are set together, under one lock); were they not, the
/// first is kept rather than adding bins that mean different things.
fn merge_histogram(mine: &mut Option<HistogramSnapshot>, other: &Option<HistogramSnapshot>) {
    match (mine.as_mut(), other) {
        (Some(m), Some(o)) => {
            if !m.merge(o) {
                tracing::warn!("block statistics: queues disagree on histogram boundaries");
            }
        }
        (None, Some(o)) => *mine = Some(o.clone()),
        (_, None) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(ops: u64, total: u64, min: u64, max: u64, hist: &[u64]) -> KindCounters {
        let mut h = HistogramSnapshot::empty(&[100, 1000]);
        h.bins = hist.to_vec();
        KindCounters {
            ops,
            bytes: ops * 4096,
            failed: 1,
            invalid: 2,
            total_time_ns: total,
            min_ns: min,
            max_ns: max,
            histogram: Some(h),
        }
    }

    #[test]
    fn queues_add_up_and_min_ignores_idle_queues() {
        let mut a = kind(3, 900, 50, 500, &[1, 2, 0]);
        let b = kind(2, 3000, 200, 2000, &[0, 1, 1]);
        a.merge(&b);
        assert_eq!(a.ops, 5);
        assert_eq!(a.bytes, 5 * 4096);
        assert_eq!((a.failed, a.invalid), (2, 4));
        assert_eq!(a.total_time_ns, 3900);
        assert_eq!((a.min_ns, a.max_ns), (50, 2000));
        assert_eq!(a.histogram.as_ref().unwrap().bins, [1, 3, 1]);
        assert_eq!(a.avg_ns(), 780);

        // A queue that served nothing has min 0: it must not win.
        let mut idle = KindCounters {
            histogram: Some(HistogramSnapshot::empty(&[100, 1000])),
            ..Default::default()
        };
        idle.merge(&b);
        assert_eq!(idle.min_ns, 200);
        let mut busy = b.clone();
        busy.merge(&KindCounters::default());
        assert_eq!(busy.min_ns, 200);
        assert_eq!(KindCounters::default().avg_ns(), 0);
    }

    #[test]
    fn a_disk_merges_kinds_and_stages_but_keeps_its_depth() {
        let mut a = DiskCounters {
            in_flight: 2,
            max_queue_depth: 9,
            syncs: SyncCounters {
                ops: 4,
                failed: 1,
                refused: 2,
            },
            ..Default::default()
        };
        a.kinds[0] = kind(1, 10, 10, 10, &[1, 0, 0]);
        a.stages[2] = StageCounters {
            count: 1,
            total_ns: 7,
            max_ns: 7,
            histogram: HistogramSnapshot {
                boundaries: vec![5],
                bins: vec![0, 1],
            },
        };
        let mut b = a.clone();
        b.in_flight = 100;
        b.syncs.ops = 50;
        b.stages[2].max_ns = 3;
        a.merge_queue(&b);
        assert_eq!(a.kind(RequestKind::Read).ops, 2);
        assert_eq!(a.ops(), 2);
        assert_eq!(a.errors(), 2 * (1 + 2));
        let s = a.stage(Stage::SubmitToComplete);
        assert_eq!((s.count, s.total_ns, s.max_ns), (2, 14, 7));
        assert_eq!(s.histogram.bins, [0, 2]);
        assert_eq!((a.in_flight, a.max_queue_depth), (2, 9));
        assert_eq!((a.syncs.ops, a.syncs.failed, a.syncs.refused), (4, 1, 2));
    }

    #[test]
    fn kinds_and_stages_name_their_histograms() {
        let names: Vec<_> = RequestKind::ALL
            .iter()
            .filter_map(|k| k.histogram())
            .chain(Stage::ALL.iter().map(|s| s.histogram()))
            .collect();
        assert_eq!(names, choices::LatencyHistogram::ALL);
        for (i, k) in RequestKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
            if let Some(h) = k.histogram() {
                assert_eq!(h.name(), k.name());
            }
        }
    }
}
