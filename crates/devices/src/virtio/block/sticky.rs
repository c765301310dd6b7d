//! A failed flush stays failed: [`StickyFlush`].
//!
//! When writeback of dirty pages fails, Linux reports the error to the
//! next `fsync`/`fdatasync` of each open file once (errseq), marks the
//! pages clean and forgets them: a later `fdatasync` succeeds although the
//! data never reached the disk. A guest told "flushed" then would trust
//! lost data, so after one failure every later FLUSH fails too
//! (VIRTIO_BLK_S_IOERR) until the image is opened again — QEMU does the
//! same (block/file-posix.c, `page_cache_inconsistent`). QEMU skips it
//! with O_DIRECT; hakoniwa's cache=none also writes unaligned requests
//! through the page cache, so it is sticky in every mode that syncs.
//!
//! The engine that runs the sync (an io_uring fsync, or a thread's
//! fdatasync) asks [`StickyFlush::refusal`] before syncing and reports
//! the outcome with [`StickyFlush::record`]. Every sync of the image
//! passes here, so here they are counted too: the [`SyncStats`] the
//! disk's statistics read (`sync_ops`, `sync_failed`, `sync_refused` in
//! `vm.counters`).

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use super::counters::SyncCounters;
use super::stats::SyncStats;

/// The flush health of one open image.
#[derive(Debug, Default)]
pub struct StickyFlush {
    /// The errno of the first failed sync, 0 while none failed.
    errno: AtomicI32,
    /// Syncs run, failed and refused.
    stats: Arc<SyncStats>,
}

impl StickyFlush {
    /// The error a flush must fail with without syncing, if an earlier
    /// sync failed (and counts it as refused).
    pub fn refusal(&self) -> Option<io::Error> {
        match self.errno.load(Ordering::SeqCst) {
            0 => None,
            errno => {
                self.stats.refused();
                Some(io::Error::from_raw_os_error(errno))
            }
        }
    }

    /// Takes (and counts) the outcome of a sync: a failure makes every
    /// later flush fail.
    pub fn record(&self, result: io::Result<()>) -> io::Result<()> {
        if let Err(e) = &result {
            let errno = e.raw_os_error().filter(|&n| n != 0).unwrap_or(libc::EIO);
            // The first error is the one reported from then on.
            let _ = self
                .errno
                .compare_exchange(0, errno, Ordering::SeqCst, Ordering::SeqCst);
        }
        self.stats.ran(result.is_ok());
        result
    }

    /// Runs `sync` unless an earlier one failed, and records its outcome.
    pub fn run(&self, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        if let Some(e) = self.refusal() {
            return Err(e);
        }
        self.record(sync())
    }

    /// Whether flushes fail from now on.
    pub fn is_failed(&self) -> bool {
        self.errno.load(Ordering::SeqCst) != 0
    }

    /// The counters, live: the disk's statistics read them.
    pub fn stats(&self) -> Arc<SyncStats> {
        self.stats.clone()
    }

    /// The counters now.
    pub fn counters(&self) -> SyncCounters {
        self.stats.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn one_failed_sync_fails_every_later_flush_without_syncing() {
        let sticky = StickyFlush::default();
        let syncs = Cell::new(0);
        let ok = || {
            syncs.set(syncs.get() + 1);
            Ok(())
        };
        sticky.run(ok).unwrap();
        let e = sticky
            .run(|| Err(io::Error::from_raw_os_error(libc::EIO)))
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert!(sticky.is_failed());
        for _ in 0..3 {
            // Linux would now report success: the pages are marked clean.
            let e = sticky.run(ok).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EIO));
        }
        assert_eq!(syncs.get(), 1, "no sync after the failure");
        assert_eq!(
            sticky.counters(),
            SyncCounters {
                ops: 2,
                failed: 1,
                refused: 3
            }
        );
    }

    #[test]
    fn the_first_errno_is_kept() {
        let sticky = StickyFlush::default();
        let _ = sticky.record(Err(io::Error::from_raw_os_error(libc::ENOSPC)));
        let _ = sticky.record(Err(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(sticky.refusal().unwrap().raw_os_error(), Some(libc::ENOSPC));
        // An error without an errno counts as EIO.
        let other = StickyFlush::default();
        let _ = other.record(Err(io::Error::other("lost")));
        assert_eq!(other.refusal().unwrap().raw_os_error(), Some(libc::EIO));
    }
}
