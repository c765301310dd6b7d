//! The VM's devices: the legacy PC platform on the port bus, the PCI root
//! bus with its host bridge, and virtio devices attached to it with their
//! BARs on the MMIO bus. Owns what the ACPI tables must say about them, and
//! keeps the virtio functions ([`VirtioFunctions`]) for snapshots.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arch::acpi::{AcpiPlatform, LegacyDevice, PciInterrupt, S5_SLEEP_TYPE};
use devices::interrupt::MsiRouting;
use devices::legacy::acpi_pm::{
    ACPI_PM_PORT, ACPI_PM_PORT_COUNT, RESET_OFFSET, RESET_VALUE, SLEEP_CONTROL_OFFSET,
    SLEEP_STATUS_OFFSET,
};
use devices::legacy::debug_exit::DEBUG_EXIT_PORT;
use devices::legacy::{
    AcpiPm, DebugExit, Serial, COM1_IRQ, COM1_PORT, I8042, I8042_PORT, I8042_PORT_COUNT,
};
use devices::pci::{
    BarAllocator, HostBridge, PciConfigIo, PCI_CONFIG_IO_PORT, PCI_CONFIG_IO_PORT_COUNT,
    PCI_MMIO_END, PCI_MMIO_START,
};
use devices::vfio::{GuestMapper, HostDevice, VfioPciDevice};
use devices::virtio::balloon::{Balloon, BalloonControl};
use devices::virtio::block::{Block, BlockConfig, Locking};
use devices::virtio::input::{Input, InputControl};
use devices::virtio::net::Net;
use devices::virtio::pci::{VirtioPciDevice, VirtioPciState, BAR_SIZE};
use devices::virtio::rng::Rng;
use devices::virtio::vsock::Vsock;
use devices::virtio::{StateError, VirtioDevice};
use devices::{Bus, ExitNotifier, SharedDevice};
use kvm_ioctls::VmFd;
use vfio_ioctls::VfioDevice;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::config::VirtioConfig;
use crate::console::{ConsoleOutput, ConsoleTail};
use crate::controller::DeviceDescription;
use crate::counters::CountedDevice;
use crate::memory::GuestMemoryMmap;
use crate::Error;

/// Every device of the VM and the buses that reach them.
pub struct Platform {
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pub serial: Arc<Mutex<Serial>>,
    /// Signalled when the guest drained COM1's input FIFO.
    pub serial_input_space: EventFd,
    /// COM1's last output, for failure reports.
    pub console_tail: ConsoleTail,
    pub devices: Vec<DeviceDescription>,
    /// The virtio-pci functions, for snapshots.
    pub virtio: VirtioFunctions,
    pci: Arc<Mutex<PciConfigIo>>,
    routing: Arc<MsiRouting>,
    bars: BarAllocator,
    /// The INTx lines of the functions on the bus, for the DSDT's `_PRT`.
    pci_interrupts: Vec<PciInterrupt>,
}

impl Platform {
    /// The legacy devices and an empty PCI bus with its host bridge.
    pub fn new(vm: &Arc<VmFd>, notifier: ExitNotifier) -> Result<Platform, Error> {
        let pio = Arc::new(Bus::new());
        let mmio = Arc::new(Bus::new());
        let device_error = |id: &'static str| {
            move |e: std::io::Error| Error::Device(id.to_string(), e.to_string())
        };

        let interrupt = EventFd::new(EFD_NONBLOCK).map_err(device_error("com1"))?;
        vm.register_irqfd(&interrupt, COM1_IRQ)
            .map_err(|e| Error::Kvm("KVM_IRQFD", e))?;
        let input_space = EventFd::new(0).map_err(device_error("com1"))?;
        let serial_input_space = input_space.try_clone().map_err(device_error("com1"))?;
        let console_tail = ConsoleTail::default();
        let serial = Arc::new(Mutex::new(Serial::new(
            interrupt,
            input_space,
            Box::new(ConsoleOutput {
                tail: console_tail.clone(),
            }),
        )));

        let mut pci = PciConfigIo::new(mmio.clone());
        pci.add_function(0, Arc::new(Mutex::new(HostBridge)));
        let pci = Arc::new(Mutex::new(pci));

        let mut platform = Platform {
            pio,
            virtio: VirtioFunctions {
                mmio: mmio.clone(),
                functions: Vec::new(),
            },
            mmio,
            serial: serial.clone(),
            serial_input_space,
            console_tail,
            devices: Vec::new(),
            pci: pci.clone(),
            routing: MsiRouting::new(vm.clone()),
            bars: BarAllocator::default(),
            pci_interrupts: Vec::new(),
        };
        platform.add_legacy(
            serial,
            "com1",
            "serial-16550a",
            COM1_PORT,
            8,
            Some(COM1_IRQ),
        )?;
        let i8042 = Arc::new(Mutex::new(I8042::new(notifier.clone())));
        platform.add_legacy(
            i8042,
            "i8042",
            "i8042-reset",
            I8042_PORT,
            I8042_PORT_COUNT,
            None,
        )?;
        let pm = Arc::new(Mutex::new(AcpiPm::new(notifier.clone(), S5_SLEEP_TYPE)));
        platform.add_legacy(
            pm,
            "acpi-pm",
            "acpi-power-management",
            ACPI_PM_PORT,
            ACPI_PM_PORT_COUNT,
            None,
        )?;
        platform.add_legacy(
            pci,
            "pci-config",
            "pci-config-mechanism-1",
            PCI_CONFIG_IO_PORT,
            PCI_CONFIG_IO_PORT_COUNT,
            None,
        )?;
        let debug_exit = Arc::new(Mutex::new(DebugExit::new(notifier)));
        platform.add_legacy(
            debug_exit,
            "debug-exit",
            "debug-exit",
            DEBUG_EXIT_PORT,
            1,
            None,
        )?;
        Ok(platform)
    }

    fn add_legacy(
        &mut self,
        device: SharedDevice,
        id: &str,
        kind: &str,
        port: u16,
        count: u16,
        irq: Option<u32>,
    ) -> Result<(), Error> {
        self.pio
            .insert(device, u64::from(port), u64::from(count))
            .map_err(|e| Error::Device(id.to_string(), e.to_string()))?;
        self.devices
            .push(DeviceDescription::legacy(id, kind, port, count, irq));
        Ok(())
    }

    /// Puts a virtio device on the PCI bus: a free slot, a BAR in the PCI
    /// memory window, MSI-X vectors and queue ioeventfds.
    pub fn attach_virtio(
        &mut self,
        vm: &Arc<VmFd>,
        memory: &GuestMemoryMmap,
        device: Box<dyn VirtioDevice>,
    ) -> Result<(), Error> {
        let id = device.id().to_string();
        let described = device.describe();
        let fail = |message: String| Error::Device(id.clone(), message);
        let slot = self.free_slot().map_err(fail)?;
        let bar = self
            .bars
            .allocate(BAR_SIZE)
            .ok_or_else(|| fail("the PCI memory window is full".into()))?;
        let virtio = VirtioPciDevice::new(device, vm.clone(), &self.routing, memory.clone(), bar)
            .map_err(|e| fail(e.to_string()))?;
        let kind = format!("virtio-pci (type {})", virtio.device_type());
        let virtio = Arc::new(Mutex::new(virtio));
        self.mmio
            .insert(virtio.clone(), bar, BAR_SIZE)
            .map_err(|e| fail(e.to_string()))?;
        self.pci
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add_function(slot, virtio.clone());
        self.virtio.functions.push((id.clone(), virtio));
        self.devices.push(DeviceDescription {
            id: id.clone(),
            kind,
            resources: [
                format!("pci 00:{slot:02x}.0"),
                format!("mmio {:#x}-{:#x}", bar, bar + BAR_SIZE - 1),
            ]
            .into_iter()
            .chain(described)
            .collect(),
        });
        Ok(())
    }

    /// Puts a host PCI function opened with VFIO on the PCI bus: a free
    /// slot, its BARs in the PCI memory window (mapped into the guest
    /// through `mapper` where VFIO allows), its MSI/MSI-X vectors in the
    /// VM's routing table, its INTx line (if it has one) in the `_PRT`
    /// (crate::passthrough).
    pub fn attach_passthrough(
        &mut self,
        id: String,
        host: HostDevice,
        device: VfioDevice,
        mapper: Arc<dyn GuestMapper>,
    ) -> Result<Arc<Mutex<VfioPciDevice>>, Error> {
        let fail = |message: String| Error::Device(id.clone(), message);
        let slot = self.free_slot().map_err(fail)?;
        let address = host.address.clone();
        let (function, bars) = VfioPciDevice::new(
            id.clone(),
            host,
            device,
            &self.routing,
            &mut self.bars,
            mapper,
        )
        .map_err(|e| fail(format!("{address}: {e}")))?;
        for bar in &bars {
            self.mmio
                .insert(bar.access.clone(), bar.address, bar.size)
                .map_err(|e| fail(e.to_string()))?;
        }
        if let Some((pin, gsi)) = function.intx_route() {
            self.pci_interrupts.push(PciInterrupt { slot, pin, gsi });
        }
        let kind = format!("vfio-pci ({})", function.identity());
        let mut resources = vec![format!("pci 00:{slot:02x}.0")];
        resources.extend(function.resources());
        let function = Arc::new(Mutex::new(function));
        self.pci
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add_function(slot, function.clone());
        self.devices.push(DeviceDescription {
            id,
            kind,
            resources,
        });
        Ok(function)
    }

    /// The next free device number on the PCI bus.
    fn free_slot(&self) -> Result<u8, String> {
        self.pci
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free_device()
            .ok_or_else(|| "no free PCI slot (31 devices at most)".into())
    }

    /// What the ACPI tables say about these devices.
    pub fn acpi(&self, vcpu_count: u8) -> AcpiPlatform {
        AcpiPlatform {
            vcpu_count,
            sleep_control_port: ACPI_PM_PORT + SLEEP_CONTROL_OFFSET as u16,
            sleep_status_port: ACPI_PM_PORT + SLEEP_STATUS_OFFSET as u16,
            reset_port: ACPI_PM_PORT + RESET_OFFSET as u16,
            reset_value: RESET_VALUE,
            devices: vec![LegacyDevice {
                name: "COM1",
                hid: "PNP0501",
                io: (COM1_PORT, 8),
                irq: Some(COM1_IRQ),
            }],
            reserved_io: vec![
                (DEBUG_EXIT_PORT, 1),
                (ACPI_PM_PORT, ACPI_PM_PORT_COUNT as u8),
            ],
            pci_mmio_window: (PCI_MMIO_START as u32, (PCI_MMIO_END - 1) as u32),
            pci_interrupts: self.pci_interrupts.clone(),
        }
    }

    /// The reset register the reset-vector stub writes.
    pub fn reset_register() -> (u16, u8) {
        (ACPI_PM_PORT + RESET_OFFSET as u16, RESET_VALUE)
    }
}

/// The VM's virtio-pci functions by device id, and the MMIO bus their BARs
/// are on: what a snapshot pauses and saves, and a restore puts back
/// (docs/snapshot.md). Cheap to clone.
#[derive(Clone)]
pub struct VirtioFunctions {
    mmio: Arc<Bus>,
    functions: Vec<(String, Arc<Mutex<VirtioPciDevice>>)>,
}

/// A virtio function's id and what went wrong with its state.
pub type VirtioStateFailure = (String, StateError);

impl VirtioFunctions {
    /// Whether the VM has no virtio device.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    fn lock(function: &Mutex<VirtioPciDevice>) -> std::sync::MutexGuard<'_, VirtioPciDevice> {
        function.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pauses every function (see `VirtioPciDevice::save_state`) and takes
    /// its state, by id. The VM's vCPUs must be paused. On failure, the
    /// functions already paused are resumed and none stays paused.
    pub fn pause_and_save(&self) -> Result<BTreeMap<String, VirtioPciState>, VirtioStateFailure> {
        let mut states = BTreeMap::new();
        for (id, function) in &self.functions {
            match Self::lock(function).save_state() {
                Ok(state) => {
                    states.insert(id.clone(), state);
                }
                Err(error) => {
                    // The failed one too: it may be half paused.
                    let _ = self.resume();
                    return Err((id.clone(), error));
                }
            }
        }
        Ok(states)
    }

    /// Lets every function serve again (after `pause_and_save` on this VM,
    /// or `restore` on a new one). All are tried; the first failure is
    /// returned.
    pub fn resume(&self) -> Result<(), VirtioStateFailure> {
        let mut result = Ok(());
        for (id, function) in &self.functions {
            if let Err(error) = Self::lock(function).resume() {
                tracing::error!("virtio device {id}: {error}");
                if result.is_ok() {
                    result = Err((id.clone(), error));
                }
            }
        }
        result
    }

    /// Puts `states` back into the functions of a VM just built from the
    /// same flags (before any vCPU exists): each function must have its
    /// state and each state its function. The devices stay paused until
    /// [`resume`](Self::resume), which must come once the vCPUs' state is
    /// back (an interrupt raised before that would be lost).
    pub fn restore(
        &self,
        states: &BTreeMap<String, VirtioPciState>,
    ) -> Result<(), VirtioStateFailure> {
        if let Some(id) = states
            .keys()
            .find(|id| !self.functions.iter().any(|(f, _)| f == *id))
        {
            return Err((
                id.clone(),
                StateError::Mismatch("the snapshot has this device, this VM does not".into()),
            ));
        }
        for (id, function) in &self.functions {
            let state = states.get(id).ok_or_else(|| {
                (
                    id.clone(),
                    StateError::Mismatch(
                        "this VM has the device, the snapshot has no state for it".into(),
                    ),
                )
            })?;
            let moved = Self::lock(function)
                .restore_state(state)
                .map_err(|e| (id.clone(), e))?;
            if let Some(moved) = moved {
                self.mmio.relocate(moved.old, moved.new).map_err(|e| {
                    (
                        id.clone(),
                        StateError::Platform(format!(
                            "its BAR cannot go back to {:#x}: {e}",
                            moved.new
                        )),
                    )
                })?;
            }
        }
        Ok(())
    }
}

/// The virtio devices to attach, and the handles the VMM keeps to drive
/// them at run time (the API's balloon endpoint, the display's input, the
/// counters of `vm.counters`).
#[derive(Default)]
pub struct VirtioDevices {
    pub devices: Vec<Box<dyn VirtioDevice>>,
    pub balloon: Option<Arc<BalloonControl>>,
    pub inputs: Vec<Arc<InputControl>>,
    /// Disks and network devices by id.
    pub counted: Vec<(String, CountedDevice)>,
    /// The disks' I/O tracers (vm.iotrace).
    pub traceable: Vec<crate::iotrace::TraceableDisk>,
    /// The disk images, for flushing and locking around migrations.
    pub disks: crate::disks::Disks,
}

/// Builds the virtio devices the command line asks for, before any KVM work,
/// so a bad option or a missing disk image is reported first. Disk images
/// are locked as `locking` says (see [`crate::disks`]). A disk without
/// `num_queues=` gets one queue per vCPU (of `vcpus`), as Cloud
/// Hypervisor gives.
pub fn create_virtio_devices(
    config: &VirtioConfig,
    locking: Locking,
    vcpus: usize,
) -> Result<VirtioDevices, Error> {
    let option_error =
        |flag: &str, e: &dyn std::fmt::Display| Error::Device(flag.to_string(), e.to_string());
    let mut out = VirtioDevices::default();
    let mut blocks = Vec::new();
    for (index, options) in config.disks.iter().enumerate() {
        let disk_config = options
            .parse::<BlockConfig>()
            .map_err(|e| option_error("--disk", &e))?
            .with_default_queues(vcpus);
        let named = disk_config.id.is_some();
        let mut disk = Block::open(disk_config, locking).map_err(|e| option_error("--disk", &e))?;
        if !named {
            disk.set_name(format!("disk{index}"));
        }
        out.counted
            .push((disk.id().to_string(), CountedDevice::Disk(disk.stats())));
        out.traceable.push(crate::iotrace::TraceableDisk {
            id: disk.id().to_string(),
            tracer: disk.tracer(),
            image: disk.config().path.clone(),
            cache: disk.config().cache,
        });
        blocks.push(disk);
    }
    out.disks = crate::disks::Disks::of(&blocks);
    for disk in blocks {
        out.devices.push(Box::new(disk));
    }
    for (index, options) in config.nets.iter().enumerate() {
        let net = Net::from_options(options, &format!("net{index}"))
            .map_err(|e| option_error("--net", &e))?;
        out.counted
            .push((net.id().to_string(), CountedDevice::Net(net.metrics())));
        out.devices.push(Box::new(net));
    }
    if let Some(options) = &config.vsock {
        let vsock =
            Vsock::from_options(options, "vsock0").map_err(|e| option_error("--vsock", &e))?;
        out.devices.push(Box::new(vsock));
    }
    if let Some(options) = &config.rng {
        let rng = Rng::from_options(options).map_err(|e| option_error("--rng", &e))?;
        out.devices.push(Box::new(rng));
    }
    if let Some(options) = &config.balloon {
        let (balloon, control) =
            Balloon::from_options(options).map_err(|e| option_error("--balloon", &e))?;
        out.devices.push(Box::new(balloon));
        out.balloon = Some(control);
    }
    for options in &config.inputs {
        let (input, control) =
            Input::from_options(options).map_err(|e| option_error("--input", &e))?;
        out.devices.push(Box::new(input));
        out.inputs.push(control);
    }
    Ok(out)
}
