//! Update detection: which framebuffer pages may have changed since the
//! last refresh period. One trait, three sibling implementations:
//!
//! - `compare` (the baseline): reports every page; the caller compares the
//!   whole framebuffer with its copy;
//! - `dirtylog`: the paper's "page-table lookup": the MMU's dirty bits, in
//!   KVM the dirty log of the framebuffer's memory slot;
//! - `wp`: the paper's "write exception": userfaultfd write-protects the
//!   framebuffer; the first write to a page in a period faults to us, we
//!   record the page and let the write through; protection is re-armed
//!   each period.
//!
//! Trackers are switchable at run time: the display drops one and builds
//! another between two periods.

mod compare;
mod dirtylog;
mod page_set;
mod wp;

use std::time::Duration;

pub use compare::CompareTracker;
pub use dirtylog::{DirtyLogTracker, FramebufferLog, FramebufferLogReader};
pub use page_set::PageSet;
pub use wp::WpTracker;

/// How trackers are chosen: `dirty=` of `--display`, `ctl display --dirty`,
/// the API (defined once, in the `choices` crate).
pub use choices::DirtyMethod;

#[derive(Debug, thiserror::Error)]
pub enum DirtyError {
    #[error("framebuffer dirty log: {0}")]
    Log(String),
    #[error("userfaultfd write-protect is unavailable: {0} (it needs Linux 5.7+ with CAP_SYS_PTRACE or access to /dev/userfaultfd)")]
    UffdUnavailable(String),
    #[error("userfaultfd {0} failed: {1}")]
    Uffd(&'static str, String),
}

/// Counters a tracker keeps (cumulative).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct TrackerCounters {
    /// Write-protect faults handled (`wp` only).
    pub wp_faults: u64,
    /// Dirty-log reads (`dirtylog` only; includes event-mode probes).
    pub log_reads: u64,
}

/// Says which framebuffer pages may have changed.
pub trait DirtyTracker: Send {
    fn method(&self) -> DirtyMethod;

    /// Adds to `out` every page that may have changed since the previous
    /// harvest and re-arms detection, so a write after this call is seen by
    /// the next one. Callers read page contents only after harvesting.
    fn harvest(&mut self, out: &mut PageSet) -> Result<(), DirtyError>;

    /// Waits up to `timeout` for the guest to write to the framebuffer;
    /// true if it did (then the caller refreshes at once: `refresh=event`).
    /// Trackers with no cheap way to notice just sleep.
    fn wait_for_write(&mut self, timeout: Duration) -> Result<bool, DirtyError> {
        std::thread::sleep(timeout);
        Ok(false)
    }

    fn counters(&self) -> TrackerCounters {
        TrackerCounters::default()
    }
}
