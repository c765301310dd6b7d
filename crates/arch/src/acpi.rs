//! ACPI tables describing the machine to the guest: CPUs and the IOAPIC
//! (MADT), the hardware-reduced power-management registers that let the
//! guest power off and reboot (FADT + `\_S5_`), the legacy devices and
//! the PCI root bridge with its interrupt routing (DSDT). The tables are built with the rust-vmm `acpi_tables` crate and
//! written into the BIOS area, where Linux finds the RSDP.

use acpi_tables::aml;
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::madt::{EnabledStatus, IoApic, ProcessorLocalApic};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::layout::{ACPI_TABLES_END, ACPI_TABLES_START, APIC_START, IOAPIC_START};
use crate::Error;

const OEM_ID: [u8; 6] = *b"HKNIWA";
const OEM_TABLE_ID: [u8; 8] = *b"HAKONIWA";
const OEM_REVISION: u32 = 1;

/// FADT IA-PC boot architecture flag: VGA is not present.
const IAPC_BOOT_ARCH_NO_VGA: u16 = 1 << 2;
/// FADT IA-PC boot architecture flag: no CMOS RTC. We emulate none, so the
/// guest must not wait on one.
const IAPC_BOOT_ARCH_NO_CMOS_RTC: u16 = 1 << 5;
/// MADT flag: the machine also has dual 8259 PICs.
const MADT_PCAT_COMPAT: u32 = 1;
/// `\_S5_` sleep type the guest writes with SLP_EN to power off.
pub const S5_SLEEP_TYPE: u8 = 5;

/// A legacy device for the DSDT: a PNP id with I/O ports and an interrupt.
#[derive(Clone, Debug)]
pub struct LegacyDevice {
    /// Four-character ACPI name, e.g. "COM1".
    pub name: &'static str,
    /// EISA PNP id, e.g. "PNP0501" for a 16550 UART.
    pub hid: &'static str,
    /// First I/O port and number of ports.
    pub io: (u16, u8),
    /// ISA interrupt, if the device has one.
    pub irq: Option<u32>,
}

/// A PCI function's INTx line, for the root bridge's `_PRT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciInterrupt {
    /// Device number on bus 0.
    pub slot: u8,
    /// The function's interrupt pin register: 1 = INTA .. 4 = INTD.
    pub pin: u8,
    /// The IOAPIC input (GSI) the line is wired to.
    pub gsi: u32,
}

/// What the ACPI tables describe.
#[derive(Clone, Debug)]
pub struct AcpiPlatform {
    /// Number of vCPUs (APIC IDs 0..n).
    pub vcpu_count: u8,
    /// Hardware-reduced sleep control register (I/O port, one byte).
    pub sleep_control_port: u16,
    /// Hardware-reduced sleep status register (I/O port, one byte).
    pub sleep_status_port: u16,
    /// Reset register (I/O port, one byte) and the value that resets.
    pub reset_port: u16,
    /// Value the guest writes to `reset_port` to reboot.
    pub reset_value: u8,
    /// Legacy devices with their resources.
    pub devices: Vec<LegacyDevice>,
    /// I/O ranges (first port, count) used by the platform itself, reserved
    /// through a motherboard-resources device so no driver claims them.
    pub reserved_io: Vec<(u16, u8)>,
    /// The PCI root bridge's 32-bit memory window (first, last byte). With
    /// ACPI, Linux finds PCI only through a root bridge in the DSDT.
    pub pci_mmio_window: (u32, u32),
    /// The INTx lines of PCI functions (only passed-through ones have any).
    pub pci_interrupts: Vec<PciInterrupt>,
}

/// Builds every table and writes them into guest memory; returns the RSDP's
/// guest address (for `boot_params.acpi_rsdp_addr`).
pub fn write_acpi_tables<M: GuestMemoryBackend>(
    mem: &M,
    platform: &AcpiPlatform,
) -> Result<u64, Error> {
    let mut writer = TableWriter::new(mem);
    // The RSDP goes first at a 16-byte boundary in the BIOS area.
    let rsdp_addr = writer.reserve(Rsdp::len() as u64)?;

    let dsdt = writer.write(&build_dsdt(platform))?;
    let fadt = writer.write(&build_fadt(platform, dsdt))?;
    let madt = writer.write(&build_madt(platform))?;

    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    xsdt.add_entry(fadt);
    xsdt.add_entry(madt);
    let xsdt_addr = writer.write(&xsdt)?;

    writer.write_at(rsdp_addr, &Rsdp::new(OEM_ID, xsdt_addr))?;
    Ok(rsdp_addr)
}

/// Appends tables one after another in the ACPI area.
struct TableWriter<'a, M> {
    mem: &'a M,
    next: u64,
}

impl<'a, M: GuestMemoryBackend> TableWriter<'a, M> {
    fn new(mem: &'a M) -> Self {
        TableWriter {
            mem,
            next: ACPI_TABLES_START,
        }
    }

    fn reserve(&mut self, len: u64) -> Result<u64, Error> {
        let addr = self.next;
        let end = addr + len;
        if end > ACPI_TABLES_END {
            return Err(Error::BootStructure("ACPI tables (area full)"));
        }
        self.next = (end + 15) & !15;
        Ok(addr)
    }

    fn write(&mut self, table: &dyn Aml) -> Result<u64, Error> {
        let mut bytes = Vec::new();
        table.to_aml_bytes(&mut bytes);
        let addr = self.reserve(bytes.len() as u64)?;
        self.write_bytes(addr, &bytes)?;
        Ok(addr)
    }

    fn write_at(&mut self, addr: u64, table: &dyn Aml) -> Result<(), Error> {
        let mut bytes = Vec::new();
        table.to_aml_bytes(&mut bytes);
        self.write_bytes(addr, &bytes)
    }

    fn write_bytes(&self, addr: u64, bytes: &[u8]) -> Result<(), Error> {
        self.mem
            .write_slice(bytes, GuestAddress(addr))
            .map_err(|_| Error::BootStructure("ACPI tables"))
    }
}

fn io_register(port: u16) -> GAS {
    GAS::new(
        AddressSpace::SystemIo,
        8,
        0,
        AccessSize::ByteAccess,
        u64::from(port),
    )
}

fn build_fadt(platform: &AcpiPlatform, dsdt: u64) -> acpi_tables::fadt::FADT {
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .dsdt_64(dsdt)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::ResetRegSup)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton);
    fadt.iapc_boot_arch = (IAPC_BOOT_ARCH_NO_VGA | IAPC_BOOT_ARCH_NO_CMOS_RTC).into();
    fadt.sleep_control_reg = io_register(platform.sleep_control_port);
    fadt.sleep_status_reg = io_register(platform.sleep_status_port);
    fadt.reset_reg = io_register(platform.reset_port);
    fadt.reset_value = platform.reset_value;
    fadt.finalize()
}

fn build_madt(platform: &AcpiPlatform) -> Sdt {
    // Header (36 bytes) + local APIC address + flags.
    let mut madt = Sdt::new(*b"APIC", 44, 5, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    madt.write_u32(36, APIC_START as u32);
    madt.write_u32(40, MADT_PCAT_COMPAT);
    for id in 0..platform.vcpu_count {
        ProcessorLocalApic::new(id, id, EnabledStatus::Enabled).to_aml_bytes(&mut madt);
    }
    // The IOAPIC id follows the CPUs' APIC ids so they never clash.
    IoApic::new(platform.vcpu_count, IOAPIC_START as u32, 0).to_aml_bytes(&mut madt);
    madt
}

fn build_dsdt(platform: &AcpiPlatform) -> Sdt {
    let mut dsdt = Sdt::new(*b"DSDT", 36, 6, OEM_ID, OEM_TABLE_ID, OEM_REVISION);

    // \_S5_: the sleep type for soft-off. Linux only offers ACPI power-off
    // when this object exists.
    let s5 = aml::Package::new(vec![&S5_SLEEP_TYPE, &S5_SLEEP_TYPE, &aml::ZERO, &aml::ZERO]);
    aml::Name::new("_S5_".into(), &s5).to_aml_bytes(&mut dsdt);

    for device in &platform.devices {
        dsdt.append_slice(&legacy_device_aml(device));
    }
    if !platform.reserved_io.is_empty() {
        dsdt.append_slice(&motherboard_resources_aml(&platform.reserved_io));
    }
    dsdt.append_slice(&pci_root_bridge_aml(
        platform.pci_mmio_window,
        &platform.pci_interrupts,
    ));
    dsdt
}

/// PCI0: a conventional PCI root bridge (bus 0, configuration through
/// ports 0xcf8..0xcff) whose windows are every I/O port but the config
/// ports, and the 32-bit memory window where the VMM places BARs; with a
/// `_PRT` when a function has an INTx line.
fn pci_root_bridge_aml(
    (mmio_first, mmio_last): (u32, u32),
    interrupts: &[PciInterrupt],
) -> Vec<u8> {
    let bus = aml::AddressSpace::<u16>::new_bus_number(0, 0);
    let config_ports = aml::IO::new(0xcf8, 0xcf8, 1, 8);
    let io_low = aml::AddressSpace::<u16>::new_io(0x0000, 0x0cf7, None);
    let io_high = aml::AddressSpace::<u16>::new_io(0x0d00, 0xffff, None);
    let mmio = aml::AddressSpace::<u32>::new_memory(
        aml::AddressSpaceCacheable::NotCacheable,
        true,
        mmio_first,
        mmio_last,
        None,
    );
    let crs = aml::ResourceTemplate::new(vec![&bus, &config_ports, &io_low, &io_high, &mmio]);
    let hid = aml::EISAName::new("PNP0A03");
    let name_hid = aml::Name::new("_HID".into(), &hid);
    let name_uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let name_seg = aml::Name::new("_SEG".into(), &aml::ZERO);
    let name_bbn = aml::Name::new("_BBN".into(), &aml::ZERO);
    let name_adr = aml::Name::new("_ADR".into(), &aml::ZERO);
    let name_crs = aml::Name::new("_CRS".into(), &crs);
    // The _PRT, in its GSI form (no link devices): each entry says slot
    // (address 0xSSSS_FFFF: any function), pin (0 = INTA), source 0, GSI.
    // Linux then registers the GSI level-triggered and active-low, the
    // PCI way, with the IOAPIC (KVM's IOAPIC ignores polarity; the
    // resample irqfd asserts the line as a level). Without a _PRT, Linux
    // would fall back to the interrupt line register only for ISA IRQs
    // below 16 (acpi_isa_register_gsi), edge-triggered defaults that
    // COM1 and the timer live among; GSIs 16-23 collide with nothing.
    let entries: Vec<(u32, u8, u32)> = interrupts
        .iter()
        .map(|i| {
            (
                (u32::from(i.slot) << 16) | 0xffff,
                i.pin.saturating_sub(1),
                i.gsi,
            )
        })
        .collect();
    let packages: Vec<aml::Package> = entries
        .iter()
        .map(|(address, pin, gsi)| aml::Package::new(vec![address, pin, &aml::ZERO, gsi]))
        .collect();
    let prt_entries: Vec<&dyn Aml> = packages.iter().map(|p| p as &dyn Aml).collect();
    let prt_package = aml::Package::new(prt_entries);
    let name_prt = aml::Name::new("_PRT".into(), &prt_package);
    let mut children: Vec<&dyn Aml> = vec![
        &name_hid, &name_uid, &name_seg, &name_bbn, &name_adr, &name_crs,
    ];
    if !interrupts.is_empty() {
        children.push(&name_prt);
    }
    let dev = aml::Device::new("PCI0".into(), children);
    let mut bytes = Vec::new();
    aml::Scope::new("\\_SB_".into(), vec![&dev]).to_aml_bytes(&mut bytes);
    bytes
}

/// AML bytes of one `Device` in `\_SB_`.
fn legacy_device_aml(device: &LegacyDevice) -> Vec<u8> {
    let (first, count) = device.io;
    let io = aml::IO::new(first, first, 1, count);
    let irq = device
        .irq
        .map(|n| aml::Interrupt::new(true, true, false, false, n));
    let mut resources: Vec<&dyn Aml> = vec![&io];
    if let Some(irq) = &irq {
        resources.push(irq);
    }
    let crs = aml::ResourceTemplate::new(resources);
    let hid = aml::EISAName::new(device.hid);
    let name_hid = aml::Name::new("_HID".into(), &hid);
    let name_uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let name_crs = aml::Name::new("_CRS".into(), &crs);
    let dev = aml::Device::new(device.name.into(), vec![&name_hid, &name_uid, &name_crs]);
    let mut bytes = Vec::new();
    aml::Scope::new("\\_SB_".into(), vec![&dev]).to_aml_bytes(&mut bytes);
    bytes
}

/// A PNP0C02 device that claims the platform's own I/O ports.
fn motherboard_resources_aml(ranges: &[(u16, u8)]) -> Vec<u8> {
    let ios: Vec<aml::IO> = ranges
        .iter()
        .map(|&(first, count)| aml::IO::new(first, first, 1, count))
        .collect();
    let resources: Vec<&dyn Aml> = ios.iter().map(|io| io as &dyn Aml).collect();
    let crs = aml::ResourceTemplate::new(resources);
    let hid = aml::EISAName::new("PNP0C02");
    let name_hid = aml::Name::new("_HID".into(), &hid);
    let name_uid = aml::Name::new("_UID".into(), &aml::ONE);
    let name_crs = aml::Name::new("_CRS".into(), &crs);
    let dev = aml::Device::new("HKRS".into(), vec![&name_hid, &name_uid, &name_crs]);
    let mut bytes = Vec::new();
    aml::Scope::new("\\_SB_".into(), vec![&dev]).to_aml_bytes(&mut bytes);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    fn platform() -> AcpiPlatform {
        AcpiPlatform {
            vcpu_count: 4,
            sleep_control_port: 0x600,
            sleep_status_port: 0x601,
            reset_port: 0x602,
            reset_value: 0x1,
            devices: vec![LegacyDevice {
                name: "COM1",
                hid: "PNP0501",
                io: (0x3f8, 8),
                irq: Some(4),
            }],
            reserved_io: vec![(0x501, 1), (0x600, 3)],
            pci_mmio_window: (0xc000_0000, 0xfebf_ffff),
            pci_interrupts: Vec::new(),
        }
    }

    fn read_table(mem: &GuestMemoryMmap, addr: u64) -> Vec<u8> {
        let len: u32 = mem.read_obj(GuestAddress(addr + 4)).unwrap();
        let mut bytes = vec![0u8; len as usize];
        mem.read_slice(&mut bytes, GuestAddress(addr)).unwrap();
        bytes
    }

    fn checksum_ok(bytes: &[u8]) -> bool {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)) == 0
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn tables_are_linked_and_checksummed() {
        let mem: GuestMemoryMmap =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let rsdp = write_acpi_tables(&mem, &platform()).unwrap();
        assert_eq!(rsdp, ACPI_TABLES_START);
        let mut rsdp_bytes = [0u8; 36];
        mem.read_slice(&mut rsdp_bytes, GuestAddress(rsdp)).unwrap();
        assert_eq!(&rsdp_bytes[..8], b"RSD PTR ");
        assert!(checksum_ok(&rsdp_bytes[..20]));
        assert!(checksum_ok(&rsdp_bytes));

        let xsdt_addr = u64::from_le_bytes(rsdp_bytes[24..32].try_into().unwrap());
        let xsdt = read_table(&mem, xsdt_addr);
        assert_eq!(&xsdt[..4], b"XSDT");
        assert!(checksum_ok(&xsdt));
        let entries: Vec<u64> = xsdt[36..]
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let signatures: Vec<Vec<u8>> = entries
            .iter()
            .map(|&a| read_table(&mem, a)[..4].to_vec())
            .collect();
        assert_eq!(signatures, vec![b"FACP".to_vec(), b"APIC".to_vec()]);

        let fadt = read_table(&mem, entries[0]);
        assert!(checksum_ok(&fadt));
        let flags = u32::from_le_bytes(fadt[112..116].try_into().unwrap());
        assert_ne!(flags & Flags::HwReducedAcpi as u32, 0);
        assert_ne!(flags & Flags::ResetRegSup as u32, 0);
        // X_DSDT at offset 140 points at a valid DSDT.
        let dsdt_addr = u64::from_le_bytes(fadt[140..148].try_into().unwrap());
        let dsdt = read_table(&mem, dsdt_addr);
        assert_eq!(&dsdt[..4], b"DSDT");
        assert!(checksum_ok(&dsdt));
        assert!(contains(&dsdt, b"_S5_"));
        assert!(contains(&dsdt, b"COM1"));
        assert!(contains(&dsdt, b"PCI0"));
        // Reset register: I/O space, port 0x602, value 1.
        assert_eq!(fadt[116], 1);
        assert_eq!(
            u64::from_le_bytes(fadt[120..128].try_into().unwrap()),
            0x602
        );
        assert_eq!(fadt[128], 1);
        // Sleep control register at offset 244: I/O port 0x600.
        assert_eq!(fadt[244], 1);
        assert_eq!(
            u64::from_le_bytes(fadt[248..256].try_into().unwrap()),
            0x600
        );
    }

    #[test]
    fn madt_lists_every_cpu_and_the_ioapic() {
        let madt = build_madt(&platform());
        let bytes = madt.as_slice();
        assert!(checksum_ok(bytes));
        assert_eq!(
            u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize,
            bytes.len()
        );
        let mut cpus = Vec::new();
        let mut ioapics = 0;
        let mut offset = 44;
        while offset < bytes.len() {
            let (kind, len) = (bytes[offset], bytes[offset + 1] as usize);
            match kind {
                0 => cpus.push(bytes[offset + 3]),
                1 => ioapics += 1,
                other => panic!("unexpected MADT entry {other}"),
            }
            offset += len;
        }
        assert_eq!(cpus, vec![0, 1, 2, 3]);
        assert_eq!(ioapics, 1);
    }

    #[test]
    fn the_prt_wires_each_intx_line_to_its_gsi_only_when_there_is_one() {
        let dsdt = build_dsdt(&platform());
        assert!(!contains(dsdt.as_slice(), b"_PRT"), "no INTx, no _PRT");
        let mut with_intx = platform();
        with_intx.pci_interrupts = vec![
            PciInterrupt {
                slot: 3,
                pin: 1,
                gsi: 16,
            },
            PciInterrupt {
                slot: 4,
                pin: 2,
                gsi: 17,
            },
        ];
        let dsdt = build_dsdt(&with_intx);
        let bytes = dsdt.as_slice();
        assert!(checksum_ok(bytes));
        assert!(contains(bytes, b"_PRT"));
        // Package { 0x0003FFFF, 0 (INTA), 0 (no link: GSI form), 16 }:
        // DWordPrefix, ZeroOp, ZeroOp, BytePrefix 0x10.
        let slot3 = [
            0x12, 0x0b, 0x04, 0x0c, 0xff, 0xff, 0x03, 0x00, 0x00, 0x00, 0x0a, 0x10,
        ];
        // Slot 4's INTB (pin 1: OneOp) on GSI 17.
        let slot4 = [
            0x12, 0x0b, 0x04, 0x0c, 0xff, 0xff, 0x04, 0x00, 0x01, 0x00, 0x0a, 0x11,
        ];
        assert!(contains(bytes, &slot3), "{bytes:02x?}");
        assert!(contains(bytes, &slot4), "{bytes:02x?}");
    }
}
