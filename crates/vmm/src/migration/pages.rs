//! Guest RAM as the migration stream sees it: pages numbered by their
//! guest-physical address (`gpa / 4096`), and a bitmap of pages in RAM
//! order that several threads may set, clear and test at once.

use std::sync::atomic::{AtomicU64, Ordering};

use vm_memory::bitmap::MS;
use vm_memory::{
    Address, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress,
    VolatileSlice, WriteVolatile,
};

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
/// host addresses into one another, and the migration's only way to read
/// and write guest pages.
///
/// A page is never lent out as a Rust `&[u8]`: vCPUs, a postcopy's
/// placement or the balloon may change it while it is read, and a shared
/// slice promises the compiler that it does not change. Pages are copied
/// with vm-memory's volatile copies (a `memcpy` underneath, so no slower)
/// into buffers we own, and worked on there.
#[derive(Clone, Debug)]
pub struct RamLayout {
    regions: Vec<RamRegion>,
    pages: usize,
    /// The same RAM, for vm-memory's copies; it also keeps the mappings
    /// alive as long as the layout.
    memory: GuestMemoryMmap,
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
            memory: memory.clone(),
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

    /// Pages `start..start + count` of RAM (contiguous in one region:
    /// [`Self::pages_left_in_region`]) as one volatile slice. The region
    /// is looked up once per run, not once per page.
    fn run(&self, start: usize, count: usize) -> VolatileSlice<'_, MS<'_, GuestMemoryMmap>> {
        let gpa = GuestAddress(self.page_of_index(start) * PAGE_SIZE as u64);
        self.memory
            .get_slice(gpa, count * PAGE_SIZE)
            .expect("a run of RAM-order pages inside one RAM region")
    }

    /// Copies the page at `index` into `buf`.
    ///
    /// The guest may write the page meanwhile: the copy is then torn, and
    /// the page is dirty and sent again by a later round (or, paused, it
    /// does not change).
    pub fn read_page(&self, index: usize, buf: &mut [u8; PAGE_SIZE]) {
        self.run(index, 1).copy_to(&mut buf[..]);
    }

    /// Appends copies of pages `start..start + count` (one region) to
    /// `out`: one copy straight into the frame being built.
    pub fn append_pages(&self, start: usize, count: usize, out: &mut Vec<u8>) {
        out.write_all_volatile(&self.run(start, count))
            .expect("a Vec takes every byte");
    }

    /// Whether the page at `index` is all zeros, judged on a copy (one
    /// page on the stack: it stays in the L1 cache for the check).
    pub fn is_zero(&self, index: usize) -> bool {
        let mut page = [0u8; PAGE_SIZE];
        self.read_page(index, &mut page);
        is_zero_page(&page)
    }

    /// Writes `bytes` (one page) into the page at `index`.
    pub fn write_page(&self, index: usize, bytes: &[u8]) {
        assert_eq!(bytes.len(), PAGE_SIZE, "one page");
        self.run(index, 1).copy_from(bytes);
    }
}

impl RamLayout {
    /// RAM as plain bytes, for work over every page while nothing can
    /// change it (the checksums of `--verify-pages`).
    ///
    /// # Safety
    ///
    /// For as long as the result lives, nothing but its holder may write
    /// guest RAM: the vCPUs are stopped or have never run, the devices
    /// (the balloon, the disks' queues) are paused or not yet activated,
    /// and no postcopy placement runs.
    pub unsafe fn at_rest(&self) -> RamAtRest<'_> {
        RamAtRest { layout: self }
    }
}

/// Guest RAM while nothing writes it ([`RamLayout::at_rest`]): the one
/// place a page is a Rust `&[u8]`.
///
/// Why not a copy here too: the checksums of `--verify-pages` run over all
/// of RAM inside the downtime, and in the rig's TCG L1, crc32fast over a
/// page just copied costs ~110 µs against ~9 µs over the page in place,
/// which took the precopy test's downtime from 2 s to 12–19 s
/// (bench/results/evidence/volatile-copies-tcg-2026-11-27/).
pub struct RamAtRest<'a> {
    layout: &'a RamLayout,
}

impl RamAtRest<'_> {
    /// The page at RAM-order index `index`.
    pub fn page(&self, index: usize) -> &[u8] {
        let host = self.layout.host_of_index(index);
        // SAFETY: `host` is one page inside guest RAM's live mappings,
        // kept alive by the layout's GuestMemoryMmap, which outlives
        // `self`; by `at_rest`'s contract nothing writes RAM while `self`
        // lives, so the bytes do not change under the shared slice.
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
fn is_zero_page(page: &[u8]) -> bool {
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
    use vm_memory::Bytes;

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
        assert!(layout.is_zero(18));
        // SAFETY: the page belongs to `memory`, alive for the test.
        unsafe { *((host + 5) as *mut u8) = 1 };
        assert!(!layout.is_zero(18));
    }

    #[test]
    fn pages_are_read_and_written_as_copies_across_the_hole() {
        let memory = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 16 * PAGE_SIZE),
            (GuestAddress(0x1_0000_0000), 8 * PAGE_SIZE),
        ])
        .unwrap();
        let layout = RamLayout::new(&memory);
        // What the guest wrote, read back through the layout: the last
        // byte of the low region's last page and of the high region's
        // second page (RAM-order indices 15 and 17).
        memory.write_obj(3u8, GuestAddress(16 * 4096 - 1)).unwrap();
        memory
            .write_obj(4u8, GuestAddress(0x1_0000_0000 + 2 * 4096 - 1))
            .unwrap();
        let mut page = [1u8; PAGE_SIZE];
        layout.read_page(15, &mut page);
        assert_eq!(
            (
                page[PAGE_SIZE - 1],
                page[..PAGE_SIZE - 1].iter().any(|&b| b != 0)
            ),
            (3, false)
        );
        // At rest, the same bytes in place.
        // SAFETY: nothing else touches `memory` during the test.
        let ram = unsafe { layout.at_rest() };
        assert_eq!(ram.page(15), &page[..]);
        assert_eq!(ram.page(17)[PAGE_SIZE - 1], 4);
        // A run is appended after what the frame holds, one region's pages.
        let mut frame = vec![7u8];
        layout.append_pages(16, 2, &mut frame);
        assert_eq!(frame.len(), 1 + 2 * PAGE_SIZE);
        assert_eq!((frame[0], frame[2 * PAGE_SIZE]), (7, 4));
        assert_eq!(frame.iter().filter(|&&b| b != 0).count(), 2);
        // A page written through the layout is what the guest reads.
        let mut bytes = [0u8; PAGE_SIZE];
        bytes[0] = 9;
        layout.write_page(16, &bytes);
        assert_eq!(
            memory.read_obj::<u8>(GuestAddress(0x1_0000_0000)).unwrap(),
            9
        );
        layout.write_page(16, &[0u8; PAGE_SIZE]);
        assert!(layout.is_zero(16));
    }

    #[test]
    #[should_panic(expected = "inside one RAM region")]
    fn a_run_across_the_hole_is_refused() {
        let memory = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 2 * PAGE_SIZE),
            (GuestAddress(0x1_0000_0000), 2 * PAGE_SIZE),
        ])
        .unwrap();
        RamLayout::new(&memory).append_pages(1, 2, &mut Vec::new());
    }
}

#[cfg(test)]
mod speed {
    use super::*;
    use std::time::Instant;
    use vm_memory::{Bytes, GuestAddress};

    /// What the page path costs per page over 256 MiB (half the pages
    /// data, in runs of 16): the zero check and the copy into frames, each
    /// through the layout's copies and, for
    /// comparison, straight over the mapping as a `&[u8]` (as the source
    /// read pages before; here only, where nothing writes RAM meanwhile).
    /// Best of 9 rounds: the machine is shared, so the minimum is the
    /// code's cost. By hand, natively and in the rig's TCG L1:
    /// `cargo test --release -p vmm --lib -- --ignored --nocapture page_path_speed`.
    #[test]
    #[ignore]
    fn page_path_speed() {
        let memory = crate::memory::create_guest_memory(256 << 20).unwrap();
        let layout = RamLayout::new(&memory);
        let pages = layout.pages();
        for i in (0..pages).filter(|i| i % 32 < 16) {
            let gpa = GuestAddress(layout.page_of_index(i) * PAGE_SIZE as u64);
            memory.write_slice(&[0x5a; PAGE_SIZE], gpa).unwrap();
        }
        let slice = |i: usize| {
            // SAFETY: one page inside `memory`'s live mapping; nothing
            // writes it during the test.
            unsafe { std::slice::from_raw_parts(layout.host_of_index(i) as *const u8, PAGE_SIZE) }
        };
        let ns = |t: Instant, n: usize| t.elapsed().as_nanos() as f64 / n as f64;
        let mut frame = Vec::with_capacity(16 * PAGE_SIZE);
        let mut best = [f64::MAX; 4];
        for _ in 0..9 {
            let t = Instant::now();
            let zeros_slice = (0..pages).filter(|&i| is_zero_page(slice(i))).count();
            let zero_slice = ns(t, pages);
            let t = Instant::now();
            let zeros_copy = (0..pages).filter(|&i| layout.is_zero(i)).count();
            let zero_copy = ns(t, pages);
            assert_eq!((zeros_slice, zeros_copy), (pages / 2, pages / 2));

            let t = Instant::now();
            for start in (0..pages).step_by(32) {
                frame.clear();
                (start..start + 16).for_each(|i| frame.extend_from_slice(slice(i)));
            }
            let frame_slice = ns(t, pages / 2);
            let t = Instant::now();
            for start in (0..pages).step_by(32) {
                frame.clear();
                layout.append_pages(start, 16, &mut frame);
            }
            let frame_copy = ns(t, pages / 2);

            let now = [zero_slice, zero_copy, frame_slice, frame_copy];
            for (b, n) in best.iter_mut().zip(now) {
                *b = b.min(n);
            }
        }
        println!(
            "ns/page, slice vs copy: zero check {:.0} vs {:.0}, frame {:.0} vs {:.0}",
            best[0], best[1], best[2], best[3]
        );
    }
}
