//! Devices of a hakoniwa VM and the buses that reach them.
//!
//! `legacy` holds the PC platform devices a stock kernel expects (16550
//! serial, i8042 reset line, the ACPI power-management registers) and the
//! debug-exit port that lets a guest end the VM with an exit status.

pub mod affinity;
pub mod bus;
pub mod host_irq;
pub mod interrupt;
pub mod legacy;
pub mod options;
pub mod pci;
pub mod vfio;
pub mod virtio;

pub use bus::{Bus, BusDevice, BusError, SharedDevice};

use std::sync::Arc;

/// Guest memory as every part of hakoniwa sees it. The bitmap records the
/// VMM's own writes into guest RAM (virtio devices), which KVM's dirty log
/// cannot see; migration and the display merge the two.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<vm_memory::bitmap::AtomicBitmap>;

/// A request from the guest to end the VM, raised by a platform device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlatformExit {
    /// ACPI soft-off (S5).
    PowerOff,
    /// ACPI reset register or i8042 CPU reset.
    Reboot,
    /// A byte written to the debug-exit port: the VMM's exit status.
    DebugExit(u8),
}

/// Where platform devices report [`PlatformExit`]s; the VMM decides what
/// they mean (e.g. stop every vCPU and exit).
pub type ExitNotifier = Arc<dyn Fn(PlatformExit) + Send + Sync>;

/// A notifier that records what it is told, for device tests.
#[cfg(test)]
pub(crate) fn recording_notifier() -> (ExitNotifier, Arc<std::sync::Mutex<Vec<PlatformExit>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    (Arc::new(move |e| sink.lock().unwrap().push(e)), seen)
}
