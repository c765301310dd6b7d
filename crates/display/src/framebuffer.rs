//! The framebuffer's memory: an anonymous mapping of its own, given to the
//! guest as a KVM memory slot outside RAM.

use std::io;
use std::ptr::NonNull;

use vm_memory::VolatileSlice;

use crate::layout::{FbGeometry, PAGE_SIZE};

/// The pixels the guest draws into. Kept separate from guest RAM so that
/// update detection (dirty log of one slot, write-protecting one range) and
/// the guest's RAM never interfere.
pub struct FramebufferMemory {
    host: NonNull<u8>,
    len: usize,
    geometry: FbGeometry,
}

// SAFETY: the mapping is plain memory owned by this struct for its whole
// life; every access goes through vm-memory's volatile copies, which
// tolerate the guest writing concurrently (the guest is another agent on
// this memory in any case).
unsafe impl Send for FramebufferMemory {}
// SAFETY: as above; &self methods only read.
unsafe impl Sync for FramebufferMemory {}

impl FramebufferMemory {
    /// Maps and populates the framebuffer, black. Populated with 4 KiB
    /// pages (no transparent huge pages): write-protect tracking and the
    /// dirty log work per page, and uffd-wp can only protect present pages.
    pub fn new(geometry: FbGeometry) -> io::Result<FramebufferMemory> {
        let len = geometry.mapped_bytes();
        // SAFETY: a fresh anonymous private mapping; no existing memory is
        // affected. The result is checked before use.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if host == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let fb = FramebufferMemory {
            host: NonNull::new(host.cast()).ok_or_else(io::Error::last_os_error)?,
            len,
            geometry,
        };
        // SAFETY: advice on our own mapping, of its exact extent.
        unsafe { libc::madvise(host, len, libc::MADV_NOHUGEPAGE) };
        for page in 0..len / PAGE_SIZE {
            // SAFETY: inside the mapping; writing a zero makes the page
            // present (and private to us) without changing its content.
            unsafe { fb.host.as_ptr().add(page * PAGE_SIZE).write_volatile(0) };
        }
        Ok(fb)
    }

    pub fn geometry(&self) -> FbGeometry {
        self.geometry
    }

    /// Host address of the first byte (for KVM and userfaultfd).
    pub fn host_address(&self) -> *mut u8 {
        self.host.as_ptr()
    }

    /// Mapped length, whole pages.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mapping as vm-memory sees guest memory: never a Rust slice,
    /// since the guest writes it while we read, only volatile copies.
    fn volatile(&self) -> VolatileSlice<'_> {
        // SAFETY: `host` is our mapping of `len` bytes, readable and
        // writable, unmapped only when self drops, which the returned
        // slice's lifetime (that of &self) cannot outlive.
        unsafe { VolatileSlice::new(self.host.as_ptr(), self.len) }
    }

    /// Copies page `page` out into `buf`. The guest may be writing the
    /// page meanwhile: we get some mix of old and new bytes, which the
    /// next detection period corrects, as on real hardware.
    pub fn read_page(&self, page: usize, buf: &mut [u8; PAGE_SIZE]) {
        let copied = self
            .volatile()
            .subslice(page * PAGE_SIZE, PAGE_SIZE)
            .map(|s| s.copy_to(&mut buf[..]));
        assert_eq!(copied.ok(), Some(PAGE_SIZE), "page {page} out of range");
    }

    /// Writes `bytes` at `offset` (tests and the VMM's own drawing, e.g. a
    /// boot splash or a restored screen; the guest normally owns the
    /// pixels).
    pub fn write(&self, offset: usize, bytes: &[u8]) {
        self.volatile()
            .subslice(offset, bytes.len())
            .expect("write out of range")
            .copy_from(bytes);
    }
}

impl Drop for FramebufferMemory {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping we created; no reference
        // into it outlives self.
        unsafe { libc::munmap(self.host.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;

    #[test]
    fn black_and_writable() {
        let g = FbGeometry::new(640, 480, Layout::Linear).unwrap();
        let fb = FramebufferMemory::new(g).unwrap();
        assert_eq!(fb.len(), 640 * 480 * 4);
        let mut page = [1u8; PAGE_SIZE];
        fb.read_page(3, &mut page);
        assert!(page.iter().all(|&b| b == 0));
        fb.write(3 * PAGE_SIZE + 8, &[1, 2, 3, 4]);
        fb.read_page(3, &mut page);
        assert_eq!(&page[8..12], &[1, 2, 3, 4]);
        // The last page, to its last byte.
        let last = fb.len() / PAGE_SIZE - 1;
        fb.write(fb.len() - 1, &[9]);
        fb.read_page(last, &mut page);
        assert_eq!((page[PAGE_SIZE - 1], page[0]), (9, 0));
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn a_page_past_the_end_is_refused() {
        let g = FbGeometry::new(640, 480, Layout::Linear).unwrap();
        let fb = FramebufferMemory::new(g).unwrap();
        let mut page = [0u8; PAGE_SIZE];
        fb.read_page(fb.len() / PAGE_SIZE, &mut page);
    }
}
