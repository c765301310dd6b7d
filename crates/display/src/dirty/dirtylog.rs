//! "Page-table lookup" (the paper's dirty-bit method): KVM's dirty log of
//! the framebuffer's memory slot.
//!
//! KVM write-protects (or, on Intel with PML, logs) the slot's pages in its
//! own page tables; a guest write sets the page's bit. The VMM's memory
//! manager owns the slot and its log ([`FramebufferLog`]): a harvest gives
//! the pages written since this tracker's last one and re-protects them —
//! then the caller reads their contents, so a write after the harvest is
//! seen next time — whoever else (a migration) reads the same log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{DirtyError, DirtyMethod, DirtyTracker, PageSet, TrackerCounters};

/// How often `wait_for_write` looks at the dirty log.
const PROBE_INTERVAL: Duration = Duration::from_millis(2);

/// The framebuffer slot's dirty log, as the VMM's memory manager offers
/// it: each [`FramebufferLog::open`] starts a reader of its own.
pub trait FramebufferLog: Send + Sync {
    /// Starts logging the framebuffer's writes for a new reader (logging
    /// stops when the last reader is dropped).
    fn open(&self) -> Result<Box<dyn FramebufferLogReader>, DirtyError>;
    /// Whether KVM's manual dirty-log protection is in use (metrics).
    fn manual_protect(&self) -> bool;
}

/// One reader of the framebuffer slot's dirty log.
pub trait FramebufferLogReader: Send {
    /// The pages written since this reader's last harvest, one bit per
    /// page (64 a word), re-protected.
    fn harvest(&mut self) -> Result<Vec<u64>, DirtyError>;
}

pub struct DirtyLogTracker {
    log: Box<dyn FramebufferLogReader>,
    manual: bool,
    /// Pages seen by probes but not yet handed out.
    pending: PageSet,
    counters: TrackerCounters,
}

impl DirtyLogTracker {
    /// Starts logging. The first harvest reports every page (the caller's
    /// copy may be stale from another method).
    pub fn new(log: &Arc<dyn FramebufferLog>, pages: usize) -> Result<DirtyLogTracker, DirtyError> {
        let mut pending = PageSet::new(pages);
        pending.insert_all();
        Ok(DirtyLogTracker {
            log: log.open()?,
            manual: log.manual_protect(),
            pending,
            counters: TrackerCounters::default(),
        })
    }

    /// Whether KVM's manual protection is in use (reported in metrics).
    pub fn manual_protect(&self) -> bool {
        self.manual
    }

    fn read(&mut self) -> Result<Vec<u64>, DirtyError> {
        self.counters.log_reads += 1;
        self.log.harvest()
    }
}

impl DirtyTracker for DirtyLogTracker {
    fn method(&self) -> DirtyMethod {
        DirtyMethod::DirtyLog
    }

    fn harvest(&mut self, out: &mut PageSet) -> Result<(), DirtyError> {
        let bitmap = self.read()?;
        out.merge_words(&bitmap);
        out.merge(&self.pending);
        self.pending.clear();
        Ok(())
    }

    fn wait_for_write(&mut self, timeout: Duration) -> Result<bool, DirtyError> {
        let deadline = Instant::now() + timeout;
        loop {
            // A probe is a harvest kept for the next period: the pages it
            // re-protected were written, and are reported then.
            let bitmap = self.read()?;
            self.pending.merge_words(&bitmap);
            if !self.pending.is_empty() {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            std::thread::sleep(PROBE_INTERVAL.min(deadline - now));
        }
    }

    fn counters(&self) -> TrackerCounters {
        self.counters
    }
}
