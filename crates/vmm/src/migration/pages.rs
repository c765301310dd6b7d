//! Guest RAM as the migration stream sees it: pages numbered by their
//! guest-physical address (`gpa / 4096`), and a bitmap of pages in RAM
//! order that several threads may set, clear and test at once.

use std::sync::atomic::{AtomicU64, Ordering};

use vm_memory::{Address, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use super::protocol::PAGE_SIZE;
use crate::memory::GuestMemoryMmap;

/// One RAM region: where it is for the guest and for us, and where its
/// pages start in RAM order.
#[derive(Clone, Copy, Debug)]
struct RamRegion {
    first_page: u64,
    pages: usize,
    host: usize,
    first_index: usize,
}

/// Guest RAM's regions, for turning guest pages, RAM-order indices and
/// host addresses into one another.
#[derive(Clone, Debug)]
pub struct RamLayout {
    regions: Vec<RamRegion>,
    pages: usize,
}

impl RamLayout {
    pub fn new(memory: &GuestMemoryMmap) -> RamLayout {
        let mut regions = Vec::new();
        let mut index = 0;
        for region in memory.iter() {
            let pages = region.len() as usize / PAGE_SIZE;
            let host = region
                .get_host_address(MemoryRegionAddress(0))
                .expect("a RAM region has a host mapping") as usize;
            regions.push(RamRegion {
                first_page: region.start_addr().raw_value() / PAGE_SIZE as u64,
                pages,
                host,
                first_index: index,
            });
            index += pages;
        }
        RamLayout {
            regions,
            pages: index,
        }
    }

    /// Pages of RAM in all.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// RAM's regions as (host address, length in bytes).
    pub fn host_ranges(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.regions.iter().map(|r| (r.host, r.pages * PAGE_SIZE))
    }

    /// The RAM-order index of guest page `page`, if it is RAM.
    pub fn index_of_page(&self, page: u64) -> Option<usize> {
        self.regions.iter().find_map(|r| {
            (page >= r.first_page && page < r.first_page + r.pages as u64)
                .then(|| r.first_index + (page - r.first_page) as usize)
        })
    }

    /// The guest page at RAM-order index `index` (< `pages()`).
    pub fn page_of_index(&self, index: usize) -> u64 {
        let r = self.region_of(index);
        r.first_page + (index - r.first_index) as u64
    }

    /// Our address of the page at RAM-order index `index`.
    pub fn host_of_index(&self, index: usize) -> usize {
        let r = self.region_of(index);
        r.host + (index - r.first_index) * PAGE_SIZE
    }

    /// The RAM-order index of the page holding host address `address`.
    pub fn index_of_host(&self, address: usize) -> Option<usize> {
        self.regions.iter().find_map(|r| {
            (address >= r.host && address < r.host + r.pages * PAGE_SIZE)
                .then(|| r.first_index + (address - r.host) / PAGE_SIZE)
        })
    }

    /// How many pages from `index` on stay inside its region (a run of
    /// pages in one frame must be contiguous for the guest and for us).
    pub fn pages_left_in_region(&self, index: usize) -> usize {
        let r = self.region_of(index);
        r.first_index + r.pages - index
    }

    /// Which pages are in memory on this host (mincore): a page that is
    /// not was never written here, and reading it would fault — under
    /// postcopy, into the userfaultfd handler, which waits for the source.
    pub fn resident(&self) -> std::io::Result<Vec<bool>> {
        let mut all = Vec::with_capacity(self.pages);
        for r in &self.regions {
            let mut vec = vec![0u8; r.pages];
            // SAFETY: `r.host` is the page-aligned start of one of guest
            // RAM's live mappings, `r.pages` pages long, and `vec` has one
            // byte per page, as mincore writes.
            let rc = unsafe {
                libc::mincore(
                    r.host as *mut libc::c_void,
                    r.pages * PAGE_SIZE,
                    vec.as_mut_ptr(),
                )
            };
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
            all.extend(vec.iter().map(|b| b & 1 != 0));
        }
        Ok(all)
    }

    fn region_of(&self, index: usize) -> &RamRegion {
        self.regions
            .iter()
            .find(|r| index >= r.first_index && index < r.first_index + r.pages)
            .expect("a RAM-order index inside RAM")
    }

    /// The page at `index`, read from our mapping.
    ///
    /// The caller must know no one writes the page meanwhile, or accept a
    /// torn copy that a later dirty-log round sends again.
    pub fn page_bytes(&self, index: usize) -> &[u8] {
        let host = self.host_of_index(index);
        // SAFETY: `host` is inside one of guest RAM's live mappings (the
        // layout was built from the VM's GuestMemoryMmap, which outlives
        // the migration), PAGE_SIZE bytes long. The guest may write the
        // page concurrently; the bytes are only copied out, and a page
        // changed while copied is dirty and sent again.
        unsafe { std::slice::from_raw_parts(host as *const u8, PAGE_SIZE) }
    }
}

/// A bitmap with one bit per RAM page, shared between threads.
pub struct PageBitmap {
    words: Vec<AtomicU64>,
    pages: usize,
}

impl PageBitmap {
    pub fn new(pages: usize) -> PageBitmap {
        PageBitmap {
            words: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            pages,
        }
    }

    pub fn len(&self) -> usize {
        self.pages
    }

    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }

    /// Sets bit `i`; returns whether it was already set.
    pub fn set(&self, i: usize) -> bool {
        let bit = 1u64 << (i % 64);
        self.words[i / 64].fetch_or(bit, Ordering::AcqRel) & bit != 0
    }

    /// Clears bit `i`; returns whether it was set.
    pub fn clear(&self, i: usize) -> bool {
        let bit = 1u64 << (i % 64);
        self.words[i / 64].fetch_and(!bit, Ordering::AcqRel) & bit != 0
    }

    pub fn get(&self, i: usize) -> bool {
        self.words[i / 64].load(Ordering::Acquire) & (1u64 << (i % 64)) != 0
    }

    pub fn set_all(&self) {
        for (n, word) in self.words.iter().enumerate() {
            let bits = (self.pages - n * 64).min(64);
            word.store(
                if bits == 64 {
                    u64::MAX
                } else {
                    (1u64 << bits) - 1
                },
                Ordering::Release,
            );
        }
    }

    pub fn clear_all(&self) {
        for word in &self.words {
            word.store(0, Ordering::Release);
        }
    }

    /// ORs `bits` (bit `i` of word `w` is page `offset + 64w + i`) in.
    pub fn or_words(&self, offset: usize, bits: &[u64]) {
        for (w, &word) in bits.iter().enumerate() {
            let mut word = word;
            while word != 0 {
                let i = word.trailing_zeros() as usize;
                word &= word - 1;
                let page = offset + w * 64 + i;
                if page < self.pages {
                    self.set(page);
                }
            }
        }
    }

    pub fn count(&self) -> usize {
        self.words
            .iter()
            .map(|w| w.load(Ordering::Acquire).count_ones() as usize)
            .sum()
    }

    /// The first set bit at or after `from`.
    pub fn next_set(&self, from: usize) -> Option<usize> {
        self.next_where(from, false)
    }

    /// The first clear bit at or after `from`.
    pub fn next_clear(&self, from: usize) -> Option<usize> {
        self.next_where(from, true)
    }

    fn next_where(&self, from: usize, clear: bool) -> Option<usize> {
        if from >= self.pages {
            return None;
        }
        let mut w = from / 64;
        let mut word = self.words[w].load(Ordering::Acquire);
        if clear {
            word = !word;
        }
        word &= u64::MAX << (from % 64);
        loop {
            if word != 0 {
                let i = w * 64 + word.trailing_zeros() as usize;
                return (i < self.pages).then_some(i);
            }
            w += 1;
            if w >= self.words.len() {
                return None;
            }
            word = self.words[w].load(Ordering::Acquire);
            if clear {
                word = !word;
            }
        }
    }

    /// The bitmap's bytes, page 0 in bit 0 of byte 0 (for `Received`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out: Vec<u8> = self
            .words
            .iter()
            .flat_map(|w| w.load(Ordering::Acquire).to_le_bytes())
            .collect();
        out.truncate(self.pages.div_ceil(8));
        out
    }

    /// The bitmap `to_bytes` wrote, for a RAM of `pages` pages.
    pub fn from_bytes(pages: usize, bytes: &[u8]) -> Option<PageBitmap> {
        if bytes.len() != pages.div_ceil(8) {
            return None;
        }
        let map = PageBitmap::new(pages);
        for (i, &byte) in bytes.iter().enumerate() {
            for bit in 0..8 {
                let page = i * 8 + bit;
                if byte & (1 << bit) != 0 {
                    if page >= pages {
                        return None;
                    }
                    map.set(page);
                }
            }
        }
        Some(map)
    }
}

/// Whether a page holds only zero bytes.
pub fn is_zero_page(page: &[u8]) -> bool {
    // Word at a time: this runs over every page of RAM in the first round.
    let (head, words, tail) = {
        // SAFETY: reinterpreting initialised bytes as u64 is sound for any
        // bit pattern; align_to puts the unaligned ends in head and tail.
        unsafe { page.align_to::<u64>() }
    };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    #[test]
    fn bitmap_sets_finds_and_round_trips() {
        let map = PageBitmap::new(130);
        assert_eq!(map.next_set(0), None);
        assert_eq!(map.next_clear(0), Some(0));
        assert!(!map.set(5));
        assert!(map.set(5));
        map.set(64);
        map.set(129);
        assert_eq!(map.count(), 3);
        assert_eq!(map.next_set(0), Some(5));
        assert_eq!(map.next_set(6), Some(64));
        assert_eq!(map.next_set(65), Some(129));
        assert_eq!(map.next_set(130), None);
        let back = PageBitmap::from_bytes(130, &map.to_bytes()).unwrap();
        assert_eq!(
            (0..130).filter(|&i| back.get(i)).collect::<Vec<_>>(),
            vec![5, 64, 129]
        );
        assert!(PageBitmap::from_bytes(130, &[0; 3]).is_none());
        map.set_all();
        assert_eq!(map.count(), 130);
        assert_eq!(map.next_clear(0), None);
        assert!(map.clear(129));
        assert_eq!(map.next_clear(0), Some(129));
        map.clear_all();
        assert_eq!(map.count(), 0);
        // Bits past the end (60 + 64 + 63) are ignored.
        map.or_words(60, &[0b101, (1 << 3) | (1 << 63)]);
        assert_eq!(
            (0..130).filter(|&i| map.get(i)).collect::<Vec<_>>(),
            vec![60, 62, 127]
        );
    }

    #[test]
    fn only_written_pages_are_resident() {
        let memory = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 4 * PAGE_SIZE),
            (GuestAddress(0x1_0000_0000), 2 * PAGE_SIZE),
        ])
        .unwrap();
        let layout = RamLayout::new(&memory);
        for i in [1, 4] {
            // SAFETY: the first byte of a page of `memory`, alive here.
            unsafe { *(layout.host_of_index(i) as *mut u8) = 1 };
        }
        assert_eq!(
            layout.resident().unwrap(),
            vec![false, true, false, false, true, false]
        );
    }

    #[test]
    fn layout_maps_pages_across_the_hole() {
        let memory = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 16 * PAGE_SIZE),
            (GuestAddress(0x1_0000_0000), 8 * PAGE_SIZE),
        ])
        .unwrap();
        let layout = RamLayout::new(&memory);
        assert_eq!(layout.pages(), 24);
        assert_eq!(layout.index_of_page(3), Some(3));
        assert_eq!(layout.index_of_page(16), None);
        assert_eq!(layout.index_of_page(0x10_0000), Some(16));
        assert_eq!(layout.page_of_index(17), 0x10_0001);
        assert_eq!(layout.pages_left_in_region(14), 2);
        assert_eq!(layout.pages_left_in_region(16), 8);
        let host = layout.host_of_index(18);
        assert_eq!(layout.index_of_host(host + 100), Some(18));
        assert_eq!(layout.index_of_host(1), None);
        assert!(is_zero_page(layout.page_bytes(18)));
        // SAFETY: the page belongs to `memory`, alive for the test.
        unsafe { *((host + 5) as *mut u8) = 1 };
        assert!(!is_zero_page(layout.page_bytes(18)));
    }
}
