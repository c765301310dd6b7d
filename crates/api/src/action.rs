//! The vocabulary shared by the API server, the client and the VMM.
//!
//! The server never talks to the VMM in HTTP terms: it turns every request
//! into an [`ApiAction`], hands it to a [`VmController`], and turns the
//! [`ApiResponse`] or [`ApiError`] back into HTTP. Keeping the VMM side free of
//! HTTP means the VMM can be tested (and later driven by other front ends)
//! without a socket, and the HTTP side can be tested without a VM.

use serde::{Deserialize, Serialize};

pub use choices::{
    Boundaries, DirtyMethod, LatencyHistogram, MigrationMode, RefreshMode, SptPages,
};

/// Lifecycle state of the VM as seen by the API.
///
/// Serialized in `snake_case` (`"running"`, `"paused"`, `"shutting_down"`) so
/// that scripts can compare against stable lowercase strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmState {
    /// The vCPUs are executing guest code.
    Running,
    /// The vCPUs are parked; guest memory and device state are kept.
    Paused,
    /// A shutdown was requested or the guest is powering off; further
    /// lifecycle actions are expected to be refused.
    ShuttingDown,
}

/// One emulated device, described generically so that new device kinds do
/// not need a schema change.
///
/// `resources` are human-readable strings such as `"io 0x3f8-0x3ff"`,
/// `"mmio 0xd0000000+0x1000"` or `"irq 4"`: they are for operators and
/// debugging, not for machine parsing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Stable identifier of the device within this VM (e.g. `"com1"`).
    pub id: String,
    /// Device kind (e.g. `"serial"`, `"virtio-blk"`); `"type"` on the wire.
    #[serde(rename = "type")]
    pub kind: String,
    /// Guest-visible resources claimed by the device, then how the host
    /// serves it where the device says (a disk's `engine io_uring`,
    /// `queues 2 x 256`, `cache none`).
    #[serde(default)]
    pub resources: Vec<String>,
}

/// Answer to `GET /api/v1/vm.info`: what is running and how it was booted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmInfo {
    /// Current lifecycle state.
    pub state: VmState,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Guest RAM size in MiB.
    pub memory_mib: u64,
    /// How guest RAM is backed on the host (`--memory size=..,hugepages=..`).
    pub memory_backing: MemoryBacking,
    /// Each vCPU's host thread and where it may run (`--cpus
    /// boot=N,affinity=[...]`).
    #[serde(default)]
    pub vcpu_threads: Vec<VcpuThread>,
    /// Every thread of the VMM with the CPUs it may run on (device threads
    /// are named after their device: `disk0-queue` or `disk0-queue0`, ...,
    /// `disk0-io0`, ...).
    #[serde(default)]
    pub threads: Vec<HostThread>,
    /// Path of the kernel image the VM was booted from.
    pub kernel: String,
    /// Kernel command line passed to the guest.
    pub cmdline: String,
    /// Boot protocol used (e.g. `"linux-boot"`, `"pvh"`).
    pub boot_protocol: String,
    /// Emulated devices.
    #[serde(default)]
    pub devices: Vec<DeviceInfo>,
    /// Why a disk paused the VM (`--disk ...,werror=stop` or `rerror=stop`):
    /// the disk, what failed and the host's errno. Absent otherwise.
    /// `ctl resume` runs the held requests again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_error: Option<String>,
}

/// One vCPU's host thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuThread {
    /// The vCPU's index.
    pub index: u8,
    /// Its thread id on the host (`/proc/PID/task/TID`).
    pub thread_id: i32,
    /// The host CPUs `--cpus affinity=` pinned it to (kernel list format,
    /// `2-3,5`), if any.
    pub pinned: Option<String>,
    /// The CPUs the kernel lets the thread run on now
    /// (`Cpus_allowed_list`), the proof of the pinning.
    pub cpus_allowed: Option<String>,
}

/// One thread of the VMM process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostThread {
    pub thread_id: i32,
    /// Its name (`/proc/PID/task/TID/comm`).
    pub name: String,
    /// `Cpus_allowed_list` as the kernel reports it now.
    pub cpus_allowed: Option<String>,
}

/// How guest RAM is backed on the host, as it applies (`--memory
/// size=..,hugepages=on|off,thp=on|off,prefault=on|off,shared=on|off`): a
/// host choice, which may differ between a migration's two ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryBacking {
    /// Guest RAM size in MiB.
    pub size_mib: u64,
    /// Backed by 2 MiB hugetlbfs pages (`MAP_HUGETLB`).
    pub hugepages: bool,
    /// Transparent huge pages in effect: asked for (`madvise(MADV_HUGEPAGE)`)
    /// and allowed by the host; `thp_note` says why not when they were
    /// asked for but do not apply.
    pub thp: bool,
    /// Every page was populated when the VM started.
    pub prefault: bool,
    /// A shared mapping (`MAP_SHARED`), not private anonymous memory.
    pub shared: bool,
    /// Why transparent huge pages do not apply although `thp=on` was given
    /// (a migration destination, the host's THP setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thp_note: Option<String>,
}

/// Answer to `GET /api/v1/vmm.ping`: proves the VMM is alive and says which
/// build it is, so a client can detect a version mismatch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmmVersion {
    /// Version string of the VMM (typically its crate version).
    pub version: String,
}

/// JSON body of every non-2xx response, so clients have one shape to parse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Human-readable, single-line explanation.
    pub error: String,
}

/// Everything the API can ask the VMM to do (Firecracker-style single enum).
///
/// Adding an endpoint means adding a variant here and its route in
/// [`crate::endpoints`]; the compiler then points at every match that needs
/// the new variant (the VMM's [`VmController`] among them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiAction {
    /// Liveness check; answered with [`ApiResponse::Pong`].
    Ping,
    /// Describe the VM; answered with [`ApiResponse::VmInfo`].
    VmInfo,
    /// Park all vCPUs; answered with [`ApiResponse::Empty`].
    Pause,
    /// Resume paused vCPUs; answered with [`ApiResponse::Empty`].
    Resume,
    /// Stop the VM and exit the VMM; answered with [`ApiResponse::Empty`]
    /// before the VMM actually exits.
    Shutdown,
    /// The balloon's target, actual size and guest statistics; answered
    /// with [`ApiResponse::Balloon`].
    BalloonInfo,
    /// Set the balloon's target size; answered with [`ApiResponse::Empty`].
    BalloonSet(BalloonTarget),
    /// Paging mode, shadow-page budget and KVM MMU statistics; answered
    /// with [`ApiResponse::Mmu`].
    MmuInfo,
    /// Change the shadow-page budget; answered with [`ApiResponse::Empty`].
    MmuSet(MmuSettings),
    /// The display's configuration and figures; answered with
    /// [`ApiResponse::Display`].
    DisplayInfo,
    /// Switch the display's update detection and/or refresh mode at run
    /// time; answered with [`ApiResponse::Empty`].
    DisplaySet(DisplaySettings),
    /// Save the whole VM to a file (pausing it meanwhile); answered with
    /// [`ApiResponse::Empty`] once the file is complete.
    Snapshot(SnapshotRequest),
    /// Start migrating the VM to another hakoniwa (`run --incoming`);
    /// answered with [`ApiResponse::Empty`] once started. Progress:
    /// [`ApiAction::MigrationInfo`].
    Migrate(MigrateRequest),
    /// The current or last migration's report, on either side; answered
    /// with [`ApiResponse::Migration`].
    MigrationInfo,
    /// Write a failure report of the VM as it is now (vCPU registers,
    /// where RIP and the stack are, the pages involved; for a guest that
    /// seems stuck), pausing it for a moment; answered with
    /// [`ApiResponse::Dump`].
    Dump(DumpRequest),
    /// Whether the VM's pinned CPUs are its own: shared with other
    /// hakoniwa VMs' threads, isolated by the host, where passed-through
    /// devices' host interrupts go; answered with
    /// [`ApiResponse::Isolation`].
    IsolationInfo,
    /// Every disk's and network device's counters (Cloud Hypervisor's
    /// `vm.counters`, with latency histograms and request stages beside);
    /// answered with [`ApiResponse::Counters`].
    Counters,
    /// Set a disk's latency histogram boundaries (QEMU's
    /// `block-latency-histogram-set`); answered with [`ApiResponse::Empty`].
    LatencyHistogramSet(LatencyHistogramRequest),
    /// Start, stop or report a disk's I/O trace (docs/iotrace.md):
    /// start is answered with [`ApiResponse::Empty`], stop and report with
    /// [`ApiResponse::IoTrace`] (the window's report).
    IoTraceSet(IoTraceRequest),
    /// Every disk and whether it is traced; answered with
    /// [`ApiResponse::IoTrace`].
    IoTraceInfo,
    /// The advisor's recommendation from a traced disk's window, applied
    /// to the guest's memory through the balloon if asked
    /// (docs/iotrace.md); answered with [`ApiResponse::Advice`].
    Advise(AdviseRequest),
}

/// Body of `PUT /api/v1/vm.advise`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdviseRequest {
    /// The traced disk's id (default: the VM's only disk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    /// Set the balloon so that the guest has the recommended memory.
    #[serde(default)]
    pub apply: bool,
}

/// What `PUT /api/v1/vm.iotrace` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoTraceAction {
    Start,
    Stop,
    Report,
}

/// Body of `PUT /api/v1/vm.iotrace`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoTraceRequest {
    pub action: IoTraceAction,
    /// The disk's id (default: the VM's only disk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    /// Start only: where the records go as JSON lines at the stop (a path
    /// as the VMM sees it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_file: Option<String>,
    /// Start only: the guest processes whose file I/O is the application
    /// layer, by pid (the guest agent's `/proc/PID/io`, docs/iotrace.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
    /// Start only: and every guest process of these names (`comm`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comms: Vec<String>,
    /// Start only: the disk's device in the guest (default: the virtio-blk
    /// name of its place among the VM's disks, `/dev/vda` for the first);
    /// `"none"`: no residency measured (no walk of the guest's files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_dev: Option<String>,
}

/// Body of `PUT /api/v1/vm.latency-histogram`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyHistogramRequest {
    /// The disk's id (as `vm.counters` and `vm.info` name it).
    pub id: String,
    /// Which histogram (default: every one of the disk's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram: Option<LatencyHistogram>,
    /// Bucket boundaries in ns, increasing (default: the default set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundaries: Option<Boundaries>,
}

/// Body of `PUT /api/v1/vm.migrate`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    /// `tcp:HOST:PORT` of the destination's `--incoming`.
    pub to: String,
    pub mode: MigrationMode,
    /// Pages sent on each side of a demanded page in postcopy (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<u32>,
    /// The downtime precopy aims for, in ms (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_downtime_ms: Option<u64>,
    /// Precopy rounds before precopy stops anyway or hybrid switches
    /// (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rounds: Option<u32>,
    /// Push pages nobody asked for during postcopy (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<bool>,
    /// Cap on the bandwidth of precopy rounds and the postcopy background
    /// push, MiB/s (default none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bandwidth_mib: Option<u32>,
    /// Resume a postcopy whose connection dropped, over a new connection
    /// to `to` (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<bool>,
    /// Send a checksum of every page once the guest is stopped; the
    /// destination checks each page against it and refuses or stops the
    /// VM on a difference (default false; a test and diagnosis mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_pages: Option<bool>,
}

/// Body of `PUT /api/v1/vm.dump`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DumpRequest {
    /// The report's file, as the VMM sees the filesystem (default: a new
    /// file in the VM's `--dump-dir`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// Answer to `PUT /api/v1/vm.dump`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpInfo {
    /// Where the report was written.
    pub path: String,
    /// Its first line: the vCPU, RIP and what its page says.
    pub summary: String,
}

/// Body of `PUT /api/v1/vm.snapshot`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Where to write the snapshot, as the VMM sees the filesystem.
    pub path: String,
}

/// Body of `PUT /api/v1/vm.display`: what to change (absent: unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisplaySettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty: Option<DirtyMethod>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<RefreshMode>,
}

/// Body of `PUT /api/v1/vm.mmu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmuSettings {
    /// The new shadow-page budget.
    pub spt_pages: SptPages,
}

/// Answer to `GET /api/v1/vm.mmu`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmuInfo {
    /// How KVM translates guest memory: `"shadow"`, `"npt"`, `"ept"` or
    /// `"unknown"`.
    pub paging: String,
    /// Where `paging` was read (e.g. `"kvm_amd npt=N"`, `"kvm_pvm"`).
    pub paging_source: String,
    /// `"default"` (KVM's own budget), `"fixed"` or `"auto"`.
    pub mode: String,
    /// The budget hakoniwa set, in 4 KiB pages (null: KVM's default).
    pub budget_pages: Option<u64>,
    /// The budget KVM reports (KVM_GET_NR_MMU_PAGES), in pages.
    pub kvm_nr_mmu_pages: Option<u64>,
    /// Guest RAM in 4 KiB pages (the largest sensible budget).
    pub guest_memory_pages: u64,
    /// The guest's PageTables from /proc/meminfo, KiB, as its agent last
    /// reported it (null until it did).
    pub guest_page_tables_kib: Option<u64>,
    /// KVM's VM statistics about the MMU (mmu_*, pages_*), by name.
    pub stats: std::collections::BTreeMap<String, u64>,
    /// KVM's per-vCPU statistics about paging and exits (pf_*, exits, ...),
    /// summed over the vCPUs.
    pub vcpu_stats: std::collections::BTreeMap<String, u64>,
}

/// Body of `PUT /api/v1/vm.balloon`: one of the two fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonTarget {
    /// How much guest memory the balloon should hold, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_mib: Option<u64>,
    /// Or how much the guest should be left with, in MiB: as much as a
    /// guest booted with that much has (QEMU's `balloon` command asks in
    /// these terms). The VMM sizes the balloon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_mib: Option<u64>,
}

/// What a [`BalloonTarget`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BalloonGoal {
    /// The balloon holds this many MiB.
    Balloon(u64),
    /// The guest is left what a guest booted with this many MiB has.
    Guest(u64),
}

impl BalloonTarget {
    /// A balloon of `mib`.
    pub fn balloon(mib: u64) -> BalloonTarget {
        BalloonTarget {
            target_mib: Some(mib),
            guest_mib: None,
        }
    }

    /// A guest of `mib`.
    pub fn guest(mib: u64) -> BalloonTarget {
        BalloonTarget {
            target_mib: None,
            guest_mib: Some(mib),
        }
    }

    /// The one thing asked for, or why the body is not one request.
    pub fn goal(&self) -> Result<BalloonGoal, &'static str> {
        match (self.target_mib, self.guest_mib) {
            (Some(mib), None) => Ok(BalloonGoal::Balloon(mib)),
            (None, Some(mib)) => Ok(BalloonGoal::Guest(mib)),
            (Some(_), Some(_)) => Err("give target_mib or guest_mib, not both"),
            (None, None) => Err("give target_mib or guest_mib"),
        }
    }
}

/// Answer to `GET /api/v1/vm.balloon`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonInfo {
    /// What the host asked the balloon to hold, MiB.
    pub target_mib: u64,
    /// What the guest says it holds, MiB.
    pub actual_mib: u64,
    /// The guest's latest memory statistics (virtio-balloon stats queue),
    /// by name, in bytes or counts; empty until the guest sent some.
    pub stats: std::collections::BTreeMap<String, u64>,
}

/// Successful result of an [`ApiAction`].
///
/// Serialized untagged: the HTTP body is just the payload (`Empty` becomes a
/// `204 No Content` and has no body), so the wire format stays the plain
/// Cloud Hypervisor shape rather than exposing the Rust enum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ApiResponse {
    /// Action done, nothing to report (HTTP 204).
    Empty,
    /// Answer to [`ApiAction::Ping`].
    Pong(VmmVersion),
    /// Answer to [`ApiAction::VmInfo`].
    VmInfo(VmInfo),
    /// Answer to [`ApiAction::BalloonInfo`].
    Balloon(BalloonInfo),
    /// Answer to [`ApiAction::MmuInfo`].
    Mmu(MmuInfo),
    /// Answer to [`ApiAction::DisplayInfo`]: the display's metrics object
    /// (docs/display.md lists the fields).
    Display(serde_json::Value),
    /// Answer to [`ApiAction::MigrationInfo`]: the migration's report
    /// (docs/migration.md lists the fields).
    Migration(serde_json::Value),
    /// Answer to [`ApiAction::Dump`].
    Dump(DumpInfo),
    /// Answer to [`ApiAction::IsolationInfo`]: the isolation report
    /// (docs/running.md lists the fields).
    Isolation(serde_json::Value),
    /// Answer to [`ApiAction::Counters`] (docs/devices.md lists the
    /// fields).
    Counters(serde_json::Value),
    /// Answer to [`ApiAction::IoTraceSet`] (stop, report) and
    /// [`ApiAction::IoTraceInfo`] (docs/iotrace.md lists the fields).
    IoTrace(serde_json::Value),
    /// Answer to [`ApiAction::Advise`] (docs/iotrace.md lists the fields).
    Advice(serde_json::Value),
}

/// Refusal or failure of an [`ApiAction`], carrying the HTTP status to send.
///
/// The VMM decides the status (e.g. 409 for "pause while paused") because
/// only it knows why an action cannot be done; the server passes it through
/// unchanged as long as it is a 4xx or 5xx code (anything else becomes 500,
/// since an error must never look like success).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (HTTP {status})")]
pub struct ApiError {
    /// HTTP status code (400–599).
    pub status: u16,
    /// Single-line explanation shown to the operator.
    pub message: String,
}

impl ApiError {
    /// An error with an explicit HTTP status.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// 400: the request was understood but its content is invalid.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    /// 409: the action conflicts with the VM's current state (e.g. pausing a
    /// paused VM).
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(409, message)
    }

    /// 500: the VMM failed while carrying out the action.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }

    /// 501: the action exists in the API but this VMM build does not
    /// support it.
    pub fn not_implemented(message: impl Into<String>) -> Self {
        Self::new(501, message)
    }
}

/// The VMM side of the API: carries out actions.
///
/// `Send + Sync` because the server calls it from its own threads: one per
/// connection, so calls may run concurrently and the implementation must do
/// its own locking. `handle` should return promptly (it runs while the
/// client waits, and the client has a timeout); long operations such as
/// shutdown should be started and acknowledged rather than awaited. It is
/// safe to drop the [`crate::ApiServer`] from inside `handle` (e.g. on
/// shutdown): the current request is still answered.
pub trait VmController: Send + Sync {
    /// Carry out `action`, or explain with an [`ApiError`] why not.
    fn handle(&self, action: ApiAction) -> Result<ApiResponse, ApiError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_state_is_snake_case_on_the_wire() {
        assert_eq!(
            serde_json::to_string(&VmState::ShuttingDown).unwrap(),
            "\"shutting_down\""
        );
        assert_eq!(
            serde_json::to_string(&VmState::Running).unwrap(),
            "\"running\""
        );
        assert_eq!(
            serde_json::from_str::<VmState>("\"paused\"").unwrap(),
            VmState::Paused
        );
    }

    #[test]
    fn device_kind_is_type_on_the_wire() {
        let d = DeviceInfo {
            id: "com1".into(),
            kind: "serial".into(),
            resources: vec!["irq 4".into()],
        };
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["type"], "serial");
        assert!(v.get("kind").is_none());
    }

    #[test]
    fn responses_serialize_as_bare_payloads() {
        let r = ApiResponse::Pong(VmmVersion {
            version: "1.2.3".into(),
        });
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"version":"1.2.3"}"#);
    }

    #[test]
    fn api_error_display_names_status() {
        assert_eq!(
            ApiError::conflict("already paused").to_string(),
            "already paused (HTTP 409)"
        );
    }
}
