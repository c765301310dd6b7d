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

/// A buffered guest whose cache served at least this share of the reads
/// keeps its cache where the window measured no read costs to weigh (see
/// [`advise`]): direct I/O would at least double the reads that leave the
/// guest, and each costs a request's round trip even where the host cache
/// holds it. The measurement of the guest's cache beats the model of it
/// ([`GUEST_CACHE_FRACTION`]). In the rig, 512 MiB guests that the model
/// shrank to small direct ones lost at hit ratios of 0.61 (185 -> 26
/// ops/s, 512 MiB of data, 2026-11-26) and 0.84 (77 -> 30 ops/s, 384 MiB,
/// 2026-11-28); at 1024 MiB of data, where the guest's cache can hold a
/// third at most, the small direct guests tied (1.00x).
pub const GUEST_CACHE_PAYS: f64 = 0.5;

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

/// Reads that start where the previous one ended, at or above this share,
/// make a stream: with few re-reads besides, the window saw data read once.
/// Below it, few re-reads say only that the window was short for the data
/// the accesses spread over (see [`WorkingSetMethod`]).
pub const SEQUENTIAL_STREAM: f64 = 0.5;

/// The fewest reads of each kind (host hit, host miss) whose mean time is
/// taken as what such a read costs.
pub const MIN_COST_SAMPLES: u64 = 20;

/// What the window shows beyond its requests: its length, its shape and
/// what the reads cost where they were served.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WindowFacts {
    pub seconds: f64,
    /// The share of virtual-disk reads that began where the previous read
    /// ended; `None` if the window had no reads to say.
    pub sequential_read_ratio: Option<f64>,
    pub read_costs: ReadCosts,
}

/// What a read the guest's cache missed costs, measured at the virtual
/// disk: from the queue's kick to the guest's interrupt, in the VMM and
/// the host (the guest's own exit and interrupt costs are not in it).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReadCosts {
    /// Reads the host page cache held whole, and their mean time (ns).
    pub host_hits: u64,
    pub host_hit_ns: Option<f64>,
    /// Reads the host page cache held none of: the device served them.
    pub host_misses: u64,
    pub host_miss_ns: Option<f64>,
}

impl ReadCosts {
    /// Both means, where each rests on enough reads.
    fn measured(&self) -> Option<(f64, f64)> {
        if self.host_hits < MIN_COST_SAMPLES || self.host_misses < MIN_COST_SAMPLES {
            return None;
        }
        Some((self.host_hit_ns?, self.host_miss_ns?))
    }
}

/// How the working set was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkingSetMethod {
    /// From the re-reads' distances (the reuse profile).
    ReuseDistances,
    /// The window was too short to see the re-reads behind the guest's
    /// cache (it touched less than that cache holds); for accesses spread
    /// uniformly, a cache of C that hits h of the reads means data of C / h.
    GuestHitRatio,
    /// Few re-reads of random accesses: n accesses with k repeats spread
    /// over about n^2 / 2k blocks (the birthday estimate; with none, at
    /// least n^2 / 2).
    RepeatCount,
}

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
    /// The guest's memory that is not page cache, in the terms of
    /// `guest_memory_bytes` (booted memory): the memory the guest's kernel
    /// kept at boot, which is not in `MemTotal`, and `MemTotal -
    /// MemAvailable`; that is, `guest_memory_bytes - MemAvailable`. Taken
    /// while the workload runs, it has the workload's own memory in it.
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

/// The two configurations the advisor weighs, by the predicted mean time
/// of a read (ns): a buffered guest sized for the working set, and the
/// smallest guest with direct I/O.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Predicted {
    pub buffered_guest_bytes: u64,
    pub buffered_read_ns: f64,
    pub direct_guest_bytes: u64,
    pub direct_read_ns: f64,
    /// Where the direct guest reads faster but the buffered guest's cache
    /// is warm now: how long the faster reads take to repay reading again
    /// from the device what the balloon and direct I/O would drop
    /// ([`switch_payback_seconds`]); `None` where nothing would be dropped
    /// or the buffered guest reads no slower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_pays_back_seconds: Option<f64>,
}

/// The advisor's answer.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Advice {
    pub working_set_bytes: u64,
    pub working_set_method: WorkingSetMethod,
    /// Where the window was too short to measure the working set: how long
    /// a window would (its footprint must outgrow the distances to see).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_at_least_seconds: Option<f64>,
    /// The predicted time of a read in the two configurations weighed,
    /// where the window measured what reads cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<Predicted>,
    pub regime: Regime,
    pub guest_memory_bytes: Recommendation<u64>,
    pub guest_io: Recommendation<GuestIo>,
    pub guest_swap: Recommendation<GuestSwap>,
    pub disk_cache: Recommendation<DiskCache>,
}

/// Advises from a window's report, the reuse profile of its accesses, the
/// VM's facts and what else the window showed.
pub fn advise(
    report: &WindowReport,
    profile: &ReuseProfile,
    source: ProfileSource,
    facts: &VmFacts,
    window: &WindowFacts,
) -> Advice {
    let reuse_ratio = profile.max_hit_ratio();
    let footprint = profile.distinct_blocks() * profile.block_bytes;
    let sequential = window.sequential_read_ratio;
    let estimate = working_set(report, profile, source, facts, window);
    let working_set = estimate.bytes;
    let small_guest = small_guest_memory(facts);
    let sized_guest = guest_memory_for(working_set, facts);
    let largest_guest_cache = guest_cache_capacity(facts.max_guest_memory_bytes, facts);
    // A smaller guest gives its memory back to the host, whose cache grows.
    let freed = facts.guest_memory_bytes.saturating_sub(small_guest);
    let host_cache = facts.host_cache_share_bytes + freed;

    // Few re-reads make a stream only where the reads run on from each
    // other (a `dd`); random reads with few re-reads are a window too
    // short for their data, and the estimate above covers them. A window
    // without reads at the virtual disk is no stream either: the guest's
    // cache served them all (the bench's 32 MiB guest at 4000 ops/s, whose
    // disk saw only write-back, was shrunk on that and lost 98 %).
    let streams = reuse_ratio < MIN_REUSE_RATIO
        && estimate.method == WorkingSetMethod::ReuseDistances
        && sequential.is_some_and(|s| s >= SEQUENTIAL_STREAM);
    let regime = if streams {
        Regime::Streaming
    } else if working_set <= largest_guest_cache {
        Regime::FitsGuestCache
    } else if working_set <= host_cache {
        Regime::FitsHostCache
    } else {
        Regime::ExceedsBothCaches
    };

    let ws = mib(working_set);
    let profile_note = match (estimate.method, source) {
        (WorkingSetMethod::GuestHitRatio, _) => format!(
            " (estimated: the window touched {} MiB, less than the guest's {} MiB cache, so the \
             re-reads behind it could not show; the guest's cache hit {} of the reads, so \
             uniform accesses spread over about {ws} MiB)",
            mib(footprint),
            mib(facts.guest_cache_bytes),
            percent(report.guest_cache.hit_ratio)
        ),
        (WorkingSetMethod::RepeatCount, ProfileSource::Unfiltered) => format!(
            " (estimated: {} accesses over {} MiB with only {:.0} % re-reads, at random: they \
             spread over about {ws} MiB)",
            profile.accesses,
            mib(footprint),
            reuse_ratio * 100.0
        ),
        (WorkingSetMethod::RepeatCount, ProfileSource::BehindGuestCache) => format!(
            " (estimated: the guest's {} accesses it missed over {} MiB, only {:.0} % of them \
             re-reads, at random: they spread over about {} MiB beyond its {} MiB cache)",
            profile.accesses,
            mib(footprint),
            reuse_ratio * 100.0,
            mib(working_set.saturating_sub(facts.guest_cache_bytes)),
            mib(facts.guest_cache_bytes)
        ),
        (WorkingSetMethod::ReuseDistances, ProfileSource::Unfiltered) => String::new(),
        (WorkingSetMethod::ReuseDistances, ProfileSource::BehindGuestCache) => format!(
            " ({} MiB re-read behind the guest's {} MiB cache)",
            mib(profile.working_set_of_reuses_bytes(WORKING_SET_REUSE_FRACTION)),
            mib(facts.guest_cache_bytes)
        ),
    };
    let longer = estimate.trace_at_least_seconds.map_or(String::new(), |s| {
        format!("; trace at least {s:.0} s to measure it rather than estimate it")
    });
    let guest_ratio = percent(report.guest_cache.hit_ratio);
    let amplification = report
        .guest_cache
        .read_amplification
        .map_or("unknown".to_string(), |a| format!("{a:.2}"));

    // Where the window measured what a read costs at the host cache and at
    // the device, the two candidates are weighed by the time of a read;
    // else the regime decides as table 5 did.
    //
    // A buffered guest gets all the memory the host can give it, as table
    // 5's best buffered guests had (the 1 GB one), not the least whose
    // cache the model says holds the working set: the model leaves out
    // the room for written pages (the guest's dirty limits scale with its
    // memory) and the guest's other caches. In the rig (one guest, three
    // rounds each way, bench/results/evidence/
    // iocache-advisor-rounds-2026-11-28) a 32 MiB data set ran at 0.27x
    // in a guest shrunk from 512 MiB to the 256 MiB that "held" its 76
    // MiB working set, and a guest grown to such a size made 3,000-4,600
    // ops/s where the whole 512 MiB made 12,600-13,200.
    let buffered_guest = facts.max_guest_memory_bytes.max(MIN_GUEST_MEMORY);
    let predicted = window.read_costs.measured().map(|(hit_ns, miss_ns)| {
        let cost = |guest: u64, guest_cache: u64| {
            // What the guest takes from (or gives to) the host's cache.
            let host =
                (facts.host_cache_share_bytes + facts.guest_memory_bytes).saturating_sub(guest);
            read_time(guest_cache, host, working_set, hit_ns, miss_ns)
        };
        let buffered_read_ns = cost(buffered_guest, buffered_cache(buffered_guest, facts));
        let direct_read_ns = cost(small_guest, 0);
        let saving_ns = buffered_read_ns - direct_read_ns;
        Predicted {
            buffered_guest_bytes: buffered_guest,
            buffered_read_ns,
            direct_guest_bytes: small_guest,
            direct_read_ns,
            switch_pays_back_seconds: switch_payback_seconds(
                report,
                facts,
                window,
                saving_ns,
                miss_ns - hit_ns,
                profile.block_bytes,
            ),
        }
    });
    let weighed = predicted.map(|p| {
        let costs = window.read_costs;
        format!(
            "; weighed by the window's reads ({} host-cache hits at {:.2} ms, {} misses at {:.2} \
             ms): a read would take {:.2} ms with a buffered {} MiB guest, {:.2} ms with a {} \
             MiB guest doing direct I/O",
            costs.host_hits,
            costs.host_hit_ns.unwrap_or(0.0) / 1e6,
            costs.host_misses,
            costs.host_miss_ns.unwrap_or(0.0) / 1e6,
            p.buffered_read_ns / 1e6,
            mib(p.buffered_guest_bytes),
            p.direct_read_ns / 1e6,
            mib(p.direct_guest_bytes)
        )
    });
    // Behind a buffered guest, its hit ratio measures what a guest cache
    // serves here (a larger guest would serve more); it decides only where
    // no measured read costs weigh the two guests.
    let guest_serves = (source == ProfileSource::BehindGuestCache && predicted.is_none())
        .then_some(report.guest_cache.hit_ratio)
        .flatten()
        .filter(|&hit| hit >= GUEST_CACHE_PAYS);
    // A switch that takes longer to pay back than the window traced is
    // not made: the advisor counts on the workload running on at least as
    // long as it has been watched, no longer.
    let repays_late = predicted
        .and_then(|p| p.switch_pays_back_seconds)
        .filter(|&s| s > window.seconds);
    let buffered_wins = match (regime, predicted) {
        (Regime::Streaming, _) => false,
        (_, Some(p)) => p.buffered_read_ns <= p.direct_read_ns || repays_late.is_some(),
        (regime, None) => regime == Regime::FitsGuestCache || guest_serves.is_some(),
    };
    let weighed = match (weighed, repays_late) {
        (Some(weighed), Some(seconds)) => format!(
            "{weighed}; but the switch would drop the {} MiB the guest's cache holds and the \
             host's does not, to be read again from the device, and the faster reads would \
             repay that only after {} s, longer than the {:.0} s traced",
            mib(dropped_cache_bytes(report, facts)),
            seconds.round(),
            window.seconds
        ),
        (weighed, _) => weighed.unwrap_or_default(),
    };
    let holds = match (regime, guest_serves) {
        (Regime::FitsGuestCache, _) => format!("{} MiB would hold it", mib(sized_guest)),
        (_, Some(hit)) => format!(
            "no guest the host can give holds it by that model, but this guest's cache served \
             {:.0} % of the reads (at least {:.0} %): direct I/O would send every one of them \
             to the host, each a request's round trip even where the host cache holds it",
            hit * 100.0,
            GUEST_CACHE_PAYS * 100.0
        ),
        _ => "no guest the host can give holds it".to_string(),
    };

    let (memory, memory_why, io, io_why) = match (regime, buffered_wins) {
        (Regime::Streaming, _) => (
            small_guest,
            format!(
                "only {:.0} % of accesses are re-reads (under {:.0} %) and {} of the reads run \
                 on from the one before: no cache size pays, so the guest keeps just its own \
                 {} MiB plus headroom",
                reuse_ratio * 100.0,
                MIN_REUSE_RATIO * 100.0,
                percent(sequential),
                mib(facts.guest_non_cache_bytes)
            ),
            GuestIo::Direct,
            "data read once gains nothing from the guest's cache, which only copies it".to_string(),
        ),
        (_, true) => (
            buffered_guest,
            format!(
                "the working set is {ws} MiB{profile_note}; a guest cache holds about {:.0} % \
                 of the memory beyond the guest's own {} MiB, so {}; the guest gets all {} MiB \
                 the host can give, since a guest sized to its working set has too little \
                 room left for written pages and its other caches{weighed}{longer}",
                GUEST_CACHE_FRACTION * 100.0,
                mib(facts.guest_non_cache_bytes),
                holds,
                mib(buffered_guest)
            ),
            GuestIo::Buffered,
            format!(
                "the guest's cache serves the re-reads of the {ws} MiB working set it holds, \
                 and a re-read it serves never leaves the guest (guest hit ratio now \
                 {guest_ratio})"
            ),
        ),
        (_, false) => (
            small_guest,
            format!(
                "the working set is {ws} MiB{profile_note}, more than the {} MiB cache of the \
                 largest guest the host can give ({} MiB); memory beyond the guest's own {} MiB \
                 serves the host cache every VM shares instead ({} MiB with this guest's {} MiB \
                 freed), so the guest keeps its own with {:.0} % headroom, in {} MiB steps, at \
                 least {} MiB: {} MiB{weighed}{longer}",
                mib(largest_guest_cache),
                mib(facts.max_guest_memory_bytes),
                mib(facts.guest_non_cache_bytes),
                mib(host_cache),
                mib(freed),
                (NON_CACHE_HEADROOM - 1.0) * 100.0,
                mib(MEMORY_GRANULE),
                mib(MIN_GUEST_MEMORY),
                mib(small_guest)
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
        working_set_method: estimate.method,
        trace_at_least_seconds: estimate.trace_at_least_seconds,
        predicted,
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

/// The working set and how it was found.
struct Estimate {
    bytes: u64,
    method: WorkingSetMethod,
    trace_at_least_seconds: Option<f64>,
}

fn working_set(
    report: &WindowReport,
    profile: &ReuseProfile,
    source: ProfileSource,
    facts: &VmFacts,
    window: &WindowFacts,
) -> Estimate {
    let profiled_set = profile.working_set_of_reuses_bytes(WORKING_SET_REUSE_FRACTION);
    let footprint = profile.distinct_blocks() * profile.block_bytes;
    let random = window
        .sequential_read_ratio
        .is_some_and(|s| s < SEQUENTIAL_STREAM);
    let guest_hit = report.guest_cache.hit_ratio;
    let reuse_ratio = profile.max_hit_ratio();
    // How long a window needs for its footprint to reach `reach` bytes,
    // at this window's pace.
    let needed = |reach: u64| {
        (window.seconds > 0.0 && footprint > 0)
            .then(|| window.seconds * reach as f64 / footprint as f64)
    };
    match source {
        // The guest's misses re-read at distance d were, before its cache,
        // at about d plus what its cache held. A window whose footprint is
        // under that cache could not see them at all: then the guest's hit
        // ratio on its cache says how far the accesses spread.
        ProfileSource::BehindGuestCache => {
            let cache = facts.guest_cache_bytes;
            match guest_hit {
                // When the guest's cache served nearly every read, what it
                // holds is itself the bound: the re-reads behind it are the
                // few it lost, not a working set beyond it.
                Some(hit) if hit >= GUEST_CACHE_SERVES => Estimate {
                    bytes: (profiled_set + cache).min(cache),
                    method: WorkingSetMethod::ReuseDistances,
                    trace_at_least_seconds: None,
                },
                Some(hit) if footprint <= cache && hit > 0.0 && random => {
                    let bytes = (cache as f64 / hit) as u64;
                    Estimate {
                        bytes,
                        method: WorkingSetMethod::GuestHitRatio,
                        trace_at_least_seconds: needed(bytes),
                    }
                }
                // Without the guest's hit ratio (no application layer yet:
                // a shell's /proc/PID/io counts a child only once reaped),
                // random misses that never repeat say the data spreads
                // beyond what the guest caches by at least their birthday
                // spread; the cache alone would be the smallest answer
                // possible (the bench's 512 MiB guests over 1024 MiB of
                // data: 171 misses, none repeated, "356 MiB", 2026-11-28).
                _ if random && profile.accesses > 0 && reuse_ratio < MIN_REUSE_RATIO => {
                    let spread = random_spread_bytes(profile).max(footprint);
                    Estimate {
                        bytes: cache + spread,
                        method: WorkingSetMethod::RepeatCount,
                        trace_at_least_seconds: needed(spread),
                    }
                }
                _ => Estimate {
                    bytes: profiled_set + cache,
                    method: WorkingSetMethod::ReuseDistances,
                    trace_at_least_seconds: None,
                },
            }
        }
        ProfileSource::Unfiltered => {
            if reuse_ratio >= MIN_REUSE_RATIO || !random || profile.accesses == 0 {
                return Estimate {
                    bytes: profiled_set,
                    method: WorkingSetMethod::ReuseDistances,
                    trace_at_least_seconds: None,
                };
            }
            let bytes = random_spread_bytes(profile);
            Estimate {
                bytes: bytes.max(footprint),
                method: WorkingSetMethod::RepeatCount,
                trace_at_least_seconds: needed(bytes),
            }
        }
    }
}

/// How far random accesses spread, from how often they repeat: n uniform
/// draws from D blocks repeat about n^2 / 2D times, so k repeats say
/// D = n^2 / 2k (with none, n^2 / 2 is a lower bound).
fn random_spread_bytes(profile: &ReuseProfile) -> u64 {
    let reuses = profile.accesses - profile.cold_misses;
    let n = profile.accesses as f64;
    let blocks = n * n / (2.0 * reuses.max(1) as f64);
    (blocks * profile.block_bytes as f64) as u64
}

/// The mean time of a read with a guest cache and a host cache of the
/// given sizes over `working_set` bytes accessed uniformly: the guest's
/// misses go to the host; the host's cache holds the most recent reads,
/// the guest's among them, so it adds hits only beyond the guest's size.
fn read_time(
    guest_cache: u64,
    host_cache: u64,
    working_set: u64,
    hit_ns: f64,
    miss_ns: f64,
) -> f64 {
    let hits = |cache: u64| (cache as f64 / working_set.max(1) as f64).min(1.0);
    let leave_guest = 1.0 - hits(guest_cache);
    let reach_device = 1.0 - hits(guest_cache.max(host_cache));
    leave_guest * hit_ns + reach_device * (miss_ns - hit_ns).max(0.0)
}

/// How long a buffered guest's switch to the smaller direct one takes to
/// pay back, in seconds: the balloon and direct I/O drop what its cache
/// holds that the host's does not, and each such block, read again, costs
/// a device read (`extra_ns` over a host-cache hit); the direct guest saves
/// `saving_ns` on each of the application's reads, at the window's rate.
/// `None` where the guest is not buffered now, caches nothing the host
/// lacks, or the direct guest would not read faster.
fn switch_payback_seconds(
    report: &WindowReport,
    facts: &VmFacts,
    window: &WindowFacts,
    saving_ns: f64,
    extra_ns: f64,
    block_bytes: u64,
) -> Option<f64> {
    if facts.guest_io != GuestIo::Buffered || saving_ns <= 0.0 || window.seconds <= 0.0 {
        return None;
    }
    let dropped = dropped_cache_bytes(report, facts);
    if dropped == 0 {
        return None;
    }
    let request_bytes = report
        .virtual_disk
        .average_read_bytes
        .unwrap_or(block_bytes as f64)
        .max(1.0);
    let refill_ns = dropped as f64 / request_bytes * extra_ns.max(0.0);
    Some(refill_ns / (saving_ns * application_reads_per_second(report, window)?))
}

/// The guest cache's bytes that the host cache does not hold as well (the
/// report's estimate of the bytes cached twice; all of them without one).
fn dropped_cache_bytes(report: &WindowReport, facts: &VmFacts) -> u64 {
    let twice = report.double_cached.map_or(0, |d| d.bytes);
    facts.guest_cache_bytes.saturating_sub(twice)
}

/// The application's reads per second in the window: counted in the guest
/// where the agent named the application; else the virtual disk's reads
/// scaled up by the guest's misses (each read it missed went to the disk);
/// else the virtual disk's reads, the fewest the application made.
fn application_reads_per_second(report: &WindowReport, window: &WindowFacts) -> Option<f64> {
    let disk_reads = report
        .virtual_disk
        .read_requests
        .max(window.read_costs.host_hits + window.read_costs.host_misses);
    let reads = if report.application.read_requests > 0 {
        report.application.read_requests as f64
    } else {
        let missed = report
            .guest_cache
            .hit_ratio
            .map_or(1.0, |hit| (1.0 - hit).max(f64::EPSILON));
        disk_reads as f64 / missed
    };
    (reads > 0.0).then_some(reads / window.seconds)
}

/// The page cache a buffered guest of `memory` keeps: as modelled, or as
/// observed where the guest is that size already.
fn buffered_cache(memory: u64, facts: &VmFacts) -> u64 {
    let modelled = guest_cache_capacity(memory, facts);
    if memory == facts.guest_memory_bytes && facts.guest_io == GuestIo::Buffered {
        modelled.max(facts.guest_cache_bytes.min(memory))
    } else {
        modelled
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

/// A ratio as the explanations print it: whole percent, or "unknown".
pub fn percent(ratio: Option<f64>) -> String {
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
        advise(
            &empty_report(),
            &profile,
            ProfileSource::Unfiltered,
            facts,
            &WindowFacts::default(),
        )
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
            assert_eq!(
                advice.guest_memory_bytes.recommended,
                1024 * MIB,
                "{data_set} MB: {advice:?}"
            );
            assert_eq!(advice.guest_io.recommended, GuestIo::Buffered);
            assert_eq!(advice.guest_swap.recommended, GuestSwap::Off);
        }
    }

    /// The bench's loss: a 512 MiB guest whose 76 MiB working set fits its
    /// cache was shrunk to the 256 MiB the model said held it, and ran at
    /// 0.27x. A working set that fits keeps the guest's memory.
    #[test]
    fn a_guest_whose_working_set_fits_is_not_shrunk() {
        for data_set in [32, 64, 128] {
            let facts = paper_vm(1024 * MIB);
            let advice = advise_for(data_set, &facts);
            assert_eq!(advice.regime, Regime::FitsGuestCache, "{data_set} MB");
            assert_eq!(advice.guest_io.recommended, GuestIo::Buffered);
            assert_eq!(
                advice.guest_memory_bytes.recommended, facts.guest_memory_bytes,
                "{data_set} MB: {advice:?}"
            );
            let why = &advice.guest_memory_bytes.explanation;
            assert!(why.contains("would hold it"), "{why}");
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
    fn a_direct_guest_keeps_room_for_what_the_guest_and_its_workload_need() {
        // The rig's 512 MiB Debian guest running fio over 16384 files: the
        // kernel's boot share (54 MiB, not in MemTotal), its services and
        // fio's files and memory make about 120 MiB of its own. The paper's
        // 128 MiB would leave it less than its own plus program pages (in
        // the rig such a guest made 0.34x the ops of the 512 MiB one); with
        // headroom it gets 192 MiB, and what it frees still goes to the
        // host cache.
        let mut facts = paper_vm(512 * MIB);
        facts.max_guest_memory_bytes = 512 * MIB;
        facts.guest_non_cache_bytes = 120 * MIB;
        let advice = advise_for(1024, &facts);
        assert_eq!(advice.guest_io.recommended, GuestIo::Direct, "{advice:?}");
        assert_eq!(advice.guest_memory_bytes.recommended, 192 * MIB);
        let why = &advice.guest_memory_bytes.explanation;
        assert!(
            why.contains("own 120 MiB") && why.contains("320 MiB freed"),
            "{why}"
        );
        assert!(
            why.contains("25 % headroom") && why.contains(": 192 MiB"),
            "{why}"
        );
        // Its own memory never goes below the floor, nor above the VM.
        facts.guest_non_cache_bytes = 20 * MIB;
        let advice = advise_for(1024, &facts);
        assert_eq!(advice.guest_memory_bytes.recommended, MIN_GUEST_MEMORY);
        facts.guest_non_cache_bytes = 500 * MIB;
        let advice = advise_for(1024, &facts);
        assert_eq!(advice.guest_memory_bytes.recommended, 512 * MIB);
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
        // Every block once, in order: no re-reads.
        let profile = ReuseProfile::from_trace(0..10_000, BLOCK);
        let facts = paper_vm(1024 * MIB);
        let sequential = WindowFacts {
            seconds: 10.0,
            sequential_read_ratio: Some(1.0),
            read_costs: ReadCosts::default(),
        };
        let advice = advise(
            &empty_report(),
            &profile,
            ProfileSource::Unfiltered,
            &facts,
            &sequential,
        );
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
        let unfiltered = advise(
            &empty_report(),
            &profile,
            ProfileSource::Unfiltered,
            &facts,
            &WindowFacts::default(),
        );
        assert_eq!(unfiltered.regime, Regime::FitsGuestCache);
        let behind = advise(
            &empty_report(),
            &profile,
            ProfileSource::BehindGuestCache,
            &facts,
            &WindowFacts::default(),
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
        let served = advise(
            &report,
            &profile,
            ProfileSource::BehindGuestCache,
            &facts,
            &WindowFacts::default(),
        );
        assert_eq!(served.working_set_bytes, 80 * MIB);
        assert_eq!(served.regime, Regime::FitsGuestCache);
        assert_eq!(served.guest_io.recommended, GuestIo::Buffered);
        // Below the threshold (or unknown) the sum stands.
        report.guest_cache.hit_ratio = Some(0.5);
        let missed = advise(
            &report,
            &profile,
            ProfileSource::BehindGuestCache,
            &facts,
            &WindowFacts::default(),
        );
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

    /// Uniform random 4 KiB accesses over `data_set`, `count` of them.
    fn random_profile(data_set: u64, count: u64) -> ReuseProfile {
        let blocks = data_set / 4096;
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let trace = (0..count).map(move |_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % blocks
        });
        ReuseProfile::from_trace(trace, 4096)
    }

    fn random_window(seconds: f64, costs: ReadCosts) -> WindowFacts {
        WindowFacts {
            seconds,
            sequential_read_ratio: Some(0.05),
            read_costs: costs,
        }
    }

    /// One of the bench's 512 MiB guests in the rig, buffered: what it
    /// cached, its own memory and its share of the host's cache.
    fn rig_vm(cached_mib: u64, own_mib: u64, host_share_mib: u64) -> VmFacts {
        let mut facts = paper_vm(512 * MIB);
        facts.max_guest_memory_bytes = 512 * MIB;
        facts.guest_cache_bytes = cached_mib * MIB;
        facts.guest_non_cache_bytes = own_mib * MIB;
        facts.host_cache_share_bytes = host_share_mib * MIB;
        facts
    }

    /// `misses` 16 KiB reads spread over `data_set` bytes, none repeated:
    /// what a buffered guest's random misses look like at its disk.
    fn spread_misses(misses: u64, data_set: u64) -> ReuseProfile {
        let blocks = data_set / 4096;
        ReuseProfile::from_trace(
            (0..misses).flat_map(move |i| {
                let first = i * 1543 % blocks;
                first..first + 4
            }),
            4096,
        )
    }

    #[test]
    fn a_short_window_behind_a_big_guest_cache_is_not_a_stream() {
        // The bench's 512 MiB try: a 512 MiB guest caching 383 MiB of a
        // 512 MiB data set, hit ratio 0.61; 32 s of FFSB touched 54 MiB,
        // none of it twice behind the cache. Called a stream, the guest
        // was shrunk and lost 86 % of its throughput.
        let mut facts = paper_vm(512 * MIB);
        facts.max_guest_memory_bytes = 512 * MIB;
        facts.guest_cache_bytes = 383 * MIB;
        let profile = ReuseProfile::from_trace(0..13_731, 4096);
        let mut report = empty_report();
        report.guest_cache.hit_ratio = Some(0.61);
        let advice = advise(
            &report,
            &profile,
            ProfileSource::BehindGuestCache,
            &facts,
            &random_window(32.0, ReadCosts::default()),
        );
        assert_ne!(advice.regime, Regime::Streaming, "{advice:?}");
        assert_eq!(advice.working_set_method, WorkingSetMethod::GuestHitRatio);
        assert_eq!(mib(advice.working_set_bytes), 628);
        // Its cache served 61 % of the reads: it stays buffered and whole.
        assert_eq!(advice.guest_io.recommended, GuestIo::Buffered);
        assert_eq!(advice.guest_memory_bytes.recommended, 512 * MIB);
        // 54 MiB in 32 s: 628 MiB takes about 372 s.
        let at_least = advice.trace_at_least_seconds.unwrap();
        assert!((360.0..390.0).contains(&at_least), "{at_least}");
        assert!(advice
            .guest_memory_bytes
            .explanation
            .contains("trace at least"));
        // The same window of sequential reads is a stream.
        let stream = advise(
            &report,
            &ReuseProfile::from_trace(0..13_731, 4096),
            ProfileSource::Unfiltered,
            &facts,
            &WindowFacts {
                sequential_read_ratio: Some(0.98),
                ..random_window(32.0, ReadCosts::default())
            },
        );
        assert_eq!(stream.regime, Regime::Streaming);
    }

    #[test]
    fn a_window_of_only_write_back_is_not_a_stream() {
        // A 512 MiB guest serving a 32 MiB data set from its cache: its
        // disk sees only the write-back of each block once (no re-reads,
        // no reads at all).
        let mut facts = paper_vm(512 * MIB);
        facts.max_guest_memory_bytes = 512 * MIB;
        facts.guest_cache_bytes = 34 * MIB;
        let profile = ReuseProfile::from_trace(0..8_000, 4096);
        let mut report = empty_report();
        report.guest_cache.hit_ratio = Some(1.0);
        let advice = advise(
            &report,
            &profile,
            ProfileSource::BehindGuestCache,
            &facts,
            &WindowFacts {
                seconds: 30.0,
                ..WindowFacts::default()
            },
        );
        assert_eq!(advice.regime, Regime::FitsGuestCache, "{advice:?}");
        assert_eq!(advice.guest_io.recommended, GuestIo::Buffered);
        assert!(advice.guest_memory_bytes.recommended >= 128 * MIB);
    }

    #[test]
    fn few_repeats_of_random_reads_estimate_their_spread() {
        // 20 000 uniform reads over 1 GiB (262 144 blocks) repeat about
        // 760 times: about 1 GiB.
        let profile = random_profile(1024 * MIB, 20_000);
        assert!(profile.max_hit_ratio() < MIN_REUSE_RATIO);
        let mut facts = paper_vm(128 * MIB);
        facts.guest_io = GuestIo::Direct;
        let advice = advise(
            &empty_report(),
            &profile,
            ProfileSource::Unfiltered,
            &facts,
            &random_window(10.0, ReadCosts::default()),
        );
        assert_eq!(advice.working_set_method, WorkingSetMethod::RepeatCount);
        let ws = mib(advice.working_set_bytes);
        assert!((800..1300).contains(&ws), "{ws} MiB");
        assert_ne!(advice.regime, Regime::Streaming);
        assert_eq!(advice.guest_io.recommended, GuestIo::Direct);
    }

    #[test]
    fn random_misses_behind_a_guest_cache_spread_beyond_it() {
        // The bench's 512 MiB guest over 1024 MiB of data (2026-11-28):
        // 356 MiB cached, its hit ratio unknown, 171 random 16 KiB misses
        // in 63 s, none repeated.
        let facts = rig_vm(356, 124, 269);
        let profile = spread_misses(171, 1024 * MIB);
        assert_eq!(profile.max_hit_ratio(), 0.0);
        let advice = advise(
            &empty_report(),
            &profile,
            ProfileSource::BehindGuestCache,
            &facts,
            &random_window(63.0, ReadCosts::default()),
        );
        assert_eq!(advice.working_set_method, WorkingSetMethod::RepeatCount);
        // 684 block reads, none repeated: at least 684^2 / 2 blocks (914
        // MiB) beyond the 356 MiB cached.
        assert_eq!(mib(advice.working_set_bytes), 356 + 914);
        assert_eq!(advice.regime, Regime::ExceedsBothCaches, "{advice:?}");
        assert!(advice.trace_at_least_seconds.is_some());
        assert!(
            advice
                .guest_memory_bytes
                .explanation
                .contains("about 914 MiB beyond its 356 MiB cache"),
            "{advice:?}"
        );
        // With the guest's hit ratio known, it decides, as before.
        let mut report = empty_report();
        report.guest_cache.hit_ratio = Some(0.35);
        let known = advise(
            &report,
            &profile,
            ProfileSource::BehindGuestCache,
            &facts,
            &random_window(63.0, ReadCosts::default()),
        );
        assert_eq!(known.working_set_method, WorkingSetMethod::GuestHitRatio);
        assert_eq!(mib(known.working_set_bytes), 1017);
    }

    #[test]
    fn a_guest_cache_that_serves_most_reads_is_kept() {
        // The bench's 512 MiB guests over 384 MiB of data (2026-11-28),
        // fio named: 380 MiB cached, hit ratio 0.84, 110 random 16 KiB
        // misses in 50 s, all host-cache misses (no read costs to weigh).
        // The model's largest guest cache (197 MiB) holds no 452 MiB
        // working set; shrunk to 192 MiB with direct I/O they went from
        // 77 to 30 ops/s (two rounds, 0.41x and 0.36x).
        let facts = rig_vm(380, 118, 270);
        let profile = spread_misses(110, 384 * MIB);
        let with_hit = |hit: f64| {
            let mut report = empty_report();
            report.guest_cache.hit_ratio = Some(hit);
            advise(
                &report,
                &profile,
                ProfileSource::BehindGuestCache,
                &facts,
                &random_window(50.0, ReadCosts::default()),
            )
        };
        let served = with_hit(0.84);
        assert_eq!(served.working_set_method, WorkingSetMethod::GuestHitRatio);
        assert_eq!(mib(served.working_set_bytes), 452);
        assert_eq!(served.regime, Regime::FitsHostCache, "{served:?}");
        assert_eq!(served.guest_io.recommended, GuestIo::Buffered, "{served:?}");
        assert_eq!(served.guest_memory_bytes.recommended, 512 * MIB);
        let why = &served.guest_memory_bytes.explanation;
        assert!(
            why.contains("this guest's cache served 84 % of the reads"),
            "{why}"
        );
        // A cache that serves a third (1024 MiB of data) does not pay for
        // the memory: the small direct guest, as before.
        let spread = with_hit(0.35);
        assert_eq!(spread.guest_io.recommended, GuestIo::Direct, "{spread:?}");
        assert_eq!(spread.guest_memory_bytes.recommended, 192 * MIB);
        // Measured read costs weigh the two guests instead, and this rule
        // is silent (see a_warm_cache_is_kept_where_dropping_it_repays_late).
        let costs = ReadCosts {
            host_hits: 100,
            host_hit_ns: Some(0.1e6),
            host_misses: 100,
            host_miss_ns: Some(50e6),
        };
        let mut report = empty_report();
        report.guest_cache.hit_ratio = Some(0.84);
        let weighed = advise(
            &report,
            &profile,
            ProfileSource::BehindGuestCache,
            &facts,
            &random_window(50.0, costs),
        );
        assert!(weighed.predicted.is_some());
        assert!(!weighed
            .guest_memory_bytes
            .explanation
            .contains("this guest's cache served"));
    }

    #[test]
    fn a_warm_cache_is_kept_where_dropping_it_repays_late() {
        // The bench's third 512 MiB guest over 384 MiB of data
        // (2026-11-28): 379 MiB cached, hit ratio 0.82, and its 54 s
        // window measured 48 host-cache hits at 1.43 ms and 42 misses at
        // 48.79 ms. By read time alone the 192 MiB direct guest won (1.43
        // against 8.62 ms); shrunk to 192 MiB (run buffered by the bench),
        // it went from 67 to 39 ops/s, re-reading from the device what its
        // cache had held.
        let facts = rig_vm(379, 119, 270);
        let profile = spread_misses(100, 384 * MIB);
        let costs = ReadCosts {
            host_hits: 48,
            host_hit_ns: Some(1.43e6),
            host_misses: 42,
            host_miss_ns: Some(48.79e6),
        };
        let mut report = empty_report();
        report.guest_cache.hit_ratio = Some(0.82);
        report.virtual_disk.read_requests = 100;
        report.virtual_disk.average_read_bytes = Some(16384.0);
        let with_window = |seconds: f64| {
            // The same rate of reads, over a window of `seconds`.
            let mut report = report.clone();
            report.virtual_disk.read_requests = (100.0 * seconds / 54.0) as u64;
            advise(
                &report,
                &profile,
                ProfileSource::BehindGuestCache,
                &facts,
                &random_window(seconds, costs),
            )
        };
        let kept = with_window(54.0);
        let p = kept.predicted.unwrap();
        assert!(p.direct_read_ns < p.buffered_read_ns, "{p:?}");
        // 24,256 reads of 16 KiB at 47 ms more than a hit (19 minutes),
        // repaid at 7 ms on each of 10 reads a second: over four hours.
        let payback = p.switch_pays_back_seconds.unwrap();
        assert!(payback > 4.0 * 3600.0, "{p:?}");
        assert_eq!(kept.guest_io.recommended, GuestIo::Buffered, "{kept:?}");
        assert_eq!(kept.guest_memory_bytes.recommended, 512 * MIB);
        let why = &kept.guest_memory_bytes.explanation;
        assert!(why.contains("drop the 379 MiB"), "{why}");
        // Traced longer than it takes to repay, the switch is made.
        let switched = with_window(payback * 1.1);
        assert_eq!(switched.guest_io.recommended, GuestIo::Direct);
        assert_eq!(switched.guest_memory_bytes.recommended, 192 * MIB);
        // What the host holds as well is not dropped: with all of the
        // guest's cache there too, the switch costs nothing to make.
        let mut twice = report.clone();
        twice.double_cached = Some(layers::DoubleCached {
            bytes: 379 * MIB,
            guest_blocks: 379 * MIB / 4096,
            host_view: layers::HostViewKind::Measured,
        });
        let free = advise(
            &twice,
            &profile,
            ProfileSource::BehindGuestCache,
            &facts,
            &random_window(54.0, costs),
        );
        assert_eq!(free.predicted.unwrap().switch_pays_back_seconds, None);
        assert_eq!(free.guest_io.recommended, GuestIo::Direct);
        // A direct guest has no cache to drop.
        let mut direct = facts;
        direct.guest_io = GuestIo::Direct;
        let grown = advise(
            &report,
            &profile,
            ProfileSource::BehindGuestCache,
            &direct,
            &random_window(54.0, costs),
        );
        assert_eq!(grown.predicted.unwrap().switch_pays_back_seconds, None);
    }

    #[test]
    fn what_reads_cost_decides_between_the_guests() {
        // 768 MiB of data (a working set of about 614 MiB) with six 1 GB
        // guests, each caching 480 MiB, on the paper's 8 GB host (a share
        // of about 170 MiB): a 128 MiB guest doing direct I/O has the host
        // cache hold it all; the 1 GB guest holds 78 % of it itself.
        // The workload reads 45 times a second (FFSB's 50/50 mix at table
        // 5's 90-odd ops/s), traced for 15 minutes.
        let mut facts = paper_vm(1024 * MIB);
        facts.host_cache_share_bytes = (8192 - 6 * 1024 - 1024) * MIB / 6;
        facts.guest_cache_bytes = 480 * MIB;
        let profile = ffsb_profile(768 * MIB);
        let with_window = |hit_ms: f64, miss_ms: f64, seconds: f64| {
            let costs = ReadCosts {
                host_hits: 100,
                host_hit_ns: Some(hit_ms * 1e6),
                host_misses: 100,
                host_miss_ns: Some(miss_ms * 1e6),
            };
            let mut report = empty_report();
            report.application.read_requests = (45.0 * seconds) as u64;
            advise(
                &report,
                &profile,
                ProfileSource::Unfiltered,
                &facts,
                &random_window(seconds, costs),
            )
        };
        let with = |hit_ms: f64, miss_ms: f64| with_window(hit_ms, miss_ms, 900.0);
        // The paper's host: a host-cache hit is cheap beside a disk seek.
        let paper = with(0.1, 8.0);
        assert_eq!(paper.guest_io.recommended, GuestIo::Direct, "{paper:?}");
        assert_eq!(paper.guest_memory_bytes.recommended, 128 * MIB);
        let p = paper.predicted.unwrap();
        assert!(p.direct_read_ns < p.buffered_read_ns, "{p:?}");
        assert!(paper.guest_memory_bytes.explanation.contains("weighed by"));
        // Dropping the 480 MiB cache costs 7,680 device reads of 64 KiB
        // (61 s); saving 1.6 ms on 45 reads a second repays it in 14
        // minutes. Traced for a minute, the guest keeps its cache.
        let payback = p.switch_pays_back_seconds.unwrap();
        assert!((700.0..900.0).contains(&payback), "{p:?}");
        let minute = with_window(0.1, 8.0, 60.0);
        assert_eq!(minute.guest_io.recommended, GuestIo::Buffered);
        assert_eq!(minute.guest_memory_bytes.recommended, 1024 * MIB);
        let why = &minute.guest_memory_bytes.explanation;
        assert!(
            why.contains("drop the 480 MiB") && why.contains("longer than the 60 s traced"),
            "{why}"
        );
        // A device as fast as the host's cache: every read that leaves the
        // guest costs the same, so the guest's own cache wins.
        let fast = with(2.0, 2.0);
        assert_eq!(fast.guest_io.recommended, GuestIo::Buffered, "{fast:?}");
        assert_eq!(fast.guest_memory_bytes.recommended, 1024 * MIB);
        // Too few reads measured: the regime decides, as table 5 did.
        let mut few = random_window(60.0, ReadCosts::default());
        few.read_costs.host_hits = 3;
        let advice = advise(
            &empty_report(),
            &profile,
            ProfileSource::Unfiltered,
            &facts,
            &few,
        );
        assert!(advice.predicted.is_none());
        assert_eq!(advice.guest_io.recommended, GuestIo::Direct);
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
