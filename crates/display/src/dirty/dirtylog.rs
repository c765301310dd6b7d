//! "Page-table lookup" (the paper's dirty-bit method): KVM's dirty log of
//! the framebuffer's memory slot.
//!
//! KVM write-protects (or, on Intel with PML, logs) the slot's pages in its
//! own page tables; a guest write sets the page's bit. Where the kernel has
//! `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`, reading the log does not re-protect:
//! we read, then clear (re-protect) exactly the pages we saw, then the
//! caller reads their contents — a write after the clear is seen next time.
//! Reading without clearing is also a cheap probe for `refresh=event`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvm_bindings::{
    kvm_clear_dirty_log, kvm_enable_cap, kvm_userspace_memory_region,
    KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2, KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE,
    KVM_MEM_LOG_DIRTY_PAGES,
};
use kvm_ioctls::VmFd;
use vmm_sys_util::ioctl::ioctl_with_ref;
use vmm_sys_util::ioctl_iowr_nr;

use super::{DirtyError, DirtyMethod, DirtyTracker, PageSet, TrackerCounters};
use crate::framebuffer::FramebufferMemory;
use crate::layout::PAGE_SIZE;

const KVMIO: u32 = 0xAE;
ioctl_iowr_nr!(KVM_CLEAR_DIRTY_LOG, KVMIO, 0xc0, kvm_clear_dirty_log);

/// How often `wait_for_write` looks at the dirty log.
const PROBE_INTERVAL: Duration = Duration::from_millis(2);

/// The framebuffer's KVM memory slot; turns dirty logging on and off.
pub struct FramebufferSlot {
    vm: Arc<VmFd>,
    slot: u32,
    guest_address: u64,
    memory: Arc<FramebufferMemory>,
    /// KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 is on for this VM.
    manual_protect: AtomicBool,
}

impl FramebufferSlot {
    /// Registers the framebuffer with KVM as slot `slot` at `guest_address`.
    pub fn register(
        vm: Arc<VmFd>,
        slot: u32,
        guest_address: u64,
        memory: Arc<FramebufferMemory>,
    ) -> Result<FramebufferSlot, DirtyError> {
        let fb = FramebufferSlot {
            vm,
            slot,
            guest_address,
            memory,
            manual_protect: AtomicBool::new(false),
        };
        fb.set_logging(false)?;
        Ok(fb)
    }

    pub fn memory(&self) -> &Arc<FramebufferMemory> {
        &self.memory
    }

    pub fn guest_address(&self) -> u64 {
        self.guest_address
    }

    /// Turns KVM's dirty logging of the slot on or off (KVM allows changing
    /// just this flag of a live slot).
    pub fn set_logging(&self, on: bool) -> Result<(), DirtyError> {
        let region = kvm_userspace_memory_region {
            slot: self.slot,
            flags: if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
            guest_phys_addr: self.guest_address,
            memory_size: self.memory.len() as u64,
            userspace_addr: self.memory.host_address() as u64,
        };
        // SAFETY: the framebuffer mapping outlives the VM's use of it (the
        // slot holds an Arc of it, and the VM is torn down before the
        // display); the guest range is reserved for it in the memory map.
        unsafe { self.vm.set_user_memory_region(region) }
            .map_err(|e| DirtyError::Kvm("KVM_SET_USER_MEMORY_REGION", e))
    }

    /// Asks for manual dirty-log protection once; false where the kernel
    /// does not have it (then reading the log also re-protects).
    fn enable_manual_protect(&self) -> bool {
        if self.manual_protect.load(Ordering::Relaxed) {
            return true;
        }
        let cap = kvm_enable_cap {
            cap: KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
            args: [u64::from(KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE), 0, 0, 0],
            ..Default::default()
        };
        let on = self.vm.enable_cap(&cap).is_ok();
        self.manual_protect.store(on, Ordering::Relaxed);
        on
    }

    fn read_log(&self) -> Result<Vec<u64>, DirtyError> {
        self.vm
            .get_dirty_log(self.slot, self.memory.len())
            .map_err(|e| DirtyError::Kvm("KVM_GET_DIRTY_LOG", e))
    }

    fn clear_log(&self, bitmap: &mut [u64]) -> Result<(), DirtyError> {
        let mut clear = kvm_clear_dirty_log {
            slot: self.slot,
            num_pages: (self.memory.len() / PAGE_SIZE) as u32,
            first_page: 0,
            ..Default::default()
        };
        clear.__bindgen_anon_1.dirty_bitmap = bitmap.as_mut_ptr().cast();
        // SAFETY: KVM reads `num_pages` bits from `dirty_bitmap`, which holds
        // one bit per page of the slot (the bitmap KVM_GET_DIRTY_LOG gave);
        // the struct and bitmap live across the call.
        let ret = unsafe { ioctl_with_ref(&*self.vm, KVM_CLEAR_DIRTY_LOG(), &clear) };
        if ret < 0 {
            return Err(DirtyError::Kvm(
                "KVM_CLEAR_DIRTY_LOG",
                kvm_ioctls::Error::last(),
            ));
        }
        Ok(())
    }
}

pub struct DirtyLogTracker {
    slot: Arc<FramebufferSlot>,
    manual: bool,
    /// Pages seen by probes but not yet handed out.
    pending: PageSet,
    counters: TrackerCounters,
}

impl DirtyLogTracker {
    /// Starts logging. The first harvest reports every page (the caller's
    /// copy may be stale from another method).
    pub fn new(slot: Arc<FramebufferSlot>) -> Result<DirtyLogTracker, DirtyError> {
        let manual = slot.enable_manual_protect();
        slot.set_logging(true)?;
        let mut pending = PageSet::new(slot.memory.len() / PAGE_SIZE);
        pending.insert_all();
        Ok(DirtyLogTracker {
            slot,
            manual,
            pending,
            counters: TrackerCounters::default(),
        })
    }

    /// Whether KVM's manual protection is in use (reported in metrics).
    pub fn manual_protect(&self) -> bool {
        self.manual
    }

    fn read(&mut self) -> Result<Vec<u64>, DirtyError> {
        self.counters.log_reads += 1;
        self.slot.read_log()
    }
}

impl DirtyTracker for DirtyLogTracker {
    fn method(&self) -> DirtyMethod {
        DirtyMethod::DirtyLog
    }

    fn harvest(&mut self, out: &mut PageSet) -> Result<(), DirtyError> {
        let mut bitmap = self.read()?;
        if self.manual && bitmap.iter().any(|&w| w != 0) {
            self.slot.clear_log(&mut bitmap)?;
        }
        out.merge_words(&bitmap);
        out.merge(&self.pending);
        self.pending.clear();
        Ok(())
    }

    fn wait_for_write(&mut self, timeout: Duration) -> Result<bool, DirtyError> {
        let deadline = Instant::now() + timeout;
        loop {
            let bitmap = self.read()?;
            // Without manual protection this read re-protected the pages:
            // keep them for the next harvest.
            self.pending.merge_words(&bitmap);
            if !self.pending.is_empty() {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            std::thread::sleep(PROBE_INTERVAL.min(deadline - now));
        }
    }

    fn counters(&self) -> TrackerCounters {
        self.counters
    }
}

impl Drop for DirtyLogTracker {
    fn drop(&mut self) {
        if let Err(e) = self.slot.set_logging(false) {
            tracing::warn!("display: cannot stop dirty logging: {e}");
        }
    }
}
