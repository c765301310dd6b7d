//! x86_64 machine description for hakoniwa: the guest memory map, the
//! structures the kernel reads at boot (zero page, PVH start info, e820,
//! ACPI tables, page tables, GDT) and the initial vCPU state (registers,
//! MSRs, CPUID, local APIC).
//!
//! Nothing here runs the VM; `vmm` calls these functions while building it.

pub mod acpi;
pub mod bootparams;
pub mod cpuid;
pub mod gdt;
pub mod layout;
pub mod paging;
pub mod regs;
pub mod reset_vector;
pub mod translate;

/// Errors while describing the machine to the guest.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A boot structure did not fit in guest memory.
    #[error("cannot write the {0} into guest memory")]
    BootStructure(&'static str),
    /// A vCPU ioctl failed.
    #[error("{0} failed: {1}")]
    Vcpu(&'static str, kvm_ioctls::Error),
    /// KVM refused one of the boot MSRs.
    #[error("KVM refused to set MSR {0:#x}")]
    MsrRejected(u32),
}
