//! hakoniwa's virtual machine monitor: builds a KVM VM from a [`VmConfig`]
//! and runs it until the guest, the user or the API ends it.
//!
//! Module map (see docs/architecture.md):
//! - [`config`]: what the user asked for, checked without KVM;
//! - [`memory`]: the memory manager: guest RAM, KVM slots, dirty logs;
//! - [`boot`]: kernel, initramfs and command line into guest memory;
//! - [`vcpu`]: vCPU threads and their exit dispatch; [`cpus`]: `--cpus`
//!   and vCPU pinning;
//! - [`start`]: the three ways a VM starts (boot, restore, migration in);
//! - [`vm`]: the builder, the built [`vm::Vm`] and its lifetime;
//! - [`console`], [`signals`], [`controller`]: the ways the outside world
//!   talks to a running VM (terminal, Unix signals, control API);
//! - [`event`]: why a VM ends, and hakoniwa's exit status for it;
//! - [`mmu`], [`stats`]: the shadow-paging budget and KVM's statistics;
//! - [`metrics`]: the periodic metrics file (`--metrics`);
//! - [`snapshot`]: saving a VM to a file and restoring it (`--restore`);
//! - [`disks`]: disk images flushed, locked and handed over around
//!   snapshots and migrations;
//! - [`migration`]: live migration (`ctl migrate`, `run --incoming`);
//! - [`dump`]: failure reports (`run --dump-dir`, `ctl dump`);
//! - [`private_file`]: files holding guest memory (snapshots, reports):
//!   0600, never through a symbolic link, renamed into place and synced;
//! - [`isolation`]: the isolation check of the pinned CPUs (`ctl isolation`).

/// Writes one line to stderr, whole: see [`console::say_line`].
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::console::say_line(&format!($($arg)*))
    };
}

pub mod boot;
pub mod config;
pub mod console;
pub mod controller;
pub mod counters;
pub mod cpus;
pub mod disks;
pub mod display;
pub mod dump;
pub mod event;
pub mod iotrace;
pub mod isolation;
pub mod memory;
pub mod metrics;
pub mod migration;
pub mod mmu;
pub mod passthrough;
pub mod platform;
pub mod private_file;
pub mod signals;
pub mod snapshot;
pub mod start;
pub mod stats;
pub mod vcpu;
pub mod vm;

use std::path::PathBuf;

pub use api::io_reason;
pub use config::VmConfig;
pub use event::{Outcome, VMM_FAILURE_STATUS};
pub use vm::run;

/// Everything that can stop hakoniwa from building or running a VM. Each
/// message is one line that names the problem.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open /dev/kvm: {} (is KVM available and are you allowed to use it?)", io_reason(&std::io::Error::from_raw_os_error(.0.errno())))]
    OpenKvm(kvm_ioctls::Error),
    #[error("{0} failed: {1}")]
    Kvm(&'static str, kvm_ioctls::Error),
    #[error("cannot allocate guest memory: {0}")]
    GuestMemory(String),
    #[error("cannot open {what} {}: {}", path.display(), io_reason(error))]
    OpenFile {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot read {what} {}: {reason}", path.display())]
    ReadFile {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{} is not a Linux kernel (neither a bzImage nor an ELF vmlinux)", .0.display())]
    NotAKernel(PathBuf),
    #[error("cannot boot kernel {}: {reason}", path.display())]
    BadKernel { path: PathBuf, reason: String },
    #[error("initramfs {} is empty", .0.display())]
    EmptyInitramfs(PathBuf),
    #[error("--memory {given} is too small for this kernel and initramfs{}", needed.as_ref().map(|n| format!(": they need at least {n}")).unwrap_or_default())]
    MemoryTooSmall {
        given: String,
        needed: Option<String>,
    },
    #[error("--memory {given} is more than the host's memory ({host})")]
    MemoryAboveHost { given: String, host: String },
    #[error("kernel command line is too long ({0} bytes; at most {1})")]
    CmdlineTooLong(usize, usize),
    #[error("invalid kernel command line: {0}")]
    BadCmdline(String),
    #[error("device {0}: {1}")]
    Device(String, String),
    #[error("cannot start the {what} thread: {}", io_reason(error))]
    Thread {
        what: &'static str,
        error: std::io::Error,
    },
    #[error("signal setup failed: {0}")]
    Signal(String),
    #[error("{0}")]
    Sandbox(String),
    #[error("{0}")]
    Api(String),
    #[error(transparent)]
    Arch(#[from] arch::Error),
    #[error(transparent)]
    Cpus(#[from] cpus::CpusError),
    #[error(transparent)]
    MemoryBacking(#[from] memory::backing::BackingError),
    #[error("--spt-pages: {0}")]
    Mmu(#[from] mmu::MmuError),
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    #[error("migration: {0}")]
    Migration(#[from] migration::MigrationError),
}
