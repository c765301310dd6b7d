//! The host's handle on a balloon: target, actual size, statistics.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{tags, MAX_SIZE_MIB, PAGES_PER_MIB};
use crate::virtio::VirtioInterrupt;

/// Why a balloon request was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BalloonError {
    #[error("balloon size {0} MiB is too large (at most {MAX_SIZE_MIB} MiB)")]
    TooLarge(u64),
    #[error("balloon size {mib} MiB is larger than guest memory ({memory_mib} MiB)")]
    ExceedsMemory { mib: u64, memory_mib: u64 },
}

/// The guest's memory statistics, as last reported on the stats queue.
///
/// Memory amounts are in bytes; faults, swap and reclaim figures are the
/// guest's counters (Linux reports swap in/out in bytes too).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BalloonStats {
    /// (tag, value) in the order the guest sent them, one per tag.
    pub values: Vec<(u16, u64)>,
    /// When the device received them.
    pub updated: Instant,
}

impl BalloonStats {
    /// Parses a stats buffer: packed `{ le16 tag; le64 val; }` entries; a
    /// trailing partial entry is ignored, a repeated tag keeps its last value.
    pub fn parse(bytes: &[u8]) -> BalloonStats {
        let mut values: Vec<(u16, u64)> = Vec::new();
        for entry in bytes.chunks_exact(10) {
            let tag = u16::from_le_bytes([entry[0], entry[1]]);
            let mut val = [0u8; 8];
            val.copy_from_slice(&entry[2..10]);
            let val = u64::from_le_bytes(val);
            match values.iter_mut().find(|(t, _)| *t == tag) {
                Some(slot) => slot.1 = val,
                None => values.push((tag, val)),
            }
        }
        BalloonStats {
            values,
            updated: Instant::now(),
        }
    }

    /// The value of `tag` (see [`super::tags`]), if the guest reported it.
    pub fn get(&self, tag: u16) -> Option<u64> {
        self.values.iter().find(|(t, _)| *t == tag).map(|(_, v)| *v)
    }

    /// Free memory in bytes (MEMFREE).
    pub fn free_memory(&self) -> Option<u64> {
        self.get(tags::MEMFREE)
    }

    /// Total memory the guest sees in bytes (MEMTOT).
    pub fn total_memory(&self) -> Option<u64> {
        self.get(tags::MEMTOT)
    }

    /// Memory available to start new programs, in bytes (AVAIL).
    pub fn available_memory(&self) -> Option<u64> {
        self.get(tags::AVAIL)
    }

    /// Every reported value with a readable name (`tag_N` for tags this
    /// device does not know), for logs and the control API.
    pub fn entries(&self) -> Vec<(String, u64)> {
        self.values
            .iter()
            .map(|(tag, v)| {
                let name = tag_name(*tag)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("tag_{tag}"));
                (name, *v)
            })
            .collect()
    }
}

/// The name of a statistics tag, `None` if unknown.
pub fn tag_name(tag: u16) -> Option<&'static str> {
    Some(match tag {
        tags::SWAP_IN => "swap_in",
        tags::SWAP_OUT => "swap_out",
        tags::MAJFLT => "major_faults",
        tags::MINFLT => "minor_faults",
        tags::MEMFREE => "free_memory",
        tags::MEMTOT => "total_memory",
        tags::AVAIL => "available_memory",
        tags::CACHES => "disk_caches",
        tags::HTLB_PGALLOC => "hugetlb_allocations",
        tags::HTLB_PGFAIL => "hugetlb_failures",
        tags::OOM_KILL => "oom_kills",
        tags::ALLOC_STALL => "alloc_stalls",
        tags::ASYNC_SCAN => "async_scans",
        tags::DIRECT_SCAN => "direct_scans",
        tags::ASYNC_RECLAIM => "async_reclaims",
        tags::DIRECT_RECLAIM => "direct_reclaims",
        _ => return None,
    })
}

/// What the device did, for `vm.info` and debugging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BalloonCounters {
    /// 4 KiB pages the guest put in the balloon (inflate queue).
    pub inflated_pages: u64,
    /// 4 KiB pages the guest took back (deflate queue).
    pub deflated_pages: u64,
    /// Page frame numbers outside guest RAM, ignored.
    pub invalid_pfns: u64,
    /// Pages whose memory could not be given back to the host.
    pub discard_errors: u64,
}

pub(super) struct State {
    pub num_pages: u32,
    pub actual: u32,
    pub interrupt: Option<Arc<dyn VirtioInterrupt>>,
    /// Guest RAM in bytes, known once the device is activated.
    pub memory_bytes: Option<u64>,
    pub stats_negotiated: bool,
    pub stats: Option<BalloonStats>,
    pub stats_generation: u64,
    pub stats_requested: bool,
    pub counters: BalloonCounters,
}

/// The host's handle on a balloon device, shared with the device (which
/// the transport owns) and its worker.
pub struct BalloonControl {
    state: Mutex<State>,
    stats_arrived: Condvar,
    /// Wakes the worker to return the stats buffer.
    pub(super) wake: EventFd,
}

impl BalloonControl {
    pub(super) fn new(size_mib: u64) -> std::io::Result<BalloonControl> {
        Ok(BalloonControl {
            state: Mutex::new(State {
                num_pages: (size_mib.min(MAX_SIZE_MIB) * PAGES_PER_MIB) as u32,
                actual: 0,
                interrupt: None,
                memory_bytes: None,
                stats_negotiated: false,
                stats: None,
                stats_generation: 0,
                stats_requested: false,
                counters: BalloonCounters::default(),
            }),
            stats_arrived: Condvar::new(),
            wake: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the plain counters
        // inconsistent in a harmful way: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the balloon's target size (memory taken from the guest) and
    /// tells the driver if it is running. The guest inflates or deflates
    /// towards it in its own time; see [`actual_mib`](Self::actual_mib).
    pub fn set_target_mib(&self, mib: u64) -> Result<(), BalloonError> {
        if mib > MAX_SIZE_MIB {
            return Err(BalloonError::TooLarge(mib));
        }
        let mut state = self.lock();
        if let Some(memory) = state.memory_bytes {
            let memory_mib = memory >> 20;
            if mib > memory_mib {
                return Err(BalloonError::ExceedsMemory { mib, memory_mib });
            }
        }
        state.num_pages = (mib * PAGES_PER_MIB) as u32;
        let interrupt = state.interrupt.clone();
        drop(state);
        if let Some(interrupt) = interrupt {
            interrupt.notify_config();
        }
        Ok(())
    }

    /// The target size in MiB.
    pub fn target_mib(&self) -> u64 {
        u64::from(self.lock().num_pages) / PAGES_PER_MIB
    }

    /// The balloon's size as the guest last reported it, in MiB (rounded
    /// down).
    pub fn actual_mib(&self) -> u64 {
        u64::from(self.lock().actual) / PAGES_PER_MIB
    }

    /// The balloon's size as the guest last reported it, in 4 KiB pages.
    pub fn actual_pages(&self) -> u32 {
        self.lock().actual
    }

    /// Whether a driver is running the device.
    pub fn is_active(&self) -> bool {
        self.lock().interrupt.is_some()
    }

    /// Whether the running driver accepted the stats queue.
    pub fn stats_enabled(&self) -> bool {
        self.lock().stats_negotiated
    }

    /// The latest statistics the guest sent (`None` before the first), and
    /// asks the guest for fresh ones, so that polling this gives values at
    /// most one poll interval old.
    pub fn stats(&self) -> Option<BalloonStats> {
        let stats = self.lock().stats.clone();
        self.request_stats();
        stats
    }

    /// The latest statistics the guest sent, without asking for more.
    pub fn last_stats(&self) -> Option<BalloonStats> {
        self.lock().stats.clone()
    }

    /// Asks the guest to refresh its statistics (returns the buffer the
    /// device holds); does nothing without a running stats queue.
    pub fn request_stats(&self) {
        let mut state = self.lock();
        if !state.stats_negotiated {
            return;
        }
        state.stats_requested = true;
        drop(state);
        let _ = self.wake.write(1);
    }

    /// Asks the guest for fresh statistics and waits up to `timeout` for
    /// them; `None` if none arrived in time.
    pub fn fresh_stats(&self, timeout: Duration) -> Option<BalloonStats> {
        let start = self.lock().stats_generation;
        self.request_stats();
        let state = self.lock();
        let (state, _) = self
            .stats_arrived
            .wait_timeout_while(state, timeout, |s| s.stats_generation == start)
            .unwrap_or_else(|e| e.into_inner());
        if state.stats_generation != start {
            state.stats.clone()
        } else {
            None
        }
    }

    /// What the device did so far.
    pub fn counters(&self) -> BalloonCounters {
        self.lock().counters
    }

    /// Called by the worker with a new stats buffer.
    pub(super) fn stats_received(&self, stats: BalloonStats) {
        let mut state = self.lock();
        state.stats = Some(stats);
        state.stats_generation += 1;
        drop(state);
        self.stats_arrived.notify_all();
    }
}
