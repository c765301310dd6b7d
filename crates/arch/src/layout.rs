//! Guest physical memory map of an x86_64 hakoniwa VM.
//!
//! ```text
//! 0x0000_0000  real-mode IVT/BDA (left alone)
//! 0x0000_0500  GDT, then IDT                      (boot only)
//! 0x0000_6000  PVH start_info + memory map        (PVH boot only)
//! 0x0000_7000  zero page (struct boot_params)     (Linux boot only)
//! 0x0000_8ff0  boot stack top
//! 0x0000_9000  identity page tables (PML4, PDPT, 4 PDs)
//! 0x0002_0000  kernel command line
//! 0x0009_fc00  EBDA .. 0x000f_ffff BIOS area: reserved in e820;
//! 0x000e_0000  ACPI tables (RSDP first, so a BIOS-area scan finds it)
//! 0x000f_fff0  reset vector: a stub that asks the VMM for a reset
//! 0x0010_0000  kernel load address, RAM up to 3 GiB
//! 0xc000_0000  32-bit MMIO hole to 4 GiB: PCI BARs up to 0xdfff_ffff,
//! 0xe000_0000  the display's framebuffer (its own KVM slot), then
//!              IOAPIC, LAPIC and KVM's TSS near the top
//! 0x1_0000_0000 RAM above 4 GiB, if the guest has more than 3 GiB
//! ```

/// Where the GDT is written for boot.
pub const BOOT_GDT_START: u64 = 0x500;
/// Where an empty IDT is written for boot.
pub const BOOT_IDT_START: u64 = 0x520;
/// PVH `hvm_start_info` structure.
pub const PVH_INFO_START: u64 = 0x6000;
/// PVH module list (the initramfs), right after `hvm_start_info`.
pub const PVH_MODLIST_START: u64 = 0x6040;
/// PVH memory map entries, after the module list.
pub const PVH_MEMMAP_START: u64 = 0x6080;
/// Linux zero page (`struct boot_params`).
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial stack pointer for the boot CPU.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// First page of the boot identity page tables (PML4).
pub const PML4_START: u64 = 0x9000;
/// Kernel command line.
pub const CMDLINE_START: u64 = 0x20000;
/// Largest command line we hand to the guest (x86 COMMAND_LINE_SIZE).
pub const CMDLINE_MAX_SIZE: usize = 2048;
/// Start of the Extended BIOS Data Area: RAM below it is usable.
pub const EBDA_START: u64 = 0x9fc00;
/// ACPI tables live in the BIOS area, where Linux also scans for the RSDP.
pub const ACPI_TABLES_START: u64 = 0xe0000;
/// End (exclusive) of the region reserved for ACPI tables.
pub const ACPI_TABLES_END: u64 = 0xf0000;
/// The x86 reset vector (f000:fff0): where a CPU, or a kernel rebooting
/// "through the BIOS", starts executing in real mode.
pub const RESET_VECTOR: u64 = 0xffff0;
/// Where high memory starts and where kernels are loaded.
pub const HIMEM_START: u64 = 0x100000;

/// Start of the 32-bit MMIO hole below 4 GiB.
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
/// End (exclusive) of the 32-bit MMIO hole.
pub const MMIO_HOLE_END: u64 = 0x1_0000_0000;
/// The display's framebuffer (when there is one): after the PCI memory
/// window, outside every BAR, and reported to the guest through the zero
/// page's `screen_info`.
pub const FRAMEBUFFER_START: u64 = 0xe000_0000;
/// Room for the framebuffer (4096x4096 at 32 bpp is 64 MiB).
pub const FRAMEBUFFER_MAX_SIZE: u64 = 0x1000_0000;
/// IOAPIC registers (fixed by convention).
pub const IOAPIC_START: u64 = 0xfec0_0000;
/// Local APIC registers (fixed by convention).
pub const APIC_START: u64 = 0xfee0_0000;
/// KVM's TSS (three pages) is placed inside the hole, out of the guest's way.
pub const KVM_TSS_ADDRESS: u64 = 0xfffb_d000;
/// KVM's identity-map page (Intel only), just below the TSS.
pub const KVM_IDENTITY_MAP_ADDRESS: u64 = 0xfffb_c000;

/// Guest RAM regions (start, size) for a guest of `mem_size` bytes: RAM is
/// split around the MMIO hole so devices can live below 4 GiB.
pub fn ram_regions(mem_size: u64) -> Vec<(u64, u64)> {
    if mem_size <= MMIO_HOLE_START {
        vec![(0, mem_size)]
    } else {
        vec![
            (0, MMIO_HOLE_START),
            (MMIO_HOLE_END, mem_size - MMIO_HOLE_START),
        ]
    }
}

/// Highest address (exclusive) of RAM below the MMIO hole.
pub fn low_ram_end(mem_size: u64) -> u64 {
    mem_size.min(MMIO_HOLE_START)
}

// Each boot structure must end before the next begins; checked when the
// crate is compiled, so a layout change that breaks this cannot build.
const _: () = {
    assert!(BOOT_IDT_START >= BOOT_GDT_START + 4 * 8);
    assert!(PVH_INFO_START >= BOOT_IDT_START + 8);
    assert!(ZERO_PAGE_START >= PVH_MEMMAP_START + 8 * 24);
    assert!(BOOT_STACK_POINTER < PML4_START);
    assert!(PML4_START + 6 * 0x1000 <= CMDLINE_START);
    assert!(CMDLINE_START + CMDLINE_MAX_SIZE as u64 <= EBDA_START);
    assert!(ACPI_TABLES_END <= RESET_VECTOR);
    assert!(RESET_VECTOR + 16 <= HIMEM_START);
    assert!(FRAMEBUFFER_START + FRAMEBUFFER_MAX_SIZE <= IOAPIC_START);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_guest_is_one_region() {
        assert_eq!(ram_regions(512 << 20), vec![(0, 512 << 20)]);
        assert_eq!(low_ram_end(512 << 20), 512 << 20);
    }

    #[test]
    fn large_guest_skips_the_mmio_hole() {
        let regions = ram_regions(4 << 30);
        assert_eq!(regions, vec![(0, 3 << 30), (4 << 30, 1 << 30)]);
        let total: u64 = regions.iter().map(|r| r.1).sum();
        assert_eq!(total, 4 << 30);
        assert_eq!(low_ram_end(4 << 30), 3 << 30);
    }
}
