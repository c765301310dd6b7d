//! The I/O-cache tracer of a running VM (docs/iotrace.md): `PUT
//! /api/v1/vm.iotrace` (start, stop, report), `GET /api/v1/vm.iotrace`
//! and `hakoniwa ctl iotrace`.
//!
//! Per disk, a window from start to stop: the virtual-disk layer is the
//! disk's own [`DiskTracer`] (every request, with the host page cache's
//! residency of each read); the physical layer is the host block device
//! under the image, its `/sys/block/<dev>/stat` read at the start and at
//! each report ([`iotrace::physical`]); the application layer is the
//! guest agent's `/proc/PID/io` deltas of the processes named at the start
//! ([`agent`]), asked at the start and at each report, with the guest's
//! memory and the disk blocks its page cache holds (the bytes cached
//! twice, estimated and measured). The report is the iotrace crate's
//! [`WindowReport`] with what this window was ([`IoTraceReport`]);
//! [`table`] is `ctl iotrace report`'s text.

pub mod advise;
pub mod agent;
pub mod table;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use devices::virtio::block::{
    now_ns, CacheMode, DiskTracer, TraceError, TraceRecord, TraceSession, TRACE_CAPACITY,
};
use iotrace::host_cache::HostCacheProbe;
use iotrace::layers::{
    self, CacheFacts, HostCacheView, LayerStats, LayerTotals, Window, WindowReport,
};
use iotrace::physical::{BlockDevice, DiskStat};
use serde::{Deserialize, Serialize};

use agent::{AgentAnswer, AgentError, AgentQuery, DeviceEntry, DoubleCachedMeasured, ProcessDelta};

/// The block the report's reuse and double-caching figures count in: the
/// host's page.
const REPORT_BLOCK_BYTES: u64 = 4096;

/// What the report says of the application layer when no process was
/// named at the start.
pub const APPLICATION_ABSENT: &str = "absent: no guest process named (start with --pid or --comm)";

/// A disk the VM can trace.
#[derive(Clone, Debug)]
pub struct TraceableDisk {
    pub id: String,
    pub tracer: Arc<DiskTracer>,
    /// Its image (a file or a block device).
    pub image: PathBuf,
    pub cache: CacheMode,
}

/// Why an iotrace action was refused. One line.
#[derive(Debug, thiserror::Error)]
pub enum IoTraceError {
    #[error("no disk '{id}' (disks: {disks})")]
    NoSuchDisk { id: String, disks: String },
    #[error("the VM has no disks")]
    NoDisks,
    #[error("the VM has several disks: name one with --disk (disks: {0})")]
    WhichDisk(String),
    #[error("disk '{0}' is already traced (stop it first)")]
    AlreadyTraced(String),
    #[error("disk '{0}' is not traced (start it first)")]
    NotTraced(String),
    #[error("trace file {path}: {error}")]
    TraceFile { path: String, error: String },
    #[error("{0}")]
    Agent(#[from] AgentError),
    #[error("guest process {pid}: {error}")]
    NoSuchProcess { pid: u32, error: String },
}

/// What to trace beside the disk, given at the start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartOptions {
    /// Where the records go as JSON lines at the stop.
    pub trace_file: Option<String>,
    /// Guest processes whose I/O is the application layer: by pid, and
    /// every process of these names (`comm`).
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    /// The disk's name in the guest, if not the virtio-blk name its place
    /// among the VM's disks gives (`/dev/vda` for the first).
    pub guest_dev: Option<String>,
}

/// `--guest-dev` that asks the agent for no disk's residency.
pub const NO_GUEST_DEV: &str = "none";

/// The guest's memory and I/O mode, as its agent said at the last report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestFacts {
    pub mem_total: u64,
    pub mem_available: u64,
    /// Its page cache (`Cached`).
    pub cached: u64,
    pub swap_total: u64,
    pub swap_free: u64,
    /// Whether a named process had a regular file open with O_DIRECT, at
    /// the start or at this report (`None`: no named process was seen).
    pub direct_io: Option<bool>,
}

/// The host device under a disk's image, as found at the start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhysicalDevice {
    /// Its kernel name (the whole disk for a partition).
    pub name: String,
    /// `MAJ:MIN` of what the image is on.
    pub dev: String,
    /// What its `stat` counted in the window: the whole device, other
    /// processes included.
    pub stat: DiskStat,
}

/// One disk's window, as `vm.iotrace` reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoTraceReport {
    pub disk: String,
    /// Still traced (a report), or stopped (the last report).
    pub tracing: bool,
    pub seconds: f64,
    /// Virtual-disk records taken, and those the buffer had no room for.
    pub records: u64,
    pub dropped: u64,
    pub capacity: u64,
    /// How reads' host page-cache residency was taken, or why not.
    pub host_cache_probe: String,
    /// The physical layer's device and counters, or why there is none.
    pub physical_device: Option<PhysicalDevice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_unavailable: Option<String>,
    /// Whose I/O the application layer is, or why it is absent.
    pub application: String,
    /// The named processes' counters in the window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessDelta>,
    /// The guest's memory, from its agent, or why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<GuestFacts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_unavailable: Option<String>,
    /// The bytes cached twice as measured (the guest agent's resident disk
    /// blocks against the host's `mincore` of the image), beside the
    /// estimate `layers.double_cached`; or why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub double_cached_measured: Option<DoubleCachedMeasured>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub double_cached_unmeasured: Option<String>,
    /// Where the records went (`--trace-file`), once stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_file: Option<String>,
    pub layers: WindowReport,
}

/// `GET /api/v1/vm.iotrace`: each disk, traced or not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoTraceStatus {
    pub disk: String,
    pub tracing: bool,
    pub records: u64,
    pub dropped: u64,
}

/// What the VMM keeps of a window beside the disk's session.
struct HostWindow {
    session: Arc<TraceSession>,
    physical: Result<(BlockDevice, DiskStat), String>,
    trace_file: Option<(String, File)>,
    /// What the agent is asked at each report, and its answer at the
    /// start (or why there was none).
    query: AgentQuery,
    agent_start: Result<AgentAnswer, AgentError>,
}

/// The VM's tracer: its disks and their windows.
#[derive(Default)]
pub struct VmIoTrace {
    disks: Vec<TraceableDisk>,
    /// The `--vsock` Unix socket, through which the guest agent answers.
    vsock_uds: Option<PathBuf>,
    windows: Mutex<BTreeMap<String, HostWindow>>,
}

impl VmIoTrace {
    /// The tracer of these disks (in the VM's order: the guest names them
    /// `/dev/vda`, `/dev/vdb`, ...), its agent behind `vsock_uds`.
    pub fn new(disks: Vec<TraceableDisk>, vsock_uds: Option<PathBuf>) -> VmIoTrace {
        VmIoTrace {
            disks,
            vsock_uds,
            windows: Mutex::new(BTreeMap::new()),
        }
    }

    /// Starts tracing `disk` (the only disk when None); with a trace
    /// file, the records go there as JSON lines at the stop. The guest
    /// agent is asked for the named processes, and refused the start
    /// with one line if it cannot answer or a named pid does not exist;
    /// without processes named, a missing agent only leaves the
    /// application layer and the guest's facts out of the reports.
    pub fn start(&self, disk: Option<&str>, options: &StartOptions) -> Result<(), IoTraceError> {
        let disk = self.disk(disk)?;
        let mut windows = self.lock();
        if windows.contains_key(&disk.id) {
            return Err(IoTraceError::AlreadyTraced(disk.id.clone()));
        }
        let index = self.disks.iter().position(|d| d.id == disk.id).unwrap_or(0);
        let query = AgentQuery {
            pids: options.pids.clone(),
            comms: options.comms.clone(),
            // "none": no residency walk at each report (a walk over a
            // large file system costs the guest CPU the traced workload
            // may need; the benchmark turns it off).
            devices: match options.guest_dev.as_deref() {
                Some(NO_GUEST_DEV) => Vec::new(),
                Some(dev) => vec![dev.to_string()],
                None => vec![agent::virtio_blk_name(index)],
            },
        };
        query.request_line()?;
        let named = !query.pids.is_empty() || !query.comms.is_empty();
        let agent_start = self.ask(&query.processes());
        if named {
            let answer = agent_start.as_ref().map_err(|e| e.clone())?;
            for entry in &answer.processes {
                if let agent::ProcessEntry::Missing { pid, error } = entry {
                    return Err(IoTraceError::NoSuchProcess {
                        pid: *pid,
                        error: error.clone(),
                    });
                }
            }
        }
        let trace_file = match options.trace_file.as_deref() {
            Some(path) => Some((
                path.to_string(),
                File::create(path).map_err(|e| IoTraceError::TraceFile {
                    path: path.to_string(),
                    error: e.to_string(),
                })?,
            )),
            None => None,
        };
        let physical = BlockDevice::of_image(&disk.image)
            .and_then(|device| device.stat().map(|stat| (device, stat)))
            .map_err(|e| e.to_string());
        let session = disk.tracer.start(TRACE_CAPACITY).map_err(|e| match e {
            TraceError::AlreadyTraced => IoTraceError::AlreadyTraced(disk.id.clone()),
            TraceError::NotTraced => IoTraceError::NotTraced(disk.id.clone()),
        })?;
        tracing::info!(
            "iotrace: tracing disk {} ({})",
            disk.id,
            match &physical {
                Ok((device, _)) => format!("on host device {}", device.name),
                Err(e) => format!("no physical layer: {e}"),
            }
        );
        windows.insert(
            disk.id.clone(),
            HostWindow {
                session,
                physical,
                trace_file,
                query,
                agent_start,
            },
        );
        Ok(())
    }

    /// The guest agent's answer, or why there is none.
    fn ask(&self, query: &AgentQuery) -> Result<AgentAnswer, AgentError> {
        let uds = self.vsock_uds.as_deref().ok_or(AgentError::NoVsock)?;
        agent::ask(uds, query)
    }

    /// The agent's answers now: the processes and the guest's memory, then
    /// the disk's residency on a connection of its own (walking a large
    /// file system may outlast the timeout; the application layer must
    /// not depend on it).
    fn ask_now(&self, query: &AgentQuery) -> AgentNow {
        AgentNow {
            processes: self.ask(&query.processes()),
            devices: (!query.devices.is_empty()).then(|| self.ask(&query.devices())),
        }
    }

    /// The report of `disk`'s window so far.
    pub fn report(&self, disk: Option<&str>) -> Result<IoTraceReport, IoTraceError> {
        let disk = self.disk(disk)?;
        let windows = self.lock();
        let window = windows
            .get(&disk.id)
            .ok_or_else(|| IoTraceError::NotTraced(disk.id.clone()))?;
        let agent_now = self.ask_now(&window.query);
        Ok(report_of(disk, window, &agent_now, true))
    }

    /// Stops tracing `disk`: its last report, the records written to the
    /// trace file if one was named.
    pub fn stop(&self, disk: Option<&str>) -> Result<IoTraceReport, IoTraceError> {
        let disk = self.disk(disk)?;
        let mut windows = self.lock();
        let mut window = windows
            .remove(&disk.id)
            .ok_or_else(|| IoTraceError::NotTraced(disk.id.clone()))?;
        // The session was started with the window; another stop cannot
        // have ended it (both hold `windows`).
        let _ = disk.tracer.stop();
        let agent_now = self.ask_now(&window.query);
        let mut report = report_of(disk, &window, &agent_now, false);
        if let Some((path, file)) = window.trace_file.take() {
            write_records(file, &window.session).map_err(|e| IoTraceError::TraceFile {
                path: path.clone(),
                error: e.to_string(),
            })?;
            report.trace_file = Some(path);
        }
        Ok(report)
    }

    /// What the advisor reads of `disk`'s window so far: its report, the
    /// virtual disk's records and the disk's cache mode.
    pub fn advice_window(
        &self,
        disk: Option<&str>,
    ) -> Result<(IoTraceReport, Vec<TraceRecord>, CacheMode), IoTraceError> {
        let disk = self.disk(disk)?;
        let windows = self.lock();
        let window = windows
            .get(&disk.id)
            .ok_or_else(|| IoTraceError::NotTraced(disk.id.clone()))?;
        let records = window.session.records();
        let agent_now = self.ask_now(&window.query);
        Ok((
            report_of(disk, window, &agent_now, true),
            records,
            disk.cache,
        ))
    }

    /// Every disk, traced or not.
    pub fn status(&self) -> Vec<IoTraceStatus> {
        let windows = self.lock();
        self.disks
            .iter()
            .map(|disk| {
                let session = windows.get(&disk.id).map(|w| &w.session);
                IoTraceStatus {
                    disk: disk.id.clone(),
                    tracing: session.is_some(),
                    records: session.map_or(0, |s| s.records().len() as u64),
                    dropped: session.map_or(0, |s| s.dropped()),
                }
            })
            .collect()
    }

    fn disk(&self, id: Option<&str>) -> Result<&TraceableDisk, IoTraceError> {
        match id {
            Some(id) => {
                self.disks
                    .iter()
                    .find(|d| d.id == id)
                    .ok_or_else(|| IoTraceError::NoSuchDisk {
                        id: id.to_string(),
                        disks: self.names(),
                    })
            }
            None => match self.disks.as_slice() {
                [] => Err(IoTraceError::NoDisks),
                [only] => Ok(only),
                _ => Err(IoTraceError::WhichDisk(self.names())),
            },
        }
    }

    fn names(&self) -> String {
        if self.disks.is_empty() {
            return "none".into();
        }
        let names: Vec<&str> = self.disks.iter().map(|d| d.id.as_str()).collect();
        names.join(", ")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, HostWindow>> {
        self.windows.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The window's report: the session's records up to now (or its stop),
/// the device's counters since the start, the agent's answers at the start
/// and now.
fn report_of(
    disk: &TraceableDisk,
    window: &HostWindow,
    agent_now: &AgentNow,
    tracing: bool,
) -> IoTraceReport {
    let session = &window.session;
    let end_ns = session.ended_ns().unwrap_or_else(now_ns);
    let records = session.records();
    let io_records: Vec<_> = records.iter().filter_map(|r| r.io_record()).collect();
    let (physical_device, physical_unavailable) = match &window.physical {
        Ok((device, start)) => match device.stat() {
            Ok(now) => (
                Some(PhysicalDevice {
                    name: device.name.clone(),
                    dev: device.dev.clone(),
                    stat: now.since(start),
                }),
                None,
            ),
            Err(e) => (None, Some(e.to_string())),
        },
        Err(e) => (None, Some(e.clone())),
    };
    let guest = from_agent(&window.query, &window.agent_start, agent_now);
    // The host's residency of the image, wanted only with the guest's.
    let host_blocks = match (&guest.facts, &guest.residency) {
        (Err(_), Err(_)) => Err(String::new()),
        _ => host_resident_blocks(&disk.image),
    };
    let facts = CacheFacts {
        guest_cache_bytes: guest.facts.as_ref().ok().map(|g| g.cached),
        host_cache: host_blocks
            .as_ref()
            .ok()
            .map(|blocks| HostCacheView::ResidentBlocks(blocks.clone())),
    };
    let (double_cached_measured, double_cached_unmeasured) = match (&guest.residency, &host_blocks)
    {
        (Ok((device, runs)), Ok(host)) => (
            Some(DoubleCachedMeasured {
                guest_device: device.clone(),
                guest_bytes: runs.iter().map(|r| r.1).sum::<u64>() * REPORT_BLOCK_BYTES,
                host_bytes: host.len() as u64 * REPORT_BLOCK_BYTES,
                both_bytes: agent::intersect(runs, host) * REPORT_BLOCK_BYTES,
            }),
            None,
        ),
        (Err(e), _) => (None, Some(e.clone())),
        (_, Err(e)) => (
            None,
            Some(format!("the host's residency of the image: {e}")),
        ),
    };
    let totals = LayerTotals {
        application: guest.application,
        physical_device: physical_device.as_ref().map(|p| p.stat.layer_stats()),
    };
    let layers = layers::report_from_layers(
        Window {
            start_ns: session.started_ns(),
            // Records are stamped at dequeue: one taken at the stop's
            // instant still belongs to the window.
            end_ns: end_ns + 1,
        },
        totals,
        &io_records,
        &facts,
        REPORT_BLOCK_BYTES,
    );
    let host_cache_probe = if session.probes_host_cache() {
        "mincore of each read's range just before it is submitted".to_string()
    } else if let Some(e) = session.probe_error() {
        format!("off: {e}")
    } else {
        format!("off: cache={} does not use the host page cache", disk.cache)
    };
    let (guest_facts, guest_unavailable) = match guest.facts {
        Ok(facts) => (Some(facts), None),
        Err(e) => (None, Some(e)),
    };
    IoTraceReport {
        disk: disk.id.clone(),
        tracing,
        seconds: end_ns.saturating_sub(session.started_ns()) as f64 / 1e9,
        records: records.len() as u64,
        dropped: session.dropped(),
        capacity: session.capacity() as u64,
        host_cache_probe,
        physical_device,
        physical_unavailable,
        application: guest.application_text,
        processes: guest.processes,
        guest: guest_facts,
        guest_unavailable,
        double_cached_measured,
        double_cached_unmeasured,
        trace_file: None,
        layers,
    }
}

/// The agent's answers at a report.
struct AgentNow {
    /// To the processes named (and the guest's memory).
    processes: Result<AgentAnswer, AgentError>,
    /// To the traced disk's guest device.
    /// None when the window asks for no device (`--guest-dev none`).
    devices: Option<Result<AgentAnswer, AgentError>>,
}

/// What a window's report takes from the guest agent.
struct FromAgent {
    /// The application layer: the named processes' counter deltas.
    application: Option<LayerStats>,
    /// Whose they are, or why there are none.
    application_text: String,
    processes: Vec<ProcessDelta>,
    facts: Result<GuestFacts, String>,
    /// The guest device and its resident blocks (`REPORT_BLOCK_BYTES`
    /// runs).
    residency: Result<(String, Vec<(u64, u64)>), String>,
}

/// The application layer, the guest's facts and its cache's residency of
/// the disk from the agent's answers at the start and now.
fn from_agent(
    query: &AgentQuery,
    start: &Result<AgentAnswer, AgentError>,
    agent_now: &AgentNow,
) -> FromAgent {
    let now = &agent_now.processes;
    let named = !query.pids.is_empty() || !query.comms.is_empty();
    let (application, application_text, processes) = match (named, start, now) {
        (false, _, _) => (None, APPLICATION_ABSENT.to_string(), Vec::new()),
        (true, Err(e), _) => (None, format!("absent: at the start, {e}"), Vec::new()),
        (true, _, Err(e)) => (None, format!("absent: {e}"), Vec::new()),
        (true, Ok(start), Ok(now)) => {
            let processes = agent::deltas(&start.processes, &now.processes);
            let counted: Vec<&ProcessDelta> =
                processes.iter().filter(|p| p.error.is_none()).collect();
            if counted.is_empty() {
                (
                    None,
                    "absent: none of the named guest processes is alive".to_string(),
                    processes,
                )
            } else {
                let sum = |f: fn(&ProcessDelta) -> u64| counted.iter().map(|p| f(p)).sum::<u64>();
                let stats = LayerStats::from_counters(
                    sum(|p| p.read_bytes),
                    sum(|p| p.write_bytes),
                    sum(|p| p.reads),
                    sum(|p| p.writes),
                );
                let names: Vec<String> = counted
                    .iter()
                    .map(|p| format!("{} ({})", p.pid, p.comm))
                    .collect();
                let gone = processes.len() - counted.len();
                let text = format!(
                    "guest processes {} (/proc/PID/io: rchar, wchar, syscr, syscw){}",
                    names.join(", "),
                    if gone > 0 {
                        format!("; {gone} not counted (gone)")
                    } else {
                        String::new()
                    }
                );
                (Some(stats), text, processes)
            }
        }
    };
    let facts = match now {
        Ok(answer) => {
            let m = &answer.meminfo;
            let seen = |a: &Result<AgentAnswer, AgentError>| -> Vec<(u64, u64)> {
                a.as_ref()
                    .map(|a| {
                        a.processes
                            .iter()
                            .filter_map(|p| match p {
                                agent::ProcessEntry::Io(io) => {
                                    Some((io.direct_fds, io.buffered_fds))
                                }
                                _ => None,
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let fds: Vec<(u64, u64)> = seen(start).into_iter().chain(seen(now)).collect();
            Ok(GuestFacts {
                mem_total: m.mem_total_kib.saturating_mul(1024),
                mem_available: m.mem_available_kib.saturating_mul(1024),
                cached: m.cached_kib.saturating_mul(1024),
                swap_total: m.swap_total_kib.saturating_mul(1024),
                swap_free: m.swap_free_kib.saturating_mul(1024),
                direct_io: (named && !fds.is_empty()).then(|| fds.iter().any(|f| f.0 > 0)),
            })
        }
        Err(e) => Err(e.to_string()),
    };
    let residency = match &agent_now.devices {
        None => Err(format!("not asked (--guest-dev {NO_GUEST_DEV})")),
        Some(Ok(answer)) => {
            let device = query.devices.first().cloned().unwrap_or_default();
            match answer.device(&device) {
                Some(DeviceEntry::Residency(r)) => r
                    .blocks(REPORT_BLOCK_BYTES)
                    .map(|runs| (device.clone(), runs))
                    .map_err(|e| e.to_string()),
                Some(DeviceEntry::Failed { error, .. }) => {
                    Err(format!("guest device {device}: {error}"))
                }
                None => Err(format!("the guest agent did not report {device}")),
            }
        }
        Some(Err(e)) => Err(e.to_string()),
    };
    FromAgent {
        application,
        application_text,
        processes,
        facts,
        residency,
    }
}

/// The image's `REPORT_BLOCK_BYTES` blocks the host page cache holds
/// (`mincore` of the whole image).
fn host_resident_blocks(image: &Path) -> Result<BTreeSet<u64>, String> {
    let file = File::open(image).map_err(|e| format!("{}: {e}", image.display()))?;
    let probe = HostCacheProbe::open(&file).map_err(|e| e.to_string())?;
    let pages = probe.resident_page_indices().map_err(|e| e.to_string())?;
    let page = probe.page_bytes();
    Ok(pages
        .into_iter()
        .flat_map(|p| {
            let first = p * page / REPORT_BLOCK_BYTES;
            first..((p + 1) * page).div_ceil(REPORT_BLOCK_BYTES).max(first + 1)
        })
        .collect())
}

/// The session's records as JSON lines.
fn write_records(file: File, session: &TraceSession) -> std::io::Result<()> {
    let mut out = BufWriter::new(file);
    for record in session.records() {
        serde_json::to_writer(&mut out, &record)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(disks: &[&str]) -> (VmIoTrace, tempfile_dir::Dir) {
        let dir = tempfile_dir::Dir::new();
        let traceable = disks
            .iter()
            .map(|id| {
                let image = dir.path.join(format!("{id}.img"));
                std::fs::write(&image, vec![0u8; 8192]).unwrap();
                TraceableDisk {
                    id: id.to_string(),
                    tracer: Arc::new(DiskTracer::new(Some(image.clone()), CacheMode::Writeback)),
                    image,
                    cache: CacheMode::Writeback,
                }
            })
            .collect();
        (VmIoTrace::new(traceable, None), dir)
    }

    /// A directory removed when dropped (the vmm crate has no tempfile).
    mod tempfile_dir {
        pub struct Dir {
            pub path: std::path::PathBuf,
        }

        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                let path = std::env::temp_dir().join(format!(
                    "hk-iotrace-{}-{}",
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&path).unwrap();
                Dir { path }
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.path);
            }
        }
    }

    fn none() -> StartOptions {
        StartOptions::default()
    }

    use iotrace::layers::Layer;

    #[test]
    fn bad_requests_get_one_line_errors() {
        let (trace, _dir) = vm(&["disk0", "data"]);
        let message = |e: IoTraceError| {
            let text = e.to_string();
            assert!(!text.contains('\n'), "{text}");
            text
        };
        assert_eq!(
            message(trace.start(Some("nope"), &none()).unwrap_err()),
            "no disk 'nope' (disks: disk0, data)"
        );
        assert_eq!(
            message(trace.start(None, &none()).unwrap_err()),
            "the VM has several disks: name one with --disk (disks: disk0, data)"
        );
        assert_eq!(
            message(trace.stop(Some("data")).unwrap_err()),
            "disk 'data' is not traced (start it first)"
        );
        assert_eq!(
            message(trace.report(Some("data")).unwrap_err()),
            "disk 'data' is not traced (start it first)"
        );
        trace.start(Some("data"), &none()).unwrap();
        assert_eq!(
            message(trace.start(Some("data"), &none()).unwrap_err()),
            "disk 'data' is already traced (stop it first)"
        );
        let err = message(
            trace
                .start(
                    Some("disk0"),
                    &StartOptions {
                        trace_file: Some("/nonexistent/dir/trace.jsonl".into()),
                        ..none()
                    },
                )
                .unwrap_err(),
        );
        assert!(
            err.starts_with("trace file /nonexistent/dir/trace.jsonl: "),
            "{err}"
        );
        // The refused start left disk0 untraced.
        assert!(!trace.status()[0].tracing);
        assert_eq!(
            message(VmIoTrace::default().start(None, &none()).unwrap_err()),
            "the VM has no disks"
        );
    }

    #[test]
    fn a_window_reports_its_layers_and_writes_its_trace_file() {
        let (trace, dir) = vm(&["data"]);
        let file = dir.path.join("trace.jsonl");
        trace
            .start(
                None,
                &StartOptions {
                    trace_file: Some(file.to_str().unwrap().into()),
                    ..none()
                },
            )
            .unwrap();
        let status = trace.status();
        assert_eq!(status.len(), 1);
        assert!(status[0].tracing);
        let report = trace.report(Some("data")).unwrap();
        assert!(report.tracing);
        assert_eq!(report.records, 0);
        assert_eq!(report.capacity, TRACE_CAPACITY as u64);
        assert_eq!(report.application, APPLICATION_ABSENT);
        assert!(report
            .layers
            .absent_layers
            .contains(&iotrace::layers::Layer::Application));
        assert!(report.host_cache_probe.starts_with("mincore"), "{report:?}");
        // The physical layer is there or says why not (a temporary
        // directory on tmpfs or overlayfs has no device).
        assert_ne!(
            report.physical_device.is_some(),
            report.physical_unavailable.is_some()
        );
        let stopped = trace.stop(None).unwrap();
        assert!(!stopped.tracing);
        assert_eq!(stopped.trace_file.as_deref(), file.to_str());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "");
        // The JSON goes both ways (ctl renders the table from it).
        let json = serde_json::to_string(&stopped).unwrap();
        let back: IoTraceReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, stopped);
        assert!(!trace.status()[0].tracing);
        // And it can start again.
        trace.start(Some("data"), &none()).unwrap();
    }

    /// A fake vsock socket whose agent takes `exchanges` in turn, one a
    /// connection: the request line it must get, and its answer.
    fn fake_agent(dir: &Path, exchanges: Vec<(&'static str, String)>) -> PathBuf {
        use std::io::{BufRead, BufReader};
        let path = dir.join("vsock.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for (request, answer) in exchanges {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                assert_eq!(line, "CONNECT 5002\n");
                (&stream).write_all(b"OK 1024\n").unwrap();
                line.clear();
                reader.read_line(&mut line).unwrap();
                assert_eq!(line, request);
                (&stream).write_all(answer.as_bytes()).unwrap();
            }
        });
        path
    }

    fn answer(rchar: u64, syscr: u64, direct_fds: u64, resident: &str, pages: u64) -> String {
        format!(
            r#"{{"agent":"hk-ioagent 1","meminfo":{{"mem_total_kib":1000,"mem_available_kib":500,"cached_kib":8,"swap_total_kib":0,"swap_free_kib":0}},"processes":[{{"pid":7,"comm":"sh","rchar":{rchar},"wchar":0,"syscr":{syscr},"syscw":0,"read_bytes":0,"write_bytes":0,"direct_fds":{direct_fds},"buffered_fds":0}}],"devices":[{{"path":"/dev/vdb","size":8192,"page_bytes":4096,"resident_pages":{pages},"resident":[{resident}]}}]}}"#
        ) + "\n"
    }

    #[test]
    fn the_agent_gives_the_application_layer_and_the_bytes_cached_twice() {
        let (trace, dir) = vm(&["disk0", "data"]);
        // The data disk's image, read so the host caches both its pages.
        let image = dir.path.join("data.img");
        assert_eq!(std::fs::read(&image).unwrap().len(), 8192);
        let processes = "report pid=7\n";
        let device = "report dev=/dev/vdb\n";
        let uds = fake_agent(
            &dir.path,
            vec![
                (processes, answer(1000, 10, 0, "", 0)),
                (processes, answer(1000 + (16 << 20), 10 + 16, 1, "", 0)),
                (device, answer(0, 0, 0, "[1,1]", 1)),
                // The agent gone wrong at the stop, for the processes;
                // the device is still measured.
                (processes, "{\"agent\":\"hk-ioagent 1\"}\n".into()),
                (device, answer(0, 0, 0, "[0,2]", 2)),
            ],
        );
        let trace = VmIoTrace::new(trace.disks, Some(uds));
        let options = StartOptions {
            pids: vec![7],
            ..none()
        };
        trace.start(Some("data"), &options).unwrap();
        let report = trace.report(Some("data")).unwrap();
        assert_eq!(
            report.layers.application.read_bytes,
            16 << 20,
            "{report:#?}"
        );
        assert_eq!(report.layers.application.read_requests, 16);
        assert!(report
            .layers
            .absent_layers
            .iter()
            .all(|l| *l != Layer::Application));
        assert_eq!(report.processes.len(), 1);
        assert!(
            report.application.contains("7 (sh)"),
            "{}",
            report.application
        );
        let guest = report.guest.clone().unwrap();
        assert_eq!((guest.cached, guest.mem_total), (8192, 1000 * 1024));
        assert_eq!(guest.direct_io, Some(true));
        // The guest holds page 1 of the disk, the host both pages of the
        // image (unless this host's cache dropped them meanwhile).
        let measured = report.double_cached_measured.clone().unwrap();
        assert_eq!(measured.guest_device, "/dev/vdb");
        assert_eq!(measured.guest_bytes, 4096);
        assert!(measured.host_bytes <= 8192);
        if measured.host_bytes == 8192 {
            assert_eq!(measured.both_bytes, 4096);
        }
        // The estimate needs the guest's cache size and the host's view:
        // both were there (no block crossed the virtual disk: 0).
        assert_eq!(report.layers.double_cached.unwrap().bytes, 0);
        // A malformed answer at the stop: the layer is absent, saying why.
        let stopped = trace.stop(Some("data")).unwrap();
        assert!(stopped.layers.absent_layers.contains(&Layer::Application));
        assert!(
            stopped
                .application
                .starts_with("absent: malformed answer from the guest agent"),
            "{}",
            stopped.application
        );
        assert!(stopped.guest.is_none() && stopped.guest_unavailable.is_some());
        let measured = stopped.double_cached_measured.unwrap();
        assert_eq!(measured.guest_bytes, 8192);
    }

    #[test]
    fn a_named_pid_the_guest_does_not_have_refuses_the_start() {
        let (trace, dir) = vm(&["data"]);
        let uds = fake_agent(
            &dir.path,
            vec![("report pid=99 comm=fio\n", r#"{"agent":"hk-ioagent 1","meminfo":{"mem_total_kib":1,"mem_available_kib":1,"cached_kib":1,"swap_total_kib":0,"swap_free_kib":0},"processes":[{"pid":99,"error":"no such process"}],"devices":[{"path":"/dev/vdz","error":"not a block device"}]}"#.to_string() + "\n")],
        );
        let trace = VmIoTrace::new(trace.disks, Some(uds));
        let options = StartOptions {
            pids: vec![99],
            comms: vec!["fio".into()],
            guest_dev: Some("/dev/vdz".into()),
            ..none()
        };
        assert_eq!(
            trace.start(None, &options).unwrap_err().to_string(),
            "guest process 99: no such process"
        );
        assert!(!trace.status()[0].tracing);
    }
}
