//! "Write exception" (the paper's second method): userfaultfd
//! write-protects the framebuffer. The guest's first write to a page in a
//! period makes KVM fault on the protected host page; the kernel hands the
//! fault to our handler thread, which records the page and lifts the
//! protection so the write (and the rest of the period's writes to that
//! page) goes through. Each harvest re-protects the recorded pages.
//!
//! Ordering keeps writes from being lost: the handler records a page before
//! unprotecting it, and a harvest re-protects pages before the caller reads
//! them, so every write is either before the read (seen now) or after the
//! re-protection (faults, seen next period).
//!
//! A page that faulted less than [`REARM_GRACE`] ago is reported but not
//! re-protected yet: it stays in the set (and writable) until the next
//! harvest. The faulting thread — a vCPU, or KVM's async page-fault worker —
//! must get to retry its write before the page is protected again; a
//! harvest right after the fault (refresh=event wakes one at once) would
//! otherwise make the retry fault again, and again, and the guest crawls.
//! Reporting the page now and again next time loses nothing.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use userfaultfd::{Event, FaultKind, FeatureFlags, RegisterMode, Uffd, UffdBuilder};
use vmm_sys_util::eventfd::EventFd;

use super::{DirtyError, DirtyMethod, DirtyTracker, PageSet, TrackerCounters};
use crate::framebuffer::FramebufferMemory;
use crate::layout::PAGE_SIZE;

/// How long a just-unprotected page stays writable at least.
pub const REARM_GRACE: Duration = Duration::from_millis(10);

struct Faults {
    /// Pages written since the last harvest (or young at it).
    dirty: PageSet,
    /// When each page last faulted.
    when: Vec<Option<Instant>>,
    /// Faults recorded so far, and at the last harvest: `wait_for_write`
    /// waits for a fault since the last harvest.
    count: u64,
    count_at_harvest: u64,
}

struct Shared {
    dirty: Mutex<Faults>,
    /// Signalled on each recorded page, for `refresh=event`.
    written: Condvar,
    faults: AtomicU64,
}

pub struct WpTracker {
    memory: Arc<FramebufferMemory>,
    uffd: Arc<Uffd>,
    shared: Arc<Shared>,
    stop: EventFd,
    handler: Option<JoinHandle<()>>,
}

impl WpTracker {
    /// Registers the framebuffer with a new userfaultfd in write-protect
    /// mode, protects every page and starts the fault handler thread. The
    /// first harvest reports every page.
    pub fn new(memory: Arc<FramebufferMemory>) -> Result<WpTracker, DirtyError> {
        // Kernel-mode faults must reach us: KVM takes the fault on the
        // guest's behalf, in the kernel (hence not user_mode_only).
        let uffd = UffdBuilder::new()
            .close_on_exec(true)
            .non_blocking(true)
            .user_mode_only(false)
            .require_features(FeatureFlags::PAGEFAULT_FLAG_WP)
            .create()
            .map_err(|e| DirtyError::UffdUnavailable(e.to_string()))?;
        let base = memory.host_address().cast();
        let len = memory.len();
        uffd.register_with_mode(base, len, RegisterMode::WRITE_PROTECT)
            .map_err(|e| DirtyError::UffdUnavailable(format!("register: {e}")))?;
        uffd.write_protect(base, len)
            .map_err(|e| DirtyError::Uffd("UFFDIO_WRITEPROTECT", e.to_string()))?;

        let mut all = PageSet::new(len / PAGE_SIZE);
        all.insert_all();
        let shared = Arc::new(Shared {
            dirty: Mutex::new(Faults {
                dirty: all,
                when: vec![None; len / PAGE_SIZE],
                count: 0,
                count_at_harvest: 0,
            }),
            written: Condvar::new(),
            faults: AtomicU64::new(0),
        });
        let uffd = Arc::new(uffd);
        let stop = EventFd::new(libc::EFD_NONBLOCK)
            .map_err(|e| DirtyError::Uffd("eventfd", e.to_string()))?;
        let handler = {
            let (uffd, shared, memory) = (uffd.clone(), shared.clone(), memory.clone());
            let stop = stop
                .try_clone()
                .map_err(|e| DirtyError::Uffd("eventfd", e.to_string()))?;
            std::thread::Builder::new()
                .name("display-wp".into())
                .spawn(move || {
                    sandbox::enter_or_exit(sandbox::ThreadKind::DisplayWp);
                    handle_faults(&uffd, &shared, &memory, &stop)
                })
                .map_err(|e| DirtyError::Uffd("thread", e.to_string()))?
        };
        Ok(WpTracker {
            memory,
            uffd,
            shared,
            stop,
            handler: Some(handler),
        })
    }

    fn page_address(&self, page: usize) -> *mut libc::c_void {
        self.memory
            .host_address()
            .wrapping_add(page * PAGE_SIZE)
            .cast()
    }
}

/// The fault handler thread: one write-protect fault at a time.
fn handle_faults(uffd: &Uffd, shared: &Shared, memory: &FramebufferMemory, stop: &EventFd) {
    let base = memory.host_address() as usize;
    let mut fds = [
        libc::pollfd {
            fd: uffd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd() as RawFd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfds for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(
                "display: wp handler poll failed: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        loop {
            match uffd.read_event() {
                Ok(Some(Event::Pagefault {
                    kind: FaultKind::WriteProtected,
                    addr,
                    ..
                })) => {
                    let offset = (addr as usize).wrapping_sub(base);
                    let page = offset / PAGE_SIZE;
                    let page_start = (base + page * PAGE_SIZE) as *mut libc::c_void;
                    {
                        let mut f = shared.dirty.lock().unwrap_or_else(|e| e.into_inner());
                        f.dirty.insert(page);
                        if let Some(when) = f.when.get_mut(page) {
                            *when = Some(Instant::now());
                        }
                        f.count += 1;
                    }
                    shared.faults.fetch_add(1, Ordering::Relaxed);
                    // Recorded first, unprotected second (see module doc).
                    if let Err(e) = uffd.remove_write_protection(page_start, PAGE_SIZE, true) {
                        tracing::error!("display: cannot unprotect framebuffer page {page}: {e}");
                    }
                    shared.written.notify_all();
                }
                Ok(Some(other)) => {
                    tracing::warn!("display: unexpected userfaultfd event {other:?}");
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("display: reading userfaultfd failed: {e}");
                    return;
                }
            }
        }
    }
}

impl DirtyTracker for WpTracker {
    fn method(&self) -> DirtyMethod {
        DirtyMethod::Wp
    }

    fn harvest(&mut self, out: &mut PageSet) -> Result<(), DirtyError> {
        let now = Instant::now();
        let (taken, rearm) = {
            let mut f = self.shared.dirty.lock().unwrap_or_else(|e| e.into_inner());
            let taken = f.dirty.clone();
            let mut rearm = PageSet::new(taken.pages());
            for page in taken.iter() {
                let young = matches!(f.when[page], Some(t) if now.duration_since(t) < REARM_GRACE);
                if !young {
                    rearm.insert(page);
                }
            }
            let mut keep = PageSet::new(taken.pages());
            for page in taken.iter().filter(|p| !rearm.contains(*p)) {
                keep.insert(page);
            }
            f.dirty = keep;
            f.count_at_harvest = f.count;
            (taken, rearm)
        };
        // Re-arm the pages that were unprotected (and are not young), in runs.
        for (first, count) in rearm.runs() {
            self.uffd
                .write_protect(self.page_address(first), count * PAGE_SIZE)
                .map_err(|e| DirtyError::Uffd("UFFDIO_WRITEPROTECT", e.to_string()))?;
        }
        out.merge(&taken);
        Ok(())
    }

    fn wait_for_write(&mut self, timeout: Duration) -> Result<bool, DirtyError> {
        let f = self.shared.dirty.lock().unwrap_or_else(|e| e.into_inner());
        // Young pages left over from the last harvest are not news: wait
        // for a fault since that harvest.
        let (f, _) = self
            .shared
            .written
            .wait_timeout_while(f, timeout, |f| f.count == f.count_at_harvest)
            .unwrap_or_else(|e| e.into_inner());
        Ok(f.count != f.count_at_harvest)
    }

    fn counters(&self) -> TrackerCounters {
        TrackerCounters {
            wp_faults: self.shared.faults.load(Ordering::Relaxed),
            log_reads: 0,
        }
    }
}

impl Drop for WpTracker {
    fn drop(&mut self) {
        // Lift all protection and wake anyone faulting before the handler
        // goes away, so no vCPU is left waiting on a fault nobody serves.
        let base = self.memory.host_address().cast();
        let len = self.memory.len();
        if let Err(e) = self.uffd.remove_write_protection(base, len, true) {
            tracing::warn!("display: cannot unprotect the framebuffer: {e}");
        }
        let _ = self.stop.write(1);
        if let Some(handler) = self.handler.take() {
            let _ = handler.join();
        }
        if let Err(e) = self.uffd.unregister(base, len) {
            tracing::warn!("display: cannot unregister the framebuffer: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{FbGeometry, Layout};

    /// Real userfaultfd on real memory (no KVM): a write from another
    /// thread is caught, recorded and let through; after a harvest the page
    /// is protected again. Skipped where write-protect is unavailable
    /// (unprivileged, old kernels): says so on stderr.
    #[test]
    fn catches_writes_and_rearms() {
        let g = FbGeometry::new(256, 64, Layout::Linear).unwrap();
        let memory = Arc::new(FramebufferMemory::new(g).unwrap());
        let mut wp = match WpTracker::new(memory.clone()) {
            Ok(wp) => wp,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        let mut out = PageSet::new(g.pages());
        wp.harvest(&mut out).unwrap();
        assert_eq!(out.len(), g.pages(), "first harvest reports everything");

        for round in 0..3u8 {
            let m = memory.clone();
            std::thread::spawn(move || m.write(5 * PAGE_SIZE + 16, &[round + 1; 4]))
                .join()
                .unwrap();
            assert!(wp.wait_for_write(Duration::from_secs(5)).unwrap());
            // Past the grace, so this harvest re-protects the page.
            std::thread::sleep(REARM_GRACE);
            let mut out = PageSet::new(g.pages());
            wp.harvest(&mut out).unwrap();
            assert_eq!(out.iter().collect::<Vec<_>>(), vec![5]);
            let mut page = [0u8; PAGE_SIZE];
            memory.read_page(5, &mut page);
            assert_eq!(page[16], round + 1, "the write went through");
        }
        assert_eq!(wp.counters().wp_faults, 3);
        let mut out = PageSet::new(g.pages());
        wp.harvest(&mut out).unwrap();
        assert!(out.is_empty());
        assert!(!wp.wait_for_write(Duration::from_millis(10)).unwrap());

        // A page harvested right after its fault is reported, left writable
        // (a second write does not fault) and reported again next time.
        memory.write(7 * PAGE_SIZE, &[9]);
        assert!(wp.wait_for_write(Duration::from_secs(5)).unwrap());
        let mut out = PageSet::new(g.pages());
        wp.harvest(&mut out).unwrap();
        assert_eq!(out.iter().collect::<Vec<_>>(), vec![7]);
        memory.write(7 * PAGE_SIZE, &[10]);
        assert_eq!(wp.counters().wp_faults, 4, "young page stayed writable");
        std::thread::sleep(REARM_GRACE);
        let mut out = PageSet::new(g.pages());
        wp.harvest(&mut out).unwrap();
        assert_eq!(out.iter().collect::<Vec<_>>(), vec![7]);
        memory.write(7 * PAGE_SIZE, &[11]);
        assert_eq!(wp.counters().wp_faults, 5, "re-armed after the grace");
    }
}
