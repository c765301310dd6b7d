//! Where each page of a migrated-in VM came from, and whether it is what
//! the source had: the destination records, per page, how and when it
//! arrived (precopy, demand, prefetch, background; data or zero), and with
//! `ctl migrate --verify-pages` the source's checksum of every page taken
//! while its guest was stopped. A failure report (crate::dump) reads it to
//! say whether a page the guest tripped over arrived wrong, arrived late
//! or never arrived.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use serde::Serialize;

use super::pages::RamLayout;
use super::protocol::{PageKind, PAGE_SIZE};

/// Bits of a page's record: its last arrival's kind (+1; 0: never
/// arrived), whether it came as "all zero", whether a hybrid's switch-over
/// dropped an earlier copy of it.
const KIND_MASK: u8 = 0b0111;
const ZERO: u8 = 1 << 3;
const DISCARDED: u8 = 1 << 4;

/// CRC32 (IEEE) of a page, as `--verify-pages` compares them.
pub fn page_crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// CRC32 of a page of zeros.
pub fn zero_page_crc() -> u32 {
    static CRC: OnceLock<u32> = OnceLock::new();
    *CRC.get_or_init(|| page_crc(&[0u8; PAGE_SIZE]))
}

/// One page's history, as a report shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PageRecord {
    /// How it last arrived ("precopy", "demand", "prefetch", "background"),
    /// or "never" (still on the source, or never sent).
    pub arrived: &'static str,
    /// It came as an "all zero" frame (no bytes on the wire).
    pub zero: bool,
    /// A hybrid's switch-over dropped the copy precopy had sent.
    pub discarded_at_switchover: bool,
    /// When it arrived, ms after the migration began here.
    pub at_ms: Option<u32>,
    /// The source's CRC32 of the page while its guest was stopped
    /// (`--verify-pages` only).
    pub source_crc32: Option<u32>,
}

/// The destination's record of every page of RAM.
pub struct PageHistory {
    layout: RamLayout,
    start: Instant,
    how: Vec<AtomicU8>,
    at_ms: Vec<AtomicU32>,
    /// `--verify-pages`: the source's checksums, one per page in RAM order.
    source_crcs: OnceLock<Vec<u32>>,
}

impl PageHistory {
    pub fn new(layout: RamLayout) -> PageHistory {
        let pages = layout.pages();
        PageHistory {
            layout,
            start: Instant::now(),
            how: (0..pages).map(|_| AtomicU8::new(0)).collect(),
            at_ms: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            source_crcs: OnceLock::new(),
        }
    }

    pub fn layout(&self) -> &RamLayout {
        &self.layout
    }

    /// Pages `index..index+count` (RAM order) arrived now as `kind`.
    pub fn arrived(&self, kind: PageKind, index: usize, count: usize, zero: bool) {
        let ms = self.start.elapsed().as_millis().min(u128::from(u32::MAX)) as u32;
        let bits = (kind as u8 + 1) | if zero { ZERO } else { 0 };
        for i in index..(index + count).min(self.how.len()) {
            let discarded = self.how[i].load(Ordering::Relaxed) & DISCARDED;
            self.how[i].store(bits | discarded, Ordering::Relaxed);
            self.at_ms[i].store(ms, Ordering::Relaxed);
        }
    }

    /// The switch-over dropped page `index`'s copy: it must come again.
    pub fn discarded(&self, index: usize) {
        if let Some(how) = self.how.get(index) {
            how.store(DISCARDED, Ordering::Relaxed);
        }
    }

    /// Keeps the source's checksums (`--verify-pages`); false if they do
    /// not cover RAM page for page, or came twice.
    pub fn set_source_crcs(&self, crcs: Vec<u32>) -> bool {
        crcs.len() == self.how.len() && self.source_crcs.set(crcs).is_ok()
    }

    /// The source's checksum of page `index`, if it sent them.
    pub fn source_crc(&self, index: usize) -> Option<u32> {
        self.source_crcs.get().and_then(|c| c.get(index).copied())
    }

    pub fn verifying(&self) -> bool {
        self.source_crcs.get().is_some()
    }

    /// Page `index`'s record.
    pub fn record(&self, index: usize) -> Option<PageRecord> {
        let how = self.how.get(index)?.load(Ordering::Relaxed);
        let kind = how & KIND_MASK;
        Some(PageRecord {
            arrived: match kind {
                0 => "never",
                k => kind_name(k - 1),
            },
            zero: how & ZERO != 0,
            discarded_at_switchover: how & DISCARDED != 0,
            at_ms: (kind != 0).then(|| self.at_ms[index].load(Ordering::Relaxed)),
            source_crc32: self.source_crc(index),
        })
    }
}

fn kind_name(kind: u8) -> &'static str {
    match kind {
        0 => PageKind::Precopy.name(),
        1 => PageKind::Demand.name(),
        2 => PageKind::Prefetch.name(),
        _ => PageKind::Background.name(),
    }
}

/// A page whose content differs from the source's checksum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WrongPage {
    /// Guest-physical address.
    pub address: u64,
    /// How it arrived.
    pub arrived: &'static str,
    pub expected_crc32: u32,
    pub found_crc32: u32,
}

impl std::fmt::Display for WrongPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "page {:#x} ({}) has CRC32 {:#010x}, the source's copy {:#010x}",
            self.address, self.arrived, self.found_crc32, self.expected_crc32
        )
    }
}

impl PageHistory {
    /// Checks the bytes of page `index` (`None`: a page of zeros) against
    /// the source's checksum; `arriving`: the kind of frame bringing them
    /// now, else they are the page's last arrival. A no-op without
    /// `--verify-pages`.
    pub fn check(
        &self,
        index: usize,
        arriving: Option<PageKind>,
        bytes: Option<&[u8]>,
    ) -> Result<(), WrongPage> {
        let Some(expected) = self.source_crc(index) else {
            return Ok(());
        };
        let found = bytes.map(page_crc).unwrap_or_else(zero_page_crc);
        if found == expected {
            return Ok(());
        }
        Err(WrongPage {
            address: self.layout.page_of_index(index) * PAGE_SIZE as u64,
            arrived: match arriving {
                Some(kind) => kind.name(),
                None => self.record(index).map(|r| r.arrived).unwrap_or("never"),
            },
            expected_crc32: expected,
            found_crc32: found,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    fn history(pages: usize) -> PageHistory {
        let memory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), pages * PAGE_SIZE)]).unwrap();
        PageHistory::new(RamLayout::new(&memory))
    }

    #[test]
    fn records_say_how_each_page_arrived() {
        let h = history(8);
        assert_eq!(h.record(0).unwrap().arrived, "never");
        assert_eq!(h.record(0).unwrap().at_ms, None);
        h.arrived(PageKind::Precopy, 0, 4, false);
        h.arrived(PageKind::Background, 4, 2, true);
        let r = h.record(5).unwrap();
        assert_eq!(
            (r.arrived, r.zero, r.discarded_at_switchover),
            ("background", true, false)
        );
        assert!(r.at_ms.is_some());
        // A hybrid drops page 1 at the switch-over; it comes again on demand.
        h.discarded(1);
        assert_eq!(h.record(1).unwrap().arrived, "never");
        h.arrived(PageKind::Demand, 1, 1, false);
        let r = h.record(1).unwrap();
        assert_eq!((r.arrived, r.discarded_at_switchover), ("demand", true));
        assert!(h.record(8).is_none());
    }

    #[test]
    fn verify_pages_compares_with_the_sources_checksums() {
        let h = history(3);
        let page = vec![7u8; PAGE_SIZE];
        // Without checksums nothing is checked.
        assert!(h.check(0, None, Some(&page)).is_ok());
        assert!(!h.set_source_crcs(vec![1, 2])); // not one per page
        assert!(h.set_source_crcs(vec![page_crc(&page), zero_page_crc(), 42]));
        assert!(!h.set_source_crcs(vec![0, 0, 0])); // only once
        assert!(h.verifying());
        assert!(h.check(0, Some(PageKind::Demand), Some(&page)).is_ok());
        assert!(h.check(1, Some(PageKind::Background), None).is_ok());
        h.arrived(PageKind::Prefetch, 2, 1, false);
        let wrong = h.check(2, None, Some(&page)).unwrap_err();
        assert_eq!(wrong.address, 2 * PAGE_SIZE as u64);
        assert_eq!(wrong.arrived, "prefetch");
        assert_eq!(wrong.expected_crc32, 42);
        assert!(
            wrong.to_string().contains("page 0x2000 (prefetch)"),
            "{wrong}"
        );
        // A page the source called zero must be zero.
        let wrong = h.check(0, Some(PageKind::Background), None).unwrap_err();
        assert_eq!(wrong.arrived, "background");
    }
}
