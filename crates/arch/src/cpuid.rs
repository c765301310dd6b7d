//! CPUID as the guest sees it: what KVM supports, plus what only the VMM
//! knows (that this is a VM, each vCPU's APIC ID, how many vCPUs there are)
//! and minus the paravirtual features the user switched off.

use kvm_bindings::{kvm_cpuid_entry2, CpuId};

/// CPUID.1:ECX bit 31. KVM_GET_SUPPORTED_CPUID leaves it clear; without it
/// Linux believes it runs on bare metal, skips kvm-clock and stalls
/// calibrating the TSC.
const HYPERVISOR_BIT: u32 = 1 << 31;
/// CPUID.1:EDX bit 28: EBX[23:16] holds a valid logical processor count.
const HTT_BIT: u32 = 1 << 28;

/// Leaf with KVM's paravirtual feature bits (after the "KVMKVMKVM" leaf).
pub const KVM_CPUID_FEATURES: u32 = 0x4000_0001;
/// KVM_FEATURE_ASYNC_PF: the guest may enable async page faults.
pub const KVM_FEATURE_ASYNC_PF: u32 = 1 << 4;
/// KVM_FEATURE_ASYNC_PF_VMEXIT: async page faults also on nested VM exits.
pub const KVM_FEATURE_ASYNC_PF_VMEXIT: u32 = 1 << 10;
/// KVM_FEATURE_ASYNC_PF_INT: "page ready" delivered as an interrupt (Linux ≥ 5.8).
pub const KVM_FEATURE_ASYNC_PF_INT: u32 = 1 << 14;

/// The guest-visible choices that shape CPUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuidOptions {
    /// Number of vCPUs in the VM.
    pub vcpu_count: u8,
    /// Expose KVM's asynchronous (para-virtualized) page faults.
    pub async_pf: bool,
}

/// Patches KVM's supported CPUID for the vCPU with APIC ID `apic_id`.
pub fn patch_cpuid(cpuid: &mut CpuId, apic_id: u8, opts: CpuidOptions) {
    let count = u32::from(opts.vcpu_count.max(1));
    // Bits needed to number every vCPU: the x2APIC "core" level shift.
    let core_shift = 32 - (count - 1).leading_zeros();
    for entry in cpuid.as_mut_slice() {
        patch_entry(entry, u32::from(apic_id), count, core_shift, opts);
    }
}

fn patch_entry(
    entry: &mut kvm_cpuid_entry2,
    apic_id: u32,
    count: u32,
    core_shift: u32,
    opts: CpuidOptions,
) {
    match entry.function {
        0x1 => {
            entry.ecx |= HYPERVISOR_BIT;
            entry.ebx = (apic_id << 24) | ((count & 0xff) << 16) | (entry.ebx & 0xffff);
            if count > 1 {
                entry.edx |= HTT_BIT;
            }
        }
        // Extended topology: one thread per core, `count` cores per package.
        0xb | 0x1f => {
            entry.edx = apic_id;
            match entry.index {
                0 => {
                    entry.eax = 0;
                    entry.ebx = 1;
                    entry.ecx = 1 << 8; // level 0 is SMT
                }
                1 => {
                    entry.eax = core_shift;
                    entry.ebx = count;
                    entry.ecx = (2 << 8) | 1; // level 1 is core
                }
                index => {
                    entry.eax = 0;
                    entry.ebx = 0;
                    entry.ecx = index; // invalid level ends the enumeration
                }
            }
        }
        // AMD extended APIC ID.
        0x8000_001e => {
            entry.eax = apic_id;
        }
        KVM_CPUID_FEATURES if !opts.async_pf => {
            entry.eax &=
                !(KVM_FEATURE_ASYNC_PF | KVM_FEATURE_ASYNC_PF_VMEXIT | KVM_FEATURE_ASYNC_PF_INT);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: 0xffff_ffff,
            ebx: 0x0000_0800,
            ecx: 0,
            edx: 0,
            ..Default::default()
        }
    }

    fn sample() -> CpuId {
        CpuId::from_entries(&[
            leaf(0x1, 0),
            leaf(0xb, 0),
            leaf(0xb, 1),
            leaf(0xb, 2),
            leaf(KVM_CPUID_FEATURES, 0),
        ])
        .unwrap()
    }

    fn find(cpuid: &CpuId, function: u32, index: u32) -> kvm_cpuid_entry2 {
        *cpuid
            .as_slice()
            .iter()
            .find(|e| e.function == function && e.index == index)
            .unwrap()
    }

    #[test]
    fn hypervisor_bit_and_apic_id_are_set() {
        let mut cpuid = sample();
        patch_cpuid(
            &mut cpuid,
            3,
            CpuidOptions {
                vcpu_count: 4,
                async_pf: true,
            },
        );
        let l1 = find(&cpuid, 1, 0);
        assert_ne!(l1.ecx & HYPERVISOR_BIT, 0);
        assert_eq!(l1.ebx >> 24, 3);
        assert_eq!((l1.ebx >> 16) & 0xff, 4);
        assert_eq!(l1.ebx & 0xffff, 0x0800, "CLFLUSH size must be kept");
        assert_ne!(l1.edx & HTT_BIT, 0);
    }

    #[test]
    fn topology_counts_every_vcpu() {
        let mut cpuid = sample();
        patch_cpuid(
            &mut cpuid,
            2,
            CpuidOptions {
                vcpu_count: 3,
                async_pf: true,
            },
        );
        let core = find(&cpuid, 0xb, 1);
        assert_eq!(core.ebx, 3);
        assert_eq!(core.eax, 2, "3 vCPUs need 2 bits of APIC ID");
        assert_eq!(core.edx, 2);
        assert_eq!(find(&cpuid, 0xb, 2).ebx, 0);
    }

    #[test]
    fn async_pf_can_be_hidden() {
        let mut on = sample();
        patch_cpuid(
            &mut on,
            0,
            CpuidOptions {
                vcpu_count: 1,
                async_pf: true,
            },
        );
        assert_ne!(
            find(&on, KVM_CPUID_FEATURES, 0).eax & KVM_FEATURE_ASYNC_PF,
            0
        );
        let mut off = sample();
        patch_cpuid(
            &mut off,
            0,
            CpuidOptions {
                vcpu_count: 1,
                async_pf: false,
            },
        );
        let eax = find(&off, KVM_CPUID_FEATURES, 0).eax;
        assert_eq!(eax & (KVM_FEATURE_ASYNC_PF | KVM_FEATURE_ASYNC_PF_INT), 0);
        assert_ne!(eax & 1, 0, "other KVM features (clocksource) stay");
    }
}
