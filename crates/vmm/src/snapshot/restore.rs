//! `run --restore FILE`: the checks made before any KVM work, and the
//! state applied to the new VM before its vCPUs run.

use std::path::Path;

use kvm_ioctls::{Cap, VmFd};

use super::file::SnapshotReader;
use super::state::{MachineState, VmSnapshot};
use super::SnapshotError;
use crate::boot::BootProtocol;
use crate::config::{format_size, VmConfig};
use crate::controller::DeviceDescription;
use crate::display::Framebuffer;
use crate::platform::Platform;
use display::DisplayConfig;

/// Puts the virtio devices' state back into a freshly built VM, before any
/// vCPU exists; the devices stay paused until [`resume_devices`], once the
/// vCPUs' state is back.
pub fn restore_virtio(platform: &Platform, snapshot: &VmSnapshot) -> Result<(), SnapshotError> {
    Ok(platform.virtio.restore(&snapshot.devices.virtio)?)
}

/// Lets the devices of a restored VM go on: called after every vCPU's
/// state (its LAPIC above all) is restored and before any runs, so the
/// interrupts they raise now reach the guest — the virtio devices start
/// serving, and COM1 raises again an interrupt its registers say is
/// pending (raised at its restore, before any vCPU existed, it was lost).
pub fn resume_devices(platform: &Platform) -> Result<(), crate::Error> {
    platform
        .serial
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .raise_pending_interrupt()
        .map_err(|e| crate::Error::Device("com1".into(), e))?;
    platform.virtio.resume().map_err(SnapshotError::from)?;
    Ok(())
}

/// Opens the snapshot `path` for a VM built from `config` and checks that
/// the two agree: no KVM work, so a bad file or flag fails first.
pub fn open_for(config: &VmConfig, path: &Path) -> Result<SnapshotReader, SnapshotError> {
    let reader = SnapshotReader::open(path)?;
    let machine = &reader.snapshot.machine;
    let mismatch = |what: String| SnapshotError::Mismatch {
        path: path.to_owned(),
        what,
    };
    if machine.memory_bytes != config.memory_bytes {
        return Err(mismatch(format!(
            "it has {} of memory, --memory is {}",
            format_size(machine.memory_bytes),
            format_size(config.memory_bytes)
        )));
    }
    if machine.vcpus != config.vcpus {
        return Err(mismatch(format!(
            "it has {} vCPUs, --cpus is {}",
            machine.vcpus, config.vcpus
        )));
    }
    let display = display_of(config);
    if machine.display != display {
        return Err(mismatch(format!(
            "it has {}, --display gives {}",
            display_words(&machine.display),
            display_words(&display)
        )));
    }
    let indices_ok = reader.snapshot.vcpus.len() == usize::from(machine.vcpus)
        && reader
            .snapshot
            .vcpus
            .iter()
            .enumerate()
            .all(|(i, v)| usize::from(v.index) == i);
    if !indices_ok {
        return Err(SnapshotError::Corrupt {
            path: path.to_owned(),
            what: "vCPU states do not match the vCPU count".into(),
        });
    }
    Ok(reader)
}

/// The machine description a snapshot records for a VM.
pub fn machine_state(
    config: &VmConfig,
    devices: &[DeviceDescription],
    boot_protocol: BootProtocol,
    kernel: String,
    cmdline: String,
) -> MachineState {
    MachineState {
        display: display_of(config),
        memory_bytes: config.memory_bytes,
        vcpus: config.vcpus,
        ram_regions: arch::layout::ram_regions(config.memory_bytes),
        devices: device_list(devices),
        boot_protocol: boot_protocol.name().into(),
        kernel,
        cmdline,
    }
}

/// The display's geometry words, as a snapshot records them.
fn display_of(config: &VmConfig) -> Option<String> {
    let text = config.display.as_deref()?;
    DisplayConfig::parse(text)
        .ok()
        .map(|c| Framebuffer::describe(&c))
}

/// How an error message names a VM's display (or its absence).
pub fn display_words(display: &Option<String>) -> String {
    match display {
        Some(g) => format!("a {g} display"),
        None => "no display".into(),
    }
}

fn device_list(devices: &[DeviceDescription]) -> Vec<(String, String)> {
    devices
        .iter()
        .map(|d| (d.id.clone(), d.kind.clone()))
        .collect()
}

/// Checks the rebuilt VM's devices against the snapshot's.
pub fn check_devices(
    reader: &SnapshotReader,
    devices: &[DeviceDescription],
) -> Result<(), SnapshotError> {
    let built = device_list(devices);
    if built != reader.snapshot.machine.devices {
        let names = |list: &[(String, String)]| {
            list.iter()
                .map(|(id, _)| id.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        return Err(SnapshotError::Mismatch {
            path: reader.path().to_owned(),
            what: format!(
                "it has devices {}, this VM has {}",
                names(&reader.snapshot.machine.devices),
                names(&built)
            ),
        });
    }
    Ok(())
}

/// Puts the VM-wide state back into a freshly built VM, before any vCPU
/// exists: the irqchip, PIT and clock in KVM, and the devices' state. The
/// same for `run --restore` and for a migration's destination.
pub fn apply_vm_state(
    vm_fd: &VmFd,
    platform: &Platform,
    framebuffer: Option<&Framebuffer>,
    snapshot: &VmSnapshot,
) -> Result<(), crate::Error> {
    super::vm_state::restore_vm(vm_fd, &snapshot.vm)?;
    let com1 = (&snapshot.devices.com1).into();
    platform
        .serial
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .restore(&com1)
        .map_err(|e| crate::Error::Device("com1".into(), e))?;
    restore_virtio(platform, snapshot)?;
    if let Some(framebuffer) = framebuffer {
        let state =
            snapshot.devices.display.as_ref().ok_or_else(|| {
                SnapshotError::Invalid("the saved VM has no display state".into())
            })?;
        framebuffer
            .restore(state)
            .map_err(|e| crate::Error::Device("--display".into(), e))?;
    }
    Ok(())
}

/// The boot protocol a snapshot names.
pub fn boot_protocol(machine: &MachineState) -> BootProtocol {
    if machine.boot_protocol == BootProtocol::Pvh.name() {
        BootProtocol::Pvh
    } else {
        BootProtocol::Linux64
    }
}

/// How many bytes KVM_SET_XSAVE reads on this host.
pub fn xsave_size(vm: &VmFd) -> usize {
    usize::try_from(vm.check_extension_int(Cap::Xsave2))
        .unwrap_or(0)
        .max(4096)
}
