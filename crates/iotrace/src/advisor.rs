//! The advisor: guest memory, guest I/O mode, guest swap and the disk's
//! cache mode, from a traced window.
//!
//! The reasoning follows the paper's table 5 (FFSB, 6 VMs, 64 KB files,
//! 16 KB operations): where the data a guest re-reads fits a guest cache
//! the host can afford, a bigger guest with buffered I/O wins by far (a
//! 1 GB guest: 5630 ops/s at 64 MB against 126 for a 128 MB one); where it
//! does not, the guest's cache only splits and multiplies the I/O (figures
//! 9–11), and a small guest with direct I/O wins, its freed memory going to
//! the host cache that every VM shares (at 768 MB: 96 ops/s for a 128 MB
//! guest with direct I/O against 86 for a 1 GB one, buffered). Without
//! swap the guest did better in most cells (figure 7).
//!
//! "The data a guest re-reads" is the working set of the window's reuse
//! profile ([`crate::reuse`]): the smallest LRU cache catching
//! [`WORKING_SET_REUSE_FRACTION`] of the re-reads. Everything here is pure
//! and deterministic; the explanations cite the numbers they come from.

use crate::layers::WindowReport;
use crate::reuse::ReuseProfile;

const MIB: u64 = 1024 * 1024;

/// The share of re-reads the working set must catch. The last tenth of a
/// reuse histogram is its long tail (blocks met again after a sweep of the
/// whole data set), which no cache of a useful size catches.
pub const WORKING_SET_REUSE_FRACTION: f64 = 0.9;

/// Below this share of accesses being re-reads, no cache size pays: the
/// workload streams (a single `dd` pass), and caching only costs copies.
pub const MIN_REUSE_RATIO: f64 = 0.1;

/// The share of a guest's memory beyond its own needs that its page cache
/// keeps for data read again. Linux keeps its active file list (pages read
/// twice) at about the size of the inactive one, so about half. With it,
/// a 1 GB guest of 64 MB of its own caches 480 MB, which holds the working
/// set (about 0.8 of the data set for FFSB's uniform random accesses) of
/// data sets up to about 600 MB: table 5's edge, where the 1 GB buffered
/// guest is still best at 512 MB (162 ops/s against 158) and a 128 MB
/// guest with direct I/O is best at 768 MB (96 against 86).
pub const GUEST_CACHE_FRACTION: f64 = 0.5;

/// A guest hit ratio at or above this says the guest's cache holds the
/// working set (see [`advise`]): the paper's 1 GB guests with buffered I/O
/// on data sets that fit (figure 8) sent almost nothing to the virtual disk.
pub const GUEST_CACHE_SERVES: f64 = 0.9;

/// Headroom over the guest's own memory (everything but its page cache)
/// when sizing it: room for the kernel's reserves and for a burst.
pub const NON_CACHE_HEADROOM: f64 = 1.25;

/// The smallest guest the advisor recommends: the paper's small VM.
pub const MIN_GUEST_MEMORY: u64 = 128 * MIB;

/// Guest memory is recommended in steps of this size (the balloon moves in
/// 4 KiB pages, but a round size is easier to read and to act on).
pub const MEMORY_GRANULE: u64 = 64 * MIB;

/// Swap goes off only if the guest's own memory, swapped-out pages
/// included, stays under this share of the recommended memory; above it,
/// turning swap off risks the guest's OOM killer.
pub const SWAP_OFF_MAX_COMMITTED: f64 = 0.8;

/// How the guest does file I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuestIo {
    /// Through the guest's page cache.
    Buffered,
    /// `O_DIRECT`: around the guest's page cache.
    Direct,
}

/// Whether the guest has swap on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuestSwap {
    On,
    Off,
}

/// The disk's host cache mode, in the words of `--disk cache=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskCache {
    /// Through the host page cache.
    Writeback,
    /// `O_DIRECT` on the image: around the host page cache.
    None,
}

/// Where the reuse profile's trace was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfileSource {
    /// A trace no guest cache filtered: the application's own accesses, or
    /// the virtual disk while the guest used direct I/O.
    Unfiltered,
    /// The virtual disk behind the guest's page cache: only the guest's
    /// misses, whose distances are short by about the guest cache's size.
    BehindGuestCache,
}

/// What the advisor knows of the VM and its host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmFacts {
    pub guest_memory_bytes: u64,
    /// The guest's memory that is not page cache (`MemTotal - MemAvailable`).
    pub guest_non_cache_bytes: u64,
    /// The guest's page cache now (`Cached`, or the balloon's `disk_caches`).
    pub guest_cache_bytes: u64,
    pub guest_swap_total_bytes: u64,
    pub guest_swap_used_bytes: u64,
    /// The largest guest the host can give this VM.
    pub max_guest_memory_bytes: u64,
    /// The host page cache this VM's image can expect: the host's memory
    /// for caching over the VMs that share it.
    pub host_cache_share_bytes: u64,
    pub guest_io: GuestIo,
    pub disk_cache: DiskCache,
}

/// Where the working set falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Regime {
    /// Few re-reads: no cache pays.
    Streaming,
    /// A guest cache the host can give holds it.
    FitsGuestCache,
    /// Only the host's cache (with what a smaller guest frees) holds it.
    FitsHostCache,
    /// Neither does: the device's speed decides.
    ExceedsBothCaches,
}

/// One recommendation: what to have, what there is, and why.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Recommendation<T> {
    pub recommended: T,
    pub current: T,
    pub explanation: String,
}

/// The advisor's answer.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Advice {
    pub working_set_bytes: u64,
    pub regime: Regime,
    pub guest_memory_bytes: Recommendation<u64>,
    pub guest_io: Recommendation<GuestIo>,
    pub guest_swap: Recommendation<GuestSwap>,
    pub disk_cache: Recommendation<DiskCache>,
}

/// Advises from a window's report, the reuse profile of its accesses and
/// the VM's facts.
pub fn advise(
    report: &WindowReport,
    profile: &ReuseProfile,
    source: ProfileSource,
    facts: &VmFacts,
) -> Advice {
    let reuse_ratio = profile.max_hit_ratio();
    let profiled_set = profile.working_set_of_reuses_bytes(WORKING_SET_REUSE_FRACTION);
    let working_set = match source {
        ProfileSource::Unfiltered => profiled_set,
        // The guest's misses re-read at distance d were, before its cache,
        // at about d plus what its cache held; with no re-reads behind the
        // cache, the cache held the working set. When the guest's cache
        // served nearly every read (the application layer says so), what
        // it holds is itself the bound: the re-reads behind it are the
        // few it lost, not a working set beyond it.
        ProfileSource::BehindGuestCache => {
            let behind = profiled_set + facts.guest_cache_bytes;
            match report.guest_cache.hit_ratio {
                Some(hit) if hit >= GUEST_CACHE_SERVES => behind.min(facts.guest_cache_bytes),
                _ => behind,
            }
        }
    };
    let small_guest = small_guest_memory(facts);
    let sized_guest = guest_memory_for(working_set, facts);
    let largest_guest_cache = guest_cache_capacity(facts.max_guest_memory_bytes, facts);
    // A smaller guest gives its memory back to the host, whose cache grows.
    let freed = facts.guest_memory_bytes.saturating_sub(small_guest);
    let host_cache = facts.host_cache_share_bytes + freed;

    let regime = if reuse_ratio < MIN_REUSE_RATIO {
        Regime::Streaming
    } else if working_set <= largest_guest_cache {
        Regime::FitsGuestCache
    } else if working_set <= host_cache {
        Regime::FitsHostCache
    } else {
        Regime::ExceedsBothCaches
    };

    let ws = mib(working_set);
    let profile_note = match source {
        ProfileSource::Unfiltered => String::new(),
        ProfileSource::BehindGuestCache => format!(
            " ({} MiB re-read behind the guest's {} MiB cache)",
            mib(profiled_set),
            mib(facts.guest_cache_bytes)
        ),
    };
    let guest_ratio = percent(report.guest_cache.hit_ratio);
    let amplification = report
        .guest_cache
        .read_amplification
        .map_or("unknown".to_string(), |a| format!("{a:.2}"));

    let (memory, memory_why, io, io_why) = match regime {
        Regime::Streaming => (
            small_guest,
            format!(
                "only {:.0} % of accesses are re-reads (under {:.0} %): no cache size pays, so \
                 the guest keeps just its own {} MiB plus headroom",
                reuse_ratio * 100.0,
                MIN_REUSE_RATIO * 100.0,
                mib(facts.guest_non_cache_bytes)
            ),
            GuestIo::Direct,
            "data read once gains nothing from the guest's cache, which only copies it".to_string(),
        ),
        Regime::FitsGuestCache => (
            sized_guest,
            format!(
                "the working set is {ws} MiB{profile_note}; a guest cache holds about {:.0} % \
                 of the memory beyond the guest's own {} MiB, so {} MiB holds it (the host \
                 can give up to {} MiB)",
                GUEST_CACHE_FRACTION * 100.0,
                mib(facts.guest_non_cache_bytes),
                mib(sized_guest),
                mib(facts.max_guest_memory_bytes)
            ),
            GuestIo::Buffered,
            format!(
                "the guest's cache can hold the {ws} MiB working set, and a re-read it serves \
                 never leaves the guest (guest hit ratio now {guest_ratio})"
            ),
        ),
        Regime::FitsHostCache | Regime::ExceedsBothCaches => (
            small_guest,
            format!(
                "the working set is {ws} MiB{profile_note}, more than the {} MiB cache of the \
                 largest guest the host can give ({} MiB); memory beyond the guest's own {} MiB \
                 serves the host cache every VM shares instead ({} MiB with this guest's {} MiB \
                 freed)",
                mib(largest_guest_cache),
                mib(facts.max_guest_memory_bytes),
                mib(facts.guest_non_cache_bytes),
                mib(host_cache),
                mib(freed)
            ),
            GuestIo::Direct,
            format!(
                "a guest cache smaller than the working set only splits the I/O into more, \
                 smaller requests (the guest read {amplification}x the bytes asked, hit ratio \
                 {guest_ratio}); direct I/O sends the application's requests whole"
            ),
        ),
    };

    let disk_cache = disk_cache_for(regime, report, working_set, host_cache);
    let guest_swap = swap_for(memory, facts);
    Advice {
        working_set_bytes: working_set,
        regime,
        guest_memory_bytes: Recommendation {
            recommended: memory,
            current: facts.guest_memory_bytes,
            explanation: memory_why,
        },
        guest_io: Recommendation {
            recommended: io,
            current: facts.guest_io,
            explanation: io_why,
        },
        guest_swap: Recommendation {
            current: if facts.guest_swap_total_bytes > 0 {
                GuestSwap::On
            } else {
                GuestSwap::Off
            },
            ..guest_swap
        },
        disk_cache: Recommendation {
            current: facts.disk_cache,
            ..disk_cache
        },
    }
}

fn disk_cache_for(
    regime: Regime,
    report: &WindowReport,
    working_set: u64,
    host_cache: u64,
) -> Recommendation<DiskCache> {
    let host_ratio = percent(report.host_cache.hit_ratio);
    let (recommended, explanation) =
        match regime {
            Regime::FitsGuestCache => (
                DiskCache::None,
                format!(
                    "the guest's cache serves the re-reads, so the host's copy of them is held \
                 twice ({}); cache=none gives that memory to the other VMs' host cache",
                    report.double_cached.map_or(
                        "not estimated this window".to_string(),
                        |d| format!("about {} MiB this window", mib(d.bytes))
                    )
                ),
            ),
            Regime::FitsHostCache => (
                DiskCache::Writeback,
                format!(
                "the host cache ({} MiB for this VM) holds the {} MiB working set the guest no \
                 longer caches (host hit ratio now {host_ratio})",
                mib(host_cache),
                mib(working_set)
            ),
            ),
            Regime::ExceedsBothCaches => (
                DiskCache::Writeback,
                format!(
                    "no cache holds the {} MiB working set, but the host's merges the guest's \
                 requests into larger device requests and absorbs writes (host hit ratio now \
                 {host_ratio})",
                    mib(working_set)
                ),
            ),
            Regime::Streaming => (
                DiskCache::None,
                "data read once gains nothing from the host's cache either, and would evict the \
             other VMs' data from it"
                    .to_string(),
            ),
        };
    Recommendation {
        recommended,
        current: DiskCache::Writeback,
        explanation,
    }
}

fn swap_for(recommended_memory: u64, facts: &VmFacts) -> Recommendation<GuestSwap> {
    let committed = facts.guest_non_cache_bytes + facts.guest_swap_used_bytes;
    let limit = (recommended_memory as f64 * SWAP_OFF_MAX_COMMITTED) as u64;
    let (recommended, explanation) = if committed <= limit {
        (
            GuestSwap::Off,
            format!(
                "the guest's own {} MiB (with {} MiB swapped out) fits in {:.0} % of {} MiB, \
                 and the paper's guests did better without swap in most cases",
                mib(facts.guest_non_cache_bytes),
                mib(facts.guest_swap_used_bytes),
                SWAP_OFF_MAX_COMMITTED * 100.0,
                mib(recommended_memory)
            ),
        )
    } else {
        (
            GuestSwap::On,
            format!(
                "the guest's own {} MiB (with {} MiB swapped out) would not fit in {:.0} % of \
                 {} MiB: without swap, it would run out of memory",
                mib(facts.guest_non_cache_bytes),
                mib(facts.guest_swap_used_bytes),
                SWAP_OFF_MAX_COMMITTED * 100.0,
                mib(recommended_memory)
            ),
        )
    };
    Recommendation {
        recommended,
        current: GuestSwap::Off,
        explanation,
    }
}

/// The page cache a guest of `memory` bytes keeps for re-reads.
fn guest_cache_capacity(memory: u64, facts: &VmFacts) -> u64 {
    let beyond_own = memory.saturating_sub(facts.guest_non_cache_bytes);
    (beyond_own as f64 * GUEST_CACHE_FRACTION) as u64
}

/// The guest that needs no cache: its own memory with headroom.
fn small_guest_memory(facts: &VmFacts) -> u64 {
    let own = (facts.guest_non_cache_bytes as f64 * NON_CACHE_HEADROOM) as u64;
    round_up(own)
        .max(MIN_GUEST_MEMORY)
        .min(facts.max_guest_memory_bytes.max(MIN_GUEST_MEMORY))
}

/// The guest whose cache holds `working_set`.
fn guest_memory_for(working_set: u64, facts: &VmFacts) -> u64 {
    let own = (facts.guest_non_cache_bytes as f64 * NON_CACHE_HEADROOM) as u64;
    let cache = (working_set as f64 / GUEST_CACHE_FRACTION) as u64;
    round_up(own + cache)
        .max(MIN_GUEST_MEMORY)
        .min(facts.max_guest_memory_bytes.max(MIN_GUEST_MEMORY))
}

fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(MEMORY_GRANULE) * MEMORY_GRANULE
}

fn mib(bytes: u64) -> u64 {
    (bytes + MIB / 2) / MIB
}

fn percent(ratio: Option<f64>) -> String {
    ratio.map_or("unknown".to_string(), |r| format!("{:.0} %", r * 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::{self, CacheFacts, Window};

    /// The paper's FFSB files are 64 KB; a block of the profile is one.
    const BLOCK: u64 = 64 * 1024;

    /// FFSB's access pattern in miniature: uniform random over the data
    /// set, four passes' worth of accesses (deterministic xorshift).
    fn ffsb_profile(data_set: u64) -> ReuseProfile {
        let blocks = data_set / BLOCK;
        let mut state = 0x2545_f491_4f6c_dd1d_u64 ^ data_set;
        let trace = (0..4 * blocks).map(move |_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % blocks
        });
        ReuseProfile::from_trace(trace, BLOCK)
    }

    fn empty_report() -> WindowReport {
        let window = Window {
            start_ns: 0,
            end_ns: 1,
        };
        layers::report(window, &[], &CacheFacts::default(), 4096)
    }

    /// The paper's host (8 GB, 6 VMs) scaled as it ran: each VM starts at
    /// 128 MB, may grow to 1 GB, and with six small guests the host's cache
    /// share is about (8 GB - 6 x 128 MB - 1 GB for the host) / 6.
    fn paper_vm(guest_memory: u64) -> VmFacts {
        VmFacts {
            guest_memory_bytes: guest_memory,
            guest_non_cache_bytes: 64 * MIB,
            guest_cache_bytes: 32 * MIB,
            guest_swap_total_bytes: 1024 * MIB,
            guest_swap_used_bytes: 0,
            max_guest_memory_bytes: 1024 * MIB,
            host_cache_share_bytes: (8192 - 6 * 128 - 1024) * MIB / 6,
            guest_io: GuestIo::Buffered,
            disk_cache: DiskCache::Writeback,
        }
    }

    fn advise_for(data_set_mib: u64, facts: &VmFacts) -> Advice {
        let profile = ffsb_profile(data_set_mib * MIB);
        advise(&empty_report(), &profile, ProfileSource::Unfiltered, facts)
    }

    #[test]
    fn table_5_small_data_sets_get_a_bigger_buffered_guest() {
        // Table 5: up to 512 MB the 1 GB guest, buffered, is best (at
        // 512 MB narrowly: 162 ops/s against 158 for 128 MB, direct). A
        // uniform random data set of D has a working set of about 0.8 D.
        for data_set in [64, 96, 128, 192, 256, 384, 512] {
            let facts = paper_vm(128 * MIB);
            let advice = advise_for(data_set, &facts);
            assert_eq!(advice.regime, Regime::FitsGuestCache, "{data_set} MB");
            assert!(
                advice.guest_memory_bytes.recommended > 128 * MIB,
                "{data_set} MB: {advice:?}"
            );
            assert!(advice.guest_memory_bytes.recommended <= 1024 * MIB);
            assert_eq!(advice.guest_io.recommended, GuestIo::Buffered);
            assert_eq!(advice.guest_swap.recommended, GuestSwap::Off);
        }
    }

    #[test]
    fn table_5_large_data_sets_get_a_smaller_direct_guest() {
        // Table 5: from 768 MB on, the 1 GB buffered guest loses to a
        // 128 MB one (direct at 768 MB: 96 vs 86 ops/s).
        for data_set in [768, 1024, 1536, 2048] {
            let facts = paper_vm(1024 * MIB);
            let advice = advise_for(data_set, &facts);
            assert!(
                matches!(
                    advice.regime,
                    Regime::FitsHostCache | Regime::ExceedsBothCaches
                ),
                "{data_set} MB: {advice:?}"
            );
            assert_eq!(advice.guest_memory_bytes.recommended, 128 * MIB);
            assert_eq!(advice.guest_memory_bytes.current, 1024 * MIB);
            assert_eq!(advice.guest_io.recommended, GuestIo::Direct);
            assert_eq!(advice.disk_cache.recommended, DiskCache::Writeback);
            assert_eq!(advice.guest_swap.recommended, GuestSwap::Off);
        }
    }

    #[test]
    fn the_regime_follows_the_host_cache() {
        // 1536 MB fits this VM's share of the host cache with the 1 GB
        // guest shrunk (about 1 GB + 896 MB); 4 GB fits nothing.
        let facts = paper_vm(1024 * MIB);
        assert_eq!(advise_for(1536, &facts).regime, Regime::FitsHostCache);
        let advice = advise_for(4096, &facts);
        assert_eq!(advice.regime, Regime::ExceedsBothCaches);
        assert_eq!(advice.guest_io.recommended, GuestIo::Direct);
    }

    #[test]
    fn explanations_cite_the_numbers() {
        let facts = paper_vm(128 * MIB);
        let advice = advise_for(64, &facts);
        let ws = mib(advice.working_set_bytes);
        assert!(ws > 50 && ws <= 64, "working set {ws} MiB");
        let why = &advice.guest_memory_bytes.explanation;
        assert!(why.contains(&format!("{ws} MiB")), "{why}");
        assert!(why.contains("1024 MiB"), "{why}");
        assert!(advice.guest_io.explanation.contains(&format!("{ws} MiB")));
        // The same input gives the same advice.
        assert_eq!(advice, advise_for(64, &facts));
    }

    #[test]
    fn swap_stays_on_when_the_guest_needs_it() {
        let mut facts = paper_vm(1024 * MIB);
        facts.guest_non_cache_bytes = 96 * MIB;
        facts.guest_swap_used_bytes = 200 * MIB;
        // Shrunk to 128 MiB, 296 MiB of its own would not fit.
        let advice = advise_for(2048, &facts);
        assert_eq!(advice.guest_memory_bytes.recommended, 128 * MIB);
        assert_eq!(advice.guest_swap.recommended, GuestSwap::On);
        assert_eq!(advice.guest_swap.current, GuestSwap::On);
        assert!(advice
            .guest_swap
            .explanation
            .contains("200 MiB swapped out"));
        // A guest without swap is told so.
        facts.guest_swap_total_bytes = 0;
        facts.guest_swap_used_bytes = 0;
        let advice = advise_for(2048, &facts);
        assert_eq!(advice.guest_swap.current, GuestSwap::Off);
        assert_eq!(advice.guest_swap.recommended, GuestSwap::Off);
    }

    #[test]
    fn a_stream_gets_no_cache_anywhere() {
        // Every block once: no re-reads.
        let profile = ReuseProfile::from_trace(0..10_000, BLOCK);
        let facts = paper_vm(1024 * MIB);
        let advice = advise(&empty_report(), &profile, ProfileSource::Unfiltered, &facts);
        assert_eq!(advice.regime, Regime::Streaming);
        assert_eq!(advice.guest_memory_bytes.recommended, 128 * MIB);
        assert_eq!(advice.guest_io.recommended, GuestIo::Direct);
        assert_eq!(advice.disk_cache.recommended, DiskCache::None);
    }

    #[test]
    fn a_profile_behind_the_guest_cache_counts_that_cache() {
        // The virtual disk shows re-reads of a 96 MiB set behind a guest
        // holding 420 MiB: the whole is about 500 MiB, beyond the 480 MiB
        // a 1 GB guest caches.
        let mut facts = paper_vm(1024 * MIB);
        facts.guest_cache_bytes = 420 * MIB;
        let profile = ffsb_profile(96 * MIB);
        let unfiltered = advise(&empty_report(), &profile, ProfileSource::Unfiltered, &facts);
        assert_eq!(unfiltered.regime, Regime::FitsGuestCache);
        let behind = advise(
            &empty_report(),
            &profile,
            ProfileSource::BehindGuestCache,
            &facts,
        );
        assert_eq!(
            behind.working_set_bytes,
            unfiltered.working_set_bytes + 420 * MIB
        );
        assert_eq!(behind.regime, Regime::FitsHostCache);
        assert!(behind
            .guest_memory_bytes
            .explanation
            .contains("420 MiB cache"));
    }

    #[test]
    fn a_guest_cache_that_serves_the_reads_bounds_the_working_set() {
        // The bench's try that found it: a 256 MiB guest caching a 64 MiB
        // data set (Cached 113 MiB), the few misses re-read at 40 MiB; the
        // sum said 154 MiB, beyond the largest guest's cache, and shrank a
        // guest that fit. Here: 80 MiB cached, re-reads at about 36 MiB
        // behind it. With the guest serving 95 % of the reads the cache's
        // own size is the bound.
        let mut facts = paper_vm(256 * MIB);
        facts.max_guest_memory_bytes = 256 * MIB;
        facts.guest_non_cache_bytes = 48 * MIB;
        facts.guest_cache_bytes = 80 * MIB;
        let profile = ffsb_profile(40 * MIB);
        let mut report = empty_report();
        report.guest_cache.hit_ratio = Some(0.95);
        let served = advise(&report, &profile, ProfileSource::BehindGuestCache, &facts);
        assert_eq!(served.working_set_bytes, 80 * MIB);
        assert_eq!(served.regime, Regime::FitsGuestCache);
        assert_eq!(served.guest_io.recommended, GuestIo::Buffered);
        // Below the threshold (or unknown) the sum stands.
        report.guest_cache.hit_ratio = Some(0.5);
        let missed = advise(&report, &profile, ProfileSource::BehindGuestCache, &facts);
        assert!(missed.working_set_bytes > 104 * MIB, "{missed:?}");
        assert_ne!(missed.regime, Regime::FitsGuestCache);
    }

    #[test]
    fn a_guest_that_fits_drops_the_host_copy() {
        let facts = paper_vm(128 * MIB);
        let advice = advise_for(128, &facts);
        assert_eq!(advice.disk_cache.recommended, DiskCache::None);
        assert_eq!(advice.disk_cache.current, DiskCache::Writeback);
        assert!(advice.disk_cache.explanation.contains("not estimated"));
    }

    #[test]
    fn the_advice_serializes() {
        let advice = advise_for(64, &paper_vm(128 * MIB));
        let json = serde_json::to_value(&advice).unwrap();
        assert_eq!(json["regime"], "fits_guest_cache");
        assert_eq!(json["guest_io"]["recommended"], "buffered");
        assert_eq!(json["disk_cache"]["current"], "writeback");
    }
}
