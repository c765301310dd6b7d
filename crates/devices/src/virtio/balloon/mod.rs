//! virtio-balloon (virtio 1.2, 5.5 "Traditional Memory Balloon Device").
//!
//! The host sets a target balloon size (`num_pages`, in 4 KiB pages) in the
//! configuration space and raises a configuration interrupt; the guest
//! driver allocates that many pages, gives their frame numbers to the device
//! on the inflate queue and reports the balloon's size in `actual`. The
//! device gives the memory behind inflated pages back to the host
//! (`madvise(MADV_DONTNEED)`, or `MADV_REMOVE` for shared mappings); a page
//! handed back on the deflate queue comes back (zeroed) when the guest
//! touches it again, so deflating needs no work (MUST_TELL_HOST is not
//! offered).
//!
//! With STATS_VQ the guest keeps one buffer of memory statistics in the
//! stats queue: the device holds it, and to ask for fresh values returns it
//! (used, interrupt); the guest refills it and makes it available again.
//!
//! The device is owned by the transport; the VMM keeps the
//! [`BalloonControl`] returned by [`Balloon::new`] to change the target and
//! read the statistics at run time.

mod control;
mod device;
mod sizing;
#[cfg(test)]
mod tests;

pub use control::{BalloonControl, BalloonCounters, BalloonError, BalloonStats};
#[doc(hidden)]
pub use device::fuzzing;
pub use device::{Balloon, BalloonState};
pub use sizing::{
    balloon_for_guest_bytes, balloon_mib_for_guest_mib, guest_bytes_with_balloon,
    BOOT_OVERHEAD_PER_10K,
};

use crate::options::{invalid, Options, OptionsError};

/// The virtio device id of a memory balloon.
pub const VIRTIO_ID_BALLOON: u32 = 5;

/// The guest must tell the host before reusing a deflated page.
pub const VIRTIO_BALLOON_F_MUST_TELL_HOST: u32 = 0;
/// The stats queue is present.
pub const VIRTIO_BALLOON_F_STATS_VQ: u32 = 1;
/// The guest may deflate the balloon when it runs out of memory.
pub const VIRTIO_BALLOON_F_DEFLATE_ON_OOM: u32 = 2;

/// Balloon page frame numbers are in units of 4 KiB, whatever the page
/// size of guest or host.
pub const BALLOON_PAGE_SHIFT: u32 = 12;
/// The size of a balloon page.
pub const BALLOON_PAGE_SIZE: u64 = 1 << BALLOON_PAGE_SHIFT;
/// Balloon pages per MiB.
pub const PAGES_PER_MIB: u64 = (1 << 20) / BALLOON_PAGE_SIZE;
/// The largest target: `num_pages` is a 32-bit count of 4 KiB pages.
pub const MAX_SIZE_MIB: u64 = u32::MAX as u64 / PAGES_PER_MIB;

/// Statistics tags (`struct virtio_balloon_stat`).
pub mod tags {
    pub const SWAP_IN: u16 = 0;
    pub const SWAP_OUT: u16 = 1;
    pub const MAJFLT: u16 = 2;
    pub const MINFLT: u16 = 3;
    pub const MEMFREE: u16 = 4;
    pub const MEMTOT: u16 = 5;
    pub const AVAIL: u16 = 6;
    pub const CACHES: u16 = 7;
    pub const HTLB_PGALLOC: u16 = 8;
    pub const HTLB_PGFAIL: u16 = 9;
    pub const OOM_KILL: u16 = 10;
    pub const ALLOC_STALL: u16 = 11;
    pub const ASYNC_SCAN: u16 = 12;
    pub const DIRECT_SCAN: u16 = 13;
    pub const ASYNC_RECLAIM: u16 = 14;
    pub const DIRECT_RECLAIM: u16 = 15;
}

/// `--balloon [size=MIB][,deflate_on_oom=on][,stats=on|off][,id=NAME]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BalloonConfig {
    /// The device's name; `balloon0` when not given.
    pub id: Option<String>,
    /// The initial target size of the balloon in MiB (memory taken from
    /// the guest); 0 by default.
    pub size_mib: u64,
    /// Offer VIRTIO_BALLOON_F_DEFLATE_ON_OOM; off by default.
    pub deflate_on_oom: bool,
    /// Offer VIRTIO_BALLOON_F_STATS_VQ; on by default.
    pub stats: bool,
}

impl Default for BalloonConfig {
    fn default() -> Self {
        BalloonConfig {
            id: None,
            size_mib: 0,
            deflate_on_oom: false,
            stats: true,
        }
    }
}

impl BalloonConfig {
    /// Parses the `--balloon` option string.
    pub fn parse(text: &str) -> Result<BalloonConfig, OptionsError> {
        let mut options = Options::parse(text, None)?;
        let id = options.take("id");
        let size_mib = options.parsed::<u64>("size")?.unwrap_or(0);
        let deflate_on_oom = options.flag("deflate_on_oom", false)?;
        let stats = options.flag("stats", true)?;
        options.finish()?;
        if let Some(id) = &id {
            super::rng::check_id(id)?;
        }
        if size_mib > MAX_SIZE_MIB {
            return Err(invalid(
                "size",
                &size_mib.to_string(),
                &format!("at most {MAX_SIZE_MIB} MiB"),
            ));
        }
        Ok(BalloonConfig {
            id,
            size_mib,
            deflate_on_oom,
            stats,
        })
    }
}
