//! The VMM side of the control API: carries out [`ApiAction`]s on the
//! running VM (pause and resume its vCPUs, describe it, shut it down).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::{
    ApiAction, ApiError, ApiResponse, ApiServer, BalloonGoal, BalloonInfo, DeviceInfo,
    DisplaySettings, HostThread, MigrateRequest, VcpuThread, VmController, VmInfo, VmState,
    VmmVersion,
};
use devices::virtio::balloon::{balloon_mib_for_guest_mib, BalloonControl};
use display::DisplayControl;

use crate::boot::BootProtocol;
use crate::event::VmmEvent;
use crate::migration::source::{MigrationRequest, ResumeCheck, VmPauser};
use crate::mmu::SptBudget;
use crate::snapshot::{SnapshotError, SnapshotSource};
use crate::vcpu::{Desired, RunControl};
use crate::vm::kick;
use crate::vm::Vm;
use crate::Error;

/// How long pause waits for every vCPU to park.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Migration defaults: the paper's ±8 neighbours, Cloud Hypervisor's
/// 300 ms downtime target, and a bound on precopy rounds.
const DEFAULT_PREFETCH: u32 = 8;
const DEFAULT_MAX_DOWNTIME_MS: u64 = 300;
const DEFAULT_MAX_ROUNDS: u32 = 30;

/// A device as `vm.info` lists it.
#[derive(Clone, Debug)]
pub struct DeviceDescription {
    pub id: String,
    pub kind: String,
    pub resources: Vec<String>,
}

impl DeviceDescription {
    /// A device at I/O ports, with an optional ISA interrupt.
    pub fn legacy(id: &str, kind: &str, port: u16, count: u16, irq: Option<u32>) -> Self {
        let mut resources = vec![format!("io {:#x}-{:#x}", port, port + count - 1)];
        if let Some(irq) = irq {
            resources.push(format!("irq {irq}"));
        }
        DeviceDescription {
            id: id.into(),
            kind: kind.into(),
            resources,
        }
    }
}

/// The facts about a VM that do not change while it runs.
#[derive(Clone, Debug)]
pub struct VmDescription {
    pub vcpus: u8,
    pub memory_bytes: u64,
    /// How guest RAM is backed, as it applies.
    pub memory_backing: crate::memory::backing::Backing,
    /// `--cpus`: the pinned vCPUs' host CPUs.
    pub cpus: crate::cpus::CpusConfig,
    pub kernel: String,
    pub cmdline: String,
    pub boot_protocol: BootProtocol,
    pub devices: Vec<DeviceDescription>,
}

/// Parks and releases the vCPU threads: the API's pause and resume, and
/// what a migration stops the guest with.
pub struct VcpuPauser {
    control: Arc<RunControl>,
    threads: Vec<libc::pthread_t>,
}

impl VcpuPauser {
    /// `threads` are the vCPU threads (not yet joined).
    pub fn new(control: Arc<RunControl>, threads: Vec<libc::pthread_t>) -> VcpuPauser {
        VcpuPauser { control, threads }
    }
}

impl VmPauser for VcpuPauser {
    /// Asks every vCPU to park, kicks them out of KVM_RUN and waits until
    /// they all have.
    fn pause(&self) -> Result<(), String> {
        self.control.set(Desired::Pause);
        for &thread in &self.threads {
            kick(thread);
        }
        if self.control.wait_parked(self.threads.len(), PAUSE_TIMEOUT) {
            Ok(())
        } else {
            Err("not every vCPU stopped within 5 s".into())
        }
    }

    /// Lets parked vCPUs run again, unless something stopped the VM.
    fn resume(&self) {
        self.control.set_if(Desired::Pause, Desired::Run);
    }

    fn run_control(&self) -> &RunControl {
        &self.control
    }
}

/// Implements the API on a running VM.
pub struct VmControl {
    vm: Arc<Vm>,
    shutting_down: AtomicBool,
    /// A snapshot is being taken: the VM must stay paused until it is done.
    snapshotting: AtomicBool,
}

impl VmControl {
    pub fn new(vm: Arc<Vm>) -> Self {
        VmControl {
            vm,
            shutting_down: AtomicBool::new(false),
            snapshotting: AtomicBool::new(false),
        }
    }

    /// Writes a failure report of the VM as it is now (for a guest that
    /// seems stuck): to `path`, or into `--dump-dir`.
    fn dump(&self, path: Option<&str>) -> Result<ApiResponse, ApiError> {
        let inspector = &self.vm.inspector;
        if self.state() == VmState::ShuttingDown {
            return Err(ApiError::conflict("the VM is shutting down"));
        }
        if self.snapshotting.load(Ordering::SeqCst) {
            return Err(ApiError::conflict("a snapshot is being taken"));
        }
        let (file, summary) = inspector
            .dump_running(self.vm.pauser.as_ref(), path.map(Path::new))
            .map_err(ApiError::conflict)?;
        Ok(ApiResponse::Dump(api::DumpInfo {
            path: file.display().to_string(),
            summary,
        }))
    }

    fn migrate(&self, request: MigrateRequest) -> Result<ApiResponse, ApiError> {
        let source = &self.vm.migrations.source;
        if self.state() == VmState::ShuttingDown {
            return Err(ApiError::conflict("the VM is shutting down"));
        }
        self.vm
            .passthrough
            .refuse("a migration")
            .map_err(ApiError::conflict)?;
        self.vm
            .disks
            .refuse_if_held("a migration")
            .map_err(ApiError::conflict)?;
        let to: crate::migration::MigrationAddress = request
            .to
            .parse()
            .map_err(|e| ApiError::bad_request(format!("to: {e}")))?;
        let request = MigrationRequest {
            to,
            mode: request.mode,
            prefetch: request.prefetch.unwrap_or(DEFAULT_PREFETCH),
            max_downtime_ms: request
                .max_downtime_ms
                .unwrap_or(DEFAULT_MAX_DOWNTIME_MS)
                .max(1),
            max_rounds: request.max_rounds.unwrap_or(DEFAULT_MAX_ROUNDS).max(1),
            background: request.background.unwrap_or(true),
            resume: request.resume.unwrap_or(false),
            max_bandwidth_mib: request.max_bandwidth_mib,
            verify_pages: request.verify_pages.unwrap_or(false),
        };
        source
            .start(request)
            .map(|()| ApiResponse::Empty)
            .map_err(|e| ApiError::conflict(e.to_string()))
    }

    /// The newest migration's report: an outgoing one if this VM started
    /// one, else the one it came in by.
    fn migration_info(&self) -> Result<ApiResponse, ApiError> {
        let status = self
            .vm
            .migrations
            .latest()
            .ok_or_else(|| ApiError::conflict("no migration has run in this VMM"))?;
        serde_json::to_value(&status)
            .map(ApiResponse::Migration)
            .map_err(|e| ApiError::internal(format!("migration report: {e}")))
    }

    /// Pauses the VM (unless it is paused already), saves it to `path`, and
    /// resumes it if it was running (docs/snapshot.md).
    fn snapshot(&self, path: &str) -> Result<ApiResponse, ApiError> {
        let source = &self.vm.snapshot;
        if path.trim().is_empty() {
            return Err(ApiError::bad_request("path: give the snapshot file's path"));
        }
        self.vm
            .passthrough
            .refuse("a snapshot")
            .map_err(ApiError::conflict)?;
        self.vm
            .disks
            .refuse_if_held("a snapshot")
            .map_err(ApiError::conflict)?;
        if self.snapshotting.swap(true, Ordering::SeqCst) {
            return Err(ApiError::conflict("a snapshot is already being taken"));
        }
        let result = self.snapshot_paused(source, Path::new(path));
        self.snapshotting.store(false, Ordering::SeqCst);
        result
    }

    fn snapshot_paused(
        &self,
        source: &SnapshotSource,
        path: &Path,
    ) -> Result<ApiResponse, ApiError> {
        let was_running = match self.state() {
            VmState::Running => true,
            VmState::Paused => false,
            VmState::ShuttingDown => return Err(ApiError::conflict("the VM is shutting down")),
        };
        if was_running {
            if let Err(e) = self.pause() {
                // Let the vCPUs that did park run again.
                self.vm.run.set_if(Desired::Pause, Desired::Run);
                return Err(e);
            }
        }
        let result = source.save(path, &self.vm.run);
        if was_running {
            // Unless something stopped the VM meanwhile.
            self.vm.run.set_if(Desired::Pause, Desired::Run);
        }
        result.map(|_| ApiResponse::Empty).map_err(|e| match e {
            SnapshotError::Io { .. } | SnapshotError::Open { .. } => {
                ApiError::bad_request(e.to_string())
            }
            _ => ApiError::internal(e.to_string()),
        })
    }

    fn display(&self) -> Result<&DisplayControl, ApiError> {
        self.vm
            .display
            .as_deref()
            .ok_or_else(|| ApiError::conflict("the VM has no display (start it with --display)"))
    }

    /// The display's metrics plus KVM's exit and fault counters (summed
    /// over vCPUs), which the paper's table 3 compares between methods.
    fn display_info(&self) -> Result<ApiResponse, ApiError> {
        let metrics = self.display()?.metrics();
        let mut value = serde_json::to_value(&metrics)
            .map_err(|e| ApiError::internal(format!("display metrics: {e}")))?;
        if let Some(object) = value.as_object_mut() {
            let info = self.vm.mmu.info();
            object.insert("kvm".into(), serde_json::json!(info.vcpu_stats));
            object.insert("kvm_vm".into(), serde_json::json!(info.stats));
        }
        Ok(ApiResponse::Display(value))
    }

    fn display_set(&self, settings: DisplaySettings) -> Result<ApiResponse, ApiError> {
        let (dirty, refresh) = (settings.dirty, settings.refresh);
        if dirty.is_none() && refresh.is_none() {
            return Err(ApiError::bad_request(
                "nothing to change: give dirty and/or refresh",
            ));
        }
        self.display()?
            .reconfigure(dirty, refresh)
            .map(|()| ApiResponse::Empty)
            .map_err(ApiError::conflict)
    }

    fn balloon(&self) -> Result<&BalloonControl, ApiError> {
        self.vm
            .balloon
            .as_deref()
            .ok_or_else(|| ApiError::conflict("the VM has no balloon (start it with --balloon)"))
    }

    fn balloon_info(&self) -> Result<ApiResponse, ApiError> {
        let balloon = self.balloon()?;
        // Ask for fresh statistics, but answer with what is known now:
        // the guest refreshes them on its own schedule.
        let stats = balloon
            .stats()
            .map(|s| s.entries().into_iter().collect())
            .unwrap_or_default();
        Ok(ApiResponse::Balloon(BalloonInfo {
            target_mib: balloon.target_mib(),
            actual_mib: balloon.actual_mib(),
            stats,
        }))
    }

    fn state(&self) -> VmState {
        if self.shutting_down.load(Ordering::SeqCst) {
            return VmState::ShuttingDown;
        }
        match self.vm.run.desired() {
            Desired::Run => VmState::Running,
            Desired::Pause => VmState::Paused,
            Desired::Stop => VmState::ShuttingDown,
        }
    }

    fn info(&self) -> VmInfo {
        let d = &self.vm.description;
        // Every thread with where it may run, read from /proc once; the
        // vCPUs' entries come from the same reading.
        let threads: Vec<HostThread> = crate::cpus::threads_of_this_process()
            .into_iter()
            .map(|(thread_id, name, cpus_allowed)| HostThread {
                thread_id,
                name,
                cpus_allowed,
            })
            .collect();
        let cpus_allowed = |tid: i32| {
            threads
                .iter()
                .find(|t| t.thread_id == tid)
                .and_then(|t| t.cpus_allowed.clone())
        };
        VmInfo {
            state: self.state(),
            vcpus: u32::from(d.vcpus),
            memory_mib: d.memory_bytes >> 20,
            memory_backing: d.memory_backing.to_api(),
            vcpu_threads: self
                .vm
                .vcpu_threads
                .report()
                .into_iter()
                .map(|(index, thread_id)| VcpuThread {
                    index,
                    thread_id,
                    pinned: d.cpus.affinity.get(&index).map(|s| s.to_string()),
                    cpus_allowed: cpus_allowed(thread_id),
                })
                .collect(),
            threads,
            kernel: d.kernel.clone(),
            cmdline: d.cmdline.clone(),
            boot_protocol: d.boot_protocol.name().into(),
            devices: d
                .devices
                .iter()
                .map(|dev| DeviceInfo {
                    id: dev.id.clone(),
                    kind: dev.kind.clone(),
                    resources: dev.resources.clone(),
                })
                .collect(),
            io_error: self.vm.disks.stop_reason(),
        }
    }

    /// The isolation check of the vCPUs' pinned CPUs (docs/running.md).
    fn isolation(&self) -> Result<ApiResponse, ApiError> {
        let d = &self.vm.description;
        let threads = self.vm.vcpu_threads.report();
        let vm = crate::isolation::ThisVm {
            pid: std::process::id(),
            vcpus: (0..d.vcpus)
                .map(|index| crate::isolation::VcpuPin {
                    index,
                    thread_id: threads.iter().find(|(i, _)| *i == index).map(|t| t.1),
                    pinned: d.cpus.affinity.get(&index).cloned(),
                })
                .collect(),
            devices: self
                .vm
                .passthrough
                .0
                .iter()
                .map(|p| crate::isolation::CheckedDevice {
                    id: p.id.clone(),
                    host_address: p.host_address.clone(),
                    irq_affinity: p.steering.is_some(),
                    irq_changes: p.steering.as_ref().map(|s| s.changes()).unwrap_or_default(),
                })
                .collect(),
        };
        let report = crate::isolation::check(Path::new("/"), &vm);
        serde_json::to_value(&report)
            .map(ApiResponse::Isolation)
            .map_err(|e| ApiError::internal(format!("isolation report: {e}")))
    }

    fn pause(&self) -> Result<ApiResponse, ApiError> {
        match self.state() {
            VmState::Running => {}
            VmState::Paused => return Err(ApiError::conflict("the VM is already paused")),
            VmState::ShuttingDown => return Err(ApiError::conflict("the VM is shutting down")),
        }
        self.vm
            .pauser
            .pause()
            .map(|()| ApiResponse::Empty)
            .map_err(ApiError::internal)
    }

    fn resume(&self) -> Result<ApiResponse, ApiError> {
        if self.snapshotting.load(Ordering::SeqCst) {
            return Err(ApiError::conflict(
                "a snapshot is being taken; the VM resumes when it is written",
            ));
        }
        match self.state() {
            VmState::Paused => {
                // A migration may hold the guest stopped, or run it
                // elsewhere: one guest must never run in two places.
                let source = &self.vm.migrations.source;
                match source.check_resume().map_err(ApiError::conflict)? {
                    ResumeCheck::Free => {}
                    ResumeCheck::Reclaim => source.reclaim().map_err(ApiError::conflict)?,
                }
                self.vm.run.set(Desired::Run);
                // Requests a disk error held run again; one failing again
                // pauses the VM again.
                self.vm.disks.retry();
                Ok(ApiResponse::Empty)
            }
            VmState::Running => Err(ApiError::conflict("the VM is not paused")),
            VmState::ShuttingDown => Err(ApiError::conflict("the VM is shutting down")),
        }
    }
}

impl VmController for VmControl {
    fn handle(&self, action: ApiAction) -> Result<ApiResponse, ApiError> {
        match action {
            ApiAction::Ping => Ok(ApiResponse::Pong(VmmVersion {
                version: env!("CARGO_PKG_VERSION").into(),
            })),
            ApiAction::VmInfo => Ok(ApiResponse::VmInfo(self.info())),
            ApiAction::Pause => self.pause(),
            ApiAction::Resume => self.resume(),
            ApiAction::Shutdown => {
                self.shutting_down.store(true, Ordering::SeqCst);
                self.vm.events.send(VmmEvent::ApiShutdown);
                Ok(ApiResponse::Empty)
            }
            ApiAction::BalloonInfo => self.balloon_info(),
            ApiAction::BalloonSet(target) => {
                let balloon = self.balloon()?;
                let target_mib = match target.goal().map_err(ApiError::bad_request)? {
                    BalloonGoal::Balloon(mib) => mib,
                    BalloonGoal::Guest(mib) => {
                        balloon_mib_for_guest_mib(self.vm.description.memory_bytes, mib)
                            .map_err(ApiError::bad_request)?
                    }
                };
                balloon
                    .set_target_mib(target_mib)
                    .map(|()| ApiResponse::Empty)
                    .map_err(|e| ApiError::conflict(e.to_string()))
            }
            ApiAction::MmuInfo => Ok(ApiResponse::Mmu(self.vm.mmu.info())),
            ApiAction::MmuSet(settings) => {
                let budget =
                    SptBudget::from_api(settings.spt_pages, self.vm.description.memory_bytes)
                        .map_err(|e| ApiError::bad_request(format!("spt_pages: {e}")))?;
                self.vm
                    .mmu
                    .set(budget)
                    .map(|()| ApiResponse::Empty)
                    .map_err(|e| match e {
                        crate::mmu::MmuError::Set { .. } => ApiError::internal(e.to_string()),
                        _ => ApiError::conflict(e.to_string()),
                    })
            }
            ApiAction::DisplayInfo => self.display_info(),
            ApiAction::DisplaySet(settings) => self.display_set(settings),
            ApiAction::Snapshot(request) => self.snapshot(&request.path),
            ApiAction::Migrate(request) => self.migrate(request),
            ApiAction::MigrationInfo => self.migration_info(),
            ApiAction::Dump(request) => self.dump(request.path.as_deref()),
            ApiAction::IsolationInfo => self.isolation(),
            ApiAction::Counters => Ok(ApiResponse::Counters(crate::counters::wire::to_json(
                &self.vm.counters.report(),
            ))),
            ApiAction::LatencyHistogramSet(request) => self
                .vm
                .counters
                .set_histogram(&request.id, request.histogram, request.boundaries.as_ref())
                .map(|()| ApiResponse::Empty)
                .map_err(|e| ApiError::bad_request(e.to_string())),
            ApiAction::IoTraceSet(request) => self.iotrace(request),
            ApiAction::IoTraceInfo => to_json(&self.vm.iotrace.status()).map(ApiResponse::IoTrace),
            ApiAction::Advise(request) => self.advise(request),
        }
    }
}

impl VmControl {
    /// `PUT vm.iotrace`: start (nothing to answer), stop and report (the
    /// window's report).
    fn iotrace(&self, request: api::IoTraceRequest) -> Result<ApiResponse, ApiError> {
        use crate::iotrace::IoTraceError;
        let trace = &self.vm.iotrace;
        let disk = request.disk.as_deref();
        let refused = |e: IoTraceError| match e {
            IoTraceError::AlreadyTraced(_) | IoTraceError::NotTraced(_) => {
                ApiError::conflict(e.to_string())
            }
            _ => ApiError::bad_request(e.to_string()),
        };
        let start_only = request.trace_file.is_some()
            || !request.pids.is_empty()
            || !request.comms.is_empty()
            || request.guest_dev.is_some();
        if start_only && request.action != api::IoTraceAction::Start {
            return Err(ApiError::bad_request(
                "trace_file, pids, comms and guest_dev are given at the start of a trace",
            ));
        }
        let report = match request.action {
            api::IoTraceAction::Start => {
                let options = crate::iotrace::StartOptions {
                    trace_file: request.trace_file.clone(),
                    pids: request.pids.clone(),
                    comms: request.comms.clone(),
                    guest_dev: request.guest_dev.clone(),
                };
                return trace
                    .start(disk, &options)
                    .map(|()| ApiResponse::Empty)
                    .map_err(refused);
            }
            api::IoTraceAction::Stop => trace.stop(disk),
            api::IoTraceAction::Report => trace.report(disk),
        };
        to_json(&report.map_err(refused)?).map(ApiResponse::IoTrace)
    }
}

impl VmControl {
    /// `PUT vm.advise`: the advisor on a traced disk's window, its memory
    /// recommendation applied through the balloon if asked.
    fn advise(&self, request: api::AdviseRequest) -> Result<ApiResponse, ApiError> {
        use crate::iotrace::advise::{advise, AdviseTarget};
        let target = AdviseTarget {
            trace: &self.vm.iotrace,
            balloon: self.vm.balloon.as_deref(),
            memory_bytes: self.vm.description.memory_bytes,
            proc_root: std::path::Path::new("/proc"),
        };
        let report = advise(&target, request.disk.as_deref(), request.apply).map_err(|e| {
            if e.is_conflict() {
                ApiError::conflict(e.to_string())
            } else {
                ApiError::bad_request(e.to_string())
            }
        })?;
        to_json(&report).map(ApiResponse::Advice)
    }
}

/// A serializable answer as JSON.
fn to_json<T: serde::Serialize>(value: &T) -> Result<serde_json::Value, ApiError> {
    serde_json::to_value(value)
        .map_err(|e| ApiError::internal(format!("cannot encode the answer: {e}")))
}

/// Serves the API on `path` until the returned server is dropped.
pub fn start_api_server(path: &Path, control: Arc<VmControl>) -> Result<ApiServer, Error> {
    ApiServer::start(path, control).map_err(|e| Error::Api(e.to_string()))
}
