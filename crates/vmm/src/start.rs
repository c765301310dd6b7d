//! The three ways a VM starts — boot a kernel, continue a snapshot
//! (`--restore`), take a VM from a migration source (`--incoming`) — as
//! one type. Each knows what it checks before any KVM work, how it fills
//! memory and the VM-wide state, how a vCPU gets its first state, and how
//! it describes the boot for `vm.info` and later snapshots.

use std::sync::Arc;

use arch::acpi::write_acpi_tables;
use arch::reset_vector::write_reset_vector;
use kvm_ioctls::VcpuFd;

use crate::boot::{check_boot_files, load_boot_images, BootEntry, BootProtocol};
use crate::config::VmConfig;
use crate::disks::Disks;
use crate::display::{boot_framebuffer, Framebuffer};
use crate::memory::MemoryManager;
use crate::migration::destination::Received;
use crate::migration::Incoming;
use crate::platform::Platform;
use crate::snapshot::file::SnapshotReader;
use crate::snapshot::restore as snapshot_restore;
use crate::snapshot::state::{VcpuState, VmSnapshot};
use crate::Error;

/// How the VM starts, chosen from the command line.
pub enum Start {
    /// Load the kernel and boot it.
    Boot,
    /// Continue the VM saved in a snapshot file.
    Restore(Box<SnapshotReader>),
    /// Take the VM a migration source sends.
    Incoming(Incoming),
}

/// What the VM is being built into, for [`Start::load`].
pub struct Target<'a> {
    pub config: &'a VmConfig,
    pub memory: &'a MemoryManager,
    pub platform: &'a Platform,
    pub framebuffer: Option<&'a Framebuffer>,
    /// The command line a boot gives the kernel.
    pub cmdline: &'a str,
    /// The disk images: a migration's destination locks them when the
    /// state arrives.
    pub disks: &'a Disks,
}

/// What `vm.info` and the next snapshot say about how the guest booted.
#[derive(Clone, Debug)]
pub struct BootRecord {
    pub kernel: String,
    pub cmdline: String,
    pub protocol: BootProtocol,
}

/// A VM whose memory and VM-wide state are in place.
pub struct Loaded {
    pub boot: BootRecord,
    pub vcpus: VcpuStart,
    /// The migration that brought the VM in, when it did.
    pub received: Option<Received>,
}

/// How each vCPU gets its first state.
pub enum VcpuStart {
    /// The boot CPU enters the kernel; the others wait for INIT/SIPI.
    Boot(BootEntry),
    /// Every vCPU takes its saved state.
    Saved(Vec<VcpuState>),
}

impl Start {
    /// Chooses how to start and makes the checks that need no KVM: the
    /// snapshot must match the flags, the incoming address must bind, the
    /// kernel and initramfs must be usable (only when booting).
    pub fn prepare(config: &VmConfig) -> Result<Start, Error> {
        if let Some(path) = &config.restore {
            return Ok(Start::Restore(Box::new(snapshot_restore::open_for(
                config, path,
            )?)));
        }
        if let Some(address) = &config.incoming {
            return Ok(Start::Incoming(
                Incoming::bind(address)?.with_huge_pages(config.memory.thp),
            ));
        }
        check_boot_files(
            &config.kernel,
            config.initramfs.as_deref(),
            config.memory_bytes,
        )?;
        Ok(Start::Boot)
    }

    /// Fills guest memory and puts the VM-wide KVM and device state in,
    /// before any vCPU exists: a boot writes the firmware tables and loads
    /// the kernel; a restore or a migration takes RAM, devices and the
    /// framebuffer from the file or the source.
    pub fn load(self, target: &Target) -> Result<Loaded, Error> {
        let config = target.config;
        let ram = target.memory.ram();
        match self {
            Start::Boot => {
                let rsdp = write_acpi_tables(ram, &target.platform.acpi(config.vcpus))?;
                let (reset_port, reset_value) = Platform::reset_register();
                write_reset_vector(ram, reset_port, reset_value)?;
                let display = target.framebuffer.map(|fb| boot_framebuffer(fb.config()));
                let entry = load_boot_images(
                    ram,
                    config.memory_bytes,
                    &config.kernel,
                    config.initramfs.as_deref(),
                    target.cmdline,
                    rsdp,
                    display,
                )?;
                Ok(Loaded {
                    boot: BootRecord {
                        kernel: config.kernel.display().to_string(),
                        cmdline: target.cmdline.to_string(),
                        protocol: entry.protocol,
                    },
                    vcpus: VcpuStart::Boot(entry),
                    received: None,
                })
            }
            Start::Restore(mut reader) => {
                snapshot_restore::check_devices(&reader, &target.platform.devices)?;
                reader.load_ram(ram)?;
                continue_saved(target, &mut reader.snapshot)
            }
            Start::Incoming(incoming) => {
                let machine = snapshot_restore::machine_state(
                    config,
                    &target.platform.devices,
                    BootProtocol::Linux64,
                    String::new(),
                    String::new(),
                );
                let mut received = incoming.receive(ram, &machine, &|| target.disks.lock())?;
                let loaded = continue_saved(target, &mut received.snapshot)?;
                Ok(Loaded {
                    received: Some(received),
                    ..loaded
                })
            }
        }
    }
}

/// A restored or migrated-in VM, once its RAM is in: the VM-wide KVM and
/// device state go back; the vCPUs' states wait for their vCPUs.
fn continue_saved(target: &Target, snapshot: &mut VmSnapshot) -> Result<Loaded, Error> {
    snapshot_restore::apply_vm_state(
        target.memory.vm_fd(),
        target.platform,
        target.framebuffer,
        snapshot,
    )?;
    Ok(Loaded {
        boot: saved_boot(&snapshot.machine),
        vcpus: VcpuStart::Saved(std::mem::take(&mut snapshot.vcpus)),
        received: None,
    })
}

/// The boot a saved VM records.
fn saved_boot(machine: &crate::snapshot::state::MachineState) -> BootRecord {
    BootRecord {
        kernel: machine.kernel.clone(),
        cmdline: machine.cmdline.clone(),
        protocol: snapshot_restore::boot_protocol(machine),
    }
}

impl VcpuStart {
    /// Gives vCPU `index` its first state (CPUID is already set).
    pub fn setup(&self, index: u8, fd: &VcpuFd, memory: &Arc<MemoryManager>) -> Result<(), Error> {
        match self {
            VcpuStart::Boot(entry) => {
                arch::regs::setup_msrs(fd)?;
                arch::regs::setup_fpu(fd)?;
                arch::regs::setup_lint(fd)?;
                if index == 0 {
                    arch::regs::setup_boot_cpu(fd, memory.ram(), entry.mode)?;
                }
            }
            VcpuStart::Saved(states) => {
                let xsave_size = snapshot_restore::xsave_size(memory.vm_fd());
                let state = &states[usize::from(index)];
                let refused = crate::snapshot::vcpu_state::restore_vcpu(fd, state, xsave_size)?;
                if !refused.is_empty() {
                    let list: Vec<String> = refused.iter().map(|m| format!("{m:#x}")).collect();
                    say!(
                        "hakoniwa: vCPU {index}: KVM did not restore MSRs {}",
                        list.join(", ")
                    );
                }
            }
        }
        Ok(())
    }

    /// Whether the devices were restored and wait to be resumed once every
    /// vCPU's state is back.
    pub fn restored(&self) -> bool {
        matches!(self, VcpuStart::Saved(_))
    }
}
