//! Periodic metrics: `hakoniwa run --metrics PATH [--metrics-interval S]`.
//!
//! Like Firecracker's metrics file: a writer thread samples every registered
//! [`MetricsSource`] once per interval and writes one JSON object per line,
//!
//! ```text
//! {"ts_ms":1795000000123,"mmu":{...},"kvm":{...}}
//! ```
//!
//! `ts_ms` is the wall-clock time of the sample in milliseconds since the
//! Unix epoch; then one object per source, under the source's name, in the
//! order the sources were registered. A last line is written when the VM
//! ends, so even a short `--exec` run leaves one.
//!
//! The sink is a regular file (created, or truncated if it exists) or a FIFO.
//! A FIFO is opened read-write and non-blocking, so hakoniwa neither waits
//! for a reader to open it nor stalls when the reader falls behind: a line
//! that finds the pipe full is dropped whole (lines are never interleaved or
//! torn, except when the VM ends while a reader has stopped reading midway).
//!
//! Sources here: `"mmu"` ([`MmuControl`]: paging mode, shadow-page budget,
//! the MMU statistics of `GET /api/v1/vm.mmu`) and `"kvm"` ([`VmStats`]:
//! KVM's per-vCPU counters summed over the vCPUs: exits, io_exits,
//! mmio_exits, halt_exits, irq_exits, pf_fixed, ...). Devices add theirs
//! (the display: `"display"`) by implementing [`MetricsSource`] and being
//! added to the list `vm.rs` hands to [`MetricsWriter::start`].
//!
//! User documentation: docs/running.md (the flags), docs/shadow-paging.md
//! (what the mmu and kvm sections mean).

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::mmu::MmuControl;
use crate::stats::VmStats;

/// Something that reports figures in every metrics line.
pub trait MetricsSource: Send + Sync {
    /// The key of this source's object in each line (unique per writer).
    fn name(&self) -> &'static str;
    /// The source's figures now, usually an object. Called on the metrics
    /// thread once per interval; it should be quick and must not block on
    /// the guest.
    fn sample(&self) -> Value;
}

/// `--metrics-interval` when not given.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The longest interval accepted.
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// When the VM ends while a FIFO reader has stopped reading in the middle
/// of a line, how long the writer keeps trying to finish it.
const STOP_GRACE: Duration = Duration::from_secs(1);
/// How often a line the pipe took only part of is retried.
const RETRY: Duration = Duration::from_millis(10);

/// `--metrics PATH` and `--metrics-interval`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsConfig {
    pub path: PathBuf,
    pub interval: Duration,
}

/// A metrics file hakoniwa cannot use, each message one line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MetricsError {
    #[error("--metrics {path}: no such directory: {dir}")]
    NoDirectory { path: String, dir: String },
    #[error("--metrics {path}: is a directory, not a file or FIFO")]
    IsDirectory { path: String },
    #[error("--metrics {path}: cannot open: {reason}")]
    Open { path: String, reason: String },
    #[error("--metrics-interval: '{0}' is not a number of seconds from 0.1 to 3600")]
    Interval(String),
    #[error("cannot start the metrics thread: {0}")]
    Thread(String),
}

/// Parses `--metrics-interval`: seconds, fractions allowed (`0.5`), from
/// [`MIN_INTERVAL`] to [`MAX_INTERVAL`].
pub fn parse_interval(text: &str) -> Result<Duration, MetricsError> {
    let bad = || MetricsError::Interval(text.to_string());
    let seconds: f64 = text.trim().parse().map_err(|_| bad())?;
    if !seconds.is_finite()
        || seconds < MIN_INTERVAL.as_secs_f64()
        || seconds > MAX_INTERVAL.as_secs_f64()
    {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Where the lines go: an open regular file, FIFO or other writable file.
#[derive(Debug)]
pub struct MetricsSink {
    file: File,
    fifo: bool,
}

impl MetricsSink {
    /// Opens `path` for metrics: a FIFO read-write and non-blocking, a
    /// regular file truncated (created if missing, in a directory that must
    /// exist). Fails with one line naming the problem.
    pub fn open(path: &Path) -> Result<MetricsSink, MetricsError> {
        let shown = path.display().to_string();
        let open_error = |e: std::io::Error| MetricsError::Open {
            path: shown.clone(),
            reason: api::io_reason(&e),
        };
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => Err(MetricsError::IsDirectory {
                path: shown.clone(),
            }),
            Ok(meta) if meta.file_type().is_fifo() => {
                // Read-write: opening never waits for a reader, and writes
                // never fail with EPIPE when there is none.
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(path)
                    .map_err(open_error)?;
                Ok(MetricsSink { file, fifo: true })
            }
            Ok(meta) => {
                let file = OpenOptions::new()
                    .write(true)
                    .truncate(meta.is_file())
                    .open(path)
                    .map_err(open_error)?;
                Ok(MetricsSink { file, fifo: false })
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let dir = match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                    _ => PathBuf::from("."),
                };
                if !dir.is_dir() {
                    return Err(MetricsError::NoDirectory {
                        path: shown.clone(),
                        dir: dir.display().to_string(),
                    });
                }
                let file = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(path)
                    .map_err(open_error)?;
                Ok(MetricsSink { file, fifo: false })
            }
            Err(e) => Err(open_error(e)),
        }
    }

    /// Whether the sink is a FIFO.
    pub fn is_fifo(&self) -> bool {
        self.fifo
    }
}

impl Write for MetricsSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// One metrics line (without the newline): `ts_ms`, then each source's
/// sample under its name, in order.
pub fn sample_line(sources: &[Arc<dyn MetricsSource>]) -> String {
    let ts_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let mut line = format!("{{\"ts_ms\":{ts_ms}");
    for source in sources {
        // serde_json's map would sort the keys; building the object by
        // hand keeps ts_ms first and the sources in order.
        let name = Value::from(source.name()).to_string();
        line.push(',');
        line.push_str(&name);
        line.push(':');
        line.push_str(&source.sample().to_string());
    }
    line.push('}');
    line
}

/// What became of one line.
#[derive(Debug, PartialEq, Eq)]
enum Written {
    Whole,
    /// The sink took none of it (a FIFO whose reader is behind).
    Dropped,
    Failed(String),
}

#[derive(Default)]
struct Shared {
    stop: Mutex<bool>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, bool> {
        self.stop.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sleeps until `deadline` or a stop request; true if stopping.
    fn wait_until(&self, deadline: Instant) -> bool {
        let mut stop = self.lock();
        loop {
            if *stop {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            stop = self
                .wake
                .wait_timeout(stop, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn stopping(&self) -> bool {
        *self.lock()
    }
}

/// The thread that writes a metrics line every interval. Dropping it (or
/// [`MetricsWriter::stop`]) writes a last line and joins the thread.
pub struct MetricsWriter {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsWriter {
    /// Starts writing `sources` to `sink` every `interval`.
    pub fn start(
        sink: MetricsSink,
        interval: Duration,
        sources: Vec<Arc<dyn MetricsSource>>,
    ) -> Result<MetricsWriter, MetricsError> {
        MetricsWriter::start_with(sink, interval, sources)
    }

    /// [`MetricsWriter::start`] to any writer (tests use a buffer). A
    /// source whose name an earlier one has is left out.
    pub fn start_with<W: Write + Send + 'static>(
        out: W,
        interval: Duration,
        sources: Vec<Arc<dyn MetricsSource>>,
    ) -> Result<MetricsWriter, MetricsError> {
        let mut unique: Vec<Arc<dyn MetricsSource>> = Vec::with_capacity(sources.len());
        for source in sources {
            if unique.iter().any(|s| s.name() == source.name()) {
                tracing::warn!(
                    "metrics: a second source named {:?} left out",
                    source.name()
                );
            } else {
                unique.push(source);
            }
        }
        let shared = Arc::new(Shared::default());
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn({
                let shared = shared.clone();
                move || {
                    sandbox::enter_or_exit(sandbox::ThreadKind::Metrics);
                    write_loop(out, interval.max(Duration::from_millis(1)), unique, shared)
                }
            })
            .map_err(|e| MetricsError::Thread(api::io_reason(&e)))?;
        Ok(MetricsWriter {
            shared,
            thread: Some(thread),
        })
    }

    /// Writes a last line and ends the thread.
    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        *self.shared.lock() = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for MetricsWriter {
    fn drop(&mut self) {
        self.finish();
    }
}

fn write_loop<W: Write>(
    mut out: W,
    interval: Duration,
    sources: Vec<Arc<dyn MetricsSource>>,
    shared: Arc<Shared>,
) {
    let mut next = Instant::now() + interval;
    let (mut dropped, mut failed) = (0u64, false);
    loop {
        let stopping = shared.wait_until(next);
        let mut line = sample_line(&sources);
        line.push('\n');
        match write_line(&mut out, line.as_bytes(), &shared) {
            Written::Whole => failed = false,
            Written::Dropped => {
                dropped += 1;
                if dropped.is_power_of_two() {
                    tracing::warn!("metrics: the FIFO is full, {dropped} line(s) dropped so far");
                }
            }
            Written::Failed(reason) => {
                if !failed {
                    tracing::warn!("metrics: cannot write: {reason}");
                }
                failed = true;
            }
        }
        if stopping {
            let _ = out.flush();
            return;
        }
        // Fixed ticks; after a stall, the next one is an interval from now.
        next += interval;
        let now = Instant::now();
        if next <= now {
            next = now + interval;
        }
    }
}

/// Writes `line` whole. A non-blocking sink that takes nothing drops the
/// line; one that took part of it gets the rest as the reader makes room
/// (for at most [`STOP_GRACE`] once stopping), so lines stay whole.
fn write_line<W: Write>(out: &mut W, line: &[u8], shared: &Shared) -> Written {
    let mut done = 0;
    let mut stalled_since: Option<Instant> = None;
    while done < line.len() {
        match out.write(&line[done..]) {
            Ok(0) => return Written::Failed("the sink accepts no more data".into()),
            Ok(n) => {
                done += n;
                stalled_since = None;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if done == 0 {
                    return Written::Dropped;
                }
                let since = *stalled_since.get_or_insert_with(Instant::now);
                if shared.stopping() && since.elapsed() >= STOP_GRACE {
                    return Written::Failed("the FIFO's reader stopped in mid-line".into());
                }
                std::thread::sleep(RETRY);
            }
            Err(e) => return Written::Failed(api::io_reason(&e)),
        }
    }
    Written::Whole
}

/// `"mmu"`: what `GET /api/v1/vm.mmu` reports (paging mode, budget, KVM's
/// MMU statistics and the paging-related vCPU counters).
impl MetricsSource for MmuControl {
    fn name(&self) -> &'static str {
        "mmu"
    }

    fn sample(&self) -> Value {
        serde_json::to_value(self.info()).unwrap_or(Value::Null)
    }
}

/// `"kvm"`: every per-vCPU statistic KVM keeps (exits, io_exits,
/// mmio_exits, halt_exits, irq_exits, pf_fixed, ...), summed over the
/// vCPUs (histograms as their sample counts, peaks as the maximum), and
/// `vcpus`, how many were summed.
impl MetricsSource for VmStats {
    fn name(&self) -> &'static str {
        "kvm"
    }

    fn sample(&self) -> Value {
        let mut object = serde_json::Map::new();
        object.insert("vcpus".into(), Value::from(self.vcpu_count()));
        for (name, value) in self.vcpus_summed() {
            object.insert(name, Value::from(value));
        }
        Value::Object(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts its samples.
    struct Counter {
        name: &'static str,
        n: AtomicU64,
    }

    impl MetricsSource for Counter {
        fn name(&self) -> &'static str {
            self.name
        }

        fn sample(&self) -> Value {
            serde_json::json!({ "n": self.n.fetch_add(1, Ordering::SeqCst) + 1 })
        }
    }

    fn counter(name: &'static str) -> Arc<dyn MetricsSource> {
        Arc::new(Counter {
            name,
            n: AtomicU64::new(0),
        })
    }

    /// A Write into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buffer {
        fn lines(&self) -> Vec<Value> {
            let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
            assert!(text.is_empty() || text.ends_with('\n'), "{text:?}");
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect()
        }
    }

    fn temp_path(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hk-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn intervals_parse_with_clear_errors() {
        assert_eq!(parse_interval("1"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("0.1"), Ok(MIN_INTERVAL));
        assert_eq!(parse_interval("3600"), Ok(MAX_INTERVAL));
        for bad in ["0", "0.05", "-1", "3601", "NaN", "inf", "", "1s", "lots"] {
            let e = parse_interval(bad).unwrap_err();
            assert_eq!(e, MetricsError::Interval(bad.into()));
            assert!(e.to_string().starts_with("--metrics-interval: '"), "{e}");
        }
    }

    #[test]
    fn lines_have_the_timestamp_first_and_sources_in_order() {
        let sources = vec![counter("zeta"), counter("alpha")];
        let line = sample_line(&sources);
        assert!(line.starts_with("{\"ts_ms\":"), "{line}");
        assert!(line.find("\"zeta\"").unwrap() < line.find("\"alpha\"").unwrap());
        assert!(!line.contains('\n'));
        let value: Value = serde_json::from_str(&line).unwrap();
        assert!(value["ts_ms"].as_u64().unwrap() > 1_600_000_000_000);
        assert_eq!(value["zeta"]["n"], 1);
        assert_eq!(value["alpha"]["n"], 1);
    }

    #[test]
    fn the_writer_samples_every_interval_and_once_more_at_the_end() {
        let buffer = Buffer::default();
        let writer = MetricsWriter::start_with(
            buffer.clone(),
            Duration::from_millis(20),
            vec![counter("a"), counter("b"), counter("a")],
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while buffer.lines().len() < 4 {
            assert!(Instant::now() < deadline, "too few lines");
            std::thread::sleep(Duration::from_millis(5));
        }
        writer.stop();
        let lines = buffer.lines();
        assert!(lines.len() >= 5, "{lines:?}");
        for (i, line) in lines.iter().enumerate() {
            let object = line.as_object().unwrap();
            // The second "a" was left out.
            assert_eq!(
                object.keys().collect::<Vec<_>>(),
                ["a", "b", "ts_ms"],
                "{line}"
            );
            assert_eq!(line["a"]["n"], i as u64 + 1, "{line}");
            assert_eq!(line["b"]["n"], i as u64 + 1, "{line}");
        }
        let ts: Vec<u64> = lines.iter().map(|l| l["ts_ms"].as_u64().unwrap()).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
        // Nothing more once stopped.
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(buffer.lines().len(), lines.len());
    }

    #[test]
    fn dropping_the_writer_writes_the_last_line_at_once() {
        let buffer = Buffer::default();
        let started = Instant::now();
        drop(
            MetricsWriter::start_with(
                buffer.clone(),
                Duration::from_secs(3600),
                vec![counter("x")],
            )
            .unwrap(),
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        let lines = buffer.lines();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["x"]["n"], 1);
    }

    /// Takes `room` bytes, then says WouldBlock.
    struct Full {
        taken: Vec<u8>,
        room: usize,
    }

    impl Write for Full {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.room);
            if n == 0 {
                return Err(std::io::Error::from(ErrorKind::WouldBlock));
            }
            self.room -= n;
            self.taken.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_full_sink_drops_whole_lines_and_finishes_started_ones() {
        let shared = Shared::default();
        let mut full = Full {
            taken: Vec::new(),
            room: 0,
        };
        assert_eq!(write_line(&mut full, b"{}\n", &shared), Written::Dropped);
        assert!(full.taken.is_empty());
        full.room = 3;
        assert_eq!(write_line(&mut full, b"{}\n", &shared), Written::Whole);
        // Part of a line went out and the reader is gone: once stopping,
        // the writer gives up after the grace period instead of hanging.
        full.room = 2;
        *shared.lock() = true;
        let started = Instant::now();
        assert!(matches!(
            write_line(&mut full, b"{\"a\":1}\n", &shared),
            Written::Failed(_)
        ));
        assert!(started.elapsed() >= STOP_GRACE);
    }

    #[test]
    fn regular_files_are_created_or_truncated() {
        let path = temp_path("metrics.json");
        std::fs::write(&path, "old contents\n").unwrap();
        let sink = MetricsSink::open(&path).unwrap();
        assert!(!sink.is_fifo());
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        let writer =
            MetricsWriter::start(sink, Duration::from_secs(3600), vec![counter("x")]).unwrap();
        writer.stop();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        std::fs::remove_file(&path).unwrap();
        assert!(MetricsSink::open(&path).is_ok());
        assert!(path.exists());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn bad_paths_are_one_line_errors() {
        let missing = Path::new("/nonexistent-hakoniwa-dir/sub/metrics.json");
        let e = MetricsSink::open(missing).unwrap_err();
        assert_eq!(
            e,
            MetricsError::NoDirectory {
                path: missing.display().to_string(),
                dir: "/nonexistent-hakoniwa-dir/sub".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "--metrics /nonexistent-hakoniwa-dir/sub/metrics.json: no such directory: /nonexistent-hakoniwa-dir/sub"
        );
        let dir = temp_path("a-directory");
        std::fs::create_dir_all(&dir).unwrap();
        let e = MetricsSink::open(&dir).unwrap_err();
        assert!(matches!(e, MetricsError::IsDirectory { .. }), "{e}");
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn a_fifo_without_a_reader_never_blocks_and_keeps_lines_whole() {
        let path = temp_path("metrics.fifo");
        let _ = std::fs::remove_file(&path);
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path and creates a FIFO.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let sink = MetricsSink::open(&path).unwrap();
        assert!(sink.is_fifo());
        // Nobody reads: lines beyond the pipe's buffer are dropped, and
        // stopping does not hang.
        let big: Arc<dyn MetricsSource> = Arc::new(Big);
        let writer =
            MetricsWriter::start(sink, Duration::from_millis(1), vec![big.clone()]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        writer.stop();
        assert!(started.elapsed() < Duration::from_secs(5));

        // With a reader: it sees whole lines.
        let reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        let sink = MetricsSink::open(&path).unwrap();
        let writer = MetricsWriter::start(sink, Duration::from_millis(5), vec![big]).unwrap();
        let mut text = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while text.iter().filter(|&&b| b == b'\n').count() < 3 {
            assert!(Instant::now() < deadline, "too few lines from the FIFO");
            let mut chunk = [0u8; 4096];
            match (&reader).read(&mut chunk) {
                Ok(n) => text.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("{e}"),
            }
        }
        writer.stop();
        let text = String::from_utf8(text).unwrap();
        for line in text.lines().take(3) {
            let value: Value = serde_json::from_str(line).unwrap();
            assert_eq!(value["big"].as_str().unwrap().len(), 3000);
        }
        let _ = std::fs::remove_file(&path);
    }

    /// A 3000-character sample: a few fill a pipe.
    struct Big;

    impl MetricsSource for Big {
        fn name(&self) -> &'static str {
            "big"
        }

        fn sample(&self) -> Value {
            Value::from("x".repeat(3000))
        }
    }
}
