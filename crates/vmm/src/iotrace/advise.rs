//! `ctl advise [--apply]` and `PUT /api/v1/vm.advise`: the advisor
//! ([`iotrace::advisor`]) run on a traced disk's window with what the VMM
//! knows of the guest and the host, and its memory recommendation applied
//! through the balloon.
//!
//! The advisor itself is pure (crates/iotrace); this module gathers its
//! facts — the guest's memory from the balloon's statistics (or the guest
//! agent, when the window has one), the host's memory shared over the
//! hakoniwa VMs running on it — and acts on one recommendation: the guest's
//! memory, the only one the host can change under a running guest. The I/O
//! mode and swap are the guest's (its programs' open flags, its swapon),
//! the cache mode needs the image re-opened: those are reported, not done.

use std::path::Path;
use std::time::Duration;

use devices::virtio::balloon::{
    balloon_for_guest_bytes, guest_bytes_with_balloon, tags, BalloonControl,
};
use devices::virtio::block::counters::RequestKind;
use devices::virtio::block::{CacheMode, TraceRecord};
use iotrace::advisor::{
    self, Advice, DiskCache, GuestIo, ProfileSource, ReadCosts, VmFacts, WindowFacts,
};
use iotrace::layers;
use iotrace::reuse::ReuseProfile;
use serde::{Deserialize, Serialize};

use super::{GuestFacts, IoTraceError, VmIoTrace};

const MIB: u64 = 1 << 20;

/// How long to wait for the guest's fresh balloon statistics.
const STATS_TIMEOUT: Duration = Duration::from_secs(3);

/// The block the reuse profile counts in: the host's page, as the report.
const PROFILE_BLOCK_BYTES: u64 = 4096;

/// Why an advice was refused. One line.
#[derive(Debug, thiserror::Error)]
pub enum AdviseError {
    #[error(transparent)]
    Trace(#[from] IoTraceError),
    #[error("cannot apply: the VM has no balloon (start it with --balloon)")]
    NoBalloonToApply,
    #[error("the guest's memory is unknown: {0}")]
    GuestUnknown(String),
    #[error("disk '{0}' has no requests in its window yet: run the workload, then advise")]
    EmptyWindow(String),
    #[error("cannot apply: {0}")]
    Balloon(String),
}

impl AdviseError {
    /// Whether the VM's state (not the request) is what refused it: HTTP
    /// 409 rather than 400.
    pub fn is_conflict(&self) -> bool {
        !matches!(
            self,
            AdviseError::Trace(IoTraceError::NoSuchDisk { .. })
                | AdviseError::Trace(IoTraceError::WhichDisk(_))
        )
    }
}

/// The guest's memory as the VMM learned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestMemory {
    /// What the guest's kernel manages (`MemTotal`; the balloon's pages
    /// are not in it).
    pub total_bytes: u64,
    /// `MemAvailable`: free memory plus what it can reclaim.
    pub available_bytes: u64,
    /// The page cache (`Cached`, the balloon's `disk_caches`).
    pub cached_bytes: u64,
    /// Swap (`SwapTotal`, `SwapTotal - SwapFree`), where the source knows
    /// it: the balloon's statistics do not.
    pub swap_total_bytes: Option<u64>,
    pub swap_used_bytes: Option<u64>,
    /// Whether the traced programs do direct I/O (the agent sees their
    /// open files' flags), where known.
    pub direct_io: Option<bool>,
    pub source: GuestMemorySource,
}

/// Where [`GuestMemory`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuestMemorySource {
    BalloonStatistics,
    GuestAgent,
}

impl GuestMemory {
    /// From the guest agent's `/proc/meminfo` and the traced programs'
    /// open files.
    pub fn from_agent(facts: &GuestFacts) -> GuestMemory {
        GuestMemory {
            total_bytes: facts.mem_total,
            available_bytes: facts.mem_available,
            cached_bytes: facts.cached,
            swap_total_bytes: Some(facts.swap_total),
            swap_used_bytes: Some(facts.swap_total.saturating_sub(facts.swap_free)),
            direct_io: facts.direct_io,
            source: GuestMemorySource::GuestAgent,
        }
    }

    /// From the balloon's statistics queue: total, available and the page
    /// cache are there (Linux's virtio_balloon sends all three); swap's
    /// size is not.
    pub fn from_balloon(values: &[(u16, u64)]) -> Result<GuestMemory, String> {
        let get = |tag: u16, name: &str| {
            values
                .iter()
                .find(|(t, _)| *t == tag)
                .map(|(_, v)| *v)
                .ok_or_else(|| format!("the balloon's statistics have no {name}"))
        };
        Ok(GuestMemory {
            total_bytes: get(tags::MEMTOT, "total_memory")?,
            available_bytes: get(tags::AVAIL, "available_memory")?,
            cached_bytes: get(tags::CACHES, "disk_caches")?,
            swap_total_bytes: None,
            swap_used_bytes: None,
            direct_io: None,
            source: GuestMemorySource::BalloonStatistics,
        })
    }
}

/// What was done with `--apply`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The balloon's new target: the VM's memory minus the recommended,
    /// less the boot overhead of the difference
    /// ([`balloon_for_guest_bytes`]).
    pub balloon_target_mib: u64,
    pub previous_target_mib: u64,
    /// What the guest will have once the balloon got there.
    pub guest_memory_mib: u64,
    /// What is left to the user, one line each.
    pub not_applied: Vec<String>,
}

/// `vm.advise`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdviceReport {
    pub disk: String,
    /// The traced window the advice is from.
    pub window_seconds: f64,
    pub requests: u64,
    /// Distinct 4 KiB blocks and the share of accesses that were re-reads.
    pub distinct_blocks: u64,
    pub reuse_ratio: f64,
    pub profile_source: ProfileSource,
    /// The guest cache's hit ratio in the window (application reads
    /// against virtual-disk reads), which sizes a buffered guest's
    /// working set; none without an application layer.
    #[serde(default)]
    pub guest_hit_ratio: Option<f64>,
    /// Whose I/O the application layer is, or why it is absent.
    #[serde(default)]
    pub application: String,
    /// The window's shape and what its reads cost.
    pub window: WindowFacts,
    pub guest: GuestMemory,
    pub facts: VmFacts,
    /// How the host's share was reckoned.
    pub host_cache_share: String,
    pub advice: Advice,
    /// The four recommendations' explanations, in order (memory, I/O,
    /// swap, cache mode), as one line each.
    pub explanations: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<Applied>,
}

/// The VM as the advisor needs it.
pub struct AdviseTarget<'a> {
    pub trace: &'a VmIoTrace,
    pub balloon: Option<&'a BalloonControl>,
    /// The VM's memory as booted: what the balloon can give back at most.
    pub memory_bytes: u64,
    /// Where `/proc` is (tests use a fake one).
    pub proc_root: &'a Path,
}

/// Advises from `disk`'s window so far; with `apply`, sets the balloon so
/// the guest has the recommended memory.
pub fn advise(
    target: &AdviseTarget<'_>,
    disk: Option<&str>,
    apply: bool,
) -> Result<AdviceReport, AdviseError> {
    if apply && target.balloon.is_none() {
        return Err(AdviseError::NoBalloonToApply);
    }
    let (report, records, cache) = target.trace.advice_window(disk)?;
    if report.layers.virtual_disk.requests() == 0 {
        return Err(AdviseError::EmptyWindow(report.disk));
    }
    // The agent's answer at this report when the window has one (it
    // knows swap and the programs' O_DIRECT), else the balloon's.
    let guest = match &report.guest {
        Some(facts) => GuestMemory::from_agent(facts),
        None => guest_memory(target.balloon)?,
    };
    let balloon_mib = target.balloon.map_or(0, |b| b.actual_mib());
    let (host_share, host_note) = host_cache_share(target.proc_root);
    let mut facts = vm_facts(&guest, target.memory_bytes, balloon_mib, host_share, cache);
    // What the guest caches of this disk, where the agent measured it, is
    // the cache the disk's re-reads see; `Cached` counts every file.
    if let Some(measured) = &report.double_cached_measured {
        facts.guest_cache_bytes = measured.guest_bytes;
    }
    let source = match facts.guest_io {
        GuestIo::Direct => ProfileSource::Unfiltered,
        GuestIo::Buffered => ProfileSource::BehindGuestCache,
    };
    let window = layers::Window {
        start_ns: 0,
        end_ns: u64::MAX,
    };
    let io_records: Vec<layers::IoRecord> = records.iter().filter_map(|r| r.io_record()).collect();
    // The working set is that of the data read again: writes keep their
    // blocks cached but are no re-reads ([`layers::virtual_disk_accesses`]).
    let reads = layers::virtual_disk_accesses(window, &io_records, PROFILE_BLOCK_BYTES);
    let profile = ReuseProfile::from_accesses(reads, PROFILE_BLOCK_BYTES);
    let shape = window_facts(report.seconds, &records);
    let advice = advisor::advise(&report.layers, &profile, source, &facts, &shape);
    let explanations = vec![
        advice.guest_memory_bytes.explanation.clone(),
        advice.guest_io.explanation.clone(),
        advice.guest_swap.explanation.clone(),
        advice.disk_cache.explanation.clone(),
    ];
    let applied = match (apply, target.balloon) {
        (true, Some(balloon)) => Some(apply_memory(balloon, &advice, target.memory_bytes, &facts)?),
        _ => None,
    };
    Ok(AdviceReport {
        disk: report.disk,
        window_seconds: report.seconds,
        requests: report.layers.virtual_disk.requests(),
        distinct_blocks: profile.distinct_blocks(),
        reuse_ratio: profile.max_hit_ratio(),
        profile_source: source,
        guest_hit_ratio: report.layers.guest_cache.hit_ratio,
        application: report.application,
        window: shape,
        guest,
        facts,
        host_cache_share: host_note,
        advice,
        explanations,
        applied,
    })
}

/// The window's shape and read costs from the virtual disk's records.
/// Records are in completion order, which for one stream of reads is
/// their order (a few out of order only lower the sequential share).
pub fn window_facts(seconds: f64, records: &[TraceRecord]) -> WindowFacts {
    let mut costs = ReadCosts::default();
    let (mut hit_ns, mut miss_ns) = (0u128, 0u128);
    let (mut reads, mut sequential) = (0u64, 0u64);
    let mut next_offset = None;
    for record in records
        .iter()
        .filter(|r| r.ok && r.kind == RequestKind::Read)
    {
        let Some(offset) = record.offset else {
            continue;
        };
        reads += 1;
        if next_offset == Some(offset) {
            sequential += 1;
        }
        next_offset = Some(offset + record.bytes);
        // Kick to interrupt: what the guest waited for in the VMM and host.
        let time: u128 = record.stages_ns.iter().map(|&ns| u128::from(ns)).sum();
        match record.host_cached_bytes {
            Some(cached) if cached >= record.bytes => {
                costs.host_hits += 1;
                hit_ns += time;
            }
            Some(0) => {
                costs.host_misses += 1;
                miss_ns += time;
            }
            _ => {}
        }
    }
    let mean = |sum: u128, n: u64| (n > 0).then(|| sum as f64 / n as f64);
    costs.host_hit_ns = mean(hit_ns, costs.host_hits);
    costs.host_miss_ns = mean(miss_ns, costs.host_misses);
    WindowFacts {
        seconds,
        sequential_read_ratio: (reads > 0).then(|| sequential as f64 / reads as f64),
        read_costs: costs,
    }
}

fn guest_memory(balloon: Option<&BalloonControl>) -> Result<GuestMemory, AdviseError> {
    let balloon = balloon.ok_or_else(|| {
        AdviseError::GuestUnknown(
            "no balloon statistics (start the VM with --balloon) and no guest agent".into(),
        )
    })?;
    if !balloon.stats_enabled() {
        return Err(AdviseError::GuestUnknown(
            "the guest's balloon driver sends no statistics (--balloon stats=on, and a driver \
             that takes the stats queue)"
                .into(),
        ));
    }
    let stats = balloon
        .fresh_stats(STATS_TIMEOUT)
        .or_else(|| balloon.last_stats())
        .ok_or_else(|| {
            AdviseError::GuestUnknown("the guest sent no balloon statistics yet".into())
        })?;
    GuestMemory::from_balloon(&stats.values).map_err(AdviseError::GuestUnknown)
}

/// The advisor's facts from what the VMM knows.
pub fn vm_facts(
    guest: &GuestMemory,
    memory_bytes: u64,
    balloon_mib: u64,
    host_cache_share_bytes: u64,
    cache: CacheMode,
) -> VmFacts {
    let swap_total = guest.swap_total_bytes.unwrap_or(0);
    let guest_memory_bytes = guest_bytes_with_balloon(memory_bytes, balloon_mib * MIB);
    VmFacts {
        guest_memory_bytes,
        // In booted terms, as the memory it is weighed against: what the
        // kernel kept at boot (not in MemTotal; 48 MiB of a 128 MiB Debian
        // guest) is the guest's own as much as MemTotal - MemAvailable.
        // Counting only the latter, the advisor sized a direct guest at
        // its 128 MiB floor that had 80 MiB of MemTotal for 42 of its own
        // and fio's 42, and it made a third of the ops of the guest it
        // replaced (bench/results/evidence/iocache-large-2026-11-28).
        guest_non_cache_bytes: guest_memory_bytes.saturating_sub(guest.available_bytes),
        guest_cache_bytes: guest.cached_bytes,
        guest_swap_total_bytes: swap_total,
        guest_swap_used_bytes: guest.swap_used_bytes.unwrap_or(0).min(swap_total),
        max_guest_memory_bytes: memory_bytes,
        host_cache_share_bytes,
        guest_io: if guest.direct_io == Some(true) {
            GuestIo::Direct
        } else {
            GuestIo::Buffered
        },
        disk_cache: match cache {
            CacheMode::None => DiskCache::None,
            CacheMode::Writeback | CacheMode::Unsafe => DiskCache::Writeback,
        },
    }
}

/// The host page cache this VM can count on: the host's `MemAvailable`
/// over the hakoniwa VMs running on it (itself included), and how that
/// was reckoned.
fn host_cache_share(proc_root: &Path) -> (u64, String) {
    let available = std::fs::read_to_string(proc_root.join("meminfo"))
        .ok()
        .and_then(|text| meminfo_kib(&text, "MemAvailable"))
        .map_or(0, |kib| kib * 1024);
    let vms = running_vms(proc_root).max(1);
    (
        available / vms,
        format!(
            "the host's MemAvailable ({} MiB) over the {vms} hakoniwa VM(s) running on it",
            available / MIB
        ),
    )
}

/// `KEY:   N kB` of a `/proc/meminfo` text, in KiB.
pub fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Processes running `hakoniwa run` (any binary named hakoniwa).
fn running_vms(proc_root: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
                return false;
            };
            let mut args = cmdline.split(|&b| b == 0);
            let is_hakoniwa = args
                .next()
                .and_then(|argv0| argv0.rsplit(|&b| b == b'/').next())
                .is_some_and(|name| name == b"hakoniwa");
            is_hakoniwa && args.next() == Some(b"run".as_slice())
        })
        .count() as u64
}

/// Sets the balloon for the recommended guest memory.
fn apply_memory(
    balloon: &BalloonControl,
    advice: &Advice,
    memory_bytes: u64,
    facts: &VmFacts,
) -> Result<Applied, AdviseError> {
    let recommended = advice.guest_memory_bytes.recommended.min(memory_bytes);
    // What the balloon takes is the booted guest's memory less its boot
    // overhead: memory_bytes - recommended would leave the guest less than
    // one booted at the recommended size has.
    let target_mib = balloon_for_guest_bytes(memory_bytes, recommended) / MIB;
    let previous_target_mib = balloon.target_mib();
    balloon
        .set_target_mib(target_mib)
        .map_err(|e| AdviseError::Balloon(e.to_string()))?;
    let mut not_applied = Vec::new();
    if advice.guest_io.recommended != facts.guest_io || facts.guest_io == GuestIo::Buffered {
        not_applied.push(format!(
            "guest I/O {}: the guest's programs choose it (O_DIRECT when they open files)",
            io_name(advice.guest_io.recommended)
        ));
    }
    not_applied.push(format!(
        "guest swap {}: the guest's (swapon/swapoff)",
        match advice.guest_swap.recommended {
            advisor::GuestSwap::On => "on",
            advisor::GuestSwap::Off => "off",
        }
    ));
    if advice.disk_cache.recommended != facts.disk_cache {
        not_applied.push(format!(
            "cache={}: the image is re-opened only at a restart (--disk ...,cache=)",
            cache_name(advice.disk_cache.recommended)
        ));
    }
    tracing::info!(
        "advise: balloon target {previous_target_mib} -> {target_mib} MiB (guest memory {} MiB)",
        recommended / MIB
    );
    Ok(Applied {
        balloon_target_mib: target_mib,
        previous_target_mib,
        guest_memory_mib: recommended / MIB,
        not_applied,
    })
}

pub fn io_name(io: GuestIo) -> &'static str {
    match io {
        GuestIo::Buffered => "buffered",
        GuestIo::Direct => "direct",
    }
}

pub fn cache_name(cache: DiskCache) -> &'static str {
    match cache {
        DiskCache::Writeback => "writeback",
        DiskCache::None => "none",
    }
}

/// `ctl advise`'s text.
pub fn render(report: &AdviceReport) -> String {
    use std::fmt::Write;
    let a = &report.advice;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "advice for disk {} from {:.1}s traced: {} requests, {} distinct 4 KiB blocks, {:.0} % \
         re-reads; guest hit ratio {}",
        report.disk,
        report.window_seconds,
        report.requests,
        report.distinct_blocks,
        report.reuse_ratio * 100.0,
        advisor::percent(report.guest_hit_ratio)
    );
    let _ = writeln!(
        out,
        "working set {} MiB: {:?}; guest memory from {:?}; host cache share {} MiB ({})",
        a.working_set_bytes / MIB,
        a.regime,
        report.guest.source,
        report.facts.host_cache_share_bytes / MIB,
        report.host_cache_share
    );
    let swap = |s: advisor::GuestSwap| match s {
        advisor::GuestSwap::On => "on",
        advisor::GuestSwap::Off => "off",
    };
    let rows = [
        (
            "guest memory",
            format!("{} MiB", a.guest_memory_bytes.current / MIB),
            format!("{} MiB", a.guest_memory_bytes.recommended / MIB),
        ),
        (
            "guest I/O",
            io_name(a.guest_io.current).to_string(),
            io_name(a.guest_io.recommended).to_string(),
        ),
        (
            "guest swap",
            swap(a.guest_swap.current).to_string(),
            swap(a.guest_swap.recommended).to_string(),
        ),
        (
            "disk cache",
            cache_name(a.disk_cache.current).to_string(),
            cache_name(a.disk_cache.recommended).to_string(),
        ),
    ];
    for ((what, now, advised), why) in rows.iter().zip(&report.explanations) {
        let _ = writeln!(out, "{what:<13} {now:>10} -> {advised:<10} {why}");
    }
    if let Some(applied) = &report.applied {
        let _ = writeln!(
            out,
            "applied: balloon target {} -> {} MiB (the guest gets {} MiB once it inflated)",
            applied.previous_target_mib, applied.balloon_target_mib, applied.guest_memory_mib
        );
        for line in &applied.not_applied {
            let _ = writeln!(out, "not applied: {line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(offset: u64, bytes: u64, cached: Option<u64>, total_ns: u64) -> TraceRecord {
        TraceRecord {
            time_ns: offset,
            kind: RequestKind::Read,
            ok: true,
            offset: Some(offset),
            bytes,
            queue: 0,
            stages_ns: [total_ns / 4; 4],
            host_cached_bytes: cached,
        }
    }

    #[test]
    fn window_facts_split_reads_by_where_the_host_found_them() {
        // Three sequential reads the host held, two random it did not, one
        // it held in part (counted in neither), one write (ignored).
        let mut records = vec![
            read(0, 4096, Some(4096), 400),
            read(4096, 4096, Some(4096), 800),
            read(8192, 4096, Some(4096), 1200),
            read(1 << 30, 16384, Some(0), 8000),
            read(1 << 20, 16384, Some(0), 12000),
            read(1 << 21, 8192, Some(4096), 4000),
        ];
        records.push(TraceRecord {
            kind: RequestKind::Write,
            ..read(12288, 4096, None, 100)
        });
        let facts = window_facts(2.0, &records);
        assert_eq!(facts.seconds, 2.0);
        let costs = facts.read_costs;
        assert_eq!((costs.host_hits, costs.host_misses), (3, 2));
        assert_eq!(costs.host_hit_ns, Some(800.0));
        assert_eq!(costs.host_miss_ns, Some(10000.0));
        // Of six reads, the second and third ran on from the one before.
        let sequential = facts.sequential_read_ratio.unwrap();
        assert!((sequential - 2.0 / 6.0).abs() < 1e-9, "{sequential}");
        // No reads: nothing to say.
        let empty = window_facts(1.0, &[]);
        assert_eq!(empty.sequential_read_ratio, None);
        assert_eq!(empty.read_costs.host_hit_ns, None);
    }

    #[test]
    fn guest_memory_from_balloon_statistics_needs_three_values() {
        // bench-iocache's advised guest: 512 MiB booted, 377 MiB of
        // balloon, 88 MiB of MemTotal.
        let values = [
            (tags::MEMTOT, 88 * MIB),
            (tags::AVAIL, 40 * MIB),
            (tags::CACHES, 20 * MIB),
        ];
        let guest = GuestMemory::from_balloon(&values).unwrap();
        assert_eq!(guest.total_bytes, 88 * MIB);
        assert_eq!(guest.swap_total_bytes, None);
        let facts = vm_facts(&guest, 512 * MIB, 377, 1024 * MIB, CacheMode::Unsafe);
        // 377 MiB of balloon is 383.6 MiB of booted memory: like a guest
        // booted at 128.4 MiB.
        assert_eq!(facts.guest_memory_bytes / (MIB / 10), 1284);
        // Its own memory in the same terms: all but the 40 MiB available,
        // the 40 MiB the kernel kept at boot (not in MemTotal) included.
        assert_eq!(
            facts.guest_non_cache_bytes / (MIB / 10),
            1284 - 400,
            "{facts:?}"
        );
        assert_eq!(facts.guest_cache_bytes, 20 * MIB);
        assert_eq!(facts.max_guest_memory_bytes, 512 * MIB);
        assert_eq!(facts.disk_cache, DiskCache::Writeback);
        assert_eq!(facts.guest_io, GuestIo::Buffered);
        let error = GuestMemory::from_balloon(&values[..2]).unwrap_err();
        assert_eq!(error, "the balloon's statistics have no disk_caches");
    }

    #[test]
    fn swap_used_never_exceeds_its_total() {
        let guest = GuestMemory {
            total_bytes: 100,
            available_bytes: 50,
            cached_bytes: 10,
            swap_total_bytes: Some(64 * MIB),
            swap_used_bytes: Some(128 * MIB),
            direct_io: Some(true),
            source: GuestMemorySource::GuestAgent,
        };
        let facts = vm_facts(&guest, 256 * MIB, 0, 0, CacheMode::None);
        assert_eq!(facts.guest_swap_used_bytes, 64 * MIB);
        assert_eq!(facts.guest_io, GuestIo::Direct);
        assert_eq!(facts.disk_cache, DiskCache::None);
    }

    #[test]
    fn meminfo_and_running_vms_from_a_proc_tree() {
        let dir = std::env::temp_dir().join(format!("hk-advise-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("meminfo"),
            "MemTotal:       2048000 kB\nMemAvailable:    1536000 kB\n",
        )
        .unwrap();
        for (pid, cmdline) in [
            ("10", &b"/usr/bin/hakoniwa\0run\0--kernel\0vmlinuz\0"[..]),
            ("11", b"./target/release/hakoniwa\0run\0"),
            ("12", b"hakoniwa\0ctl\0--api-socket\0s\0advise\0"),
            ("13", b"/usr/bin/qemu-system-x86_64\0run\0"),
        ] {
            std::fs::create_dir_all(dir.join(pid)).unwrap();
            std::fs::write(dir.join(pid).join("cmdline"), cmdline).unwrap();
        }
        std::fs::create_dir_all(dir.join("self")).unwrap();
        assert_eq!(running_vms(&dir), 2);
        let (share, note) = host_cache_share(&dir);
        assert_eq!(share, 1536000 * 1024 / 2);
        assert!(note.contains("2 hakoniwa VM(s)"), "{note}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
