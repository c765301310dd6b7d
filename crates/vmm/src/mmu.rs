//! The shadow-paging budget (seed 001: Moriki et al., "Virtage" SPT
//! multiplexing).
//!
//! Without two-dimensional paging (EPT/NPT off, or PVM), KVM runs the guest
//! on shadow page tables and keeps them in a cache bounded by a page budget
//! (`n_max_mmu_pages`). If the budget cannot hold the shadow tables of the
//! guest's working set of processes, every process switch tears down and
//! rebuilds shadow tables (`mmu_recycled`, `mmu_cache_miss`,
//! `mmu_shadow_zapped` grow): the paper's "one SPT" case, 0.23 of native
//! speed, against 0.90 with enough tables cached. The VMM's knob is
//! `KVM_SET_NR_MMU_PAGES`; the evidence is KVM's statistics ([`crate::stats`]).
//!
//! - [`SptBudget`]: KVM's default, a fixed number of pages, or `auto`;
//! - [`paging_mode`]: shadow or two-dimensional paging on this host;
//! - [`auto_pages`] / [`AutoSizer`]: the `auto` policy (see there);
//! - [`MmuControl`]: applies a budget to a VM and describes it for the API;
//! - [`AgentListener`]: the host end of the guest agent (vsock port
//!   [`AGENT_PORT`]) that reports the guest's `PageTables`.
//!
//! User documentation: docs/shadow-paging.md.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use api::{MmuInfo, SptPages};
use kvm_ioctls::VmFd;
use vmm_sys_util::ioctl::{ioctl, ioctl_with_val};
use vmm_sys_util::ioctl_io_nr;

use crate::config::format_size;
use crate::stats::VmStats;

const KVMIO: u32 = 0xAE;
ioctl_io_nr!(KVM_SET_NR_MMU_PAGES, KVMIO, 0x44);
ioctl_io_nr!(KVM_GET_NR_MMU_PAGES, KVMIO, 0x45);

/// KVM refuses budgets below this (KVM_MIN_ALLOC_MMU_PAGES).
pub const MIN_PAGES: u64 = 64;
/// The vsock port (guest → host, CID 2) where the guest agent reports its
/// PageTables; the host end is the Unix socket `<uds>_1024`.
pub const AGENT_PORT: u32 = 1024;
/// `auto` changes the budget at most this often.
pub const AUTO_INTERVAL: Duration = Duration::from_secs(2);
/// Shadow pages `auto` budgets per guest page-table page (see [`auto_pages`]).
pub const AUTO_FACTOR: u64 = 2;

const PAGE_SIZE: u64 = 4096;

/// The budget the user asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SptBudget {
    /// Leave KVM's own (2 % of guest pages on x86, recomputed when memory
    /// slots change).
    #[default]
    Default,
    /// Exactly this many 4 KiB pages.
    Pages(u64),
    /// Follow the guest's page-table size ([`auto_pages`]).
    Auto,
}

/// A budget the VMM cannot use, each message one line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MmuError {
    #[error("'{0}' is not a number of 4 KiB pages or \"auto\"")]
    NotPages(String),
    #[error("{0} pages is too few: KVM needs at least {MIN_PAGES}")]
    TooFew(u64),
    #[error("{pages} pages ({shadow} of shadow page tables) is more than the guest's {memory} of memory ({max} pages of 4 KiB)")]
    BeyondMemory {
        pages: u64,
        shadow: String,
        memory: String,
        max: u64,
    },
    #[error("\"auto\" needs the guest agent, which talks over vsock: add --vsock cid=N,uds=PATH")]
    AutoNeedsVsock,
    #[error("cannot listen for the guest agent on {path}: {reason}")]
    Agent { path: String, reason: String },
    #[error("KVM_SET_NR_MMU_PAGES {pages} failed: {reason}")]
    Set { pages: u64, reason: String },
}

impl SptBudget {
    /// Parses `N` or `auto` for a guest of `memory_bytes`.
    pub fn parse(text: &str, memory_bytes: u64) -> Result<SptBudget, MmuError> {
        let pages = text
            .parse::<SptPages>()
            .map_err(|_| MmuError::NotPages(text.to_string()))?;
        SptBudget::from_api(pages, memory_bytes)
    }

    /// Checks a budget given through the API.
    pub fn from_api(pages: SptPages, memory_bytes: u64) -> Result<SptBudget, MmuError> {
        match pages {
            SptPages::Auto => Ok(SptBudget::Auto),
            SptPages::Pages(n) => check_pages(n, memory_bytes).map(SptBudget::Pages),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SptBudget::Default => "default",
            SptBudget::Pages(_) => "fixed",
            SptBudget::Auto => "auto",
        }
    }
}

/// A fixed budget must be one KVM takes and no more than the guest's memory
/// in pages: shadow tables larger than the memory they map are nonsense.
pub fn check_pages(pages: u64, memory_bytes: u64) -> Result<u64, MmuError> {
    let max = memory_bytes / PAGE_SIZE;
    if pages < MIN_PAGES {
        return Err(MmuError::TooFew(pages));
    }
    if pages > max {
        return Err(MmuError::BeyondMemory {
            pages,
            shadow: human_size(pages.saturating_mul(PAGE_SIZE)),
            memory: format_size(memory_bytes),
            max,
        });
    }
    Ok(pages)
}

/// A size for messages: MiB below 10 GiB, else GiB.
fn human_size(bytes: u64) -> String {
    if bytes < 10 << 30 {
        format_size(bytes)
    } else {
        format!("{}G", bytes >> 30)
    }
}

/// How KVM translates guest addresses on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PagingMode {
    /// "shadow", "npt", "ept" or "unknown".
    pub kind: &'static str,
    /// Where that was read, e.g. "kvm_amd npt=N".
    pub source: String,
}

impl PagingMode {
    pub fn is_shadow(&self) -> bool {
        self.kind == "shadow"
    }
}

/// Reads the paging mode from sysfs: PVM always shadows; kvm_amd's `npt`
/// and kvm_intel's `ept` parameters say whether two-dimensional paging is on.
pub fn paging_mode() -> PagingMode {
    paging_mode_in(Path::new("/sys/module"))
}

/// [`paging_mode`] under another sysfs module directory (for tests).
pub fn paging_mode_in(modules: &Path) -> PagingMode {
    if modules.join("kvm_pvm").exists() {
        return PagingMode {
            kind: "shadow",
            source: "kvm_pvm".into(),
        };
    }
    for (module, param, kind) in [("kvm_amd", "npt", "npt"), ("kvm_intel", "ept", "ept")] {
        let path = modules.join(module).join("parameters").join(param);
        if let Ok(text) = std::fs::read_to_string(&path) {
            let value = text.trim();
            let on = matches!(value, "Y" | "y" | "1");
            return PagingMode {
                kind: if on { kind } else { "shadow" },
                source: format!("{module} {param}={value}"),
            };
        }
    }
    PagingMode {
        kind: "unknown",
        source: "no kvm_amd, kvm_intel or kvm_pvm module parameters".into(),
    }
}

/// The `auto` budget for a guest whose page tables take `page_tables_kib`
/// (its /proc/meminfo PageTables), capped at the guest's memory in pages.
///
/// ```text
/// pages = floor + AUTO_FACTOR × page_tables_kib / 4
/// floor = 64 + guest RAM / 2 MiB
/// ```
///
/// - One shadow page per guest page-table page is the minimum to keep every
///   process's tables shadowed at once (the paper's "multiple SPTs": shadow
///   memory sized from the guest's own page-table size). KVM keys shadow
///   pages by (guest frame, role), so a guest table seen in two roles needs
///   two; and the budget must absorb growth between two agent reports (1 s)
///   and two updates ([`AUTO_INTERVAL`]). [`AUTO_FACTOR`] = 2 covers both
///   with room to spare, and stays small: guest PageTables is typically
///   0.2–1 % of guest RAM, so the budget is 0.4–2 % of it, within the
///   paper's estimate of ≈ 3 % (320 MB for 16 processes using 10 GB).
/// - PageTables does not count what KVM needs beyond the guest's tables:
///   the guest kernel maps its direct map with 2 MiB pages, and KVM shadows
///   each 2 MiB guest mapping with one 4 KiB shadow table when the host
///   backs it with small pages; hence one page per 2 MiB of guest RAM, plus
///   KVM's minimum (64) for roots and upper levels.
pub fn auto_pages(page_tables_kib: u64, memory_bytes: u64) -> u64 {
    let floor = MIN_PAGES + memory_bytes / (2 << 20);
    let need = floor.saturating_add(AUTO_FACTOR.saturating_mul(page_tables_kib / 4));
    need.min((memory_bytes / PAGE_SIZE).max(MIN_PAGES))
}

/// The `auto` policy over time: grow to the need at once, shrink slowly.
///
/// Changes are at most one per [`AUTO_INTERVAL`]. Growing goes straight to
/// the need. Shrinking zaps shadow pages (KVM frees down to the new budget),
/// so it goes at most a quarter of the way per step, never below the need,
/// and only when the budget is more than an eighth above the need (a guest
/// whose tables shrink briefly, e.g. between two forks, keeps its cache).
#[derive(Debug)]
pub struct AutoSizer {
    current: u64,
    last_change: Option<Instant>,
}

impl AutoSizer {
    pub fn new(current: u64) -> AutoSizer {
        AutoSizer {
            current,
            last_change: None,
        }
    }

    pub fn current(&self) -> u64 {
        self.current
    }

    /// The budget to set now for `need` pages, if it should change.
    pub fn next(&mut self, need: u64, now: Instant) -> Option<u64> {
        if let Some(last) = self.last_change {
            if now.duration_since(last) < AUTO_INTERVAL {
                return None;
            }
        }
        let next = if need > self.current {
            need
        } else if self.current - need > self.current / 8 {
            need.max(self.current - self.current / 4)
        } else {
            return None;
        };
        self.current = next;
        self.last_change = Some(now);
        Some(next)
    }
}

/// Parses one agent report: `PageTables:   1234 kB` (the /proc/meminfo line).
pub fn parse_agent_line(line: &str) -> Option<u64> {
    let rest = line.trim().strip_prefix("PageTables:")?;
    let mut words = rest.split_whitespace();
    let kib = words.next()?.parse().ok()?;
    match words.next() {
        None | Some("kB") | Some("KiB") => Some(kib),
        _ => None,
    }
}

struct MmuState {
    budget: SptBudget,
    sizer: AutoSizer,
    /// The guest's PageTables (KiB) as the agent last reported it.
    guest_page_tables_kib: Option<u64>,
}

/// The shadow-page budget of one VM and its statistics.
pub struct MmuControl {
    vm: Arc<VmFd>,
    memory_bytes: u64,
    paging: PagingMode,
    state: Mutex<MmuState>,
    stats: Arc<VmStats>,
    /// Whether an [`AgentListener`] serves this VM.
    agent: AtomicBool,
}

impl MmuControl {
    /// Applies `budget` to a VM whose memory is registered and whose vCPUs
    /// do not run yet.
    pub fn new(
        vm: Arc<VmFd>,
        memory_bytes: u64,
        budget: SptBudget,
    ) -> Result<MmuControl, MmuError> {
        let stats = Arc::new(VmStats::new(vm.as_ref()));
        let control = MmuControl {
            memory_bytes,
            paging: paging_mode(),
            state: Mutex::new(MmuState {
                budget: SptBudget::Default,
                sizer: AutoSizer::new(0),
                guest_page_tables_kib: None,
            }),
            stats,
            vm,
            agent: AtomicBool::new(false),
        };
        if budget != SptBudget::Default {
            control.apply(budget)?;
        }
        Ok(control)
    }

    pub fn stats(&self) -> &VmStats {
        &self.stats
    }

    /// The same statistics, shared (the metrics file's "kvm" source).
    pub fn shared_stats(&self) -> Arc<VmStats> {
        self.stats.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MmuState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_kvm(&self, pages: u64) -> Result<(), MmuError> {
        // SAFETY: KVM_SET_NR_MMU_PAGES takes its argument by value and
        // touches no user memory; the VM fd is valid for the call.
        let ret = unsafe { ioctl_with_val(self.vm.as_ref(), KVM_SET_NR_MMU_PAGES(), pages as _) };
        if ret < 0 {
            return Err(MmuError::Set {
                pages,
                reason: std::io::Error::last_os_error().to_string(),
            });
        }
        Ok(())
    }

    /// The budget KVM reports now.
    pub fn kvm_pages(&self) -> Option<u64> {
        // SAFETY: KVM_GET_NR_MMU_PAGES takes no argument and returns the
        // budget; the VM fd is valid for the call.
        let ret = unsafe { ioctl(self.vm.as_ref(), KVM_GET_NR_MMU_PAGES()) };
        u64::try_from(ret).ok()
    }

    /// Switches to `budget` (checked against guest memory for fixed ones).
    /// `Default` is not reachable once another budget was set (KVM keeps a
    /// requested budget), so it is set as KVM would compute it: 2 % of
    /// guest pages.
    pub fn set(&self, budget: SptBudget) -> Result<(), MmuError> {
        if budget == SptBudget::Auto && !self.agent.load(Ordering::SeqCst) {
            return Err(MmuError::AutoNeedsVsock);
        }
        self.apply(budget)
    }

    fn apply(&self, budget: SptBudget) -> Result<(), MmuError> {
        let mut state = self.lock();
        let pages = match budget {
            SptBudget::Pages(n) => check_pages(n, self.memory_bytes)?,
            SptBudget::Default => (self.memory_bytes / PAGE_SIZE * 20 / 1000).max(MIN_PAGES),
            SptBudget::Auto => {
                auto_pages(state.guest_page_tables_kib.unwrap_or(0), self.memory_bytes)
            }
        };
        self.set_kvm(pages)?;
        state.budget = budget;
        state.sizer = AutoSizer::new(pages);
        if budget == SptBudget::Auto {
            state.sizer.last_change = Some(Instant::now());
        }
        Ok(())
    }

    /// Records an agent report; in `auto` mode, resizes the budget.
    pub fn guest_page_tables(&self, kib: u64) {
        let mut state = self.lock();
        state.guest_page_tables_kib = Some(kib);
        if state.budget != SptBudget::Auto {
            return;
        }
        let need = auto_pages(kib, self.memory_bytes);
        if let Some(pages) = state.sizer.next(need, Instant::now()) {
            if let Err(e) = self.set_kvm(pages) {
                tracing::warn!("auto shadow-page budget: {e}");
            } else {
                tracing::debug!(
                    "auto shadow-page budget: {pages} pages (guest PageTables {kib} kB)"
                );
            }
        }
    }

    /// Everything `GET /api/v1/vm.mmu` shows.
    pub fn info(&self) -> MmuInfo {
        let (budget, sizer_pages, pt) = {
            let s = self.lock();
            (s.budget, s.sizer.current(), s.guest_page_tables_kib)
        };
        let stats = self
            .stats
            .vm()
            .into_iter()
            .filter(|(name, _)| is_mmu_vm_stat(name))
            .collect();
        let vcpu_stats = self
            .stats
            .vcpus_summed()
            .into_iter()
            .filter(|(name, _)| is_mmu_vcpu_stat(name))
            .collect();
        MmuInfo {
            paging: self.paging.kind.into(),
            paging_source: self.paging.source.clone(),
            mode: budget.name().into(),
            budget_pages: match budget {
                SptBudget::Default => None,
                _ => Some(sizer_pages),
            },
            kvm_nr_mmu_pages: self.kvm_pages(),
            guest_memory_pages: self.memory_bytes / PAGE_SIZE,
            guest_page_tables_kib: pt,
            stats,
            vcpu_stats,
        }
    }
}

/// VM statistics `vm.mmu` shows.
pub fn is_mmu_vm_stat(name: &str) -> bool {
    name.starts_with("mmu_")
        || name.starts_with("pages_")
        || name.starts_with("max_mmu_")
        || name == "nx_lpage_splits"
        || name == "remote_tlb_flush"
}

/// vCPU statistics `vm.mmu` shows (summed over vCPUs).
pub fn is_mmu_vcpu_stat(name: &str) -> bool {
    name.starts_with("pf_")
        || matches!(
            name,
            "exits" | "tlb_flush" | "invlpg" | "insn_emulation" | "guest_mode"
        )
}

/// The host end of the guest agent: a Unix socket at `<uds>_1024` that
/// accepts connections from the guest's vsock port [`AGENT_PORT`] and
/// passes each `PageTables:` line to [`MmuControl::guest_page_tables`].
/// Removes its socket file when dropped.
pub struct AgentListener {
    path: PathBuf,
}

impl AgentListener {
    /// Listens for the agent of the VM whose `--vsock` options are
    /// `vsock_options`.
    pub fn start(vsock_options: &str, mmu: Arc<MmuControl>) -> Result<AgentListener, MmuError> {
        let uds = devices::virtio::vsock::VsockConfig::parse(vsock_options)
            .map(|c| c.uds)
            .map_err(|_| MmuError::AutoNeedsVsock)?;
        let mut path = uds.into_os_string();
        path.push(format!("_{AGENT_PORT}"));
        let path = PathBuf::from(path);
        let fail = |reason: String| MmuError::Agent {
            path: path.display().to_string(),
            reason,
        };
        // A stale socket from an earlier run: nobody can be listening on it
        // if connecting fails.
        if path.exists() && std::os::unix::net::UnixStream::connect(&path).is_err() {
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path).map_err(|e| fail(api::io_reason(&e)))?;
        std::thread::Builder::new()
            .name("mmu-agent".into())
            .spawn({
                let mmu = mmu.clone();
                move || {
                    sandbox::enter_or_exit(sandbox::ThreadKind::MmuAgent);
                    serve_agent(listener, mmu)
                }
            })
            .map_err(|e| fail(api::io_reason(&e)))?;
        mmu.agent.store(true, Ordering::SeqCst);
        Ok(AgentListener { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for AgentListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve_agent(listener: UnixListener, mmu: Arc<MmuControl>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let mut last = None;
        for line in BufReader::new(conn).lines().take(64) {
            let Ok(line) = line else { break };
            if let Some(kib) = parse_agent_line(&line) {
                last = Some(kib);
            }
        }
        if let Some(kib) = last {
            mmu.guest_page_tables(kib);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn budgets_parse_with_clear_errors() {
        let mem = 512 * MIB;
        assert_eq!(SptBudget::parse("auto", mem), Ok(SptBudget::Auto));
        assert_eq!(SptBudget::parse("64", mem), Ok(SptBudget::Pages(64)));
        assert_eq!(
            SptBudget::parse("131072", mem),
            Ok(SptBudget::Pages(131072))
        );
        assert_eq!(SptBudget::parse("0", mem), Err(MmuError::TooFew(0)));
        assert_eq!(SptBudget::parse("63", mem), Err(MmuError::TooFew(63)));
        assert_eq!(
            SptBudget::parse("lots", mem),
            Err(MmuError::NotPages("lots".into()))
        );
        assert!(SptBudget::parse("-5", mem).is_err());
        assert!(SptBudget::parse("", mem).is_err());
        let err = SptBudget::parse("131073", mem).unwrap_err();
        assert_eq!(
            err.to_string(),
            "131073 pages (513M of shadow page tables) is more than the guest's 512M of memory (131072 pages of 4 KiB)"
        );
        assert!(SptBudget::parse("99999999999999999999", mem).is_err());
        for e in [
            MmuError::TooFew(0),
            MmuError::NotPages("x".into()),
            MmuError::AutoNeedsVsock,
        ] {
            assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn paging_mode_from_module_parameters() {
        let dir = std::env::temp_dir().join(format!("hk-mmu-sys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(paging_mode_in(&dir).kind, "unknown");
        let amd = dir.join("kvm_amd/parameters");
        std::fs::create_dir_all(&amd).unwrap();
        std::fs::write(amd.join("npt"), "1\n").unwrap();
        assert_eq!(paging_mode_in(&dir).kind, "npt");
        std::fs::write(amd.join("npt"), "N\n").unwrap();
        let mode = paging_mode_in(&dir);
        assert!(mode.is_shadow());
        assert_eq!(mode.source, "kvm_amd npt=N");
        std::fs::remove_dir_all(&amd).unwrap();
        let intel = dir.join("kvm_intel/parameters");
        std::fs::create_dir_all(&intel).unwrap();
        std::fs::write(intel.join("ept"), "Y\n").unwrap();
        assert_eq!(paging_mode_in(&dir).kind, "ept");
        std::fs::create_dir_all(dir.join("kvm_pvm")).unwrap();
        assert_eq!(paging_mode_in(&dir).source, "kvm_pvm");
        assert!(paging_mode_in(&dir).is_shadow());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn auto_sizing_math() {
        let mem = 512 * MIB;
        // Floor: 64 + 256 (one page per 2 MiB of RAM).
        assert_eq!(auto_pages(0, mem), 320);
        // 4 MiB of guest page tables = 1024 pages, doubled.
        assert_eq!(auto_pages(4096, mem), 320 + 2048);
        // Never more than the guest's memory in pages.
        assert_eq!(auto_pages(u64::MAX / 2, mem), mem / 4096);
        // 16 processes each mapping 24 MiB with 4 KiB pages: 12 page
        // tables each plus upper levels, ~1 MiB of PageTables in all.
        let pages = auto_pages(1024, mem);
        assert!(pages > 320 + 2 * 16 * 12, "{pages}");
    }

    #[test]
    fn auto_grows_at_once_and_shrinks_slowly() {
        let t0 = Instant::now();
        let mut s = AutoSizer::new(320);
        assert_eq!(s.next(1000, t0), Some(1000));
        // Rate limit.
        assert_eq!(s.next(2000, t0 + Duration::from_secs(1)), None);
        let t = t0 + AUTO_INTERVAL;
        assert_eq!(s.next(2000, t), Some(2000));
        // Small dips are ignored; big ones shrink a quarter per step.
        let t = t + AUTO_INTERVAL;
        assert_eq!(s.next(1900, t), None);
        assert_eq!(s.next(320, t), Some(1500));
        let t = t + AUTO_INTERVAL;
        assert_eq!(s.next(1400, t), None);
        assert_eq!(s.next(1000, t), Some(1125));
        assert_eq!(s.current(), 1125);
    }

    #[test]
    fn agent_lines() {
        assert_eq!(parse_agent_line("PageTables:         1234 kB"), Some(1234));
        assert_eq!(parse_agent_line("PageTables: 8 kB\n"), Some(8));
        assert_eq!(parse_agent_line("PageTables: 8"), Some(8));
        assert_eq!(parse_agent_line("MemTotal: 8 kB"), None);
        assert_eq!(parse_agent_line("PageTables: x kB"), None);
        assert_eq!(parse_agent_line("PageTables: 8 MB"), None);
    }
}
