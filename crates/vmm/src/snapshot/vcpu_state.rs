//! Saving and restoring one vCPU: registers, special registers, XSAVE,
//! XCRs, debug registers, LAPIC, MSRs, pending events and MP state.
//!
//! Must run on the vCPU's own thread while every vCPU is paused (KVM's
//! vCPU ioctls are per-thread in spirit, and GET/SET_VCPU_EVENTS are only
//! consistent while no other vCPU runs).

use kvm_bindings::{kvm_msr_entry, CpuId, Msrs, KVM_MAX_CPUID_ENTRIES, KVM_MAX_MSR_ENTRIES};
use kvm_ioctls::VcpuFd;

use super::state::{MsrValue, VcpuState};
use super::SnapshotError;

/// Reads the state of vCPU `index`. `msr_indices` is KVM's MSR index list
/// (KVM_GET_MSR_INDEX_LIST); MSRs KVM will not read for this vCPU are left
/// out.
///
/// Order, after QEMU's and Firecracker's notes: MP state first
/// (KVM_GET_MP_STATE accepts pending INIT/SIPI, changing LAPIC state), the
/// LAPIC after the registers, vCPU events last (the other GETs may change
/// what is pending).
pub fn save_vcpu(fd: &VcpuFd, index: u8, msr_indices: &[u32]) -> Result<VcpuState, SnapshotError> {
    let kvm = |what: &'static str| move |error| SnapshotError::Vcpu { index, what, error };
    let mp_state = fd.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?;
    let regs = fd.get_regs().map_err(kvm("KVM_GET_REGS"))?;
    let sregs = fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    let xsave = fd.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?;
    let xcrs = match fd.get_xcrs() {
        Ok(xcrs) => Some(xcrs),
        Err(e) if e.errno() == libc::EINVAL || e.errno() == libc::ENOTTY => None,
        Err(e) => return Err(kvm("KVM_GET_XCRS")(e)),
    };
    let debug_regs = fd.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?;
    let lapic = fd.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?;
    let tsc_khz = fd.get_tsc_khz().ok();
    let cpuid = fd
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm("KVM_GET_CPUID2"))?
        .as_slice()
        .to_vec();
    let msrs = read_msrs(fd, index, msr_indices)?;
    let vcpu_events = fd.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?;
    Ok(VcpuState {
        index,
        cpuid,
        mp_state,
        regs,
        sregs,
        xsave,
        xcrs,
        debug_regs,
        lapic,
        msrs,
        vcpu_events,
        tsc_khz,
    })
}

/// Puts a freshly created vCPU (never run) in `state`. `xsave_size` is
/// KVM_CAP_XSAVE2's answer: how many bytes KVM_SET_XSAVE reads. Returns
/// the MSRs KVM refused to set (reported, not fatal: KVM lists a few it
/// only accepts in some vCPU configurations).
///
/// Order (QEMU's notes): CPUID first; SET_REGS clears pending exceptions,
/// so it precedes SET_VCPU_EVENTS; SET_SREGS restores the APIC base, so it
/// precedes SET_LAPIC; the LAPIC precedes the MSRs (the TSC deadline only
/// sticks with the LAPIC configured); events and MP state last.
pub fn restore_vcpu(
    fd: &VcpuFd,
    state: &VcpuState,
    xsave_size: usize,
) -> Result<Vec<u32>, SnapshotError> {
    let index = state.index;
    let kvm = |what: &'static str| move |error| SnapshotError::Vcpu { index, what, error };
    let cpuid = CpuId::from_entries(&state.cpuid)
        .map_err(|_| SnapshotError::Invalid(format!("vCPU {index}: too many CPUID entries")))?;
    fd.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
    fd.set_regs(&state.regs).map_err(kvm("KVM_SET_REGS"))?;
    fd.set_sregs(&state.sregs).map_err(kvm("KVM_SET_SREGS"))?;
    if xsave_size > std::mem::size_of_val(&state.xsave) {
        return Err(SnapshotError::Invalid(format!(
            "this host's XSAVE area is {xsave_size} bytes; snapshots hold the 4096-byte legacy area"
        )));
    }
    // SAFETY: KVM_SET_XSAVE reads KVM_CAP_XSAVE2's size (at least 4096)
    // bytes; that size was just checked to fit in the kvm_xsave we pass.
    unsafe { fd.set_xsave(&state.xsave) }.map_err(kvm("KVM_SET_XSAVE"))?;
    if let Some(xcrs) = &state.xcrs {
        fd.set_xcrs(xcrs).map_err(kvm("KVM_SET_XCRS"))?;
    }
    fd.set_debug_regs(&state.debug_regs)
        .map_err(kvm("KVM_SET_DEBUGREGS"))?;
    fd.set_lapic(&state.lapic).map_err(kvm("KVM_SET_LAPIC"))?;
    let refused = write_msrs(fd, index, &state.msrs)?;
    fd.set_vcpu_events(&state.vcpu_events)
        .map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
    fd.set_mp_state(state.mp_state)
        .map_err(kvm("KVM_SET_MP_STATE"))?;
    Ok(refused)
}

/// Reads every MSR in `indices` that KVM will read. KVM_GET_MSRS stops at
/// the first MSR it refuses and returns how many it read, so each refusal
/// costs one more call that resumes after it.
fn read_msrs(fd: &VcpuFd, index: u8, indices: &[u32]) -> Result<Vec<MsrValue>, SnapshotError> {
    let mut values = Vec::with_capacity(indices.len());
    let mut rest = indices;
    while !rest.is_empty() {
        let chunk = &rest[..rest.len().min(KVM_MAX_MSR_ENTRIES)];
        let entries: Vec<kvm_msr_entry> = chunk
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries)
            .map_err(|_| SnapshotError::Invalid("MSR list too long".into()))?;
        let read = fd
            .get_msrs(&mut msrs)
            .map_err(|error| SnapshotError::Vcpu {
                index,
                what: "KVM_GET_MSRS",
                error,
            })?;
        values.extend(msrs.as_slice()[..read].iter().map(|e| MsrValue {
            index: e.index,
            data: e.data,
        }));
        // Entry `read`, if any, is one KVM refuses for this vCPU: skip it.
        rest = &rest[(read + 1).min(chunk.len())..];
    }
    Ok(values)
}

/// Writes `msrs` in order; returns the indices KVM refused.
fn write_msrs(fd: &VcpuFd, index: u8, msrs: &[MsrValue]) -> Result<Vec<u32>, SnapshotError> {
    let mut refused = Vec::new();
    let mut rest = msrs;
    while !rest.is_empty() {
        let chunk = &rest[..rest.len().min(KVM_MAX_MSR_ENTRIES)];
        let entries: Vec<kvm_msr_entry> = chunk
            .iter()
            .map(|m| kvm_msr_entry {
                index: m.index,
                data: m.data,
                ..Default::default()
            })
            .collect();
        let list = Msrs::from_entries(&entries)
            .map_err(|_| SnapshotError::Invalid("MSR list too long".into()))?;
        let written = fd.set_msrs(&list).map_err(|error| SnapshotError::Vcpu {
            index,
            what: "KVM_SET_MSRS",
            error,
        })?;
        if written < chunk.len() {
            refused.push(chunk[written].index);
        }
        rest = &rest[(written + 1).min(chunk.len())..];
    }
    Ok(refused)
}
