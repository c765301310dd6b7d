//! PCI: configuration-space access through the legacy I/O ports, the root
//! bus and the functions on it. Linux probes configuration mechanism #1 at
//! boot and calls it fatal when nothing answers, so every VM has the port
//! pair and a host bridge; virtio devices sit on the same bus.

pub mod config_io;
pub mod config_space;
pub mod host_bridge;
pub mod msix;

pub use config_io::{PciConfigIo, PCI_CONFIG_IO_PORT, PCI_CONFIG_IO_PORT_COUNT};
pub use config_space::{Bar, BarKind, PciConfigSpace, PciIdentity};
pub use host_bridge::HostBridge;

/// A BAR the guest moved: where it was and where it is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarMove {
    pub old: u64,
    pub new: u64,
    pub size: u64,
}

/// One PCI function's configuration space, accessed in aligned dwords.
pub trait PciDevice: Send {
    /// Reads the dword at `reg` (a dword index, 0..64).
    fn read_config(&mut self, reg: usize) -> u32;
    /// Writes `value` to the bytes of dword `reg` selected by `mask`;
    /// returns a BAR the write moved, for the bus to follow.
    fn write_config(&mut self, reg: usize, value: u32, mask: u32) -> Option<BarMove>;
}

/// Where the 32-bit PCI memory window lives: device BARs are allocated
/// here, below the display's framebuffer (arch::layout).
pub const PCI_MMIO_START: u64 = 0xc000_0000;
pub const PCI_MMIO_END: u64 = 0xe000_0000;

/// Hands out BAR addresses in the PCI memory window, naturally aligned.
pub struct BarAllocator {
    next: u64,
}

impl Default for BarAllocator {
    fn default() -> Self {
        BarAllocator {
            next: PCI_MMIO_START,
        }
    }
}

impl BarAllocator {
    /// An address for a BAR of `size` bytes (a power of two), if it fits.
    pub fn allocate(&mut self, size: u64) -> Option<u64> {
        let address = self.next.checked_next_multiple_of(size)?;
        let end = address.checked_add(size)?;
        (end <= PCI_MMIO_END).then(|| {
            self.next = end;
            address
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_are_aligned_and_stay_in_the_window() {
        let mut a = BarAllocator::default();
        assert_eq!(a.allocate(0x1000), Some(0xc000_0000));
        assert_eq!(a.allocate(0x8000), Some(0xc000_8000));
        assert_eq!(a.allocate(0x1000), Some(0xc001_0000));
        assert_eq!(a.allocate(1 << 30), None, "does not fit below the IOAPIC");
    }
}
