//! PCI: configuration-space access through the legacy I/O ports and the
//! functions on bus 0. Linux probes configuration mechanism #1 at boot and
//! calls it fatal when nothing answers, so even a VM without PCI devices
//! has the port pair and a host bridge.

pub mod config_io;
pub mod host_bridge;

pub use config_io::{PciConfigIo, PCI_CONFIG_IO_PORT, PCI_CONFIG_IO_PORT_COUNT};
pub use host_bridge::HostBridge;

/// One PCI function's configuration space, accessed in aligned dwords.
pub trait PciFunction: Send {
    /// Reads the dword at `reg` (a dword index, 0..64).
    fn read_config(&self, reg: usize) -> u32;
    /// Writes `value` to the bytes of dword `reg` selected by `mask`.
    fn write_config(&mut self, reg: usize, value: u32, mask: u32);
}
