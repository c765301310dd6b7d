//! Which RAM pages changed since the last look, on the source: KVM's dirty
//! log for what vCPUs wrote, ORed with vm-memory's bitmap for what the
//! VMM's own threads wrote (virtio devices filling guest buffers), which
//! KVM never sees.
//!
//! Only RAM's slots are logged. The display's framebuffer has a slot and
//! dirty log of its own (display::dirty::dirtylog), so the two never
//! harvest (and so clear) the same log.

use std::sync::Arc;

use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::VmFd;
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use super::pages::PageBitmap;
use super::protocol::PAGE_SIZE;
use super::MigrationError;
use crate::memory::GuestMemoryMmap;

/// Dirty logging switched on for every RAM slot; switched off when dropped.
pub struct RamDirtyLog {
    vm: Arc<VmFd>,
    memory: GuestMemoryMmap,
}

impl RamDirtyLog {
    /// Starts logging. Writes before this are not reported: the first
    /// round sends every page anyway.
    pub fn start(vm: Arc<VmFd>, memory: GuestMemoryMmap) -> Result<RamDirtyLog, MigrationError> {
        set_logging(&vm, &memory, true)?;
        // Forget the VMM's writes so far, for the same reason.
        for region in memory.iter() {
            region_bitmap(region).reset();
        }
        Ok(RamDirtyLog { vm, memory })
    }

    /// Adds the pages written since the last harvest (or the start) to
    /// `into`, clearing the logs; returns how many pages were dirty.
    pub fn harvest(&self, into: &PageBitmap) -> Result<usize, MigrationError> {
        let before = into.count();
        let mut index = 0;
        for (slot, region) in self.memory.iter().enumerate() {
            let len = region.len() as usize;
            let kvm = self
                .vm
                .get_dirty_log(slot as u32, len)
                .map_err(|e| MigrationError::Kvm("KVM_GET_DIRTY_LOG", e))?;
            into.or_words(index, &kvm);
            into.or_words(index, &region_bitmap(region).get_and_reset());
            index += len / PAGE_SIZE;
        }
        Ok(into.count() - before)
    }
}

impl Drop for RamDirtyLog {
    fn drop(&mut self) {
        if let Err(e) = set_logging(&self.vm, &self.memory, false) {
            tracing::warn!("cannot switch RAM dirty logging off: {e}");
        }
    }
}

/// vm-memory's dirty bitmap of one region (one bit per 4 KiB page).
fn region_bitmap(
    region: &vm_memory::GuestRegionMmap<vm_memory::bitmap::AtomicBitmap>,
) -> &vm_memory::bitmap::AtomicBitmap {
    let mapping: &vm_memory::MmapRegion<vm_memory::bitmap::AtomicBitmap> = region;
    mapping.bitmap()
}

/// Re-registers every RAM slot with dirty logging on or off (slot numbers
/// as `memory::register_guest_memory` gave them).
fn set_logging(vm: &VmFd, memory: &GuestMemoryMmap, on: bool) -> Result<(), MigrationError> {
    for (slot, region) in memory.iter().enumerate() {
        let host = region
            .get_host_address(MemoryRegionAddress(0))
            .map_err(|e| MigrationError::Invalid(format!("RAM region: {e}")))?;
        let entry = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
            guest_phys_addr: region.start_addr().raw_value(),
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the same slot, guest range and host mapping as
        // `register_guest_memory` registered (the mapping is owned by
        // `memory`, which the VM keeps alive); only the flags change.
        unsafe { vm.set_user_memory_region(entry) }
            .map_err(|e| MigrationError::Kvm("KVM_SET_USER_MEMORY_REGION", e))?;
    }
    Ok(())
}
