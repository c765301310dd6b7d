//! How guest RAM is backed on the host: `--memory SIZE`, or Cloud
//! Hypervisor's `--memory size=SIZE[,hugepages=on|off][,thp=on|off]
//! [,prefault=on|off][,shared=on|off]`, and the mapping that follows.
//!
//! - `hugepages=on`: 2 MiB hugetlbfs pages (`MAP_HUGETLB`), reserved when
//!   RAM is mapped, so the host's pool (`/proc/sys/vm/nr_hugepages`) must
//!   hold them all; the size must be a multiple of 2 MiB.
//! - `thp=on` (the default, as QEMU's): `madvise(MADV_HUGEPAGE)`, so the
//!   host backs RAM with transparent huge pages where its setting allows
//!   (`/sys/kernel/mm/transparent_hugepage/enabled`, `shmem_enabled` for
//!   shared RAM); `thp=off`: `MADV_NOHUGEPAGE`, never. Does not apply with
//!   `hugepages=on`, and the parsed and printed forms then say `thp=off`.
//! - `prefault=on`: every page is populated before the guest runs
//!   (`MADV_POPULATE_WRITE`, or a write to each page on older kernels).
//! - `shared=on`: `MAP_SHARED | MAP_ANONYMOUS` instead of private memory.
//!
//! A migration destination (`run --incoming`) may have to register RAM
//! with userfaultfd and place 4 KiB pages one at a time (postcopy, or a
//! hybrid's switch to it): THP is off until it is known not to (a
//! precopy's hello) or no longer to (a postcopy complete), then
//! [`advise_huge_pages`] turns it on, as QEMU does after postcopy (`vm.info`
//! says so); `hugepages=on`, `prefault=on` and `shared=on` are refused.
//!
//! The regions keep vm-memory's dirty bitmap (`AtomicBitmap`), which
//! records the VMM's own writes for migration, whatever the backing.

use std::fmt;
use std::str::FromStr;

use devices::options::{Options, OptionsError};
use devices::GuestMemoryMmap;
use serde::{Deserialize, Serialize};
use vm_memory::bitmap::{AtomicBitmap, NewBitmap};
use vm_memory::mmap::{MmapRegionBuilder, MmapRegionError};
use vm_memory::{GuestAddress, GuestRegionMmap};

use crate::config::{format_size, parse_memory_size, ConfigError};
use crate::Error;

/// The huge page `hugepages=on` maps.
pub const HUGE_PAGE_SIZE: u64 = 2 << 20;
/// The host's pool of 2 MiB huge pages.
const HUGE_PAGES_SYSFS: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";
/// The host's THP settings for private and for shared anonymous memory.
const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
const THP_SHMEM_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
/// Why THP is off on a migration destination.
const THP_OFF_FOR_UFFD: &str =
    "off on a migration destination until a precopy starts or a postcopy completes: postcopy places 4 KiB pages (userfaultfd)";

/// Guest RAM as `--memory` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// Bytes of guest RAM, a whole number of MiB (of 2 MiB with hugepages).
    pub size: u64,
    /// 2 MiB hugetlbfs pages.
    pub hugepages: bool,
    /// Transparent huge pages asked for (always false with `hugepages`).
    pub thp: bool,
    /// Populate every page before the guest runs.
    pub prefault: bool,
    /// A shared mapping instead of private anonymous memory.
    pub shared: bool,
}

/// Mistakes in `--memory` and hosts that cannot back it; each one line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BackingError {
    /// The size, with `--memory SIZE`'s own errors.
    #[error(transparent)]
    Size(#[from] ConfigError),
    #[error("--memory: {0}")]
    Option(#[from] OptionsError),
    #[error("--memory {0}: no size given (e.g. size=2G,hugepages=on)")]
    MissingSize(String),
    #[error("--memory size={0},hugepages=on: the size must be a multiple of the 2 MiB huge page")]
    NotHugePageMultiple(String),
    #[error("--memory hugepages=on cannot be used with --incoming (postcopy into hugetlbfs pages is not supported)")]
    HugePagesIncoming,
    #[error("--memory prefault=on cannot be used with --incoming (a postcopy destination's RAM must start empty)")]
    PrefaultIncoming,
    #[error("--memory shared=on cannot be used with --incoming (postcopy places pages into private memory only)")]
    SharedIncoming,
    #[error("--memory hugepages=on: the host kernel has no 2 MiB huge pages ({HUGE_PAGES_SYSFS} is missing)")]
    NoHugePages,
    #[error("--memory {size},hugepages=on needs {needed} free 2 MiB huge pages and the host has {available}: set /proc/sys/vm/nr_hugepages to at least {target}")]
    TooFewHugePages {
        size: String,
        needed: u64,
        available: u64,
        target: u64,
    },
    #[error("cannot map guest RAM ({backing}): {reason}")]
    Map { backing: String, reason: String },
}

impl MemoryConfig {
    /// `size` bytes with the default backing: private anonymous memory,
    /// transparent huge pages asked for, nothing populated in advance.
    pub const fn new(size: u64) -> MemoryConfig {
        MemoryConfig {
            size,
            hugepages: false,
            thp: true,
            prefault: false,
            shared: false,
        }
    }

    /// Parses `--memory`: a bare size (`2G`, as ever, with the same
    /// errors) or `size=2G[,hugepages=on|off][,thp=on|off]
    /// [,prefault=on|off][,shared=on|off]` (a first part without `=` is
    /// the size too: `2G,hugepages=on`).
    pub fn parse(text: &str) -> Result<MemoryConfig, BackingError> {
        if !text.contains(['=', ',']) {
            return Ok(MemoryConfig::new(parse_memory_size(text)?));
        }
        let mut options = Options::parse(text, Some("size"))?;
        let size_text = options.take("size");
        let hugepages = options.flag("hugepages", false)?;
        let thp = options.flag("thp", true)?;
        let prefault = options.flag("prefault", false)?;
        let shared = options.flag("shared", false)?;
        options.finish()?;
        let size_text = size_text.ok_or_else(|| BackingError::MissingSize(text.to_string()))?;
        let size = parse_memory_size(&size_text)?;
        if hugepages && !size.is_multiple_of(HUGE_PAGE_SIZE) {
            return Err(BackingError::NotHugePageMultiple(size_text));
        }
        Ok(MemoryConfig {
            size,
            hugepages,
            // hugetlbfs pages are huge already: THP does not apply.
            thp: thp && !hugepages,
            prefault,
            shared,
        })
    }

    /// What applies on this host: refuses what a migration destination
    /// (`uffd_needs_small_pages`) cannot take, and says whether transparent
    /// huge pages apply given the host's setting (`host_thp`: the word in
    /// brackets of its `enabled` or, for shared RAM, `shmem_enabled`; None
    /// when the kernel has no THP).
    pub fn in_effect(
        &self,
        uffd_needs_small_pages: bool,
        host_thp: Option<&str>,
    ) -> Result<Backing, BackingError> {
        if uffd_needs_small_pages {
            if self.hugepages {
                return Err(BackingError::HugePagesIncoming);
            }
            if self.prefault {
                return Err(BackingError::PrefaultIncoming);
            }
            if self.shared {
                return Err(BackingError::SharedIncoming);
            }
        }
        let (thp, thp_note) = if !self.thp {
            (false, None)
        } else if uffd_needs_small_pages {
            (false, Some(THP_OFF_FOR_UFFD.to_string()))
        } else {
            let setting = if self.shared {
                THP_SHMEM_ENABLED
            } else {
                THP_ENABLED
            };
            match host_thp {
                None => (
                    false,
                    Some(format!(
                        "the host kernel has no transparent huge pages ({setting})"
                    )),
                ),
                Some(word) if thp_allowed(word, self.shared) => (true, None),
                Some(word) => (false, Some(format!("the host's {setting} is {word}"))),
            }
        };
        Ok(Backing {
            config: *self,
            thp,
            thp_note,
            uffd_needs_small_pages,
        })
    }
}

/// Whether the host's THP setting `word` lets `MADV_HUGEPAGE` memory have
/// transparent huge pages.
fn thp_allowed(word: &str, shared: bool) -> bool {
    if shared {
        matches!(word, "always" | "within_size" | "advise" | "force")
    } else {
        matches!(word, "always" | "madvise")
    }
}

impl FromStr for MemoryConfig {
    type Err = BackingError;

    fn from_str(text: &str) -> Result<MemoryConfig, BackingError> {
        MemoryConfig::parse(text)
    }
}

/// The canonical form, which [`MemoryConfig::parse`] reads back.
impl fmt::Display for MemoryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = |b: bool| if b { "on" } else { "off" };
        write!(
            f,
            "size={},hugepages={},thp={},prefault={},shared={}",
            format_size(self.size),
            on(self.hugepages),
            on(self.thp),
            on(self.prefault),
            on(self.shared)
        )
    }
}

/// The backing as it applies to one VM on this host (what `vm.info`
/// reports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backing {
    /// As given.
    pub config: MemoryConfig,
    /// Transparent huge pages apply.
    pub thp: bool,
    /// Why they do not, although asked for.
    pub thp_note: Option<String>,
    /// RAM will be filled through userfaultfd (a migration destination).
    uffd_needs_small_pages: bool,
}

impl Backing {
    /// Guest RAM over [`ram_ranges`], as this checked backing says (see
    /// [`check_host`]: the checks are not made again).
    pub fn map_ram(&self) -> Result<GuestMemoryMmap, Error> {
        map_checked(
            &self.config,
            &ram_ranges(self.config.size),
            self.uffd_needs_small_pages,
        )
    }

    pub fn to_api(&self) -> api::MemoryBacking {
        api::MemoryBacking {
            size_mib: self.config.size >> 20,
            hugepages: self.config.hugepages,
            thp: self.thp,
            prefault: self.config.prefault,
            shared: self.config.shared,
            thp_note: self.thp_note.clone(),
        }
    }
}

/// The host's THP setting for private (or shared) anonymous memory: the
/// word in brackets, e.g. `madvise`; None when the kernel has no THP.
pub fn host_thp_setting(shared: bool) -> Option<String> {
    let path = if shared {
        THP_SHMEM_ENABLED
    } else {
        THP_ENABLED
    };
    let text = std::fs::read_to_string(path).ok()?;
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_string())
}

/// The host's pool of 2 MiB huge pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugePagePool {
    /// `nr_hugepages`: the persistent pool.
    pub total: u64,
    /// `free_hugepages`, of which `resv_hugepages` are promised already.
    pub free: u64,
    pub reserved: u64,
    /// `nr_overcommit_hugepages` less `surplus_hugepages`: more the kernel
    /// may allocate beyond the pool.
    pub overcommit_left: u64,
}

impl HugePagePool {
    /// The pool as sysfs shows it; None when the kernel has no 2 MiB huge
    /// pages.
    pub fn read() -> Option<HugePagePool> {
        let read = |name: &str| -> Option<u64> {
            std::fs::read_to_string(format!("{HUGE_PAGES_SYSFS}/{name}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Some(HugePagePool {
            total: read("nr_hugepages")?,
            free: read("free_hugepages")?,
            reserved: read("resv_hugepages").unwrap_or(0),
            overcommit_left: read("nr_overcommit_hugepages")
                .unwrap_or(0)
                .saturating_sub(read("surplus_hugepages").unwrap_or(0)),
        })
    }

    /// Huge pages a new mapping can have.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved) + self.overcommit_left
    }

    /// The error for a guest of `size` bytes that this pool cannot back.
    pub fn shortage(&self, size: u64) -> Option<BackingError> {
        let needed = size.div_ceil(HUGE_PAGE_SIZE);
        let available = self.available();
        (available < needed).then(|| BackingError::TooFewHugePages {
            size: format_size(size),
            needed,
            available,
            target: self.total + (needed - available),
        })
    }
}

/// The checks that need no KVM, for before any VM is built: `config` as it
/// applies here (see [`MemoryConfig::in_effect`]), and with `hugepages=on`
/// enough free huge pages.
pub fn check_host(config: &MemoryConfig, uffd_needs_small_pages: bool) -> Result<Backing, Error> {
    let backing = config.in_effect(
        uffd_needs_small_pages,
        host_thp_setting(config.shared).as_deref(),
    )?;
    if config.hugepages {
        let pool = HugePagePool::read().ok_or(BackingError::NoHugePages)?;
        if let Some(shortage) = pool.shortage(config.size) {
            return Err(shortage.into());
        }
    }
    Ok(backing)
}

/// Guest RAM's ranges for `size` bytes, laid out as `arch::layout` says
/// (around the MMIO hole).
pub fn ram_ranges(size: u64) -> Vec<(GuestAddress, usize)> {
    arch::layout::ram_regions(size)
        .into_iter()
        .map(|(start, len)| (GuestAddress(start), len as usize))
        .collect()
}

/// Maps guest RAM for `ranges` as `config` asks, each region with its
/// dirty bitmap, after [`check_host`]. `uffd_needs_small_pages`: RAM will
/// be registered with userfaultfd and filled 4 KiB at a time (a migration
/// destination), so THP is off and hugepages, prefault and shared are
/// refused.
pub fn map_ram(
    config: &MemoryConfig,
    ranges: &[(GuestAddress, usize)],
    uffd_needs_small_pages: bool,
) -> Result<GuestMemoryMmap, Error> {
    check_host(config, uffd_needs_small_pages)?;
    map_checked(config, ranges, uffd_needs_small_pages)
}

/// [`map_ram`] once [`check_host`] has passed.
fn map_checked(
    config: &MemoryConfig,
    ranges: &[(GuestAddress, usize)],
    uffd_needs_small_pages: bool,
) -> Result<GuestMemoryMmap, Error> {
    // Said in the log and in vm.info's thp_note, not on stderr: a
    // destination's stderr is one line per event (waiting, refused, ...).
    if uffd_needs_small_pages && config.thp {
        tracing::info!(
            "--incoming: transparent huge pages are off for guest RAM (postcopy places 4 KiB pages)"
        );
    }
    // MADV_HUGEPAGE even where the host's setting is "never" for now: it
    // takes effect if the host allows THP later.
    let thp = config.thp && !uffd_needs_small_pages;
    let mut regions = Vec::with_capacity(ranges.len());
    for &(start, len) in ranges {
        let region = map_region(config, len, thp)?;
        let region = GuestRegionMmap::new(region, start).ok_or_else(|| {
            Error::GuestMemory(format!("RAM at {:#x} + {len:#x} overflows", start.0))
        })?;
        regions.push(region);
    }
    GuestMemoryMmap::from_regions(regions).map_err(|e| Error::GuestMemory(e.to_string()))
}

/// Lets a migration destination's RAM (mapped `MADV_NOHUGEPAGE` by
/// [`map_ram`]) have transparent huge pages, once no page of it is left to
/// userfaultfd: a precopy writes every page whole, and a postcopy that
/// completed has placed them all. A huge page faulted in before then
/// would be zeros where the source's pages have not come yet, and
/// userfaultfd would never be asked for them. Pages already here are
/// collapsed by khugepaged over time; those written from now on are huge
/// at once where the host allows.
/// `ranges`: (host address, length) of each RAM mapping.
pub fn advise_huge_pages(ranges: impl IntoIterator<Item = (usize, usize)>) {
    for (host, len) in ranges {
        // SAFETY: the caller's range is guest RAM this process mapped and
        // keeps mapped; MADV_HUGEPAGE changes how it is backed, not what
        // it holds. It fails (EINVAL) only on kernels without THP.
        if unsafe { libc::madvise(host as *mut libc::c_void, len, libc::MADV_HUGEPAGE) } != 0 {
            tracing::debug!(
                "MADV_HUGEPAGE on guest RAM: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// One region of `len` bytes.
fn map_region(
    config: &MemoryConfig,
    len: usize,
    thp: bool,
) -> Result<vm_memory::MmapRegion<AtomicBitmap>, BackingError> {
    let mut flags = libc::MAP_ANONYMOUS;
    flags |= if config.shared {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE
    };
    flags |= if config.hugepages {
        // Reserved at mmap (no MAP_NORESERVE): a short pool fails here,
        // not with SIGBUS when the guest touches a page.
        libc::MAP_HUGETLB | libc::MAP_HUGE_2MB
    } else {
        // As vm-memory's own anonymous regions: overcommitted.
        libc::MAP_NORESERVE
    };
    let region = MmapRegionBuilder::new_with_bitmap(len, AtomicBitmap::with_len(len))
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(flags)
        .with_hugetlbfs(config.hugepages)
        .build()
        .map_err(|e| map_error(config, &e))?;
    let host = region.as_ptr().cast::<libc::c_void>();
    if !config.hugepages {
        let advice = if thp {
            libc::MADV_HUGEPAGE
        } else {
            libc::MADV_NOHUGEPAGE
        };
        // SAFETY: [host, host + len) is the mapping just made, which
        // `region` owns; the advice changes how it is backed, not what it
        // holds. It fails (EINVAL) only on kernels without THP, where
        // there is nothing to switch.
        unsafe { libc::madvise(host, len, advice) };
    }
    if config.prefault {
        populate(config, &region)?;
    }
    Ok(region)
}

/// Populates every page of `region`, after the THP advice so that the
/// pages are as large as they will be.
fn populate(
    config: &MemoryConfig,
    region: &vm_memory::MmapRegion<AtomicBitmap>,
) -> Result<(), BackingError> {
    let (host, len) = (region.as_ptr(), region.size());
    // SAFETY: [host, host + len) is `region`'s mapping; populating it
    // allocates the pages (zeros) without changing what they read as.
    let r = unsafe { libc::madvise(host.cast(), len, libc::MADV_POPULATE_WRITE) };
    if r == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    if error.raw_os_error() != Some(libc::EINVAL) {
        return Err(BackingError::Map {
            backing: config.to_string(),
            reason: format!("prefault: {}", api::io_reason(&error)),
        });
    }
    // Kernels before 5.14: a write to each page.
    let page = if config.hugepages {
        HUGE_PAGE_SIZE as usize
    } else {
        // SAFETY: sysconf has no side effects.
        unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
    };
    for offset in (0..len).step_by(page) {
        // SAFETY: `offset` < `len`, so the byte lies in `region`'s
        // mapping, which nothing else uses yet (no vCPU exists); a zero
        // written over a new page's zero changes nothing it holds.
        unsafe { host.add(offset).write_volatile(0) };
    }
    Ok(())
}

/// What a failed mmap means: with hugepages=on, most likely a pool that
/// shrank since [`check_host`] looked.
fn map_error(config: &MemoryConfig, error: &MmapRegionError) -> BackingError {
    if config.hugepages {
        if let Some(shortage) = HugePagePool::read().and_then(|p| p.shortage(config.size)) {
            return shortage;
        }
    }
    let reason = match error {
        MmapRegionError::Mmap(e) => api::io_reason(e),
        other => other.to_string(),
    };
    BackingError::Map {
        backing: config.to_string(),
        reason,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use vm_memory::bitmap::Bitmap;
    use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion};

    use super::*;

    const MIB: u64 = 1 << 20;

    fn parse(text: &str) -> MemoryConfig {
        MemoryConfig::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn error(text: &str) -> String {
        let e = MemoryConfig::parse(text).expect_err(text).to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.starts_with("--memory"), "{e}");
        e
    }

    #[test]
    fn a_bare_size_is_parsed_as_ever() {
        for (text, bytes) in [
            ("512M", 512 * MIB),
            ("2G", 2 << 30),
            ("1GiB", 1 << 30),
            ("1024", 1 << 30),
        ] {
            assert_eq!(parse(text), MemoryConfig::new(bytes));
            assert_eq!(parse_memory_size(text), Ok(bytes));
        }
        // The same errors as parse_memory_size, word for word.
        for text in ["lots", "0", "-5M", "100K", "99999999999T", ""] {
            let ours = MemoryConfig::parse(text).unwrap_err();
            let theirs = parse_memory_size(text).unwrap_err();
            assert_eq!(ours.to_string(), theirs.to_string());
            assert_eq!(ours, BackingError::Size(theirs));
        }
    }

    #[test]
    fn options_and_their_defaults() {
        let c = parse("size=2G");
        assert_eq!(c, MemoryConfig::new(2 << 30));
        assert!(c.thp && !c.hugepages && !c.prefault && !c.shared);
        let c = parse("size=1G,hugepages=on,prefault=on,shared=on");
        assert_eq!(
            c,
            MemoryConfig {
                size: 1 << 30,
                hugepages: true,
                thp: false,
                prefault: true,
                shared: true
            }
        );
        let c = parse("2G,thp=off,prefault=true");
        assert_eq!((c.size, c.thp, c.prefault), (2 << 30, false, true));
        // hugepages=on with thp=on is fine: THP does not apply, and the
        // parsed form says so.
        let c = parse("size=4M,hugepages=on,thp=on");
        assert!(c.hugepages && !c.thp);
        assert_eq!(
            c.to_string(),
            "size=4M,hugepages=on,thp=off,prefault=off,shared=off"
        );
    }

    #[test]
    fn each_mistake_is_one_line() {
        assert_eq!(
            error("size=2G,colour=red"),
            "--memory: unknown option 'colour' (known: size, hugepages, thp, prefault, shared)"
        );
        assert_eq!(
            error("size=2G,thp=maybe"),
            "--memory: option thp=maybe: 'maybe' is not on or off"
        );
        assert_eq!(
            error("hugepages=on"),
            "--memory hugepages=on: no size given (e.g. size=2G,hugepages=on)"
        );
        assert_eq!(
            error("size=3M,hugepages=on"),
            "--memory size=3M,hugepages=on: the size must be a multiple of the 2 MiB huge page"
        );
        assert_eq!(
            error("size=2G,size=4G"),
            "--memory: option 'size' is given twice"
        );
        assert_eq!(error("size=2G,junk"), "--memory: 'junk' is not key=value");
        assert!(error("size=lots,shared=on").contains("'lots' is not a size"));
        assert!(error("size=100K").contains("not a whole number of MiB"));
    }

    #[test]
    fn the_printed_form_parses_back() {
        for bits in 0..16u8 {
            let bit = |n: u8| bits & (1 << n) != 0;
            let c = MemoryConfig {
                size: if bit(0) { 6 << 30 } else { 514 * MIB },
                hugepages: bit(1),
                thp: bit(2) && !bit(1),
                prefault: bit(3),
                shared: bit(0) && bit(2),
            };
            let printed = c.to_string();
            assert_eq!(parse(&printed), c, "{printed}");
            assert_eq!(printed.parse::<MemoryConfig>(), Ok(c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(
                serde_json::from_str::<MemoryConfig>(&json).unwrap(),
                c,
                "{json}"
            );
        }
        assert_eq!(
            MemoryConfig::new(512 * MIB).to_string(),
            "size=512M,hugepages=off,thp=on,prefault=off,shared=off"
        );
    }

    #[test]
    fn what_applies_on_a_host_and_on_a_migration_destination() {
        let default = MemoryConfig::new(512 * MIB);
        let b = default.in_effect(false, Some("madvise")).unwrap();
        assert_eq!((b.thp, b.thp_note), (true, None));
        assert!(default.in_effect(false, Some("always")).unwrap().thp);
        let b = default.in_effect(false, Some("never")).unwrap();
        assert!(!b.thp);
        assert_eq!(
            b.thp_note.as_deref(),
            Some("the host's /sys/kernel/mm/transparent_hugepage/enabled is never")
        );
        assert!(default
            .in_effect(false, None)
            .unwrap()
            .thp_note
            .unwrap()
            .contains("no transparent huge pages"));
        // Shared RAM follows shmem_enabled, whose words differ.
        let shared = MemoryConfig {
            shared: true,
            ..default
        };
        assert!(shared.in_effect(false, Some("advise")).unwrap().thp);
        let b = shared.in_effect(false, Some("never")).unwrap();
        assert!(!b.thp && b.thp_note.unwrap().contains("shmem_enabled is never"));
        // thp=off needs no explanation.
        let off = MemoryConfig {
            thp: false,
            ..default
        };
        assert_eq!(off.in_effect(false, Some("always")).unwrap().thp_note, None);

        // A migration destination: THP off, said why; the rest refused.
        let b = default.in_effect(true, Some("always")).unwrap();
        assert!(!b.thp);
        assert_eq!(b.thp_note.as_deref(), Some(THP_OFF_FOR_UFFD));
        let api = b.to_api();
        assert_eq!((api.size_mib, api.thp, api.hugepages), (512, false, false));
        assert!(api.thp_note.unwrap().contains("migration destination"));
        for (config, e) in [
            (
                MemoryConfig {
                    hugepages: true,
                    thp: false,
                    ..default
                },
                BackingError::HugePagesIncoming,
            ),
            (
                MemoryConfig {
                    prefault: true,
                    ..default
                },
                BackingError::PrefaultIncoming,
            ),
            (
                MemoryConfig {
                    shared: true,
                    ..default
                },
                BackingError::SharedIncoming,
            ),
        ] {
            assert!(
                e.to_string().contains("cannot be used with --incoming"),
                "{e}"
            );
            assert_eq!(config.in_effect(true, Some("never")), Err(e));
        }
    }

    #[test]
    fn too_few_huge_pages_names_nr_hugepages_and_how_many() {
        let empty = HugePagePool {
            total: 0,
            free: 0,
            reserved: 0,
            overcommit_left: 0,
        };
        let e = empty.shortage(512 * MIB).unwrap();
        assert_eq!(
            e.to_string(),
            "--memory 512M,hugepages=on needs 256 free 2 MiB huge pages and the host has 0: set /proc/sys/vm/nr_hugepages to at least 256"
        );
        // 50 free of 100, 10 of them promised to another mapping.
        let some = HugePagePool {
            total: 100,
            free: 50,
            reserved: 10,
            overcommit_left: 0,
        };
        assert_eq!(some.available(), 40);
        assert_eq!(
            some.shortage(512 * MIB),
            Some(BackingError::TooFewHugePages {
                size: "512M".into(),
                needed: 256,
                available: 40,
                target: 316
            })
        );
        assert_eq!(some.shortage(80 * MIB), None);
        let overcommit = HugePagePool {
            overcommit_left: 300,
            ..empty
        };
        assert_eq!(overcommit.shortage(512 * MIB), None);
    }

    /// The /proc/self/smaps entry of the mapping that holds `addr`.
    pub(crate) fn smaps_entry(addr: *const u8) -> String {
        let addr = addr as u64;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut entry = None::<String>;
        for line in smaps.lines() {
            // A mapping's first line starts with its range: "start-end perms ...".
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            let header = range.and_then(|(a, b)| {
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                ))
            });
            if let Some((start, end)) = header {
                if entry.is_some() {
                    break;
                }
                if (start..end).contains(&addr) {
                    entry = Some(format!("{line}\n"));
                }
            } else if let Some(text) = &mut entry {
                text.push_str(line);
                text.push('\n');
            }
        }
        entry.unwrap_or_else(|| panic!("no mapping holds {addr:#x}"))
    }

    fn vm_flags(entry: &str) -> Vec<String> {
        entry
            .lines()
            .find_map(|l| l.strip_prefix("VmFlags:"))
            .unwrap_or_default()
            .split_whitespace()
            .map(String::from)
            .collect()
    }

    /// Pages of `len` bytes at `host` that are in memory (mincore).
    fn resident(host: *mut u8, len: usize) -> usize {
        let mut vec = vec![0u8; len.div_ceil(4096)];
        // SAFETY: [host, host + len) is a live mapping; `vec` has a byte
        // per 4 KiB page of it, as mincore writes.
        let r = unsafe { libc::mincore(host.cast(), len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        vec.iter().filter(|b| **b & 1 != 0).count()
    }

    fn two_ranges() -> Vec<(GuestAddress, usize)> {
        vec![(GuestAddress(0), 4 << 20), (GuestAddress(1 << 30), 2 << 20)]
    }

    fn map(config: &MemoryConfig, uffd: bool) -> GuestMemoryMmap {
        map_ram(config, &two_ranges(), uffd).unwrap_or_else(|e| panic!("{config}: {e}"))
    }

    #[test]
    fn the_default_is_private_lazy_with_thp_asked_for_and_a_dirty_bitmap() {
        let mem = map(&MemoryConfig::new(6 << 20), false);
        assert_eq!(mem.num_regions(), 2);
        for (region, (start, len)) in mem.iter().zip(two_ranges()) {
            assert_eq!((region.start_addr(), region.len()), (start, len as u64));
            assert_ne!(region.flags() & libc::MAP_PRIVATE, 0);
            assert_eq!(region.is_hugetlbfs(), Some(false));
            let host = region.as_ptr();
            assert_eq!(resident(host, len), 0, "nothing populated yet");
            if host_thp_setting(false).is_some() {
                let entry = smaps_entry(host);
                assert!(vm_flags(&entry).contains(&"hg".to_string()), "{entry}");
            }
        }
        // The VMM's own writes still land in the dirty bitmap.
        mem.write_obj(7u8, GuestAddress((1 << 30) + 0x3000))
            .unwrap();
        let high = mem.iter().nth(1).unwrap();
        assert!(high.bitmap().dirty_at(0x3000));
        assert!(!high.bitmap().dirty_at(0x2000));
    }

    #[test]
    fn thp_off_and_migration_destinations_say_nohugepage_until_advised() {
        if host_thp_setting(false).is_none() {
            return; // a kernel without THP: nothing to advise
        }
        let off = MemoryConfig {
            thp: false,
            ..MemoryConfig::new(6 << 20)
        };
        for (config, uffd) in [(off, false), (MemoryConfig::new(6 << 20), true)] {
            let mem = map(&config, uffd);
            for region in mem.iter() {
                let entry = smaps_entry(region.as_ptr());
                let flags = vm_flags(&entry);
                assert!(
                    flags.contains(&"nh".to_string()),
                    "{config} uffd={uffd}: {entry}"
                );
                assert!(!flags.contains(&"hg".to_string()), "{entry}");
            }
            // A destination's RAM once a precopy starts or a postcopy
            // completes.
            if uffd {
                for region in mem.iter() {
                    advise_huge_pages([(region.as_ptr() as usize, region.len() as usize)]);
                    let entry = smaps_entry(region.as_ptr());
                    let flags = vm_flags(&entry);
                    assert!(flags.contains(&"hg".to_string()), "{entry}");
                    assert!(!flags.contains(&"nh".to_string()), "{entry}");
                }
            }
        }
    }

    #[test]
    fn prefault_populates_every_page() {
        let config = MemoryConfig {
            prefault: true,
            ..MemoryConfig::new(6 << 20)
        };
        let mem = map(&config, false);
        for region in mem.iter() {
            let len = region.len() as usize;
            assert_eq!(resident(region.as_ptr(), len), len / 4096);
        }
        // Populated pages still read as zeros.
        assert_eq!(mem.read_obj::<u64>(GuestAddress(0x1000)).unwrap(), 0);
    }

    #[test]
    fn shared_ram_is_a_shared_mapping() {
        let config = MemoryConfig {
            shared: true,
            ..MemoryConfig::new(6 << 20)
        };
        let mem = map(&config, false);
        for region in mem.iter() {
            assert_ne!(region.flags() & libc::MAP_SHARED, 0);
            let entry = smaps_entry(region.as_ptr());
            // "rw-s": shared, and the VmFlags say so too.
            assert!(entry.lines().next().unwrap().contains(" rw-s "), "{entry}");
            assert!(vm_flags(&entry).contains(&"sh".to_string()), "{entry}");
        }
        mem.write_obj(0x5a5a_u16, GuestAddress(0x2000)).unwrap();
        assert_eq!(mem.read_obj::<u16>(GuestAddress(0x2000)).unwrap(), 0x5a5a);
    }

    #[test]
    fn a_migration_destination_refuses_what_it_cannot_fill() {
        let config = MemoryConfig {
            prefault: true,
            ..MemoryConfig::new(6 << 20)
        };
        let e = map_ram(&config, &two_ranges(), true).unwrap_err();
        assert!(
            e.to_string()
                .contains("prefault=on cannot be used with --incoming"),
            "{e}"
        );
    }

    /// Only where the host has 2 MiB huge pages free: these tests do not
    /// change the host's pool.
    #[test]
    fn hugepages_map_hugetlbfs_pages_when_the_host_has_them() {
        let config = MemoryConfig {
            hugepages: true,
            thp: false,
            ..MemoryConfig::new(6 << 20)
        };
        match HugePagePool::read() {
            Some(pool) if pool.available() >= 3 => {}
            _ => {
                let e = map_ram(&config, &two_ranges(), false)
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("huge pages"), "{e}");
                return;
            }
        }
        let prefaulted = MemoryConfig {
            prefault: true,
            shared: true,
            ..config
        };
        for config in [config, prefaulted] {
            let mem = map(&config, false);
            for region in mem.iter() {
                assert_eq!(region.is_hugetlbfs(), Some(true));
                let entry = smaps_entry(region.as_ptr());
                assert!(entry.contains("KernelPageSize:     2048 kB"), "{entry}");
                let len = region.len() as usize;
                let expected = if config.prefault { len / 4096 } else { 0 };
                assert_eq!(resident(region.as_ptr(), len), expected, "{config}");
            }
            mem.write_obj(1u32, GuestAddress(0x20_0000)).unwrap();
        }
    }
}
