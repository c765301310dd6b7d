//! A type-0 PCI configuration header: identity registers, command/status,
//! memory BARs whose sizes the guest discovers the usual way (write all
//! ones, read back the mask), and a capability list.
//!
//! Each dword has a writable mask, so sizing a BAR is simply "the bits
//! below the size are read-only zero".

/// Capability list pointer, in the header.
const CAPABILITY_POINTER: usize = 0x34;
/// First byte after the standard header, where capabilities go.
const FIRST_CAPABILITY: usize = 0x40;
const STATUS_CAPABILITIES: u32 = 1 << 20; // bit 4 of the status register
const COMMAND_WRITABLE: u32 = 0x0000_0407; // I/O, memory, bus master, INTx disable
const BAR0_REG: usize = 4;
const BAR_COUNT: usize = 6;
/// BAR type bits: 64-bit memory BAR; prefetchable memory.
const BAR_MEM64: u32 = 0b100;
const BAR_PREFETCHABLE: u32 = 0b1000;

/// Identity of a PCI function.
#[derive(Clone, Copy, Debug)]
pub struct PciIdentity {
    pub vendor: u16,
    pub device: u16,
    /// Base class, subclass, programming interface.
    pub class: (u8, u8, u8),
    pub revision: u8,
    pub subsystem_vendor: u16,
    pub subsystem: u16,
}

/// A memory BAR the VMM placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bar {
    pub index: usize,
    pub address: u64,
    pub size: u64,
    /// A 64-bit BAR: registers `index` and `index + 1`.
    pub wide: bool,
}

/// The type bits of a memory BAR (the register's low nibble).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BarKind {
    /// 64-bit (two registers) rather than 32-bit.
    pub wide: bool,
    pub prefetchable: bool,
}

impl BarKind {
    /// The kind a BAR register's low nibble says (bit 0 must be clear:
    /// memory, not I/O).
    pub fn from_register(register: u32) -> BarKind {
        BarKind {
            wide: register & 0b110 == BAR_MEM64,
            prefetchable: register & BAR_PREFETCHABLE != 0,
        }
    }

    fn bits(self) -> u32 {
        (if self.wide { BAR_MEM64 } else { 0 })
            | (if self.prefetchable {
                BAR_PREFETCHABLE
            } else {
                0
            })
    }
}

/// The 256-byte configuration space of one function.
pub struct PciConfigSpace {
    regs: [u32; 64],
    writable: [u32; 64],
    bars: Vec<Bar>,
    next_capability: usize,
    last_capability: Option<usize>,
}

impl PciConfigSpace {
    pub fn new(id: PciIdentity) -> Self {
        let mut regs = [0u32; 64];
        let mut writable = [0u32; 64];
        regs[0] = (u32::from(id.device) << 16) | u32::from(id.vendor);
        writable[1] = COMMAND_WRITABLE;
        let (class, subclass, prog_if) = id.class;
        regs[2] = (u32::from(class) << 24)
            | (u32::from(subclass) << 16)
            | (u32::from(prog_if) << 8)
            | u32::from(id.revision);
        regs[11] = (u32::from(id.subsystem) << 16) | u32::from(id.subsystem_vendor);
        writable[15] = 0xff; // interrupt line: scratch for the OS
        PciConfigSpace {
            regs,
            writable,
            bars: Vec::new(),
            next_capability: FIRST_CAPABILITY,
            last_capability: None,
        }
    }

    /// Adds a 64-bit memory BAR at `index` (uses `index` and `index + 1`),
    /// placed at `address`; `size` must be a power of two ≥ 4 KiB.
    pub fn add_bar64(&mut self, index: usize, address: u64, size: u64) {
        let kind = BarKind {
            wide: true,
            prefetchable: false,
        };
        self.add_memory_bar(index, address, size, kind);
    }

    /// Adds a memory BAR of `kind` at `index` (a 64-bit one also uses
    /// `index + 1`), placed at `address`; `size` must be a power of two
    /// ≥ 16 bytes that the address is aligned to, and a 32-bit BAR must lie
    /// below 4 GiB.
    pub fn add_memory_bar(&mut self, index: usize, address: u64, size: u64, kind: BarKind) {
        let last = index + usize::from(kind.wide);
        assert!(
            last < BAR_COUNT
                && size.is_power_of_two()
                && size >= 16
                && address.is_multiple_of(size)
                && (kind.wide || address + size <= 1 << 32)
        );
        let reg = BAR0_REG + index;
        self.regs[reg] = (address as u32) | kind.bits();
        self.writable[reg] = !((size - 1) as u32) & !0xf;
        if kind.wide {
            self.regs[reg + 1] = (address >> 32) as u32;
            self.writable[reg + 1] = !((size - 1) >> 32) as u32;
        }
        self.bars.push(Bar {
            index,
            address,
            size,
            wide: kind.wide,
        });
    }

    /// Appends a capability (`bytes[0]` is its id; byte 1, the next
    /// pointer, is filled in); returns its offset. `writable` gives the
    /// writable bits of each of its dwords.
    pub fn add_capability(&mut self, bytes: &[u8], writable: &[u32]) -> usize {
        let offset = self.next_capability;
        let len = bytes.len().next_multiple_of(4);
        assert!(offset + len <= 256, "configuration space full");
        for (i, b) in bytes.iter().enumerate() {
            let byte = offset + i;
            let shift = 8 * (byte % 4);
            self.regs[byte / 4] =
                (self.regs[byte / 4] & !(0xff << shift)) | (u32::from(*b) << shift);
        }
        for (i, mask) in writable.iter().enumerate() {
            self.writable[offset / 4 + i] = *mask;
        }
        match self.last_capability {
            None => {
                self.regs[CAPABILITY_POINTER / 4] = offset as u32;
                self.regs[1] |= STATUS_CAPABILITIES;
            }
            Some(prev) => self.set_byte(prev + 1, offset as u8),
        }
        self.set_byte(offset + 1, 0);
        self.last_capability = Some(offset);
        self.next_capability = offset + len;
        offset
    }

    fn set_byte(&mut self, byte: usize, value: u8) {
        let shift = 8 * (byte % 4);
        self.regs[byte / 4] =
            (self.regs[byte / 4] & !(0xff << shift)) | (u32::from(value) << shift);
    }

    pub fn read(&self, reg: usize) -> u32 {
        self.regs.get(reg).copied().unwrap_or(0xffff_ffff)
    }

    /// Writes the writable bits of dword `reg` under `mask`; returns a BAR
    /// whose address the guest changed (not a sizing probe).
    pub fn write(&mut self, reg: usize, value: u32, mask: u32) -> Option<(Bar, u64)> {
        let (Some(old), Some(&writable)) = (self.regs.get(reg).copied(), self.writable.get(reg))
        else {
            return None;
        };
        let bits = writable & mask;
        let new = (old & !bits) | (value & bits);
        self.regs[reg] = new;
        self.bar_moved(reg, value, bits)
    }

    /// The BAR at `reg` and its new address, if the guest moved it.
    fn bar_moved(&mut self, reg: usize, value: u32, bits: u32) -> Option<(Bar, u64)> {
        let i = self
            .bars
            .iter()
            .position(|b| reg == BAR0_REG + b.index || (b.wide && reg == BAR0_REG + b.index + 1))?;
        if value & bits == bits {
            return None; // all ones: the guest is sizing the BAR
        }
        let low = BAR0_REG + self.bars[i].index;
        let wide = self.bars[i].wide;
        // While either half still holds its sizing mask, the address is a
        // transient of the probe, not a place to move to.
        if self.regs[low] & !0xf == self.writable[low]
            || (wide && self.regs[low + 1] == self.writable[low + 1])
        {
            return None;
        }
        let high = if wide { self.regs[low + 1] } else { 0 };
        let address = (u64::from(high) << 32) | u64::from(self.regs[low] & !0xf);
        let bar = self.bars[i];
        if address == bar.address || !address.is_multiple_of(bar.size) {
            return None;
        }
        self.bars[i].address = address;
        Some((bar, address))
    }

    /// Where each BAR is now.
    pub fn bars(&self) -> &[Bar] {
        &self.bars
    }

    /// The 64 registers as the guest sees them now (for a snapshot).
    pub fn registers(&self) -> Vec<u32> {
        self.regs.to_vec()
    }

    /// Puts saved registers back, with each BAR (in the order of
    /// [`bars`](Self::bars)) at the address it had. The saved registers
    /// must be those of a function like this one: every bit the guest
    /// cannot write (identity, class, capability layout, BAR types) must
    /// be the same. The registers of a BAR the guest was sizing hold its
    /// mask; the BAR stays at `bar_addresses` all the same.
    pub fn restore_registers(&mut self, regs: &[u32], bar_addresses: &[u64]) -> Result<(), String> {
        if regs.len() != self.regs.len() {
            return Err(format!(
                "{} configuration registers, not {}",
                regs.len(),
                self.regs.len()
            ));
        }
        if bar_addresses.len() != self.bars.len() {
            return Err(format!(
                "{} BAR addresses for {} BARs",
                bar_addresses.len(),
                self.bars.len()
            ));
        }
        if let Some(reg) =
            (0..regs.len()).find(|&i| (regs[i] ^ self.regs[i]) & !self.writable[i] != 0)
        {
            return Err(format!(
                "configuration register {:#x} is {:#010x}, this function has {:#010x} in its read-only bits",
                reg * 4,
                regs[reg],
                self.regs[reg]
            ));
        }
        for (bar, &address) in self.bars.iter().zip(bar_addresses) {
            if address == 0 || !address.is_multiple_of(bar.size) {
                return Err(format!(
                    "BAR {} at {address:#x} is not aligned to its size {:#x}",
                    bar.index, bar.size
                ));
            }
        }
        self.regs.copy_from_slice(regs);
        for (bar, &address) in self.bars.iter_mut().zip(bar_addresses) {
            bar.address = address;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> PciConfigSpace {
        PciConfigSpace::new(PciIdentity {
            vendor: 0x1af4,
            device: 0x1044,
            class: (0xff, 0, 0),
            revision: 1,
            subsystem_vendor: 0x1af4,
            subsystem: 0x40,
        })
    }

    #[test]
    fn identity_registers() {
        let s = space();
        assert_eq!(s.read(0), 0x1044_1af4);
        assert_eq!(s.read(2), 0xff00_0001);
        assert_eq!(s.read(11), 0x0040_1af4);
    }

    #[test]
    fn bar_sizing_reads_back_the_size_and_restoring_is_not_a_move() {
        let mut s = space();
        s.add_bar64(0, 0xc000_0000, 0x8000);
        assert_eq!(s.read(4), 0xc000_0004);
        assert_eq!(s.write(4, 0xffff_ffff, 0xffff_ffff), None);
        assert_eq!(s.read(4), 0xffff_8004, "size 32 KiB, 64-bit memory BAR");
        assert_eq!(s.write(5, 0xffff_ffff, 0xffff_ffff), None);
        assert_eq!(s.read(5), 0xffff_ffff);
        // Restoring the original address is no move.
        s.write(5, 0, 0xffff_ffff);
        assert_eq!(s.write(4, 0xc000_0000, 0xffff_ffff), None);
        assert_eq!(s.bars()[0].address, 0xc000_0000);
    }

    #[test]
    fn linux_order_of_sizing_is_not_a_move_either() {
        let mut s = space();
        s.add_bar64(0, 0xc000_0000, 0x8000);
        for (reg, original) in [(4, 0xc000_0000u32), (5, 0)] {
            assert_eq!(s.write(reg, 0xffff_ffff, 0xffff_ffff), None);
            assert_eq!(s.write(reg, original, 0xffff_ffff), None);
        }
        assert_eq!(s.bars()[0].address, 0xc000_0000);
    }

    #[test]
    fn a_32_bit_prefetchable_bar_sizes_and_moves_in_one_register() {
        let mut s = space();
        let kind = BarKind {
            wide: false,
            prefetchable: true,
        };
        s.add_memory_bar(2, 0xc002_0000, 0x2_0000, kind);
        assert_eq!(s.read(6), 0xc002_0008);
        assert_eq!(BarKind::from_register(s.read(6)), kind);
        assert_eq!(s.write(6, 0xffff_ffff, 0xffff_ffff), None);
        assert_eq!(s.read(6), 0xfffe_0008, "size 128 KiB");
        assert_eq!(s.write(6, 0xc002_0000, 0xffff_ffff), None);
        // The next register is not part of this BAR.
        assert_eq!(s.write(7, 0xffff_ffff, 0xffff_ffff), None);
        assert_eq!(s.read(7), 0);
        let (old, new) = s.write(6, 0xd000_0000, 0xffff_ffff).unwrap();
        assert_eq!((old.address, new), (0xc002_0000, 0xd000_0000));
        assert_eq!(s.bars()[0].address, 0xd000_0000);
    }

    #[test]
    fn moving_a_bar_is_reported() {
        let mut s = space();
        s.add_bar64(0, 0xc000_0000, 0x8000);
        let (old, new) = s.write(4, 0xd000_0000, 0xffff_ffff).unwrap();
        assert_eq!((old.address, new), (0xc000_0000, 0xd000_0000));
        assert_eq!(s.bars()[0].address, 0xd000_0000);
    }

    #[test]
    fn capabilities_are_chained() {
        let mut s = space();
        let first = s.add_capability(&[0x09, 0, 0x10, 1, 2, 3], &[]);
        let second = s.add_capability(&[0x11, 0, 0, 0], &[0xc000_0000]);
        assert_eq!(first, 0x40);
        assert_eq!(second, 0x48);
        assert_ne!(s.read(1) & STATUS_CAPABILITIES, 0);
        assert_eq!(s.read(0x34 / 4) & 0xff, 0x40);
        assert_eq!(
            (s.read(0x40 / 4) >> 8) & 0xff,
            0x48,
            "first points to second"
        );
        assert_eq!((s.read(0x48 / 4) >> 8) & 0xff, 0, "second ends the list");
        // Only the writable bits change.
        s.write(0x48 / 4, 0xffff_ffff, 0xffff_ffff);
        assert_eq!(s.read(0x48 / 4), 0xc000_0011);
    }

    #[test]
    fn registers_are_restored_and_foreign_ones_refused() {
        let mut s = space();
        s.add_bar64(0, 0xc000_0000, 0x8000);
        s.write(1, 0x0006, 0xffff); // memory and bus master on
        s.write(4, 0xd000_0000, 0xffff_ffff);
        let saved = s.registers();

        let mut fresh = space();
        fresh.add_bar64(0, 0xc000_0000, 0x8000);
        fresh.restore_registers(&saved, &[0xd000_0000]).unwrap();
        assert_eq!(fresh.read(1) & 0xffff, 0x0006);
        assert_eq!(fresh.read(4), 0xd000_0004);
        assert_eq!(fresh.bars()[0].address, 0xd000_0000);

        // Another device id, a short list, a misaligned BAR: refused, and
        // nothing changed.
        let mut other = saved.clone();
        other[0] = 0x1041_1af4;
        let mut target = space();
        target.add_bar64(0, 0xc000_0000, 0x8000);
        let err = target
            .restore_registers(&other, &[0xd000_0000])
            .unwrap_err();
        assert!(err.contains("register 0x0"), "{err}");
        assert!(target
            .restore_registers(&saved[..10], &[0xd000_0000])
            .is_err());
        assert!(target.restore_registers(&saved, &[0xd000_1000]).is_err());
        assert!(target.restore_registers(&saved, &[]).is_err());
        assert_eq!(target.read(4), 0xc000_0004);
        assert_eq!(target.bars()[0].address, 0xc000_0000);
    }

    #[test]
    fn read_only_registers_ignore_writes() {
        let mut s = space();
        s.write(0, 0, 0xffff_ffff);
        assert_eq!(s.read(0), 0x1044_1af4);
        assert_eq!(s.read(200), 0xffff_ffff);
        assert_eq!(s.write(200, 1, 1), None);
    }
}
