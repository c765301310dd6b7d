//! The configuration space a passed-through function shows the guest: the
//! host function's own registers, except those a VMM must emulate. Pure:
//! it decides what each access means and leaves the doing to the device
//! (crate::vfio::device), so every rule here is tested without VFIO.
//!
//! Emulated: the BARs (the guest sees our addresses, sizes itself the usual
//! way and may move them), the expansion ROM and I/O BARs (hidden: not
//! offered), the interrupt line (set to the INTx line's GSI, as firmware
//! would; scratch for the guest) and pin (the host's, or none when VFIO
//! offers no INTx), the MSI capability (its message becomes a KVM
//! route, so the device's interrupts go through KVM to the vCPU without a
//! VMM thread) and the MSI-X capability's enable and function-mask bits
//! (the table itself is trapped in its BAR). Everything else reads and
//! writes the host function through VFIO, whose kernel side protects what
//! the host must keep (bus numbers, power state). The command register
//! goes to the function too, but its INTx-disable bit is watched: with the
//! MSI and MSI-X enables it decides [`IntxState`].

use crate::interrupt::MsiMessage;
use crate::pci::{BarKind, BarMove, PciConfigSpace, PciIdentity};

/// Bytes of configuration space reachable through mechanism #1.
pub const CONFIG_SIZE: usize = 256;
const COMMAND_REG: usize = 1;
/// Command register: the function must not assert INTx.
const COMMAND_INTX_DISABLE: u32 = 1 << 10;
const CAPABILITY_POINTER: usize = 0x34;
const STATUS_CAPABILITIES: u16 = 1 << 4;
const CAP_ID_MSI: u8 = 0x05;
const CAP_ID_MSIX: u8 = 0x11;
const BAR0_REG: usize = 4;
const BAR_COUNT: usize = 6;
const ROM_REG: usize = 12;
const INTERRUPT_REG: usize = 15;

const MSI_ENABLE: u16 = 1;
const MSI_MMC_SHIFT: u16 = 1;
const MSI_MME_SHIFT: u16 = 4;
const MSI_64BIT: u16 = 1 << 7;
/// Per-vector masking: not offered (the bit reads as clear), so a guest
/// never uses the mask and pending registers.
#[cfg(test)]
const MSI_PER_VECTOR_MASK: u16 = 1 << 8;
const MSIX_ENABLE: u16 = 1 << 15;
const MSIX_FUNCTION_MASK: u16 = 1 << 14;

/// A memory BAR of the host function, as VFIO and its register describe it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostBar {
    pub index: u32,
    /// The region's size (a power of two).
    pub size: u64,
    pub kind: BarKind,
}

/// What the host function's configuration space says: its memory BARs
/// (I/O BARs and empty ones left out) and interrupt capabilities.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostLayout {
    pub bars: Vec<HostBar>,
    /// I/O BARs the function has, which the guest does not see.
    pub hidden_io_bars: Vec<u32>,
    pub msi: Option<MsiCapability>,
    pub msix: Option<MsixCapability>,
    /// The INTx pin (1 = INTA .. 4 = INTD), 0 for none.
    pub interrupt_pin: u8,
    /// The command register's INTx-disable bit as read (clear after reset).
    pub intx_disabled: bool,
}

/// Where the MSI capability is and what it can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsiCapability {
    pub offset: usize,
    /// Address is 64 bits (the data word then sits 4 bytes later).
    pub wide: bool,
    /// log2 of the vectors the function can use.
    pub max_vectors_log2: u8,
}

/// Where the MSI-X capability, table and pending bits are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixCapability {
    pub offset: usize,
    pub vectors: u16,
    pub table_bar: u32,
    pub table_offset: u64,
    pub pba_bar: u32,
    pub pba_offset: u64,
}

impl MsixCapability {
    /// Bytes of the vector table (16 per vector).
    pub fn table_size(&self) -> u64 {
        u64::from(self.vectors) * 16
    }

    /// Bytes of the pending-bit array (a bit per vector, in qwords).
    pub fn pba_size(&self) -> u64 {
        u64::from(self.vectors).div_ceil(64) * 8
    }
}

fn dword(config: &[u8; CONFIG_SIZE], byte: usize) -> u32 {
    u32::from_le_bytes([
        config[byte],
        config[byte + 1],
        config[byte + 2],
        config[byte + 3],
    ])
}

fn word(config: &[u8; CONFIG_SIZE], byte: usize) -> u16 {
    u16::from_le_bytes([config[byte], config[byte + 1]])
}

impl HostLayout {
    /// Reads the layout from the host function's configuration space and
    /// the sizes of its BAR regions (`region_size(index)`, 0 if absent).
    /// A capability list that loops or points outside the space ends where
    /// it goes wrong; a malformed MSI-X capability (table outside its BAR)
    /// is an error, as the guest could not use it.
    pub fn read(
        config: &[u8; CONFIG_SIZE],
        region_size: impl Fn(u32) -> u64,
    ) -> Result<HostLayout, String> {
        let mut layout = HostLayout {
            interrupt_pin: match config[INTERRUPT_REG * 4 + 1] {
                pin @ 1..=4 => pin,
                _ => 0,
            },
            intx_disabled: dword(config, COMMAND_REG * 4) & COMMAND_INTX_DISABLE != 0,
            ..HostLayout::default()
        };
        let mut index = 0;
        while index < BAR_COUNT {
            let register = dword(config, (BAR0_REG + index) * 4);
            let this = index as u32;
            let kind = BarKind::from_register(register);
            index += 1;
            if register & 1 != 0 {
                layout.hidden_io_bars.push(this);
                continue;
            }
            if kind.wide {
                index += 1;
            }
            let size = region_size(this);
            if size == 0 {
                continue;
            }
            if !size.is_power_of_two() {
                return Err(format!("BAR {this} has size {size:#x}, not a power of two"));
            }
            if kind.wide && this as usize + 1 >= BAR_COUNT {
                return Err(format!("BAR {this} is 64-bit but the last one"));
            }
            layout.bars.push(HostBar {
                index: this,
                size,
                kind,
            });
        }
        if word(config, 6) & STATUS_CAPABILITIES == 0 {
            return Ok(layout);
        }
        let mut offset = usize::from(config[CAPABILITY_POINTER] & !3);
        // 48 capabilities fill the space after the header: more is a loop.
        for _ in 0..48 {
            if offset < 0x40 || offset + 12 > CONFIG_SIZE {
                break;
            }
            let control = word(config, offset + 2);
            match config[offset] {
                CAP_ID_MSI => {
                    layout.msi = Some(MsiCapability {
                        offset,
                        wide: control & MSI_64BIT != 0,
                        max_vectors_log2: ((control >> MSI_MMC_SHIFT) & 7).min(5) as u8,
                    })
                }
                CAP_ID_MSIX => {
                    let table = dword(config, offset + 4);
                    let pba = dword(config, offset + 8);
                    let msix = MsixCapability {
                        offset,
                        vectors: (control & 0x7ff) + 1,
                        table_bar: table & 7,
                        table_offset: u64::from(table & !7),
                        pba_bar: pba & 7,
                        pba_offset: u64::from(pba & !7),
                    };
                    for (bar, start, len, what) in [
                        (
                            msix.table_bar,
                            msix.table_offset,
                            msix.table_size(),
                            "table",
                        ),
                        (
                            msix.pba_bar,
                            msix.pba_offset,
                            msix.pba_size(),
                            "pending-bit array",
                        ),
                    ] {
                        let fits = layout
                            .bars
                            .iter()
                            .any(|b| b.index == bar && start + len <= b.size);
                        if !fits {
                            return Err(format!(
                                "its MSI-X {what} ({len:#x} bytes at {start:#x} in BAR {bar}) is outside every memory BAR"
                            ));
                        }
                    }
                    layout.msix = Some(msix);
                }
                _ => {}
            }
            offset = usize::from(config[offset + 1] & !3);
        }
        Ok(layout)
    }

    /// The ranges of BAR `index` the VMM must trap (MSI-X table and PBA).
    pub fn trapped(&self, index: u32) -> Vec<(u64, u64)> {
        let mut ranges = Vec::new();
        if let Some(m) = &self.msix {
            if m.table_bar == index {
                ranges.push((m.table_offset, m.table_size()));
            }
            if m.pba_bar == index {
                ranges.push((m.pba_offset, m.pba_size()));
            }
        }
        ranges
    }
}

/// The parts of a BAR of `size` bytes that can be mapped straight into the
/// guest: `areas` (VFIO's sparse areas, or the whole BAR) less the pages
/// that hold a `trapped` range, each area page-aligned (`page` bytes).
pub fn mappable_areas(
    size: u64,
    areas: &[(u64, u64)],
    trapped: &[(u64, u64)],
    page: u64,
) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(start, len) in areas {
        // Only whole pages inside the BAR can become a KVM slot.
        let mut pieces = vec![(
            start.next_multiple_of(page),
            (start + len).min(size) / page * page,
        )];
        for &(t_start, t_len) in trapped {
            let (t_lo, t_hi) = (
                t_start / page * page,
                (t_start + t_len).next_multiple_of(page),
            );
            pieces = pieces
                .into_iter()
                .flat_map(|(lo, hi)| [(lo, hi.min(t_lo)), (lo.max(t_hi), hi)])
                .filter(|(lo, hi)| lo < hi)
                .collect();
        }
        out.extend(
            pieces
                .into_iter()
                .filter(|(lo, hi)| lo < hi)
                .map(|(lo, hi)| (lo, hi - lo)),
        );
    }
    out
}

/// MSI as the guest programmed it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiConfig {
    pub enabled: bool,
    /// Vectors the guest enabled (1, 2, 4, .. 32).
    pub vectors: u8,
    /// The first vector's message; vector i's data has i in its low bits.
    pub message: MsiMessage,
}

/// What a configuration write means for the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigWrite {
    /// Goes to the host function as it is.
    Device,
    /// Absorbed by the emulation; nothing more to do.
    Absorbed,
    /// The guest moved a BAR: its slots and bus range must follow.
    BarMoved { bar: u32, moved: BarMove },
    /// MSI-X's enable or function-mask bit changed; `dword` is the
    /// capability's first dword as the guest now sees it.
    MsixControl {
        enabled: bool,
        masked: bool,
        dword: u32,
    },
    /// MSI's enable, vector count or message changed.
    Msi(MsiConfig),
}

/// What a function's INTx needs from VFIO and KVM, as the guest has
/// configured it: decided by [`GuestConfig::intx_state`] after every write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntxState {
    /// No pin, or MSI or MSI-X enabled: INTx off in VFIO (which refuses
    /// MSI while INTx is on), the line disconnected.
    Off,
    /// The guest set the command register's INTx-disable bit: INTx stays
    /// on in VFIO, which masks it itself as it sees the bit, and the line
    /// is disconnected, so an interrupt asserted before is withdrawn.
    Disabled,
    /// INTx on in VFIO, its eventfd an irqfd with resample on the line.
    Delivered,
}

/// The guest's view of a passed-through function's configuration space.
pub struct GuestConfig {
    layout: HostLayout,
    /// Shadow of the BAR registers (the identity in it is unused).
    bars: PciConfigSpace,
    msi_control: u16,
    msi_address: u64,
    msi_data: u16,
    msix_control: u16,
    interrupt_line: u8,
    /// The command register's INTx-disable bit as the guest last wrote it.
    intx_disabled: bool,
}

impl GuestConfig {
    /// The function with its memory BARs at `addresses` (in the order of
    /// `layout.bars`; each aligned to its size).
    pub fn new(layout: HostLayout, addresses: &[u64]) -> GuestConfig {
        let mut bars = PciConfigSpace::new(PciIdentity {
            vendor: 0,
            device: 0,
            class: (0, 0, 0),
            revision: 0,
            subsystem_vendor: 0,
            subsystem: 0,
        });
        for (bar, &address) in layout.bars.iter().zip(addresses) {
            bars.add_memory_bar(bar.index as usize, address, bar.size.max(16), bar.kind);
        }
        let layout_intx_disabled = layout.intx_disabled;
        let msi_control = layout.msi.map_or(0, |m| {
            (u16::from(m.max_vectors_log2) << MSI_MMC_SHIFT) | if m.wide { MSI_64BIT } else { 0 }
        });
        GuestConfig {
            layout,
            bars,
            msi_control,
            msi_address: 0,
            msi_data: 0,
            msix_control: 0,
            interrupt_line: 0,
            intx_disabled: layout_intx_disabled,
        }
    }

    /// Sets the interrupt line register to `line`, the INTx line's GSI,
    /// as firmware does (Linux reads the `_PRT` instead; others may not).
    pub fn set_interrupt_line(&mut self, line: u8) {
        self.interrupt_line = line;
    }

    /// Where the function's INTx stands now; see [`IntxState`]. MSI-X and
    /// MSI win over INTx whatever the command register says, as in a
    /// function (PCI 3.0 6.8.1.3: with MSI enabled, INTx is not used).
    pub fn intx_state(&self) -> IntxState {
        let msi = self.msi_control & MSI_ENABLE != 0;
        let msix = self.msix_control & MSIX_ENABLE != 0;
        if self.layout.interrupt_pin == 0 || msi || msix {
            IntxState::Off
        } else if self.intx_disabled {
            IntxState::Disabled
        } else {
            IntxState::Delivered
        }
    }

    pub fn layout(&self) -> &HostLayout {
        &self.layout
    }

    /// Where memory BAR `index` is now, if the function has it.
    pub fn bar_address(&self, index: u32) -> Option<u64> {
        self.bars
            .bars()
            .iter()
            .find(|b| b.index == index as usize)
            .map(|b| b.address)
    }

    /// Whether the guest's read of dword `reg` needs nothing of the host.
    pub fn emulates(&self, reg: usize) -> bool {
        (BAR0_REG..BAR0_REG + BAR_COUNT).contains(&reg)
            || reg == ROM_REG
            || self.msi_dword(reg).is_some_and(|d| d > 0)
    }

    /// Which dword of the MSI capability `reg` is (0 holds the control
    /// word), if it is one the emulation owns.
    fn msi_dword(&self, reg: usize) -> Option<usize> {
        let msi = self.layout.msi?;
        let first = msi.offset / 4;
        let count = if msi.wide { 4 } else { 3 };
        (first..first + count).contains(&reg).then(|| reg - first)
    }

    fn msix_control_reg(&self) -> Option<usize> {
        self.layout.msix.map(|m| m.offset / 4)
    }

    /// What the guest reads at dword `reg`, given the host function's
    /// value there (ignored where [`emulates`](Self::emulates) is true).
    pub fn read(&self, reg: usize, host: u32) -> u32 {
        if (BAR0_REG..BAR0_REG + BAR_COUNT).contains(&reg) {
            return self.bars.read(reg);
        }
        if reg == ROM_REG {
            return 0;
        }
        if reg == INTERRUPT_REG {
            return (host & 0xffff_0000)
                | (u32::from(self.layout.interrupt_pin) << 8)
                | u32::from(self.interrupt_line);
        }
        if let Some(d) = self.msi_dword(reg) {
            let wide = self.layout.msi.is_some_and(|m| m.wide);
            return match (d, wide) {
                (0, _) => (host & 0xffff) | (u32::from(self.msi_control) << 16),
                (1, _) => self.msi_address as u32,
                (2, true) => (self.msi_address >> 32) as u32,
                _ => u32::from(self.msi_data),
            };
        }
        if Some(reg) == self.msix_control_reg() {
            let control =
                (((host >> 16) as u16) & !(MSIX_ENABLE | MSIX_FUNCTION_MASK)) | self.msix_control;
            return (host & 0xffff) | (u32::from(control) << 16);
        }
        host
    }

    /// The guest writes the bytes of `value` selected by `mask` to dword
    /// `reg`; `host` is the host function's value there (for the read-only
    /// bits of emulated registers).
    pub fn write(&mut self, reg: usize, value: u32, mask: u32, host: u32) -> ConfigWrite {
        if (BAR0_REG..BAR0_REG + BAR_COUNT).contains(&reg) {
            return match self.bars.write(reg, value, mask) {
                Some((bar, new)) => ConfigWrite::BarMoved {
                    bar: bar.index as u32,
                    moved: BarMove {
                        old: bar.address,
                        new,
                        size: bar.size,
                    },
                },
                None => ConfigWrite::Absorbed,
            };
        }
        if reg == ROM_REG {
            return ConfigWrite::Absorbed;
        }
        if reg == INTERRUPT_REG {
            if mask & 0xff != 0 {
                self.interrupt_line = value as u8;
            }
            return ConfigWrite::Absorbed;
        }
        if reg == COMMAND_REG {
            // To the function (VFIO masks INTx itself on the bit); watched
            // for what it means to the line.
            if mask & COMMAND_INTX_DISABLE != 0 {
                self.intx_disabled = value & COMMAND_INTX_DISABLE != 0;
            }
            return ConfigWrite::Device;
        }
        let merged = |old: u32| (old & !mask) | (value & mask);
        if let Some(d) = self.msi_dword(reg) {
            let before = self.msi_config();
            let wide = self.layout.msi.is_some_and(|m| m.wide);
            let current = self.read(reg, host);
            let new = merged(current);
            match (d, wide) {
                (0, _) => {
                    let written = (new >> 16) as u16;
                    let writable = MSI_ENABLE | (7 << MSI_MME_SHIFT);
                    self.msi_control = (self.msi_control & !writable) | (written & writable);
                }
                (1, _) => {
                    self.msi_address = (self.msi_address & !0xffff_ffff) | u64::from(new & !3)
                }
                (2, true) => {
                    self.msi_address = (self.msi_address & 0xffff_ffff) | (u64::from(new) << 32)
                }
                _ => self.msi_data = new as u16,
            }
            let after = self.msi_config();
            return if after != before && (after.enabled || before.enabled) {
                ConfigWrite::Msi(after)
            } else {
                ConfigWrite::Absorbed
            };
        }
        if Some(reg) == self.msix_control_reg() {
            let written = (merged(self.read(reg, host)) >> 16) as u16;
            let control = written & (MSIX_ENABLE | MSIX_FUNCTION_MASK);
            if control == self.msix_control {
                return ConfigWrite::Absorbed;
            }
            self.msix_control = control;
            return ConfigWrite::MsixControl {
                enabled: control & MSIX_ENABLE != 0,
                masked: control & MSIX_FUNCTION_MASK != 0,
                dword: self.read(reg, host),
            };
        }
        // The rest of the MSI-X capability (table and PBA locations) is
        // read-only; everything else belongs to the function.
        if self
            .msix_control_reg()
            .is_some_and(|first| reg > first && reg < first + 3)
        {
            return ConfigWrite::Absorbed;
        }
        ConfigWrite::Device
    }

    /// MSI as the guest has programmed it so far.
    pub fn msi_config(&self) -> MsiConfig {
        let max = self.layout.msi.map_or(0, |m| m.max_vectors_log2);
        let enabled_log2 = ((self.msi_control >> MSI_MME_SHIFT) & 7).min(u16::from(max));
        MsiConfig {
            enabled: self.msi_control & MSI_ENABLE != 0,
            vectors: 1 << enabled_log2,
            message: MsiMessage {
                address_lo: self.msi_address as u32,
                address_hi: (self.msi_address >> 32) as u32,
                data: u32::from(self.msi_data),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function like QEMU's NVMe: BAR0 64-bit 16 KiB with the MSI-X
    /// table at 0x2000 and PBA at 0x3000 (65 vectors), an MSI capability
    /// (64-bit, 32 vectors, per-vector masking) at 0x40, MSI-X at 0x60,
    /// and an I/O BAR 2.
    fn nvme_like() -> [u8; CONFIG_SIZE] {
        let mut c = [0u8; CONFIG_SIZE];
        c[0..4].copy_from_slice(&0x0010_1b36u32.to_le_bytes());
        c[6] = STATUS_CAPABILITIES as u8;
        c[16..20].copy_from_slice(&0xfebf_0004u32.to_le_bytes()); // BAR0 64-bit
        c[24..28].copy_from_slice(&0x0000_c001u32.to_le_bytes()); // BAR2 I/O
        c[60..64].copy_from_slice(&0x0000_010bu32.to_le_bytes()); // line 11, pin A
        c[CAPABILITY_POINTER] = 0x40;
        // MSI: id, next 0x60, control: 64-bit, MMC=5, per-vector masking.
        c[0x40] = CAP_ID_MSI;
        c[0x41] = 0x60;
        c[0x42..0x44].copy_from_slice(&(MSI_64BIT | (5 << 1) | MSI_PER_VECTOR_MASK).to_le_bytes());
        // MSI-X: 65 vectors, table in BAR0 at 0x2000, PBA at 0x3000.
        c[0x60] = CAP_ID_MSIX;
        c[0x61] = 0;
        c[0x62..0x64].copy_from_slice(&64u16.to_le_bytes());
        c[0x64..0x68].copy_from_slice(&0x2000u32.to_le_bytes());
        c[0x68..0x6c].copy_from_slice(&0x3000u32.to_le_bytes());
        c
    }

    fn host_dword(c: &[u8; CONFIG_SIZE], reg: usize) -> u32 {
        dword(c, reg * 4)
    }

    fn layout(c: &[u8; CONFIG_SIZE]) -> HostLayout {
        HostLayout::read(c, |i| match i {
            0 => 0x4000,
            2 => 0x100,
            _ => 0,
        })
        .unwrap()
    }

    #[test]
    fn layout_finds_memory_bars_and_both_msi_capabilities() {
        let l = layout(&nvme_like());
        assert_eq!(
            l.bars,
            vec![HostBar {
                index: 0,
                size: 0x4000,
                kind: BarKind {
                    wide: true,
                    prefetchable: false
                }
            }]
        );
        assert_eq!(l.hidden_io_bars, vec![2]);
        assert_eq!(
            l.msi,
            Some(MsiCapability {
                offset: 0x40,
                wide: true,
                max_vectors_log2: 5
            })
        );
        let m = l.msix.unwrap();
        assert_eq!((m.vectors, m.table_bar, m.table_offset), (65, 0, 0x2000));
        assert_eq!(
            (m.pba_offset, m.table_size(), m.pba_size()),
            (0x3000, 65 * 16, 16)
        );
        assert_eq!(l.trapped(0), vec![(0x2000, 65 * 16), (0x3000, 16)]);
        assert!(l.trapped(1).is_empty());
    }

    #[test]
    fn a_looping_capability_list_ends_and_a_misplaced_table_is_refused() {
        let mut c = nvme_like();
        c[0x41] = 0x40; // MSI points to itself
        let l = layout(&c);
        assert!(l.msi.is_some() && l.msix.is_none());
        let mut c = nvme_like();
        c[0x64..0x68].copy_from_slice(&0x3ff8u32.to_le_bytes()); // table past the BAR
        let err = HostLayout::read(&c, |i| if i == 0 { 0x4000 } else { 0 }).unwrap_err();
        assert!(err.contains("MSI-X table"), "{err}");
        let mut c = nvme_like();
        c[CAPABILITY_POINTER] = 0xfc; // outside: no capabilities read
        assert_eq!(layout(&c).msix, None);
    }

    #[test]
    fn mappable_areas_leave_out_the_trapped_pages() {
        let page = 0x1000;
        // Whole 16 KiB BAR, table at 0x2000 and PBA at 0x3000: two pages left.
        assert_eq!(
            mappable_areas(
                0x4000,
                &[(0, 0x4000)],
                &[(0x2000, 0x410), (0x3000, 16)],
                page
            ),
            vec![(0, 0x2000)]
        );
        // Table in the middle of a 128 KiB BAR: both sides stay mapped.
        assert_eq!(
            mappable_areas(0x2_0000, &[(0, 0x2_0000)], &[(0x1_0800, 0x50)], page),
            vec![(0, 0x1_0000), (0x1_1000, 0xf000)]
        );
        // Sparse areas are honoured and clipped to whole pages.
        assert_eq!(
            mappable_areas(0x4000, &[(0x800, 0x1800), (0x3000, 0x1000)], &[], page),
            vec![(0x1000, 0x1000), (0x3000, 0x1000)]
        );
        // A BAR smaller than a page cannot be mapped at all.
        assert!(mappable_areas(0x100, &[(0, 0x100)], &[], page).is_empty());
    }

    #[test]
    fn bars_are_emulated_and_sized_the_usual_way() {
        let c = nvme_like();
        let mut g = GuestConfig::new(layout(&c), &[0xc000_4000]);
        assert!(g.emulates(4) && g.emulates(5) && g.emulates(ROM_REG));
        assert_eq!(g.read(4, host_dword(&c, 4)), 0xc000_4004);
        assert_eq!(g.read(5, 0), 0);
        assert_eq!(g.read(6, host_dword(&c, 6)), 0, "the I/O BAR is hidden");
        assert_eq!(
            g.write(4, 0xffff_ffff, 0xffff_ffff, 0),
            ConfigWrite::Absorbed
        );
        assert_eq!(g.read(4, 0), 0xffff_c004);
        assert_eq!(
            g.write(4, 0xc000_4000, 0xffff_ffff, 0),
            ConfigWrite::Absorbed
        );
        assert_eq!(
            g.write(4, 0xd000_0000, 0xffff_ffff, 0),
            ConfigWrite::BarMoved {
                bar: 0,
                moved: BarMove {
                    old: 0xc000_4000,
                    new: 0xd000_0000,
                    size: 0x4000
                }
            }
        );
        assert_eq!(g.bar_address(0), Some(0xd000_0000));
        assert_eq!(
            g.write(ROM_REG, 0xffff_f800, 0xffff_ffff, 0),
            ConfigWrite::Absorbed
        );
        assert_eq!(g.read(ROM_REG, 0xfeb0_0000), 0, "no expansion ROM");
    }

    #[test]
    fn the_host_pin_is_shown_and_the_line_is_scratch() {
        let c = nvme_like();
        let mut g = GuestConfig::new(layout(&c), &[0xc000_4000]);
        let host = host_dword(&c, INTERRUPT_REG);
        assert_eq!(g.read(INTERRUPT_REG, host), 0x0100, "INTA, no line yet");
        g.set_interrupt_line(16);
        assert_eq!(g.read(INTERRUPT_REG, host), 0x0110);
        assert_eq!(
            g.write(INTERRUPT_REG, 0xffff_ff0a, 0xffff_ffff, host),
            ConfigWrite::Absorbed
        );
        assert_eq!(g.read(INTERRUPT_REG, host), 0x010a, "the pin is read-only");
        // A function without INTx (or one VFIO offers none of) has no pin.
        let mut l = layout(&c);
        l.interrupt_pin = 0;
        let g = GuestConfig::new(l, &[0xc000_4000]);
        assert_eq!(g.read(INTERRUPT_REG, host), 0);
        assert_eq!(g.intx_state(), IntxState::Off);
        // A pin number out of range is no pin.
        let mut c = nvme_like();
        c[INTERRUPT_REG * 4 + 1] = 7;
        assert_eq!(layout(&c).interrupt_pin, 0);
    }

    #[test]
    fn intx_gives_way_to_msi_and_msix_and_follows_the_command_bit() {
        let c = nvme_like();
        let mut g = GuestConfig::new(layout(&c), &[0xc000_4000]);
        assert_eq!(g.intx_state(), IntxState::Delivered, "after reset");
        let disable = COMMAND_INTX_DISABLE | 0x6;
        // The command register still goes to the function.
        assert_eq!(
            g.write(COMMAND_REG, disable, 0xffff, 0),
            ConfigWrite::Device
        );
        assert_eq!(g.intx_state(), IntxState::Disabled);
        // A byte write that leaves the bit's byte alone changes nothing.
        g.write(COMMAND_REG, 0x6, 0xff, 0);
        assert_eq!(g.intx_state(), IntxState::Disabled);
        g.write(COMMAND_REG, 0x6, 0xffff, 0);
        assert_eq!(g.intx_state(), IntxState::Delivered);

        // MSI-X enabled: INTx off, whatever the command bit (Linux sets it
        // after enabling MSI-X and clears it after disabling).
        let msix = 0x60 / 4;
        let msix_host = host_dword(&c, msix);
        let on = u32::from(MSIX_ENABLE | MSIX_FUNCTION_MASK) << 16;
        g.write(msix, on, 0xffff_0000, msix_host);
        assert_eq!(g.intx_state(), IntxState::Off);
        g.write(COMMAND_REG, disable, 0xffff, 0);
        assert_eq!(g.intx_state(), IntxState::Off);
        g.write(msix, 0, 0xffff_0000, msix_host);
        assert_eq!(g.intx_state(), IntxState::Disabled);
        g.write(COMMAND_REG, 0x6, 0xffff, 0);
        assert_eq!(g.intx_state(), IntxState::Delivered);

        // MSI likewise.
        let msi = 0x40 / 4;
        let msi_host = host_dword(&c, msi);
        g.write(msi + 1, 0xfee0_0000, 0xffff_ffff, 0);
        g.write(msi, u32::from(MSI_ENABLE) << 16, 0xffff_0000, msi_host);
        assert_eq!(g.intx_state(), IntxState::Off);
        g.write(msi, 0, 0xffff_0000, msi_host);
        assert_eq!(g.intx_state(), IntxState::Delivered);

        // A function left with INTx disabled by its last user starts so.
        let mut c = nvme_like();
        c[5] = (COMMAND_INTX_DISABLE >> 8) as u8;
        let g = GuestConfig::new(layout(&c), &[0xc000_4000]);
        assert_eq!(g.intx_state(), IntxState::Disabled);
    }

    #[test]
    fn msi_is_emulated_without_per_vector_masking() {
        let c = nvme_like();
        let mut g = GuestConfig::new(layout(&c), &[0xc000_4000]);
        let reg = 0x40 / 4;
        let host = host_dword(&c, reg);
        let control = g.read(reg, host) >> 16;
        assert_eq!(control as u16 & MSI_PER_VECTOR_MASK, 0, "masking hidden");
        assert_eq!((control >> 1) & 7, 5, "32 vectors capable");
        assert_eq!(
            g.write(reg + 1, 0xfee0_1000, 0xffff_ffff, 0),
            ConfigWrite::Absorbed
        );
        assert_eq!(g.write(reg + 3, 0x4041, 0xffff, 0), ConfigWrite::Absorbed);
        // Enable with 4 vectors (MME=2).
        let w = g.write(reg, (MSI_ENABLE as u32 | (2 << 4)) << 16, 0xffff_0000, host);
        let expected = MsiConfig {
            enabled: true,
            vectors: 4,
            message: MsiMessage {
                address_lo: 0xfee0_1000,
                address_hi: 0,
                data: 0x4041,
            },
        };
        assert_eq!(w, ConfigWrite::Msi(expected));
        assert_eq!(g.read(reg + 1, 0), 0xfee0_1000);
        assert_eq!(g.read(reg + 3, 0), 0x4041);
        // A new message while enabled is a change; disabling too.
        let w = g.write(reg + 3, 0x4051, 0xffff, 0);
        assert!(matches!(w, ConfigWrite::Msi(m) if m.message.data == 0x4051));
        let w = g.write(reg, 0, 0xffff_0000, host);
        assert!(matches!(
            w,
            ConfigWrite::Msi(MsiConfig { enabled: false, .. })
        ));
    }

    #[test]
    fn msix_enable_and_mask_are_emulated_and_the_rest_read_only() {
        let c = nvme_like();
        let mut g = GuestConfig::new(layout(&c), &[0xc000_4000]);
        let reg = 0x60 / 4;
        let host = host_dword(&c, reg);
        assert_eq!(g.read(reg, host), host, "disabled at first");
        let on = u32::from(MSIX_ENABLE | MSIX_FUNCTION_MASK) << 16;
        assert_eq!(
            g.write(reg, on, 0xffff_0000, host),
            ConfigWrite::MsixControl {
                enabled: true,
                masked: true,
                dword: host | on
            }
        );
        assert_eq!(g.write(reg, on, 0xffff_0000, host), ConfigWrite::Absorbed);
        let w = g.write(reg, u32::from(MSIX_ENABLE) << 16, 0xffff_0000, host);
        assert!(matches!(
            w,
            ConfigWrite::MsixControl {
                enabled: true,
                masked: false,
                ..
            }
        ));
        assert_eq!(g.write(reg + 1, 0, 0xffff_ffff, 0), ConfigWrite::Absorbed);
        // The command register and others go to the function.
        assert_eq!(g.write(1, 0x6, 0xffff, 0), ConfigWrite::Device);
        assert!(!g.emulates(1) && !g.emulates(reg));
    }
}
