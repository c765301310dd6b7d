//! The host bridge at 00:00.0: what makes Linux's sanity check of
//! configuration mechanism #1 pass (it looks for a host-bridge class).

use super::{BarMove, PciDevice};

/// Vendor/device of the host bridge (the ids Cloud Hypervisor also uses).
const VENDOR_INTEL: u32 = 0x8086;
const DEVICE_HOST_BRIDGE: u32 = 0x0d57;
/// Class 06 (bridge), subclass 00 (host), prog-if 00; revision 0.
const CLASS_HOST_BRIDGE: u32 = 0x0600_0000;

/// A host bridge with no resources: read-only identity registers.
#[derive(Default)]
pub struct HostBridge;

impl PciDevice for HostBridge {
    fn read_config(&mut self, reg: usize) -> u32 {
        match reg {
            0 => (DEVICE_HOST_BRIDGE << 16) | VENDOR_INTEL,
            2 => CLASS_HOST_BRIDGE,
            _ => 0, // header type 0, no BARs, no capabilities
        }
    }

    fn write_config(&mut self, _reg: usize, _value: u32, _mask: u32) -> Option<BarMove> {
        None
    }
}
