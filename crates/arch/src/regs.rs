//! Initial vCPU state: general registers, segment/control registers, FPU,
//! model-specific registers and the local APIC's LINT pins.
//!
//! Two entry states are supported: the Linux 64-bit boot protocol (long
//! mode, paging on, RSI = zero page) and PVH (32-bit protected mode, paging
//! off, RBX = `hvm_start_info`).

use kvm_bindings::{kvm_fpu, kvm_msr_entry, kvm_regs, Msrs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::gdt::{
    gdt_entry, kvm_segment_from_gdt, CODE32_FLAGS, CODE64_FLAGS, DATA_FLAGS, TSS_FLAGS,
};
use crate::layout::{BOOT_GDT_START, BOOT_IDT_START, BOOT_STACK_POINTER};
use crate::paging::write_identity_tables;
use crate::Error;

const X86_CR0_PE: u64 = 1 << 0;
const X86_CR0_ET: u64 = 1 << 4;
const X86_CR0_PG: u64 = 1 << 31;
const X86_CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// How the boot CPU enters the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryMode {
    /// Linux 64-bit boot protocol: long mode at `entry`, RSI = zero page.
    Linux64 { entry: u64, zero_page: u64 },
    /// PVH: 32-bit protected mode at `entry`, RBX = `hvm_start_info`.
    Pvh { entry: u64, start_info: u64 },
}

/// Loads the boot CPU's registers for `mode`, writing the GDT (and, for
/// long mode, identity page tables) into guest memory.
pub fn setup_boot_cpu<M: GuestMemoryBackend>(
    vcpu: &VcpuFd,
    mem: &M,
    mode: EntryMode,
) -> Result<(), Error> {
    setup_sregs(vcpu, mem, mode)?;
    let mut regs = kvm_regs {
        rflags: 0x2, // bit 1 is reserved and always set
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        ..Default::default()
    };
    match mode {
        EntryMode::Linux64 { entry, zero_page } => {
            regs.rip = entry;
            regs.rsi = zero_page;
        }
        EntryMode::Pvh { entry, start_info } => {
            regs.rip = entry;
            regs.rbx = start_info;
        }
    }
    vcpu.set_regs(&regs)
        .map_err(|e| Error::Vcpu("KVM_SET_REGS", e))
}

fn setup_sregs<M: GuestMemoryBackend>(
    vcpu: &VcpuFd,
    mem: &M,
    mode: EntryMode,
) -> Result<(), Error> {
    let mut sregs = vcpu
        .get_sregs()
        .map_err(|e| Error::Vcpu("KVM_GET_SREGS", e))?;
    let code_flags = match mode {
        EntryMode::Linux64 { .. } => CODE64_FLAGS,
        EntryMode::Pvh { .. } => CODE32_FLAGS,
    };
    // Index 0 must be the null descriptor; code 0x08, data 0x10, TSS 0x18.
    let gdt = [
        gdt_entry(0, 0, 0),
        gdt_entry(code_flags, 0, 0xfffff),
        gdt_entry(DATA_FLAGS, 0, 0xfffff),
        gdt_entry(TSS_FLAGS, 0, 0xfffff),
    ];
    for (i, entry) in gdt.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(BOOT_GDT_START + 8 * i as u64))
            .map_err(|_| Error::BootStructure("GDT"))?;
    }
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
        .map_err(|_| Error::BootStructure("IDT"))?;
    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit = (std::mem::size_of_val(&gdt) - 1) as u16;
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = 7;

    let code = kvm_segment_from_gdt(gdt[1], 1);
    let data = kvm_segment_from_gdt(gdt[2], 2);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_segment_from_gdt(gdt[3], 3);

    match mode {
        EntryMode::Linux64 { .. } => {
            sregs.cr3 = write_identity_tables(mem)?;
            sregs.cr4 |= X86_CR4_PAE;
            sregs.cr0 |= X86_CR0_PE | X86_CR0_PG;
            sregs.efer |= EFER_LME | EFER_LMA;
        }
        EntryMode::Pvh { .. } => {
            // PVH starts with paging off, in flat protected mode.
            sregs.cr0 = X86_CR0_PE | X86_CR0_ET;
            sregs.cr4 = 0;
            sregs.efer = 0;
        }
    }
    vcpu.set_sregs(&sregs)
        .map_err(|e| Error::Vcpu("KVM_SET_SREGS", e))
}

/// Puts the FPU in its reset state with SSE exceptions masked.
pub fn setup_fpu(vcpu: &VcpuFd) -> Result<(), Error> {
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu)
        .map_err(|e| Error::Vcpu("KVM_SET_FPU", e))
}

mod msr {
    pub const IA32_TSC: u32 = 0x10;
    pub const IA32_SYSENTER_CS: u32 = 0x174;
    pub const IA32_SYSENTER_ESP: u32 = 0x175;
    pub const IA32_SYSENTER_EIP: u32 = 0x176;
    pub const IA32_MISC_ENABLE: u32 = 0x1a0;
    pub const MTRR_DEF_TYPE: u32 = 0x2ff;
    pub const STAR: u32 = 0xc000_0081;
    pub const LSTAR: u32 = 0xc000_0082;
    pub const CSTAR: u32 = 0xc000_0083;
    pub const SYSCALL_MASK: u32 = 0xc000_0084;
    pub const KERNEL_GS_BASE: u32 = 0xc000_0102;

    pub const MISC_ENABLE_FAST_STRING: u64 = 1;
    /// MTRRs enabled, default memory type write-back: without it the
    /// guest would see all memory as uncacheable.
    pub const MTRR_ENABLE_WRITEBACK: u64 = (1 << 11) | 6;
}

/// The MSR values every vCPU starts with.
pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    let entry = |index, data| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    vec![
        entry(msr::IA32_SYSENTER_CS, 0),
        entry(msr::IA32_SYSENTER_ESP, 0),
        entry(msr::IA32_SYSENTER_EIP, 0),
        entry(msr::STAR, 0),
        entry(msr::CSTAR, 0),
        entry(msr::KERNEL_GS_BASE, 0),
        entry(msr::SYSCALL_MASK, 0),
        entry(msr::LSTAR, 0),
        entry(msr::IA32_TSC, 0),
        entry(msr::IA32_MISC_ENABLE, msr::MISC_ENABLE_FAST_STRING),
        entry(msr::MTRR_DEF_TYPE, msr::MTRR_ENABLE_WRITEBACK),
    ]
}

/// Writes the boot MSRs; KVM reports how many it accepted.
pub fn setup_msrs(vcpu: &VcpuFd) -> Result<(), Error> {
    let entries = boot_msr_entries();
    let msrs = Msrs::from_entries(&entries).map_err(|_| Error::BootStructure("MSR list"))?;
    let written = vcpu
        .set_msrs(&msrs)
        .map_err(|e| Error::Vcpu("KVM_SET_MSRS", e))?;
    if written != entries.len() {
        let rejected = entries[written].index;
        return Err(Error::MsrRejected(rejected));
    }
    Ok(())
}

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

fn set_delivery_mode(reg: u32, mode: u32) -> u32 {
    (reg & !0x700) | (mode << 8)
}

/// Wires LINT0 as ExtINT (the legacy PIC) and LINT1 as NMI, as a BIOS would,
/// so PIC interrupts reach the CPU before the kernel programs the APIC.
pub fn setup_lint(vcpu: &VcpuFd) -> Result<(), Error> {
    let mut lapic = vcpu
        .get_lapic()
        .map_err(|e| Error::Vcpu("KVM_GET_LAPIC", e))?;
    for (offset, mode) in [(APIC_LVT0, APIC_MODE_EXTINT), (APIC_LVT1, APIC_MODE_NMI)] {
        let bytes: [u8; 4] = std::array::from_fn(|i| lapic.regs[offset + i] as u8);
        let value = set_delivery_mode(u32::from_le_bytes(bytes), mode);
        for (i, b) in value.to_le_bytes().iter().enumerate() {
            lapic.regs[offset + i] = *b as _;
        }
    }
    vcpu.set_lapic(&lapic)
        .map_err(|e| Error::Vcpu("KVM_SET_LAPIC", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_mode_replaces_only_its_bits() {
        assert_eq!(
            set_delivery_mode(0x0001_0000, APIC_MODE_EXTINT),
            0x0001_0700
        );
        assert_eq!(set_delivery_mode(0x0001_0700, APIC_MODE_NMI), 0x0001_0400);
    }

    #[test]
    fn boot_msrs_enable_writeback_mtrrs() {
        let entries = boot_msr_entries();
        let mtrr = entries
            .iter()
            .find(|e| e.index == msr::MTRR_DEF_TYPE)
            .unwrap();
        assert_eq!(mtrr.data & (1 << 11), 1 << 11, "MTRRs must be enabled");
        assert_eq!(mtrr.data & 0xff, 6, "default type must be write-back");
    }
}
