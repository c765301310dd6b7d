//! Saving and restoring VM-wide KVM state: the in-kernel PICs and IOAPIC,
//! the PIT and the kvm-clock.

use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::VmFd;

use super::state::VmLevelState;
use super::SnapshotError;

/// Reads the irqchip, PIT and clock of a paused VM.
pub fn save_vm(vm: &VmFd) -> Result<VmLevelState, SnapshotError> {
    let chip = |chip_id: u32| -> Result<kvm_irqchip, SnapshotError> {
        let mut chip = kvm_irqchip {
            chip_id,
            ..Default::default()
        };
        vm.get_irqchip(&mut chip)
            .map_err(|e| SnapshotError::Kvm("KVM_GET_IRQCHIP", e))?;
        Ok(chip)
    };
    let pic_master = chip(KVM_IRQCHIP_PIC_MASTER)?;
    let pic_slave = chip(KVM_IRQCHIP_PIC_SLAVE)?;
    let ioapic = chip(KVM_IRQCHIP_IOAPIC)?;
    let pit = vm
        .get_pit2()
        .map_err(|e| SnapshotError::Kvm("KVM_GET_PIT2", e))?;
    let clock = vm
        .get_clock()
        .map_err(|e| SnapshotError::Kvm("KVM_GET_CLOCK", e))?;
    Ok(VmLevelState {
        pic_master,
        pic_slave,
        ioapic,
        pit,
        clock,
    })
}

/// Restores VM-wide state into a new VM whose irqchip and PIT exist and
/// whose vCPUs have not run. The kvm-clock continues from the saved value,
/// as after a pause: the guest does not see the time the VM spent saved.
pub fn restore_vm(vm: &VmFd, state: &VmLevelState) -> Result<(), SnapshotError> {
    vm.set_pit2(&state.pit)
        .map_err(|e| SnapshotError::Kvm("KVM_SET_PIT2", e))?;
    // No flags: KVM_CLOCK_REALTIME would advance the clock by the wall
    // time since the snapshot; the others are output-only.
    let clock = kvm_clock_data {
        clock: state.clock.clock,
        ..Default::default()
    };
    vm.set_clock(&clock)
        .map_err(|e| SnapshotError::Kvm("KVM_SET_CLOCK", e))?;
    for chip in [&state.pic_master, &state.pic_slave, &state.ioapic] {
        vm.set_irqchip(chip)
            .map_err(|e| SnapshotError::Kvm("KVM_SET_IRQCHIP", e))?;
    }
    Ok(())
}
