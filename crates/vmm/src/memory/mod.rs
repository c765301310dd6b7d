//! The memory manager: the one owner of guest RAM, of every KVM memory
//! slot and of dirty logging (in the manner of Cloud Hypervisor's
//! `MemoryManager`).
//!
//! - RAM is anonymous host memory laid out as `arch::layout` says, one
//!   slot per region (slots 0..n, in guest-physical order, which is also
//!   the order snapshots and the migration stream number pages in).
//! - Extra regions (the display's framebuffer) get the next free slot
//!   from [`MemoryManager::add_region`]; nobody else picks slot numbers.
//! - Dirty logging is VM-wide policy: KVM's manual protection
//!   (`KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`) is switched on once, here, when
//!   the kernel has it, and every consumer reads a slot's log through
//!   [`DirtyLogReader`], which gets every page written since its own last
//!   look whoever else reads that slot (`dirty_log`). For RAM the VMM's
//!   own writes (virtio devices filling guest buffers, which KVM never
//!   sees) are ORed in from vm-memory's bitmap.
//!
//! - How the host backs RAM (`--memory size=..,hugepages=..,thp=..,
//!   prefault=..,shared=..`) is `backing`.
//!
//! `kvm_userspace_memory_region` is written in this file only.

pub mod backing;
mod dirty_log;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    kvm_clear_dirty_log, kvm_enable_cap, kvm_userspace_memory_region,
    KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2, KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE,
    KVM_MEM_LOG_DIRTY_PAGES,
};
use kvm_ioctls::VmFd;
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::ioctl::ioctl_with_ref;
use vmm_sys_util::ioctl_iowr_nr;

use crate::Error;
// Private: a consumer that fetched a slot's log itself would take pages
// from the other readers; everyone goes through DirtyLogReader.
use dirty_log::{LogBackend, ReaderId, SharedDirtyLog};

pub use devices::GuestMemoryMmap;

const KVMIO: u32 = 0xAE;
ioctl_iowr_nr!(KVM_CLEAR_DIRTY_LOG, KVMIO, 0xc0, kvm_clear_dirty_log);

/// Guest page size as KVM's dirty log counts pages.
pub const PAGE_SIZE: usize = 4096;

/// Why the memory manager could not do something.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("{0} failed: {1}")]
    Kvm(&'static str, kvm_ioctls::Error),
    #[error("memory slot {0} is not being logged")]
    NotLogging(u32),
    #[error("no memory slot {0}")]
    NoSlot(u32),
}

impl From<MemoryError> for Error {
    fn from(e: MemoryError) -> Error {
        Error::GuestMemory(e.to_string())
    }
}

/// `mem_size` bytes of plain guest RAM around the MMIO hole, for tests
/// that need memory laid out as a VM's (VMs get theirs from
/// [`backing::Backing::map_ram`]).
#[cfg(test)]
pub fn create_guest_memory(mem_size: u64) -> Result<GuestMemoryMmap, Error> {
    GuestMemoryMmap::from_ranges(&backing::ram_ranges(mem_size))
        .map_err(|e| Error::GuestMemory(e.to_string()))
}

/// What a slot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// Guest RAM region `index` (in guest-physical order).
    Ram(usize),
    /// Memory of a device, by name ("framebuffer").
    Device(&'static str),
}

/// One KVM memory slot.
struct Slot {
    kind: SlotKind,
    guest_address: u64,
    len: usize,
    host_address: u64,
    /// Keeps a device region's mapping alive while KVM may use it.
    _owner: Option<Arc<dyn Send + Sync>>,
}

/// Guest RAM, every memory slot, and dirty logging of them.
pub struct MemoryManager {
    vm: Arc<VmFd>,
    ram: GuestMemoryMmap,
    slots: Mutex<Vec<Slot>>,
    manual_protect: bool,
    logs: SharedDirtyLog,
    next_reader: AtomicU64,
}

impl MemoryManager {
    /// Takes `ram` and registers it with KVM (slots 0..n), and switches on
    /// manual dirty-log protection where the kernel has it.
    pub fn new(vm: Arc<VmFd>, ram: GuestMemoryMmap) -> Result<Arc<MemoryManager>, Error> {
        let cap = kvm_enable_cap {
            cap: KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
            args: [u64::from(KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE), 0, 0, 0],
            ..Default::default()
        };
        let manual_protect = vm.enable_cap(&cap).is_ok();
        let mut slots = Vec::new();
        for (index, region) in ram.iter().enumerate() {
            let host = region
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .map_err(|e| Error::GuestMemory(e.to_string()))?;
            slots.push(Slot {
                kind: SlotKind::Ram(index),
                guest_address: region.start_addr().raw_value(),
                len: region.len() as usize,
                host_address: host as u64,
                _owner: None,
            });
        }
        let manager = MemoryManager {
            vm,
            ram,
            slots: Mutex::new(Vec::new()),
            manual_protect,
            logs: SharedDirtyLog::default(),
            next_reader: AtomicU64::new(1),
        };
        for slot in slots {
            manager.register(slot)?;
        }
        Ok(Arc::new(manager))
    }

    /// Guest RAM.
    pub fn ram(&self) -> &GuestMemoryMmap {
        &self.ram
    }

    /// The KVM VM the slots belong to.
    pub fn vm_fd(&self) -> &Arc<VmFd> {
        &self.vm
    }

    /// Whether reading a dirty log needs a separate clear (KVM's manual
    /// protection is on): reported by the display's metrics.
    pub fn manual_protect(&self) -> bool {
        self.manual_protect
    }

    /// RAM's slots, in RAM order.
    pub fn ram_slots(&self) -> Vec<u32> {
        (0..self.ram.num_regions() as u32).collect()
    }

    /// Gives the guest `len` bytes at our `host` address as guest-physical
    /// `guest_address` in a slot of its own; `owner` keeps the mapping
    /// alive for as long as the VM is. Returns the slot.
    ///
    /// # Safety
    ///
    /// `host` must be the start of a mapping of at least `len` bytes that
    /// `owner` keeps mapped, and the guest range must not overlap RAM or
    /// another region.
    pub unsafe fn add_region(
        &self,
        name: &'static str,
        host: *mut u8,
        len: usize,
        guest_address: u64,
        owner: Arc<dyn Send + Sync>,
    ) -> Result<u32, Error> {
        let slot = self.slots.lock().unwrap_or_else(|e| e.into_inner()).len() as u32;
        self.register(Slot {
            kind: SlotKind::Device(name),
            guest_address,
            len,
            host_address: host as u64,
            _owner: Some(owner),
        })?;
        Ok(slot)
    }

    /// Moves device region `slot` (from [`add_region`](Self::add_region))
    /// to guest-physical `guest_address`: the guest moved the BAR it is
    /// in. KVM cannot move a slot, so it is deleted and added again.
    pub fn move_region(&self, slot: u32, guest_address: u64) -> Result<(), MemoryError> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let s = slots
            .get_mut(slot as usize)
            .filter(|s| matches!(s.kind, SlotKind::Device(_)))
            .ok_or(MemoryError::NoSlot(slot))?;
        if s.guest_address == guest_address {
            return Ok(());
        }
        let deleted = Slot {
            kind: s.kind.clone(),
            guest_address: s.guest_address,
            len: 0,
            host_address: s.host_address,
            _owner: None,
        };
        self.set_region(slot, &deleted, false)?;
        s.guest_address = guest_address;
        self.set_region(slot, s, false)
    }

    /// Each RAM region as (guest-physical address, host address, length):
    /// what a device that DMAs into the guest must have mapped (VFIO).
    pub fn ram_mappings(&self) -> Vec<(u64, *mut u8, usize)> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .iter()
            .filter(|s| matches!(s.kind, SlotKind::Ram(_)))
            .map(|s| (s.guest_address, s.host_address as *mut u8, s.len))
            .collect()
    }

    /// Starts a reader of the dirty logs of `slots`: each harvest gives the
    /// pages written since this reader's previous harvest (or now).
    pub fn dirty_log(self: &Arc<Self>, slots: &[u32]) -> Result<DirtyLogReader, MemoryError> {
        let id = self.next_reader.fetch_add(1, Ordering::Relaxed);
        let mut attached = Vec::new();
        for &slot in slots {
            if let Err(e) = self.logs.attach(&**self, slot, id) {
                for &done in &attached {
                    self.logs.detach(&**self, done, id);
                }
                return Err(e);
            }
            attached.push(slot);
        }
        Ok(DirtyLogReader {
            manager: self.clone(),
            id,
            slots: attached,
        })
    }

    /// The pages in slot `slot`, for sizing a bitmap.
    pub fn slot_pages(&self, slot: u32) -> Result<usize, MemoryError> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let s = slots.get(slot as usize).ok_or(MemoryError::NoSlot(slot))?;
        Ok(s.len / PAGE_SIZE)
    }

    fn register(&self, slot: Slot) -> Result<(), Error> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let number = slots.len() as u32;
        self.set_region(number, &slot, false)
            .map_err(|e| Error::GuestMemory(e.to_string()))?;
        slots.push(slot);
        Ok(())
    }

    /// (Re-)registers `slot` as `number` with dirty logging on or off (KVM
    /// allows changing just this flag of a live slot).
    fn set_region(&self, number: u32, slot: &Slot, log: bool) -> Result<(), MemoryError> {
        let entry = kvm_userspace_memory_region {
            slot: number,
            flags: if log { KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
            guest_phys_addr: slot.guest_address,
            memory_size: slot.len as u64,
            userspace_addr: slot.host_address,
        };
        // SAFETY: the host range is a live mapping of `slot.len` bytes: RAM
        // is owned by `self.ram`, a device region by `slot._owner` (per
        // `add_region`'s contract), and the manager lives as long as the
        // VmFd's users; guest ranges come from `ram_regions` and the
        // reserved device windows, which do not overlap.
        unsafe { self.vm.set_user_memory_region(entry) }
            .map_err(|e| MemoryError::Kvm("KVM_SET_USER_MEMORY_REGION", e))
    }

    fn with_slot<T>(
        &self,
        number: u32,
        f: impl FnOnce(&Slot) -> Result<T, MemoryError>,
    ) -> Result<T, MemoryError> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        f(slots
            .get(number as usize)
            .ok_or(MemoryError::NoSlot(number))?)
    }

    /// vm-memory's bitmap of the VMM's writes into RAM region `index`.
    fn vmm_writes(&self, index: usize) -> Option<&AtomicBitmap> {
        let region = self.ram.iter().nth(index)?;
        let mapping: &vm_memory::MmapRegion<AtomicBitmap> = region;
        Some(mapping.bitmap())
    }

    /// KVM_CLEAR_DIRTY_LOG of exactly the pages in `bitmap`: re-protects
    /// them, so the next write to each is logged again.
    fn clear_log(&self, slot: u32, pages: usize, bitmap: &mut [u64]) -> Result<(), MemoryError> {
        let mut clear = kvm_clear_dirty_log {
            slot,
            num_pages: pages as u32,
            first_page: 0,
            ..Default::default()
        };
        clear.__bindgen_anon_1.dirty_bitmap = bitmap.as_mut_ptr().cast();
        // SAFETY: KVM reads `num_pages` bits from `dirty_bitmap`, which holds
        // one bit per page of the slot (the bitmap KVM_GET_DIRTY_LOG gave);
        // the struct and bitmap live across the call.
        let ret = unsafe { ioctl_with_ref(&*self.vm, KVM_CLEAR_DIRTY_LOG(), &clear) };
        if ret < 0 {
            return Err(MemoryError::Kvm(
                "KVM_CLEAR_DIRTY_LOG",
                kvm_ioctls::Error::last(),
            ));
        }
        Ok(())
    }
}

impl LogBackend for MemoryManager {
    fn set_logging(&self, slot: u32, on: bool) -> Result<(), MemoryError> {
        self.with_slot(slot, |s| self.set_region(slot, s, on))
    }

    fn fetch(&self, slot: u32) -> Result<Vec<u64>, MemoryError> {
        let (kind, len) = self.with_slot(slot, |s| Ok((s.kind.clone(), s.len)))?;
        let mut bitmap = self
            .vm
            .get_dirty_log(slot, len)
            .map_err(|e| MemoryError::Kvm("KVM_GET_DIRTY_LOG", e))?;
        // With manual protection, reading neither empties the log nor
        // re-protects the pages: clear exactly what was read.
        if self.manual_protect && bitmap.iter().any(|&w| w != 0) {
            self.clear_log(slot, len / PAGE_SIZE, &mut bitmap)?;
        }
        if let SlotKind::Ram(index) = kind {
            if let Some(vmm) = self.vmm_writes(index) {
                for (word, vmm_word) in bitmap.iter_mut().zip(vmm.get_and_reset()) {
                    *word |= vmm_word;
                }
            }
        }
        Ok(bitmap)
    }

    fn forget_vmm_writes(&self, slot: u32) {
        if let Ok(SlotKind::Ram(index)) = self.with_slot(slot, |s| Ok(s.kind.clone())) {
            if let Some(vmm) = self.vmm_writes(index) {
                vmm.reset();
            }
        }
    }
}

/// One consumer's view of the dirty logs of some slots; logging of a slot
/// stops when its last reader is dropped.
pub struct DirtyLogReader {
    manager: Arc<MemoryManager>,
    id: ReaderId,
    slots: Vec<u32>,
}

impl DirtyLogReader {
    /// The slots read, in the order given.
    pub fn slots(&self) -> &[u32] {
        &self.slots
    }

    /// The pages of `slot` written since this reader last looked, one bit
    /// per page (64 pages a word); they are re-armed, so a write after
    /// this call shows in the next.
    pub fn harvest(&self, slot: u32) -> Result<Vec<u64>, MemoryError> {
        self.manager.logs.harvest(&*self.manager, slot, self.id)
    }
}

impl Drop for DirtyLogReader {
    fn drop(&mut self) {
        for &slot in &self.slots {
            self.manager.logs.detach(&*self.manager, slot, self.id);
        }
    }
}
