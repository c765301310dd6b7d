//! The virtual-disk layer of the I/O tracer (docs/iotrace.md): every
//! request a disk completes, one [`TraceRecord`] each, while the disk is
//! traced.
//!
//! Off, the cost is one relaxed atomic load per request
//! ([`DiskTracer::current`]). On, a request takes the session (a mutex
//! held for an `Arc` clone), carries it as a [`Pending`], and at
//! completion claims a slot of the session's buffer with one `fetch_add`
//! and fills it: the queue threads never wait for each other or for a
//! reader, and a full buffer only counts the record as dropped. For reads
//! of an image in the host page cache (cache=writeback or unsafe), the
//! host cache's residency of the range is taken just before the read goes
//! to the host ([`Pending::submitting`]).

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use iotrace::host_cache::HostCacheProbe;
use iotrace::layers::{Direction, IoRecord, Layer};

use super::counters::{Outcome, RequestKind};
use super::engine::{IoOp, OpKind};
use super::stats::{now_ns, RequestRecord};
use super::CacheMode;

/// Records a session holds: 65536 of [`TraceRecord`]'s 88 bytes (plus the
/// slot's flag), about 6 MiB per traced disk, allocated at start and freed
/// when the session's last reader lets go. At 64 KiB a request that is
/// 4 GiB of I/O; a longer window drops what does not fit, and says so.
pub const TRACE_CAPACITY: usize = 65_536;

/// One request as the virtual disk saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TraceRecord {
    /// When it was taken off the available ring ([`now_ns`]: the
    /// monotonic clock of every stamp).
    pub time_ns: u64,
    #[serde(serialize_with = "kind_name")]
    pub kind: RequestKind,
    /// Whether it succeeded (a failed or invalid request moved nothing).
    pub ok: bool,
    /// Its byte offset on the disk (None for requests without one, or
    /// completed without reaching the host: GET_ID, discards, refusals).
    pub offset: Option<u64>,
    pub bytes: u64,
    pub queue: u16,
    /// kick → dequeue → submit → complete → interrupt, in ns
    /// ([`super::stats::StageTimes::durations`]).
    pub stages_ns: [u64; 4],
    /// Reads in the host page cache: the bytes of the range resident in it
    /// just before the read was submitted.
    pub host_cached_bytes: Option<u64>,
}

fn kind_name<S: serde::Serializer>(kind: &RequestKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(kind.name())
}

impl TraceRecord {
    /// The record for [`iotrace::layers`]: successful reads and writes
    /// only (the layers compare data moved).
    pub fn io_record(&self) -> Option<IoRecord> {
        let direction = match self.kind {
            RequestKind::Read => Direction::Read,
            RequestKind::Write => Direction::Write,
            _ => return None,
        };
        if !self.ok {
            return None;
        }
        Some(IoRecord {
            layer: Layer::VirtualDisk,
            time_ns: self.time_ns,
            direction,
            offset: self.offset?,
            bytes: self.bytes,
            host_cached_bytes: self.host_cached_bytes,
        })
    }
}

/// Why a disk's tracer refused. One line.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("is already traced")]
    AlreadyTraced,
    #[error("is not traced")]
    NotTraced,
}

/// A disk's tracer: off, or one session.
#[derive(Debug)]
pub struct DiskTracer {
    on: AtomicBool,
    session: Mutex<Option<Arc<TraceSession>>>,
    /// The image whose host page cache reads are probed against (None:
    /// no probe — cache=none, or a back end that is not a file).
    probed_image: Option<PathBuf>,
}

impl DiskTracer {
    /// A tracer, off, for a disk on `image` (if it is a file) with
    /// `cache`.
    pub fn new(image: Option<PathBuf>, cache: CacheMode) -> DiskTracer {
        let probed_image = match cache {
            CacheMode::Writeback | CacheMode::Unsafe => image,
            // O_DIRECT: the host page cache never serves the disk.
            CacheMode::None => None,
        };
        DiskTracer {
            on: AtomicBool::new(false),
            session: Mutex::new(None),
            probed_image,
        }
    }

    /// The session a request starting now belongs to; None when off (one
    /// relaxed load: a request that misses a start or stop by a moment is
    /// not traced, or traced into the session just stopped).
    pub(crate) fn current(&self) -> Option<Arc<TraceSession>> {
        if !self.on.load(Ordering::Relaxed) {
            return None;
        }
        self.lock().clone()
    }

    /// Starts a session of `capacity` records.
    pub fn start(&self, capacity: usize) -> Result<Arc<TraceSession>, TraceError> {
        let mut session = self.lock();
        if session.is_some() {
            return Err(TraceError::AlreadyTraced);
        }
        let started = Arc::new(TraceSession::new(capacity, self.probe()));
        *session = Some(started.clone());
        self.on.store(true, Ordering::Relaxed);
        Ok(started)
    }

    /// Ends the session, returning it (its records stay readable).
    pub fn stop(&self) -> Result<Arc<TraceSession>, TraceError> {
        let mut session = self.lock();
        let stopped = session.take().ok_or(TraceError::NotTraced)?;
        self.on.store(false, Ordering::Relaxed);
        stopped.end_ns.store(now_ns(), Ordering::Relaxed);
        Ok(stopped)
    }

    /// The session, while traced.
    pub fn session(&self) -> Option<Arc<TraceSession>> {
        self.lock().clone()
    }

    fn probe(&self) -> Result<Option<HostCacheProbe>, String> {
        let Some(path) = &self.probed_image else {
            return Ok(None);
        };
        let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        HostCacheProbe::open(&file)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<TraceSession>>> {
        self.session.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One traced window of one disk: its records, as a bounded append-only
/// buffer.
#[derive(Debug)]
pub struct TraceSession {
    started_ns: u64,
    /// Set by [`DiskTracer::stop`] (0 while traced).
    end_ns: AtomicU64,
    /// Each slot is claimed once, through `next`, and set once.
    slots: Box<[OnceLock<TraceRecord>]>,
    next: AtomicUsize,
    dropped: AtomicU64,
    probe: Option<HostCacheProbe>,
    /// Why reads are not probed although the cache mode uses the host's
    /// page cache.
    probe_error: Option<String>,
}

impl TraceSession {
    fn new(capacity: usize, probe: Result<Option<HostCacheProbe>, String>) -> TraceSession {
        let (probe, probe_error) = match probe {
            Ok(probe) => (probe, None),
            Err(e) => (None, Some(e)),
        };
        TraceSession {
            started_ns: now_ns(),
            end_ns: AtomicU64::new(0),
            slots: (0..capacity).map(|_| OnceLock::new()).collect(),
            next: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            probe,
            probe_error,
        }
    }

    /// When it started, on [`now_ns`]'s clock.
    pub fn started_ns(&self) -> u64 {
        self.started_ns
    }

    /// When it was stopped (None while traced).
    pub fn ended_ns(&self) -> Option<u64> {
        Some(self.end_ns.load(Ordering::Relaxed)).filter(|&t| t != 0)
    }

    /// The records so far, in completion order.
    pub fn records(&self) -> Vec<TraceRecord> {
        let claimed = self.next.load(Ordering::Acquire).min(self.slots.len());
        // A slot claimed but not yet set is a request completing right
        // now: left for the next read.
        self.slots[..claimed]
            .iter()
            .filter_map(|slot| slot.get().copied())
            .collect()
    }

    /// Records that did not fit.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Records it can hold.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Whether reads are probed against the host page cache.
    pub fn probes_host_cache(&self) -> bool {
        self.probe.is_some()
    }

    /// Why reads are not probed although they could be.
    pub fn probe_error(&self) -> Option<&str> {
        self.probe_error.as_deref()
    }

    fn push(&self, record: TraceRecord) {
        let index = self.next.fetch_add(1, Ordering::AcqRel);
        match self.slots.get(index) {
            Some(slot) => {
                let _ = slot.set(record);
            }
            None => {
                // Keep `next` from wrapping on a very long window.
                self.next.store(self.slots.len(), Ordering::Relaxed);
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// What a traced request carries from its start to its completion.
pub(crate) struct Pending {
    session: Arc<TraceSession>,
    offset: Option<u64>,
    host_cached_bytes: Option<u64>,
}

impl Pending {
    pub(crate) fn new(session: Arc<TraceSession>) -> Pending {
        Pending {
            session,
            offset: None,
            host_cached_bytes: None,
        }
    }

    /// The request goes to the host as `op`: its offset, and for a read,
    /// what the host page cache holds of the range now.
    ///
    /// `mincore`, not `preadv2(RWF_NOWAIT)`: a NOWAIT read would copy the
    /// cached bytes (a second read of the data for every read traced), and
    /// on a miss it starts the host's readahead of the range itself, so the
    /// device would see I/O the guest's read did not cause and the real
    /// read a moment later would find a cache this probe changed. `mincore`
    /// counts the resident pages and changes nothing. What it cannot see is
    /// a page evicted or read in between this call and the read, a few
    /// microseconds later.
    pub(crate) fn submitting(&mut self, op: &IoOp) {
        self.offset = Some(op.offset);
        if op.kind != OpKind::Read {
            return;
        }
        let Some(probe) = &self.session.probe else {
            return;
        };
        let len = op.len() as u64;
        // Pages resident, as bytes; partial pages at either end count whole,
        // so the request's own size bounds it.
        self.host_cached_bytes = probe
            .resident_pages(op.offset, len)
            .ok()
            .map(|(resident, _)| (resident * page_size()).min(len));
    }

    /// The request runs alone, from `offset`, without an engine (and
    /// unprobed: only cache=none's unaligned accesses and outsized bounces
    /// do).
    pub(crate) fn running_alone(&mut self, offset: u64) {
        self.offset = Some(offset);
    }

    /// The request is done and the guest told: record it.
    pub(crate) fn record(self, queue: u16, request: &RequestRecord) {
        self.session.push(TraceRecord {
            time_ns: request.times.dequeue,
            kind: request.kind,
            ok: request.outcome == Outcome::Ok,
            offset: self.offset,
            bytes: request.bytes,
            queue,
            stages_ns: request.times.durations(),
            host_cached_bytes: self.host_cached_bytes,
        });
    }
}

fn page_size() -> u64 {
    static PAGE_SIZE: OnceLock<u64> = OnceLock::new();
    *PAGE_SIZE.get_or_init(|| {
        // SAFETY: sysconf reads a configuration value; no memory is passed.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::block::stats::StageTimes;

    fn request(kind: RequestKind, bytes: u64, dequeue: u64) -> RequestRecord {
        let mut times = StageTimes::kicked_at(dequeue - 10);
        (times.dequeue, times.submit, times.complete, times.interrupt) =
            (dequeue, dequeue + 20, dequeue + 320, dequeue + 4320);
        RequestRecord {
            kind,
            outcome: Outcome::Ok,
            bytes,
            times,
        }
    }

    fn read_op(offset: u64, len: usize) -> (IoOp, Vec<u8>) {
        let mut buf = vec![0u8; len];
        let op = IoOp {
            kind: OpKind::Read,
            offset,
            iovecs: vec![libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: len,
            }],
            bounce: None,
            dsync: false,
        };
        (op, buf)
    }

    #[test]
    fn off_costs_nothing_and_records_nothing() {
        let tracer = DiskTracer::new(None, CacheMode::Writeback);
        assert!(tracer.current().is_none());
        assert!(matches!(tracer.stop(), Err(TraceError::NotTraced)));
        assert!(tracer.session().is_none());
    }

    #[test]
    fn a_session_records_each_request_with_its_stages() {
        let tracer = DiskTracer::new(None, CacheMode::Writeback);
        let session = tracer.start(8).unwrap();
        assert!(matches!(tracer.start(8), Err(TraceError::AlreadyTraced)));
        assert!(!session.probes_host_cache());
        let mut pending = Pending::new(tracer.current().unwrap());
        let (op, _buf) = read_op(8192, 4096);
        pending.submitting(&op);
        pending.record(3, &request(RequestKind::Read, 4096, 1_000));
        let records = session.records();
        assert_eq!(records.len(), 1);
        let r = records[0];
        assert_eq!(
            (r.time_ns, r.offset, r.bytes, r.queue),
            (1_000, Some(8192), 4096, 3)
        );
        assert_eq!(r.stages_ns, [10, 20, 300, 4000]);
        assert_eq!(r.host_cached_bytes, None, "no image, no probe");
        let io = r.io_record().unwrap();
        assert_eq!(
            (io.layer, io.direction),
            (Layer::VirtualDisk, Direction::Read)
        );
        let json = serde_json::to_value(r).unwrap();
        assert_eq!(json["kind"], "read");
        assert_eq!(json["stages_ns"][2], 300);

        let stopped = tracer.stop().unwrap();
        assert!(stopped.ended_ns().is_some());
        assert!(tracer.current().is_none());
        // A new session starts empty.
        let again = tracer.start(8).unwrap();
        assert!(again.records().is_empty());
    }

    #[test]
    fn a_full_buffer_drops_and_counts() {
        let tracer = DiskTracer::new(None, CacheMode::None);
        let session = tracer.start(2).unwrap();
        for i in 0..5 {
            let mut pending = Pending::new(session.clone());
            pending.running_alone(i * 512);
            pending.record(0, &request(RequestKind::Write, 512, 100 + i));
        }
        assert_eq!(session.records().len(), 2);
        assert_eq!(session.dropped(), 3);
        assert_eq!(session.capacity(), 2);
    }

    #[test]
    fn only_successful_reads_and_writes_with_an_offset_are_layer_records() {
        let mut record = TraceRecord {
            time_ns: 1,
            kind: RequestKind::Flush,
            ok: true,
            offset: Some(0),
            bytes: 0,
            queue: 0,
            stages_ns: [0; 4],
            host_cached_bytes: None,
        };
        assert!(record.io_record().is_none());
        record.kind = RequestKind::Write;
        assert!(record.io_record().is_some());
        record.ok = false;
        assert!(record.io_record().is_none());
        record.ok = true;
        record.offset = None;
        assert!(record.io_record().is_none());
    }

    #[test]
    fn reads_of_a_cached_image_are_probed() {
        // A file just written is in the page cache (on tmpfs, always).
        let dir = std::env::temp_dir().join(format!("hk-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("image");
        std::fs::write(&path, vec![7u8; 64 * 1024]).unwrap();
        let tracer = DiskTracer::new(Some(path.clone()), CacheMode::Writeback);
        let session = tracer.start(4).unwrap();
        assert!(session.probes_host_cache(), "{:?}", session.probe_error());
        let mut pending = Pending::new(session.clone());
        let (op, _buf) = read_op(4096, 8192);
        pending.submitting(&op);
        pending.record(0, &request(RequestKind::Read, 8192, 10));
        assert_eq!(session.records()[0].host_cached_bytes, Some(8192));
        // cache=none never probes.
        let direct = DiskTracer::new(Some(path), CacheMode::None);
        assert!(!direct.start(4).unwrap().probes_host_cache());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_image_that_cannot_be_probed_says_why() {
        let tracer = DiskTracer::new(Some("/nonexistent/image".into()), CacheMode::Unsafe);
        let session = tracer.start(1).unwrap();
        assert!(!session.probes_host_cache());
        assert!(session
            .probe_error()
            .unwrap()
            .contains("/nonexistent/image"));
    }
}
