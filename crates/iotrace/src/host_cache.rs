//! Whether the host page cache holds a range of an image file.
//!
//! Two questions, two system calls, because neither answers both:
//!
//! - **`preadv2(.., RWF_NOWAIT)`** answers "would this read have to wait
//!   for the device?". The kernel copies what the page cache holds,
//!   starting at the offset, and stops at the first page it would have to
//!   fetch: a full read is a hit, a short read or `EAGAIN` is a miss. It is
//!   the exact test for the request the VMM is about to issue, but it costs
//!   a copy of the cached bytes into a scratch buffer (about the cost of the
//!   real read), it says nothing about the pages after the first missing
//!   one, and on a miss the kernel starts reading the range in the
//!   background (its readahead), as the real read would a moment later. So
//!   it is a probe to take just before a real read, never a passive scan.
//! - **`mincore`** over a shared mapping of the file counts the resident
//!   pages of the range (uptodate pages only), without copying data and
//!   without touching the cache or the device. It costs a page-cache lookup
//!   per page, and it cannot tell "resident now" from "resident but about to
//!   be reclaimed"; it is what measures how much of a range (or of a whole
//!   image) the host holds, e.g. for the bytes cached twice.
//!
//! [`HostCacheProbe::probe`] takes `mincore` first, so its own `RWF_NOWAIT`
//! read's readahead is never counted as residency, and it counts a NOWAIT
//! read's bytes only as far as the pages `mincore` found resident: the
//! readahead a NOWAIT miss starts is submitted within the call, and on a
//! fast device it can complete before the kernel looks at the pages again,
//! so the "non-waiting" read returns bytes the device has just read. Seen
//! on this host (2026-11-28, ext4 on virtio-blk): after
//! `POSIX_FADV_DONTNEED`, 12 of 300 NOWAIT reads of 64 pages returned
//! bytes, one of them all 64 pages with none resident before it, in 177 µs.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// What the host page cache holds of one range of the image file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Residency {
    /// Pages of the range resident in the host page cache (`mincore`).
    pub resident_pages: u64,
    /// Pages the range spans (partial pages at either end count whole).
    pub total_pages: u64,
    /// The cached prefix: bytes a `RWF_NOWAIT` read returned from the
    /// range's start, but no further than the first page `mincore` found
    /// missing before it (past it, the bytes are the read's own readahead).
    pub nowait_bytes: u64,
    /// Whether the whole range could be read without waiting for the device
    /// (`nowait_bytes` is the whole range).
    pub nowait_hit: bool,
}

impl Residency {
    /// Every page of the range is resident.
    pub fn fully_resident(&self) -> bool {
        self.resident_pages == self.total_pages
    }

    /// Some but not all of the range's pages are resident.
    pub fn partially_resident(&self) -> bool {
        self.resident_pages > 0 && self.resident_pages < self.total_pages
    }
}

/// Probes the host page cache of one image file.
///
/// Owns a duplicate of the file's descriptor (so the caller's `File` can go
/// on being used, and the two share one open file description) and one
/// read-only shared mapping of the whole file, made at [`open`](Self::open)
/// and only ever passed to `mincore`: no page of it is touched, so it costs
/// address space, not memory. The file's length is taken at `open`; ranges
/// beyond it are refused.
#[derive(Debug)]
pub struct HostCacheProbe {
    file: File,
    mapping: Option<FileMapping>,
    file_len: u64,
    page_size: u64,
    scratch: Vec<u8>,
}

impl HostCacheProbe {
    /// Prepares probes of `file` (opened for reading).
    pub fn open(file: &File) -> io::Result<Self> {
        let file = file.try_clone()?;
        let file_len = byte_len(&file)?;
        let page_size = page_size();
        let mapping = if file_len == 0 {
            None
        } else {
            Some(FileMapping::new(&file, file_len)?)
        };
        Ok(Self {
            file,
            mapping,
            file_len,
            page_size,
            scratch: Vec::new(),
        })
    }

    /// The file's length when the probe was opened.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Both answers for `len` bytes at `offset`: `mincore` residency, then a
    /// `RWF_NOWAIT` read (which, on a miss, starts the host's readahead of
    /// the range), counted only as far as the resident pages reach (see the
    /// module's documentation).
    pub fn probe(&mut self, offset: u64, len: u64) -> io::Result<Residency> {
        let vec = self.resident_vector(offset, len)?;
        let resident_pages = resident_count(&vec);
        let resident_prefix = resident_prefix_bytes(&vec, offset, len, self.page_size);
        let nowait_bytes = self.nowait_read(offset, len)?.min(resident_prefix);
        Ok(Residency {
            resident_pages,
            total_pages: vec.len() as u64,
            nowait_bytes,
            nowait_hit: nowait_bytes == len,
        })
    }

    /// `mincore` alone: (resident pages, pages spanned) of `len` bytes at
    /// `offset`. Changes nothing in the cache.
    pub fn resident_pages(&self, offset: u64, len: u64) -> io::Result<(u64, u64)> {
        let vec = self.resident_vector(offset, len)?;
        Ok((resident_count(&vec), vec.len() as u64))
    }

    /// `mincore`'s vector of the pages `len` bytes at `offset` span.
    fn resident_vector(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        self.check_range(offset, len)?;
        let Some(mapping) = &self.mapping else {
            return Ok(Vec::new());
        };
        let (first_page, pages) = page_span(offset, len, self.page_size);
        if pages == 0 {
            return Ok(Vec::new());
        }
        let mut vec = vec![0u8; pages as usize];
        let start = first_page * self.page_size;
        // SAFETY: `start` is page-aligned and `start + pages * page_size`
        // ends within the page that holds the range's last byte, which
        // lies inside the mapping (check_range: the range is within the
        // file's length, which is what was mapped; the mapping covers
        // whole pages). `vec` has one byte per page of that span, as
        // mincore writes.
        let ret = unsafe {
            libc::mincore(
                mapping
                    .addr
                    .as_ptr()
                    .cast::<u8>()
                    .add(start as usize)
                    .cast(),
                (pages * self.page_size) as usize,
                vec.as_mut_ptr(),
            )
        };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec)
    }

    /// `mincore` of the whole file: the indices of its resident pages, in
    /// [`page_bytes`](Self::page_bytes) pages (for the bytes cached twice,
    /// against the guest's resident blocks). Changes nothing in the cache;
    /// a page-table walk of the whole image, in chunks of 64 MiB.
    pub fn resident_page_indices(&self) -> io::Result<Vec<u64>> {
        const CHUNK_PAGES: u64 = 16384;
        let total = self.file_len.div_ceil(self.page_size);
        let mut out = Vec::new();
        let mut first = 0;
        while first < total {
            let pages = CHUNK_PAGES.min(total - first);
            let len = (pages * self.page_size).min(self.file_len - first * self.page_size);
            let vec = self.resident_vector(first * self.page_size, len)?;
            out.extend(
                vec.iter()
                    .enumerate()
                    .filter(|(_, &b)| is_resident(b))
                    .map(|(i, _)| first + i as u64),
            );
            first += pages;
        }
        Ok(out)
    }

    /// The host's page size, the unit of [`resident_page_indices`](Self::resident_page_indices).
    pub fn page_bytes(&self) -> u64 {
        self.page_size
    }

    /// The bytes a `RWF_NOWAIT` read of the range returns: its cached prefix.
    fn nowait_read(&mut self, offset: u64, len: u64) -> io::Result<u64> {
        if len == 0 {
            return Ok(0);
        }
        if self.scratch.len() < len as usize {
            self.scratch.resize(len as usize, 0);
        }
        let iov = libc::iovec {
            iov_base: self.scratch.as_mut_ptr().cast(),
            iov_len: len as usize,
        };
        loop {
            // SAFETY: the iovec points into `scratch`, which is at least
            // `len` bytes and outlives the call; the descriptor is ours.
            let ret = unsafe {
                libc::preadv2(
                    self.file.as_raw_fd(),
                    &iov,
                    1,
                    offset as libc::off_t,
                    libc::RWF_NOWAIT,
                )
            };
            if ret >= 0 {
                return Ok(ret as u64);
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(0),
                Some(libc::EINTR) => continue,
                _ => return Err(err),
            }
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.file_len => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {offset}+{len} is beyond the image's {} bytes",
                    self.file_len
                ),
            )),
        }
    }
}

/// A regular file's length, or a block device's size (whose metadata
/// says 0): the end, found with a seek. The descriptor is this probe's own
/// duplicate and only used with positioned calls, so moving its offset
/// changes nothing.
fn byte_len(file: &File) -> io::Result<u64> {
    let metadata = file.metadata()?;
    if metadata.file_type().is_file() {
        return Ok(metadata.len());
    }
    // SAFETY: lseek on a descriptor we own; no memory is passed.
    let end = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) };
    if end < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(end as u64)
}

/// Whether mincore's byte for a page says it is resident (the low bit; the
/// others are reserved).
fn is_resident(byte: u8) -> bool {
    byte & 1 != 0
}

/// The resident pages of mincore's vector.
fn resident_count(vec: &[u8]) -> u64 {
    vec.iter().filter(|&&b| is_resident(b)).count() as u64
}

/// The bytes of `len` at `offset` before the first page `vec` (mincore's
/// vector of the pages the range spans) marks missing.
fn resident_prefix_bytes(vec: &[u8], offset: u64, len: u64, page_size: u64) -> u64 {
    let Some(missing) = vec.iter().position(|&b| !is_resident(b)) else {
        return len;
    };
    let first_page = offset / page_size;
    let missing_at = (first_page + missing as u64) * page_size;
    missing_at.saturating_sub(offset).min(len)
}

/// The pages `len` bytes at `offset` touch: (first page index, page count).
fn page_span(offset: u64, len: u64, page_size: u64) -> (u64, u64) {
    if len == 0 {
        return (offset / page_size, 0);
    }
    let first = offset / page_size;
    let last = (offset + len - 1) / page_size;
    (first, last - first + 1)
}

fn page_size() -> u64 {
    // SAFETY: sysconf reads a configuration value; no memory is passed.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

/// A read-only shared mapping of a whole file, only ever given to `mincore`.
#[derive(Debug)]
struct FileMapping {
    addr: NonNull<libc::c_void>,
    len: usize,
}

impl FileMapping {
    fn new(file: &File, len: u64) -> io::Result<Self> {
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large to map"))?;
        // SAFETY: a new mapping chosen by the kernel (no fixed address), of
        // a descriptor we own; the result is checked before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let addr = NonNull::new(addr).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { addr, len })
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: `addr`/`len` are exactly the mapping made in `new`, which
        // nothing else references (it is never dereferenced, only passed to
        // mincore through `&self`).
        unsafe {
            libc::munmap(self.addr.as_ptr(), self.len);
        }
    }
}

// SAFETY: the mapping is never read or written through, only named to
// mincore; moving it to another thread changes nothing.
unsafe impl Send for FileMapping {}
// SAFETY: likewise, `&FileMapping` only gives its address to mincore,
// which reads the kernel's page tables, not the memory: any number of
// threads may do so at once (the VMM's queue threads of one disk).
unsafe impl Sync for FileMapping {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    const PAGES: u64 = 64;

    #[test]
    fn the_resident_prefix_ends_at_the_first_missing_page() {
        assert_eq!(resident_prefix_bytes(&[1, 1], 0, 8192, 4096), 8192);
        assert_eq!(resident_prefix_bytes(&[1, 0, 1], 0, 12288, 4096), 4096);
        assert_eq!(resident_prefix_bytes(&[0, 1], 0, 8192, 4096), 0);
        // Unaligned: the first page's share is what lies after the offset.
        assert_eq!(resident_prefix_bytes(&[1, 0], 4000, 200, 4096), 96);
        assert_eq!(
            resident_prefix_bytes(&[1, 1, 0], 8192 + 100, 9000, 4096),
            8092
        );
        // mincore's other bits are not residency.
        assert_eq!(resident_prefix_bytes(&[2, 1], 0, 8192, 4096), 0);
        assert_eq!(resident_prefix_bytes(&[], 0, 0, 4096), 0);
    }

    /// The race the prefix guards against: a NOWAIT read of pages that
    /// were not resident, which its own readahead may serve on a fast
    /// device, never counts as cached. Many rounds, since the race is
    /// rare (4 % of reads on this host).
    #[test]
    fn a_nowait_read_of_dropped_pages_never_counts() {
        let Some(dir) = evictable_dir() else { return };
        let file = cold_file(&dir);
        let mut probe = HostCacheProbe::open(&file).unwrap();
        let len = PAGES * page_size();
        for _ in 0..100 {
            evict(&file);
            let residency = probe.probe(0, len).unwrap();
            let prefix = residency.resident_pages * page_size();
            assert!(residency.nowait_bytes <= prefix, "{residency:?}");
        }
    }

    #[test]
    fn page_span_counts_partial_pages_whole() {
        assert_eq!(page_span(0, 4096, 4096), (0, 1));
        assert_eq!(page_span(100, 5000, 4096), (0, 2));
        assert_eq!(page_span(4095, 2, 4096), (0, 2));
        assert_eq!(page_span(8192, 1, 4096), (2, 1));
        assert_eq!(page_span(8192, 0, 4096), (2, 0));
    }

    /// A temporary directory on a file system whose page cache can be
    /// dropped (not tmpfs or ramfs, whose pages are the file itself).
    fn evictable_dir() -> Option<tempfile::TempDir> {
        let candidates = [std::env::temp_dir(), "/var/tmp".into()];
        for dir in candidates {
            let Ok(c_path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: a zeroed statfs is a valid output buffer.
            let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: a NUL-terminated path and a valid statfs to fill.
            if unsafe { libc::statfs(c_path.as_ptr(), &mut fs) } != 0 {
                continue;
            }
            // ramfs's magic, which the libc crate does not name.
            const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;
            let memory_backed = [libc::TMPFS_MAGIC, RAMFS_MAGIC];
            if memory_backed.contains(&(fs.f_type as libc::c_long)) {
                continue;
            }
            if let Ok(tmp) = tempfile::tempdir_in(&dir) {
                return Some(tmp);
            }
        }
        eprintln!("skipped: no temporary directory outside tmpfs/ramfs");
        None
    }

    /// Writes a file of `PAGES` pages, syncs it and drops it from the cache.
    fn cold_file(dir: &tempfile::TempDir) -> File {
        let path = dir.path().join("image");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let data: Vec<u8> = (0..PAGES * page_size()).map(|i| (i % 251) as u8).collect();
        file.write_all(&data).unwrap();
        evict(&file);
        file
    }

    fn evict(file: &File) {
        file.sync_data().unwrap();
        // SAFETY: plain advice on a descriptor we own.
        let ret = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(ret, 0);
    }

    /// Readahead off for this open file, so a read caches what it reads.
    fn no_readahead(file: &File) {
        // SAFETY: plain advice on a descriptor we own.
        let ret = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        assert_eq!(ret, 0);
    }

    #[test]
    fn dropped_file_misses_both_ways() {
        let Some(dir) = evictable_dir() else { return };
        let file = cold_file(&dir);
        let mut probe = HostCacheProbe::open(&file).unwrap();
        let len = PAGES * page_size();
        let residency = probe.probe(0, len).unwrap();
        assert_eq!(residency.total_pages, PAGES);
        assert_eq!(residency.resident_pages, 0);
        assert!(!residency.nowait_hit);
        assert_eq!(residency.nowait_bytes, 0);
    }

    #[test]
    fn read_file_hits_both_ways() {
        let Some(dir) = evictable_dir() else { return };
        let file = cold_file(&dir);
        let len = PAGES * page_size();
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, 0).unwrap();
        let mut probe = HostCacheProbe::open(&file).unwrap();
        let residency = probe.probe(0, len).unwrap();
        assert!(residency.fully_resident(), "{residency:?}");
        assert!(residency.nowait_hit);
        assert_eq!(residency.nowait_bytes, len);
        // The bytes a NOWAIT read copies are the file's.
        assert_eq!(probe.scratch[..len as usize], buf[..]);
    }

    #[test]
    fn half_read_file_is_partial() {
        let Some(dir) = evictable_dir() else { return };
        let file = cold_file(&dir);
        no_readahead(&file);
        let half = PAGES / 2 * page_size();
        let mut buf = vec![0u8; half as usize];
        file.read_exact_at(&mut buf, 0).unwrap();
        let mut probe = HostCacheProbe::open(&file).unwrap();

        let residency = probe.probe(0, 2 * half).unwrap();
        assert_eq!(residency.resident_pages, PAGES / 2, "{residency:?}");
        assert!(residency.partially_resident());
        assert!(!residency.nowait_hit);
        assert_eq!(residency.nowait_bytes, half);

        // The cached half alone, at an unaligned offset: a full hit.
        let residency = probe.probe(100, half - 100).unwrap();
        assert!(residency.fully_resident(), "{residency:?}");
        assert!(residency.nowait_hit);
    }

    #[test]
    fn resident_page_indices_are_the_pages_read() {
        let Some(dir) = evictable_dir() else { return };
        let file = cold_file(&dir);
        no_readahead(&file);
        let page = page_size();
        let probe = HostCacheProbe::open(&file).unwrap();
        assert_eq!(probe.resident_page_indices().unwrap(), Vec::<u64>::new());
        // Pages 3, 4 and 40.
        let mut buf = vec![0u8; 2 * page as usize];
        file.read_exact_at(&mut buf, 3 * page).unwrap();
        file.read_exact_at(&mut buf[..1], 40 * page + 7).unwrap();
        assert_eq!(probe.page_bytes(), page);
        assert_eq!(probe.resident_page_indices().unwrap(), vec![3, 4, 40]);
    }

    #[test]
    fn ranges_beyond_the_file_are_refused() {
        let Some(dir) = evictable_dir() else { return };
        let file = cold_file(&dir);
        let mut probe = HostCacheProbe::open(&file).unwrap();
        let len = probe.file_len();
        assert_eq!(
            probe.probe(len - 1, 2).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert!(probe.probe(u64::MAX, 2).is_err());
        assert_eq!(probe.probe(len, 0).unwrap().total_pages, 0);
    }
}
