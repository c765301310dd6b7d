//! Guest RAM: anonymous host memory laid out as `arch::layout` says and
//! registered with KVM one memory slot per region.

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::bitmap::{AtomicBitmap, NewBitmap};
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{Address, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap};

use crate::Error;

pub use devices::GuestMemoryMmap;

/// Transparent huge page size on x86_64.
const HUGE_PAGE: usize = 2 << 20;

/// Allocates `mem_size` bytes of guest RAM around the MMIO hole.
///
/// Each region starts on a 2 MiB boundary and is marked for transparent
/// huge pages: only when guest-physical and host-virtual addresses agree
/// modulo 2 MiB can KVM map guest memory with 2 MiB pages, which saves most
/// nested page faults while the guest boots (QEMU does the same).
pub fn create_guest_memory(mem_size: u64) -> Result<GuestMemoryMmap, Error> {
    let regions = arch::layout::ram_regions(mem_size)
        .into_iter()
        .map(|(start, size)| {
            let size = size as usize;
            let host = huge_page_aligned_mapping(size)?;
            // SAFETY: `host` is the start of a fresh private anonymous mapping
            // of `size` bytes made just above, used for nothing else.
            let builder = unsafe {
                MmapRegionBuilder::new_with_bitmap(size, AtomicBitmap::with_len(size))
                    .with_raw_mmap_pointer(host)
            };
            let mapping = builder
                .build()
                .map_err(|e| Error::GuestMemory(e.to_string()))?;
            GuestRegionMmap::new(mapping, GuestAddress(start)).ok_or_else(|| {
                Error::GuestMemory(format!(
                    "region at {start:#x} does not fit the address space"
                ))
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    GuestMemoryMmap::from_regions(regions).map_err(|e| Error::GuestMemory(e.to_string()))
}

/// Maps `size` bytes of anonymous memory at a 2 MiB-aligned address and asks
/// for transparent huge pages on it. The mapping lives as long as the
/// process: guest RAM is never given back before hakoniwa exits.
fn huge_page_aligned_mapping(size: usize) -> Result<*mut u8, Error> {
    let padded = size + HUGE_PAGE;
    // SAFETY: a new private anonymous mapping; no existing memory is touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            padded,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(Error::GuestMemory(
            std::io::Error::last_os_error().to_string(),
        ));
    }
    let start = raw as usize;
    let aligned = start.next_multiple_of(HUGE_PAGE);
    let head = aligned - start;
    let tail = padded - head - size;
    // SAFETY: both ranges lie inside the mapping made above and outside the
    // aligned part that is kept; unmapping them returns the padding.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((aligned + size) as *mut libc::c_void, tail);
        }
        // Advice only: without THP support the memory works the same.
        libc::madvise(aligned as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
    }
    Ok(aligned as *mut u8)
}

/// Tells KVM where each RAM region lives in our address space.
pub fn register_guest_memory(vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), Error> {
    for (slot, region) in mem.iter().enumerate() {
        let host = region
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(|e| Error::GuestMemory(e.to_string()))?;
        let entry = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr: region.start_addr().raw_value(),
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: `host` is the start of a live mapping of `region.len()`
        // bytes owned by `mem`, which the VM keeps for as long as the VmFd
        // exists; the guest-physical ranges come from `ram_regions` and do
        // not overlap.
        unsafe { vm.set_user_memory_region(entry) }
            .map_err(|e| Error::Kvm("KVM_SET_USER_MEMORY_REGION", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    #[test]
    fn regions_are_huge_page_aligned_and_usable() {
        let mem = create_guest_memory(64 << 20).unwrap();
        for region in mem.iter() {
            let host = region
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .unwrap() as usize;
            assert_eq!(host % HUGE_PAGE, 0);
        }
        mem.write_obj(0x1234_5678u32, GuestAddress((64 << 20) - 4))
            .unwrap();
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress((64 << 20) - 4)).unwrap(),
            0x1234_5678
        );
        assert!(
            mem.write_obj(0u8, GuestAddress(64 << 20)).is_err(),
            "no RAM past the end"
        );
    }
}
