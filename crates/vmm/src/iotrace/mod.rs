//! The I/O-cache tracer of a running VM (docs/iotrace.md): `PUT
//! /api/v1/vm.iotrace` (start, stop, report), `GET /api/v1/vm.iotrace`
//! and `hakoniwa ctl iotrace`.
//!
//! Per disk, a window from start to stop: the virtual-disk layer is the
//! disk's own [`DiskTracer`] (every request, with the host page cache's
//! residency of each read); the physical layer is the host block device
//! under the image, its `/sys/block/<dev>/stat` read at the start and at
//! each report ([`iotrace::physical`]); the application layer needs a
//! guest agent that does not exist yet and is reported absent. The report
//! is the iotrace crate's [`WindowReport`] with what this window was
//! ([`IoTraceReport`]); [`table`] is `ctl iotrace report`'s text.

pub mod advise;
pub mod agent;
pub mod table;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use devices::virtio::block::{
    now_ns, CacheMode, DiskTracer, TraceError, TraceSession, TRACE_CAPACITY,
};
use iotrace::layers::{self, CacheFacts, LayerTotals, Window, WindowReport};
use iotrace::physical::{BlockDevice, DiskStat};
use serde::{Deserialize, Serialize};

/// The block the report's reuse and double-caching figures count in: the
/// host's page.
const REPORT_BLOCK_BYTES: u64 = 4096;

/// What the report says of the application layer until a guest agent
/// reports it.
pub const APPLICATION_ABSENT: &str = "absent: no guest agent reports it yet";

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
    pub application: String,
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
}

/// The VM's tracer: its disks and their windows.
#[derive(Default)]
pub struct VmIoTrace {
    disks: Vec<TraceableDisk>,
    windows: Mutex<BTreeMap<String, HostWindow>>,
}

impl VmIoTrace {
    pub fn new(disks: Vec<TraceableDisk>) -> VmIoTrace {
        VmIoTrace {
            disks,
            windows: Mutex::new(BTreeMap::new()),
        }
    }

    /// Starts tracing `disk` (the only disk when None); with `trace_file`,
    /// the records go there as JSON lines at the stop.
    pub fn start(&self, disk: Option<&str>, trace_file: Option<&str>) -> Result<(), IoTraceError> {
        let disk = self.disk(disk)?;
        let mut windows = self.lock();
        if windows.contains_key(&disk.id) {
            return Err(IoTraceError::AlreadyTraced(disk.id.clone()));
        }
        let trace_file = match trace_file {
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
            },
        );
        Ok(())
    }

    /// The report of `disk`'s window so far.
    pub fn report(&self, disk: Option<&str>) -> Result<IoTraceReport, IoTraceError> {
        let disk = self.disk(disk)?;
        let windows = self.lock();
        let window = windows
            .get(&disk.id)
            .ok_or_else(|| IoTraceError::NotTraced(disk.id.clone()))?;
        Ok(report_of(disk, window, true))
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
        let mut report = report_of(disk, &window, false);
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
    ) -> Result<(IoTraceReport, Vec<layers::IoRecord>, CacheMode), IoTraceError> {
        let disk = self.disk(disk)?;
        let windows = self.lock();
        let window = windows
            .get(&disk.id)
            .ok_or_else(|| IoTraceError::NotTraced(disk.id.clone()))?;
        let records = window
            .session
            .records()
            .iter()
            .filter_map(|r| r.io_record())
            .collect();
        Ok((report_of(disk, window, true), records, disk.cache))
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
/// the device's counters since the start.
fn report_of(disk: &TraceableDisk, window: &HostWindow, tracing: bool) -> IoTraceReport {
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
    let totals = LayerTotals {
        application: None,
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
        &CacheFacts::default(),
        REPORT_BLOCK_BYTES,
    );
    let host_cache_probe = if session.probes_host_cache() {
        "mincore of each read's range just before it is submitted".to_string()
    } else if let Some(e) = session.probe_error() {
        format!("off: {e}")
    } else {
        format!("off: cache={} does not use the host page cache", disk.cache)
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
        application: APPLICATION_ABSENT.to_string(),
        trace_file: None,
        layers,
    }
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
        (VmIoTrace::new(traceable), dir)
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

    #[test]
    fn bad_requests_get_one_line_errors() {
        let (trace, _dir) = vm(&["disk0", "data"]);
        let message = |e: IoTraceError| {
            let text = e.to_string();
            assert!(!text.contains('\n'), "{text}");
            text
        };
        assert_eq!(
            message(trace.start(Some("nope"), None).unwrap_err()),
            "no disk 'nope' (disks: disk0, data)"
        );
        assert_eq!(
            message(trace.start(None, None).unwrap_err()),
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
        trace.start(Some("data"), None).unwrap();
        assert_eq!(
            message(trace.start(Some("data"), None).unwrap_err()),
            "disk 'data' is already traced (stop it first)"
        );
        let err = message(
            trace
                .start(Some("disk0"), Some("/nonexistent/dir/trace.jsonl"))
                .unwrap_err(),
        );
        assert!(
            err.starts_with("trace file /nonexistent/dir/trace.jsonl: "),
            "{err}"
        );
        // The refused start left disk0 untraced.
        assert!(!trace.status()[0].tracing);
        assert_eq!(
            message(VmIoTrace::default().start(None, None).unwrap_err()),
            "the VM has no disks"
        );
    }

    #[test]
    fn a_window_reports_its_layers_and_writes_its_trace_file() {
        let (trace, dir) = vm(&["data"]);
        let file = dir.path.join("trace.jsonl");
        trace.start(None, Some(file.to_str().unwrap())).unwrap();
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
        trace.start(Some("data"), None).unwrap();
    }
}
