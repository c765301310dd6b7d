//! Configuration mechanism #1: the address register at 0xcf8 selects
//! bus/device/function/register, the data window at 0xcfc..0xcff reads
//! or writes it. Absent functions read as all ones, as on hardware.

use std::sync::{Arc, Mutex};

use super::{BarMove, PciDevice};
use crate::bus::{Bus, BusDevice};

/// First port of the mechanism (address register), and the port count
/// including the data window.
pub const PCI_CONFIG_IO_PORT: u16 = 0xcf8;
pub const PCI_CONFIG_IO_PORT_COUNT: u16 = 8;

const ENABLE_BIT: u32 = 1 << 31;
const DATA_OFFSET: u64 = 4;

/// A function on the bus, shared with the MMIO bus that maps its BARs.
pub type SharedPciDevice = Arc<Mutex<dyn PciDevice>>;

/// The port pair and the functions of bus 0 (indexed by devfn). When the
/// guest moves a BAR, the MMIO bus mapping follows.
pub struct PciConfigIo {
    address: u32,
    functions: Vec<Option<SharedPciDevice>>,
    mmio: Arc<Bus>,
}

impl PciConfigIo {
    pub fn new(mmio: Arc<Bus>) -> Self {
        PciConfigIo {
            address: 0,
            functions: (0..256).map(|_| None).collect(),
            mmio,
        }
    }

    /// Puts `function` at device `device`, function 0, of bus 0.
    pub fn add_function(&mut self, device: u8, function: SharedPciDevice) {
        if let Some(slot) = self.functions.get_mut(usize::from(device & 0x1f) << 3) {
            *slot = Some(function);
        }
    }

    /// The first free device number, if any (device 0 is the host bridge).
    pub fn free_device(&self) -> Option<u8> {
        (1..32u8).find(|d| self.functions[usize::from(*d) << 3].is_none())
    }

    /// The function and dword the address register selects, if any.
    fn selected(&self) -> Option<(SharedPciDevice, usize)> {
        if self.address & ENABLE_BIT == 0 || (self.address >> 16) & 0xff != 0 {
            return None; // disabled, or a bus other than 0
        }
        let devfn = ((self.address >> 8) & 0xff) as usize;
        let reg = ((self.address >> 2) & 0x3f) as usize;
        self.functions[devfn].clone().map(|f| (f, reg))
    }

    fn follow(&self, moved: BarMove) {
        if let Err(e) = self.mmio.relocate(moved.old, moved.new) {
            tracing::warn!(
                "PCI BAR {:#x} cannot move to {:#x}: {e}",
                moved.old,
                moved.new
            );
        }
    }
}

/// Bits of a dword that an access of `len` bytes at byte `offset` covers.
fn lane_mask(offset: u64, len: usize) -> Option<(u32, u32)> {
    let shift = u32::try_from(offset).ok()?.checked_mul(8)?;
    let mask = match len {
        1 => 0xff,
        2 => 0xffff,
        4 => 0xffff_ffff,
        _ => return None,
    };
    (offset as usize + len <= 4).then_some((mask << shift, shift))
}

impl BusDevice for PciConfigIo {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let dword = if offset < DATA_OFFSET {
            self.address
        } else {
            self.selected().map_or(0xffff_ffff, |(f, reg)| {
                f.lock().unwrap_or_else(|e| e.into_inner()).read_config(reg)
            })
        };
        let Some((mask, shift)) = lane_mask(offset % 4, data.len()) else {
            data.fill(0xff);
            return;
        };
        let value = (dword & mask) >> shift;
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = (value >> (8 * i)) as u8;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some((mask, shift)) = lane_mask(offset % 4, data.len()) else {
            return;
        };
        let value = data
            .iter()
            .rev()
            .fold(0u32, |acc, b| (acc << 8) | u32::from(*b))
            << shift;
        if offset < DATA_OFFSET {
            self.address = (self.address & !mask) | (value & mask);
        } else if let Some((f, reg)) = self.selected() {
            let moved = f
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_config(reg, value, mask);
            if let Some(moved) = moved {
                self.follow(moved);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::HostBridge;

    fn config_io() -> PciConfigIo {
        let mut io = PciConfigIo::new(Arc::new(Bus::new()));
        io.add_function(0, Arc::new(Mutex::new(HostBridge)));
        io
    }

    fn read32(io: &mut PciConfigIo, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        io.read(offset, &mut data);
        u32::from_le_bytes(data)
    }

    fn select(io: &mut PciConfigIo, devfn: u32, reg: u32) {
        io.write(0, &(ENABLE_BIT | (devfn << 8) | (reg << 2)).to_le_bytes());
    }

    #[test]
    fn address_register_reads_back_as_linux_probes_it() {
        let mut io = config_io();
        io.write(3, &[0x01]); // outb(0x01, 0xcfb)
        io.write(0, &0x8000_0000u32.to_le_bytes());
        assert_eq!(read32(&mut io, 0), 0x8000_0000);
    }

    #[test]
    fn host_bridge_is_found_and_others_are_absent() {
        let mut io = config_io();
        select(&mut io, 0, 0);
        assert_eq!(read32(&mut io, 4), 0x0d57_8086);
        select(&mut io, 0, 2);
        let mut class = [0u8; 2];
        io.read(6, &mut class); // PCI_CLASS_DEVICE, a 2-byte read at 0xcfe
        assert_eq!(u16::from_le_bytes(class), 0x0600);
        select(&mut io, 1 << 3, 0);
        assert_eq!(read32(&mut io, 4), 0xffff_ffff);
    }

    #[test]
    fn disabled_or_other_bus_reads_all_ones() {
        let mut io = config_io();
        io.write(0, &0u32.to_le_bytes());
        assert_eq!(read32(&mut io, 4), 0xffff_ffff);
        io.write(0, &(ENABLE_BIT | (1 << 16)).to_le_bytes());
        assert_eq!(read32(&mut io, 4), 0xffff_ffff);
    }

    #[test]
    fn odd_sizes_and_offsets_are_harmless() {
        let mut io = config_io();
        let mut three = [0u8; 3];
        io.read(4, &mut three);
        assert_eq!(three, [0xff; 3]);
        io.write(6, &[1, 2, 3, 4]); // crosses the dword: ignored
        io.write(0x1000, &[1]);
    }
}
