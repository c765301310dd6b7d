//! VM snapshots (docs/snapshot.md): the whole VM's state — every vCPU,
//! the in-kernel irqchip, PIT and kvm-clock, COM1, the virtio devices and
//! guest RAM — in one file, and a VM built from that file that continues
//! where it stopped.
//!
//! - [`state`]: the serializable state types;
//! - [`vcpu_state`]: saving and restoring one vCPU (on its own thread);
//! - [`vm_state`]: the irqchip, PIT and clock;
//! - [`file`]: the on-disk format and its checks;
//! - [`save`]: taking a snapshot of a running VM (the API's `vm.snapshot`);
//! - [`restore`]: what `run --restore` checks and applies.

pub mod file;
pub mod restore;
pub mod save;
pub mod state;
pub mod vcpu_state;
pub mod vm_state;

use std::path::{Path, PathBuf};

use api::io_reason;

pub use file::{SnapshotReader, FORMAT_VERSION, HAKONIWA_VERSION};
pub use save::SnapshotSource;

/// Why a snapshot cannot be taken or restored; each one line.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("cannot open snapshot {}: {}", path.display(), io_reason(error))]
    Open {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("snapshot {}: {}", path.display(), io_reason(error))]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{} is not a hakoniwa snapshot", .0.display())]
    NotASnapshot(PathBuf),
    #[error("snapshot {} has format version {found}; this hakoniwa reads version {}", path.display(), FORMAT_VERSION)]
    FormatVersion { path: PathBuf, found: u32 },
    #[error("snapshot {} was taken by hakoniwa {found}; this is hakoniwa {}", path.display(), HAKONIWA_VERSION)]
    HakoniwaVersion { path: PathBuf, found: String },
    #[error("snapshot {} is truncated ({what})", path.display())]
    Truncated { path: PathBuf, what: String },
    #[error("snapshot {} is corrupt: {what}", path.display())]
    Corrupt { path: PathBuf, what: String },
    #[error("snapshot {} does not match this VM: {what}", path.display())]
    Mismatch { path: PathBuf, what: String },
    #[error("{0} failed: {1}")]
    Kvm(&'static str, kvm_ioctls::Error),
    #[error("vCPU {index}: {what} failed: {error}")]
    Vcpu {
        index: u8,
        what: &'static str,
        error: kvm_ioctls::Error,
    },
    #[error("snapshot: {0}")]
    Invalid(String),
    /// The file could not be created or put in place.
    #[error("snapshot {0}")]
    File(#[from] crate::private_file::PrivateFileError),
    /// A disk image could not be flushed, unlocked or locked.
    #[error("{0}")]
    Disk(String),
    #[error("virtio device {id}: {error}")]
    Virtio {
        id: String,
        error: devices::virtio::StateError,
    },
}

impl From<crate::platform::VirtioStateFailure> for SnapshotError {
    fn from((id, error): crate::platform::VirtioStateFailure) -> Self {
        SnapshotError::Virtio { id, error }
    }
}

impl SnapshotError {
    fn io(path: &Path, error: std::io::Error) -> Self {
        SnapshotError::Io {
            path: path.to_owned(),
            error,
        }
    }
}
