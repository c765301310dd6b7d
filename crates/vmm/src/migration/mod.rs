//! Live migration between two hakoniwa processes over TCP (seed 003,
//! docs/migration.md): precopy (the baseline), postcopy over userfaultfd
//! with ±N prefetch and a background push, and hybrid, which switches from
//! precopy to postcopy by itself when the measured dirty rate says precopy
//! will not fit the downtime limit.
//!
//! - [`address`]: `tcp:HOST:PORT,tls=DIR|auth=none`, parsed and printed;
//! - [`tls`]: TLS 1.3 with certificates both ways, and its pump thread;
//! - [`link`]: the connection as a plain byte stream, plain or over TLS;
//! - [`protocol`]: the framed, checksummed stream;
//! - [`pages`]: guest pages, RAM-order indices and shared page bitmaps;
//! - [`dirty`]: the source's dirty log over RAM (KVM's and the VMM's);
//! - [`history`]: how and when each page arrived on the destination, and
//!   the source's page checksums (`--verify-pages`);
//! - [`source`]: `ctl migrate`: rounds, the switch-over, serving postcopy;
//! - [`switchover`]: after each precopy round, another round, stop and
//!   copy, or (hybrid) postcopy: a pure policy per mode;
//! - [`destination`]: `run --incoming`: taking pages and state in;
//! - [`postcopy`]: the destination's userfaultfd fault handler and page
//!   placement;
//! - [`status`]: what both sides report (API, `ctl migrate`'s progress).

pub mod address;
pub mod destination;
pub mod dirty;
pub mod history;
pub mod link;
pub mod pages;
pub mod postcopy;
pub mod protocol;
pub mod source;
pub mod status;
pub mod switchover;
pub mod tls;

use serde::{Deserialize, Serialize};

use crate::snapshot::state::MachineState;
use crate::snapshot::SnapshotError;
use protocol::StreamError;

pub use address::{MigrationAddress, MigrationAuth};
pub use destination::Incoming;
pub use source::{MigrationSource, VmPauser};
pub use status::{MigrationStatus, Phase};

/// How the source moves the VM (defined once, in the `choices` crate).
pub use choices::MigrationMode;

/// The first message: the source's version and the machine the state fits.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub hakoniwa: String,
    pub mode: MigrationMode,
    pub machine: MachineState,
    /// A resumed postcopy (after the connection dropped), not a new one.
    #[serde(default)]
    pub resume: bool,
}

/// Why a migration failed or was refused; each one line.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("{0}")]
    Stream(#[from] StreamError),
    #[error("cannot connect to {to}: {reason}")]
    Connect { to: String, reason: String },
    #[error("the destination refused the VM: {0}")]
    Refused(String),
    #[error("refused the incoming VM: {0}")]
    RefusedIncoming(String),
    #[error("{0}")]
    Snapshot(#[from] SnapshotError),
    #[error("{0} failed: {1}")]
    Kvm(&'static str, kvm_ioctls::Error),
    #[error("userfaultfd: {0}")]
    Uffd(String),
    /// `--verify-pages` found pages that differ from the source's.
    #[error("--verify-pages: {0}")]
    WrongPages(String),
    #[error("unexpected {got} message {when}")]
    Unexpected {
        got: &'static str,
        when: &'static str,
    },
    #[error("{0}")]
    Invalid(String),
}

impl MigrationError {
    /// The connection broke (as opposed to a refusal, a corrupt stream or
    /// a local failure): a postcopy can be resumed over a new one.
    pub fn is_disconnect(&self) -> bool {
        matches!(self, MigrationError::Stream(e) if e.is_disconnect())
    }
}

/// The newest migration's report in this VMM: an outgoing one if the VM
/// started one, else the one it came in by. Serves the API
/// (`vm.migration`) and the `--metrics` file's "migration" section.
pub struct MigrationReports {
    pub source: std::sync::Arc<MigrationSource>,
    pub incoming: Option<std::sync::Arc<status::SharedStatus>>,
}

impl MigrationReports {
    pub fn latest(&self) -> Option<MigrationStatus> {
        self.source
            .status()
            .or_else(|| self.incoming.as_ref().map(|s| s.get()))
    }
}

impl crate::metrics::MetricsSource for MigrationReports {
    fn name(&self) -> &'static str {
        "migration"
    }

    fn sample(&self) -> serde_json::Value {
        self.latest()
            .and_then(|s| serde_json::to_value(s).ok())
            .unwrap_or(serde_json::Value::Null)
    }
}

/// Wall-clock time now, ns since the Unix epoch: both sides of a
/// same-host migration share it, so downtime can be measured across them.
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
