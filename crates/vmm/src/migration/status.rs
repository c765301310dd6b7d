//! What a migration reports, on both sides: the phase, the bytes and pages
//! by kind, rates, downtime, and on the destination the postcopy faults
//! (major, minor, double), their latency and the guest's run-time fraction.
//! `GET /api/v1/vm.migration` returns it; `ctl migrate` prints its
//! progress from it.

use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use super::protocol::PageKind;
use super::MigrationMode;

/// Where a migration is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Connecting and agreeing on the machine.
    Setup,
    /// Copying RAM while the guest runs on the source.
    Precopy,
    /// The guest is stopped; the last pages and the state are on their way.
    StopAndCopy,
    /// The guest runs on the destination; pages still come from the source.
    Postcopy,
    /// Postcopy lost its connection: both sides wait for `migrate --resume`.
    Paused,
    /// Everything arrived.
    Completed,
    /// It failed; `error` says why.
    Failed,
}

/// Pages and bytes by why they were sent.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PageCounts {
    pub precopy: u64,
    pub demand: u64,
    pub prefetch: u64,
    pub background: u64,
    /// Pages sent as "all zero" (no bytes on the wire), of any kind.
    pub zero: u64,
    /// Destination: pages of data from the source whose place in guest RAM
    /// was already taken (UFFDIO_COPY: EEXIST), so their bytes were not
    /// written. Nothing should ever take that place: not zero is a bug.
    pub already_present: u64,
    /// `--verify-pages`, destination: pages checked against the source's
    /// checksum, and those that differed (each a bug, or damage).
    pub verified: u64,
    pub wrong: u64,
}

impl PageCounts {
    pub fn add(&mut self, kind: PageKind, pages: u64) {
        match kind {
            PageKind::Precopy => self.precopy += pages,
            PageKind::Demand => self.demand += pages,
            PageKind::Prefetch => self.prefetch += pages,
            PageKind::Background => self.background += pages,
        }
    }

    pub fn total(&self) -> u64 {
        self.precopy + self.demand + self.prefetch + self.background
    }
}

/// Postcopy faults on the destination.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FaultCounts {
    /// Faults that had to fetch their page over the network.
    pub major: u64,
    /// Faults on a page that had arrived by the time they were read (a
    /// prefetched or pushed page beat the fault): no request sent.
    pub minor: u64,
    /// A fault on a page already requested and still on its way.
    pub double: u64,
    /// Faults taken by a vCPU thread itself (the vCPU waits: the guest
    /// could not run another task).
    pub vcpu: u64,
    /// Faults taken by KVM's async page-fault workers (the guest got "page
    /// not present" and ran another task meanwhile).
    pub async_worker: u64,
    /// Faults taken by the VMM's own threads (devices reading rings).
    pub vmm: u64,
}

/// Fault latency histogram bounds, µs: a major fault is counted in the
/// first bucket whose bound is at least its latency.
pub const LATENCY_BOUNDS_US: [u64; 10] =
    [50, 100, 200, 500, 1000, 2000, 5000, 10000, 50000, 100000];

/// Request → arrival latency of major faults.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LatencyHistogram {
    /// Upper bounds (µs) of the buckets; the last bucket is everything above.
    pub bounds_us: Vec<u64>,
    pub counts: Vec<u64>,
    pub total_us: u64,
    pub max_us: u64,
}

impl LatencyHistogram {
    pub fn new() -> Self {
        LatencyHistogram {
            bounds_us: LATENCY_BOUNDS_US.to_vec(),
            counts: vec![0; LATENCY_BOUNDS_US.len() + 1],
            total_us: 0,
            max_us: 0,
        }
    }

    pub fn record(&mut self, us: u64) {
        let bucket = LATENCY_BOUNDS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        self.counts[bucket] += 1;
        self.total_us += us;
        self.max_us = self.max_us.max(us);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// One precopy round.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Round {
    pub round: u32,
    /// Pages sent in the round and how long that took.
    pub pages: u64,
    pub seconds: f64,
    pub mib_per_s: f64,
    /// Pages the guest dirtied since the previous harvest, and per second.
    pub dirty_pages: u64,
    pub dirty_pages_per_s: f64,
    /// What stopping now would cost at this round's bandwidth.
    pub predicted_downtime_ms: f64,
}

/// One point of the guest's run-time fraction over time.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RunFraction {
    /// Milliseconds since the destination's vCPUs started.
    pub t_ms: u64,
    /// 1 − (time vCPU threads spent waiting for pages) / (window × vCPUs).
    pub fraction: f64,
}

/// A migration's report.
#[derive(Clone, Debug, Serialize)]
pub struct MigrationStatus {
    /// "source" or "destination".
    pub role: &'static str,
    pub mode: MigrationMode,
    pub phase: Phase,
    /// The other side's address.
    pub peer: String,
    pub error: Option<String>,
    /// Since the migration started (source: `migrate`; destination: the
    /// source connected), ms; frozen when it ends.
    pub elapsed_ms: u64,
    /// Start to completion, ms.
    pub total_ms: Option<u64>,
    /// Source stop → destination vCPUs running, ms, measured on the
    /// destination with the source's stop time (wall clock; exact on one
    /// host, off by the clocks' skew across hosts).
    pub downtime_ms: Option<f64>,
    /// The source's view: stop → the destination said it runs (one round
    /// trip more than the real downtime).
    pub source_downtime_ms: Option<f64>,
    /// Precopy rounds done (the first sends all of RAM).
    pub rounds: u32,
    pub ram_pages: u64,
    /// Pages sent (source) or placed (destination), by kind.
    pub pages: PageCounts,
    /// Bytes on the wire, this direction.
    pub bytes: u64,
    /// Pages not yet on the destination (or dirty since sent).
    pub remaining_pages: u64,
    /// Over the last second.
    pub pages_per_s: f64,
    pub mib_per_s: f64,
    /// Pages dirtied per second in the last precopy round.
    pub dirty_pages_per_s: f64,
    /// Why hybrid switched to postcopy, when it did.
    pub switch_reason: Option<String>,
    /// Each precopy round.
    pub round_log: Vec<Round>,
    /// Postcopy page requests sent (destination) or served (source).
    pub requests: u64,
    pub faults: FaultCounts,
    pub fault_latency: LatencyHistogram,
    /// The guest's run-time fraction per 100 ms window during postcopy.
    pub run_fraction: Vec<RunFraction>,
    /// Destination, postcopy: whether the guest has async page faults
    /// enabled (its vCPUs' MSR_KVM_ASYNC_PF_EN). Without, KVM halts a vCPU
    /// whose fault its worker takes, and that wait counts in run_fraction.
    pub guest_async_pf: Option<bool>,
    /// The connection dropped and was resumed this many times.
    pub resumes: u32,
    /// `ctl migrate --verify-pages`: the source sent a checksum of every
    /// page and the destination checks each page against it.
    pub verify_pages: bool,
    /// Destination: the first pages found to differ from the source's.
    pub wrong_pages: Vec<super::history::WrongPage>,
}

impl MigrationStatus {
    pub fn new(role: &'static str, mode: MigrationMode, peer: String, ram_pages: u64) -> Self {
        MigrationStatus {
            role,
            mode,
            phase: Phase::Setup,
            peer,
            error: None,
            elapsed_ms: 0,
            total_ms: None,
            downtime_ms: None,
            source_downtime_ms: None,
            rounds: 0,
            ram_pages,
            pages: PageCounts::default(),
            bytes: 0,
            remaining_pages: ram_pages,
            pages_per_s: 0.0,
            mib_per_s: 0.0,
            dirty_pages_per_s: 0.0,
            switch_reason: None,
            round_log: Vec::new(),
            requests: 0,
            faults: FaultCounts::default(),
            fault_latency: LatencyHistogram::new(),
            run_fraction: Vec::new(),
            guest_async_pf: None,
            resumes: 0,
            verify_pages: false,
            wrong_pages: Vec::new(),
        }
    }

    /// Whether the migration has ended, well or not.
    pub fn finished(&self) -> bool {
        matches!(self.phase, Phase::Completed | Phase::Failed)
    }
}

/// The status behind a lock, with the clock and the rate window.
pub struct SharedStatus {
    status: Mutex<MigrationStatus>,
    started: Instant,
    rate: Mutex<RateWindow>,
}

struct RateWindow {
    at: Instant,
    pages: u64,
    bytes: u64,
}

impl SharedStatus {
    pub fn new(status: MigrationStatus) -> SharedStatus {
        SharedStatus {
            status: Mutex::new(status),
            started: Instant::now(),
            rate: Mutex::new(RateWindow {
                at: Instant::now(),
                pages: 0,
                bytes: 0,
            }),
        }
    }

    /// Changes the status under its lock.
    pub fn update<R>(&self, f: impl FnOnce(&mut MigrationStatus) -> R) -> R {
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut status)
    }

    /// A copy, with the elapsed time and the rates brought up to date.
    pub fn get(&self) -> MigrationStatus {
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if !status.finished() {
            status.elapsed_ms = self.started.elapsed().as_millis() as u64;
            let mut rate = self.rate.lock().unwrap_or_else(|e| e.into_inner());
            let dt = rate.at.elapsed().as_secs_f64();
            if dt >= 1.0 {
                let pages = status.pages.total();
                status.pages_per_s = (pages - rate.pages) as f64 / dt;
                status.mib_per_s = (status.bytes - rate.bytes) as f64 / dt / (1 << 20) as f64;
                *rate = RateWindow {
                    at: Instant::now(),
                    pages,
                    bytes: status.bytes,
                };
            }
        }
        status.clone()
    }

    /// Ends the migration in `phase` (Completed or Failed).
    pub fn finish(&self, phase: Phase, error: Option<String>) {
        let elapsed = self.started.elapsed().as_millis() as u64;
        self.update(|s| {
            s.phase = phase;
            s.error = error;
            s.elapsed_ms = elapsed;
            if phase == Phase::Completed {
                s.total_ms = Some(elapsed);
                s.remaining_pages = 0;
            }
        });
    }

    pub fn started(&self) -> Instant {
        self.started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_their_buckets() {
        let mut h = LatencyHistogram::new();
        for us in [10, 50, 51, 999, 1000, 200_000] {
            h.record(us);
        }
        assert_eq!(h.count(), 6);
        assert_eq!(h.counts[0], 2); // 10, 50
        assert_eq!(h.counts[1], 1); // 51
        assert_eq!(h.counts[4], 2); // 999, 1000
        assert_eq!(*h.counts.last().unwrap(), 1);
        assert_eq!(h.max_us, 200_000);
    }

    #[test]
    fn a_finished_status_stays_frozen() {
        let shared = SharedStatus::new(MigrationStatus::new(
            "source",
            MigrationMode::Precopy,
            "x".into(),
            10,
        ));
        shared.update(|s| s.pages.add(PageKind::Precopy, 3));
        shared.finish(Phase::Completed, None);
        let a = shared.get();
        assert_eq!(a.phase, Phase::Completed);
        assert_eq!(a.remaining_pages, 0);
        assert_eq!(a.pages.total(), 3);
        assert_eq!(a.total_ms, Some(a.elapsed_ms));
    }
}
