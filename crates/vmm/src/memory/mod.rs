//! Guest RAM: anonymous host memory laid out as `arch::layout` says and
//! registered with KVM one memory slot per region.

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::{Address, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::Error;

pub use devices::GuestMemoryMmap;

/// Allocates `mem_size` bytes of guest RAM around the MMIO hole.
pub fn create_guest_memory(mem_size: u64) -> Result<GuestMemoryMmap, Error> {
    let ranges: Vec<(GuestAddress, usize)> = arch::layout::ram_regions(mem_size)
        .into_iter()
        .map(|(start, size)| (GuestAddress(start), size as usize))
        .collect();
    GuestMemoryMmap::from_ranges(&ranges).map_err(|e| Error::GuestMemory(e.to_string()))
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
