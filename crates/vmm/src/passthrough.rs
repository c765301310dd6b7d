//! PCI passthrough for one VM (docs/passthrough.md): the `--device`
//! options checked on the host before any KVM work, then one VFIO
//! container per VM tied to KVM's VFIO device, every RAM slot of the
//! memory manager mapped through it for the devices' DMA, and each device
//! put on the PCI bus (crate::platform).
//!
//! What a VM with a passthrough device cannot do is refused here, once, by
//! [`PassthroughDevices::refuse`]: its device state lives in hardware no
//! one can save, so no snapshot and no migration; and VFIO pins all of RAM,
//! so no balloon and no postcopy (anchors: VFIO pins all guest RAM, which
//! fights lazy postcopy, and its DMA bypasses KVM's dirty log).

use std::path::Path;
use std::sync::{mpsc, Arc};

use devices::affinity::CpuSet;
use devices::host_irq::IrqSteering;
use devices::vfio::{host, GuestMapper, HostDevice, PassthroughConfig};
use kvm_bindings::{kvm_create_device, kvm_device_type_KVM_DEV_TYPE_VFIO};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioDeviceFd, VfioError};

use crate::config::{format_size, VmConfig};
use crate::memory::MemoryManager;
use crate::platform::Platform;
use crate::Error;

const DEV_VFIO: &str = "/dev/vfio";
/// CAP_IPC_LOCK: pinning memory without the memlock limit.
const CAP_IPC_LOCK: u32 = 14;

fn fail(message: impl Into<String>) -> Error {
    Error::Device("--device".into(), message.into())
}

/// A passthrough device of the running VM, for the API and the checks
/// that refuse what it cannot do.
#[derive(Clone, Debug)]
pub struct PassthroughDevice {
    pub id: String,
    /// The host function (`0000:00:03.0`).
    pub host_address: String,
    /// With `irq_affinity=on`: the steering, run each time the guest
    /// enables or changes the device's MSI/MSI-X, and what it changed.
    pub steering: Option<IrqSteering>,
}

/// The VM's passthrough devices (empty for most VMs).
#[derive(Clone, Debug, Default)]
pub struct PassthroughDevices(pub Vec<PassthroughDevice>);

impl PassthroughDevices {
    /// Err with one line if the VM has a passthrough device: `what` (a
    /// snapshot, a migration) would need its state.
    pub fn refuse(&self, what: &str) -> Result<(), String> {
        match self.0.first() {
            None => Ok(()),
            Some(d) => Err(format!(
                "{what} is not possible: passthrough device {} ({}) keeps its state in hardware, which cannot be saved",
                d.id, d.host_address
            )),
        }
    }
}

/// One `--device`, parsed and checked on the host.
struct Planned {
    id: String,
    host: HostDevice,
    steering: Option<IrqSteering>,
}

/// The `--device` options, parsed and checked on the host.
pub struct PassthroughPlan {
    devices: Vec<Planned>,
}

impl PassthroughPlan {
    /// Parses and checks every `--device`, before any KVM work: the
    /// function is bound to vfio-pci with a usable IOMMU group, the VM
    /// asks for nothing a passthrough device rules out, and the memlock
    /// limit lets VFIO pin all of RAM.
    pub fn check(config: &VmConfig) -> Result<PassthroughPlan, Error> {
        let mut devices: Vec<Planned> = Vec::new();
        for (index, text) in config.passthrough.iter().enumerate() {
            let options: PassthroughConfig = text.parse().map_err(|e| fail(format!("{e}")))?;
            let host =
                host::check(&options.path, Path::new(DEV_VFIO)).map_err(|e| fail(e.to_string()))?;
            let id = options.id.clone().unwrap_or_else(|| format!("pt{index}"));
            if let Some(other) = devices.iter().find(|p| p.host.address == host.address) {
                return Err(fail(format!(
                    "{} is given twice (also as {})",
                    host.address, other.id
                )));
            }
            let steering = match options.irq_affinity {
                true => Some(
                    IrqSteering::new(
                        Path::new("/proc"),
                        &host.address,
                        CpuSet::union(config.cpus.affinity.values()),
                    )
                    .map_err(fail)?,
                ),
                false => None,
            };
            devices.push(Planned { id, host, steering });
        }
        if devices.is_empty() {
            return Ok(PassthroughPlan { devices });
        }
        let refusal = if config.incoming.is_some() {
            Some("--incoming: a migration cannot bring a passthrough device's state")
        } else if config.restore.is_some() {
            Some("--restore: a snapshot cannot hold a passthrough device's state")
        } else if config.virtio.balloon.is_some() {
            Some("--balloon: VFIO pins all guest RAM, so pages the balloon frees would stay pinned for the device")
        } else {
            None
        };
        if let Some(why) = refusal {
            return Err(fail(format!("cannot be used with {why}")));
        }
        if let Some(line) = memlock_shortfall(
            has_capability(CAP_IPC_LOCK),
            memlock_limit(),
            config.memory_bytes,
        ) {
            return Err(fail(line));
        }
        Ok(PassthroughPlan { devices })
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Opens the devices in one container tied to KVM, maps all of RAM for
    /// their DMA and puts them on the PCI bus.
    pub fn attach(
        self,
        memory: &Arc<MemoryManager>,
        platform: &mut Platform,
    ) -> Result<PassthroughDevices, Error> {
        if self.devices.is_empty() {
            return Ok(PassthroughDevices::default());
        }
        let mut create = kvm_create_device {
            type_: kvm_device_type_KVM_DEV_TYPE_VFIO,
            fd: 0,
            flags: 0,
        };
        let kvm_vfio = memory
            .vm_fd()
            .create_device(&mut create)
            .map_err(|e| Error::Kvm("KVM_CREATE_DEVICE (VFIO)", e))?;
        let container = VfioContainer::new(Some(Arc::new(VfioDeviceFd::new_from_kvm(kvm_vfio))))
            .map_err(|e| fail(format!("VFIO container: {e}")))?;
        let container = Arc::new(container);
        let mapper: Arc<dyn GuestMapper> = Arc::new(DeviceMemory(memory.clone()));
        let mut attached = Vec::new();
        let mut opened = Vec::new();
        // The container gets its IOMMU when the first group joins, so the
        // devices are opened before RAM is mapped.
        for planned in self.devices {
            let host = &planned.host;
            let device = VfioDevice::new(&host.sysfs, container.clone(), false)
                .map_err(|e| fail(format!("{}: {}", host.address, open_error(&e, host))))?;
            opened.push((planned, device));
        }
        map_ram(&container, memory)?;
        for (planned, device) in opened {
            let Planned { id, host, steering } = planned;
            attached.push(PassthroughDevice {
                id: id.clone(),
                host_address: host.address.clone(),
                steering: steering.clone(),
            });
            let function = platform.attach_passthrough(id, host, device, mapper.clone())?;
            if let Some(steering) = steering {
                // The host IRQs exist once the guest enables MSI/MSI-X; a
                // thread of their own steers them, told by the vCPU that
                // saw the enable.
                let wake = start_steering(steering)?;
                function
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .on_interrupts_changed(Box::new(move || {
                        let _ = wake.send(());
                    }));
            }
        }
        Ok(PassthroughDevices(attached))
    }
}

/// Starts the thread that steers one device's host IRQs each time it is
/// told to (several tellings since its last turn are one). It ends when
/// the device, holding the sender, goes.
fn start_steering(steering: IrqSteering) -> Result<mpsc::Sender<()>, Error> {
    let (wake, woken) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("irq-steer".into())
        .spawn(move || {
            sandbox::enter_or_exit(sandbox::ThreadKind::IrqSteer);
            while woken.recv().is_ok() {
                while woken.try_recv().is_ok() {}
                steering.steer();
            }
        })
        .map_err(|e| fail(format!("cannot start the IRQ steering thread: {e}")))?;
    Ok(wake)
}

/// Why VFIO would not open a device, said for a user.
fn open_error(error: &VfioError, host: &HostDevice) -> String {
    match error {
        VfioError::OpenGroup(e, _) if e.raw_os_error() == Some(libc::EBUSY) => format!(
            "IOMMU group {} is in use by another process (another VM?)",
            host.group
        ),
        VfioError::GroupViable => format!(
            "IOMMU group {} is not viable: bind every device of the group to vfio-pci",
            host.group
        ),
        e => e.to_string(),
    }
}

/// Maps every RAM slot at its guest-physical address, so the devices' DMA
/// addresses are guest-physical ones.
fn map_ram(container: &VfioContainer, memory: &MemoryManager) -> Result<(), Error> {
    let regions = memory.ram_mappings();
    let total: u64 = regions.iter().map(|&(_, _, len)| len as u64).sum();
    for (guest_address, host, len) in regions {
        // SAFETY: `host` is RAM the memory manager keeps mapped for the
        // VM's life (longer than the container, which the devices hold);
        // hakoniwa touches guest RAM only through volatile accessors and
        // system calls, never through Rust references, so the device
        // writing it at any time breaks nothing.
        unsafe { container.vfio_dma_map(guest_address, len, host) }.map_err(|e| {
            let enomem = matches!(&e, VfioError::IommuDmaMap(s) if s.errno() == libc::ENOMEM);
            if enomem {
                fail(format!(
                    "VFIO could not pin guest RAM ({}) for DMA: raise the memlock limit (ulimit -l) to at least {} KiB, or run with CAP_IPC_LOCK",
                    format_size(total),
                    total >> 10
                ))
            } else {
                fail(format!("mapping guest RAM at {guest_address:#x} for DMA: {e}"))
            }
        })?;
    }
    Ok(())
}

/// The line to refuse a VM whose RAM VFIO could not pin, or None: without
/// CAP_IPC_LOCK, pinned pages count against RLIMIT_MEMLOCK (`limit`, None
/// for unlimited).
fn memlock_shortfall(capable: bool, limit: Option<u64>, ram: u64) -> Option<String> {
    match limit {
        Some(limit) if !capable && limit < ram => Some(format!(
            "VFIO pins all guest RAM ({}) but the memlock limit is {} KiB: raise it (ulimit -l {}, LimitMEMLOCK= under systemd) or run with CAP_IPC_LOCK",
            format_size(ram),
            limit >> 10,
            ram >> 10
        )),
        _ => None,
    }
}

/// RLIMIT_MEMLOCK's soft limit in bytes, None when unlimited.
fn memlock_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own and nothing else.
    let ret = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    (ret == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Whether this process has capability `cap` in its effective set.
fn has_capability(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << cap) != 0)
}

/// The memory manager as the passthrough devices' BAR mapper.
struct DeviceMemory(Arc<MemoryManager>);

impl GuestMapper for DeviceMemory {
    unsafe fn map(
        &self,
        host: *mut u8,
        len: usize,
        guest_address: u64,
        owner: Arc<dyn Send + Sync>,
    ) -> Result<u32, String> {
        // SAFETY: the caller's contract is add_region's.
        unsafe {
            self.0
                .add_region("vfio-bar", host, len, guest_address, owner)
        }
        .map_err(|e| e.to_string())
    }

    fn move_to(&self, slot: u32, guest_address: u64) -> Result<(), String> {
        self.0
            .move_region(slot, guest_address)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memlock_is_checked_only_without_the_capability() {
        let gib = 1 << 30;
        let line = memlock_shortfall(false, Some(8 << 20), gib).unwrap();
        assert!(
            line.contains("memlock limit is 8192 KiB") && line.contains("ulimit -l 1048576"),
            "{line}"
        );
        assert_eq!(memlock_shortfall(true, Some(8 << 20), gib), None);
        assert_eq!(memlock_shortfall(false, None, gib), None);
        assert_eq!(memlock_shortfall(false, Some(2 * gib), gib), None);
    }

    #[test]
    fn a_vm_with_a_passthrough_device_refuses_snapshots_and_migration() {
        assert!(PassthroughDevices::default().refuse("a snapshot").is_ok());
        let vm = PassthroughDevices(vec![PassthroughDevice {
            id: "nvme0".into(),
            host_address: "0000:00:03.0".into(),
            steering: None,
        }]);
        let e = vm.refuse("a migration").unwrap_err();
        assert!(
            e.starts_with("a migration is not possible: passthrough device nvme0 (0000:00:03.0)"),
            "{e}"
        );
    }
}
