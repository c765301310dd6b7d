//! Building a VM top to bottom and running it until something ends it:
//! KVM → guest memory → platform devices → ACPI and boot images → vCPUs →
//! console, signals and API → wait for the first ending event → stop.

use std::os::unix::thread::JoinHandleExt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arch::acpi::write_acpi_tables;
use arch::cpuid::{patch_cpuid, CpuidOptions};
use arch::layout::{KVM_IDENTITY_MAP_ADDRESS, KVM_TSS_ADDRESS};
use arch::reset_vector::write_reset_vector;
use devices::ExitNotifier;
use display::DisplayConfig;
use kvm_bindings::{kvm_pit_config, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Kvm, VmFd};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::boot::{check_boot_files, load_boot_images, BootProtocol};
use crate::config::{format_size, VmConfig};
use crate::console::{spawn_input_thread, RawTerminal};
use crate::controller::{VcpuPauser, VmControl, VmDescription};
use crate::display::{
    boot_framebuffer, default_inputs, layout_cmdline_word, start_display, DisplayMetrics,
};
use crate::dump::Inspector;
use crate::event::{channel, outcome, EventSender, Outcome, VmmEvent};
use crate::memory::{create_guest_memory, register_guest_memory, GuestMemoryMmap};
use crate::metrics::{MetricsSink, MetricsSource, MetricsWriter};
use crate::migration::{
    Incoming, IncomingAddress, MigrationError, MigrationReports, MigrationSource,
};
use crate::mmu::{AgentListener, MmuControl, SptBudget};
use crate::platform::{create_virtio_devices, Platform};
use crate::snapshot::restore as snapshot_restore;
use crate::snapshot::SnapshotSource;
use crate::vcpu::{install_kick_handler, kick_signal, Desired, RunControl, Vcpu};
use crate::{signals, Error};

/// A VM that is built and whose vCPUs are running.
pub struct Vm {
    // Field order is drop order: vCPU threads first, then the VM, then memory.
    vcpu_threads: Vec<JoinHandle<()>>,
    control: Arc<RunControl>,
    _vm_fd: Arc<VmFd>,
    _memory: GuestMemoryMmap,
}

/// Builds the VM from `config`, runs it, and returns how hakoniwa should end.
pub fn run(config: &VmConfig) -> Result<Outcome, Error> {
    signals::block_stop_signals()?;
    check_host_memory(config.memory_bytes)?;
    // `--restore`: the snapshot, checked against the flags before any KVM
    // work; `--incoming`: the listening socket, bound before any KVM work.
    // Either way the kernel is not loaded, so not checked.
    let mut restore = match &config.restore {
        Some(path) => Some(snapshot_restore::open_for(config, path)?),
        None => None,
    };
    let incoming = match &config.incoming {
        Some(address) => {
            if let Some((what, flags)) = snapshot_restore::unsupported(config) {
                return Err(Error::Migration(MigrationError::Invalid(format!(
                    "migration of {what} is not supported yet ({flags})"
                ))));
            }
            Some(Incoming::bind(&IncomingAddress(address.clone()))?)
        }
        None => None,
    };
    if restore.is_none() && incoming.is_none() {
        check_boot_files(
            &config.kernel,
            config.initramfs.as_deref(),
            config.memory_bytes,
        )?;
    }
    let display_config = parse_display(config)?;
    let mut virtio_config = config.virtio.clone();
    if let Some(display) = &display_config {
        if virtio_config.inputs.is_empty() {
            virtio_config.inputs = default_inputs(display);
        }
    }
    let mut virtio_devices = create_virtio_devices(&virtio_config)?;
    // The metrics file, opened before any KVM work so a bad path fails early.
    let metrics_sink = match &config.metrics {
        Some(metrics) => Some(MetricsSink::open(&metrics.path)?),
        None => None,
    };

    let (events, ending) = channel();
    let control = Arc::new(RunControl::default());
    let kvm = Kvm::new().map_err(Error::OpenKvm)?;
    // The MSRs a snapshot saves (docs/snapshot.md).
    let msr_indices = kvm
        .get_msr_index_list()
        .map_err(|e| Error::Kvm("KVM_GET_MSR_INDEX_LIST", e))?
        .as_slice()
        .to_vec();
    let vm_fd = Arc::new(create_vm(&kvm)?);
    let memory = create_guest_memory(config.memory_bytes)?;
    register_guest_memory(&vm_fd, &memory)?;
    // The framebuffer takes the memory slot after RAM's.
    let display = match &display_config {
        Some(c) => Some(start_display(
            c,
            &vm_fd,
            arch::layout::ram_regions(config.memory_bytes).len() as u32,
            &virtio_devices.inputs,
        )?),
        None => None,
    };
    // The shadow-page budget, before any vCPU runs (docs/shadow-paging.md).
    let mmu = Arc::new(MmuControl::new(
        vm_fd.clone(),
        config.memory_bytes,
        config.spt_budget,
    )?);
    let _mmu_agent = start_mmu_agent(config, &mmu)?;

    let notifier = exit_notifier(control.clone(), events.clone());
    let mut platform = Platform::new(&vm_fd, notifier)?;
    for device in std::mem::take(&mut virtio_devices.devices) {
        platform.attach_virtio(&vm_fd, &memory, device)?;
    }
    let mut cmdline = guest_cmdline(config);
    if let Some(display) = &display_config {
        cmdline = format!("{cmdline} {}", layout_cmdline_word(display));
    }
    // Booting writes the firmware tables and loads the kernel; restoring
    // and migrating in take RAM and the VM-wide KVM and device state from
    // the snapshot or the source instead, before any vCPU exists.
    let mut received = None;
    let entry = match (&mut restore, incoming) {
        (Some(reader), _) => {
            snapshot_restore::check_devices(reader, &platform.devices)?;
            reader.load_ram(&memory)?;
            snapshot_restore::apply_vm_state(&vm_fd, &platform, &reader.snapshot)?;
            None
        }
        (None, Some(incoming)) => {
            let machine = snapshot_restore::machine_state(
                config,
                &platform.devices,
                BootProtocol::Linux64,
                String::new(),
                String::new(),
            );
            let vm = incoming.receive(&memory, &machine)?;
            snapshot_restore::apply_vm_state(&vm_fd, &platform, &vm.snapshot)?;
            received = Some(vm);
            None
        }
        (None, None) => {
            let rsdp = write_acpi_tables(&memory, &platform.acpi(config.vcpus))?;
            let (reset_port, reset_value) = Platform::reset_register();
            write_reset_vector(&memory, reset_port, reset_value)?;
            Some(load_boot_images(
                &memory,
                config.memory_bytes,
                &config.kernel,
                config.initramfs.as_deref(),
                &cmdline,
                rsdp,
                display_config.as_ref().map(boot_framebuffer),
            )?)
        }
    };
    // The state the vCPUs take, when they do not boot.
    let saved = restore
        .as_ref()
        .map(|reader| &reader.snapshot)
        .or(received.as_ref().map(|vm| &vm.snapshot));
    // What vm.info and the next snapshot say about the boot.
    let (kernel, cmdline, boot_protocol) = match (saved, &entry) {
        (Some(saved), _) => {
            let machine = &saved.machine;
            (
                machine.kernel.clone(),
                machine.cmdline.clone(),
                snapshot_restore::boot_protocol(machine),
            )
        }
        (None, Some(entry)) => (
            config.kernel.display().to_string(),
            cmdline.clone(),
            entry.protocol,
        ),
        (None, None) => unreachable!("a VM either boots or restores"),
    };
    let xsave_size = snapshot_restore::xsave_size(&vm_fd);
    // Failure reports (--dump-dir, ctl dump).
    let inspector = Arc::new(
        Inspector::new(
            memory.clone(),
            vm_fd.clone(),
            platform.serial.clone(),
            platform.console_tail.clone(),
            config.vcpus,
            config.dump_dir.clone(),
        )
        .with_history(received.as_ref().map(|r| r.history())),
    );

    install_kick_handler()?;
    let mut vm = Vm {
        vcpu_threads: Vec::new(),
        control: control.clone(),
        _vm_fd: vm_fd.clone(),
        _memory: memory.clone(),
    };
    let cpuid_options = CpuidOptions {
        vcpu_count: config.vcpus,
        async_pf: config.async_pf,
    };
    let supported_cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(|e| Error::Kvm("KVM_GET_SUPPORTED_CPUID", e))?;
    // Every vCPU is created and configured before any runs: once the boot
    // CPU runs, it may send INIT/SIPI to the others at any time, and their
    // LAPIC and MSR setup must not land on top of that.
    let mut vcpus = Vec::with_capacity(usize::from(config.vcpus));
    for index in 0..config.vcpus {
        let fd = vm_fd
            .create_vcpu(u64::from(index))
            .map_err(|e| Error::Kvm("KVM_CREATE_VCPU", e))?;
        mmu.stats().add_vcpu(&fd);
        let mut cpuid = supported_cpuid.clone();
        patch_cpuid(&mut cpuid, index, cpuid_options);
        fd.set_cpuid2(&cpuid)
            .map_err(|e| Error::Kvm("KVM_SET_CPUID2", e))?;
        match (saved, &entry) {
            (Some(saved), _) => {
                let state = &saved.vcpus[usize::from(index)];
                let refused = crate::snapshot::vcpu_state::restore_vcpu(&fd, state, xsave_size)?;
                if !refused.is_empty() {
                    let list: Vec<String> = refused.iter().map(|m| format!("{m:#x}")).collect();
                    say!(
                        "hakoniwa: vCPU {index}: KVM did not restore MSRs {}",
                        list.join(", ")
                    );
                }
            }
            (None, Some(entry)) => {
                arch::regs::setup_msrs(&fd)?;
                arch::regs::setup_fpu(&fd)?;
                arch::regs::setup_lint(&fd)?;
                if index == 0 {
                    arch::regs::setup_boot_cpu(&fd, &memory, entry.mode)?;
                }
            }
            (None, None) => unreachable!("a VM either boots or restores"),
        }
        vcpus.push(Vcpu {
            index,
            fd,
            pio: platform.pio.clone(),
            mmio: platform.mmio.clone(),
            control: control.clone(),
            events: events.clone(),
            captures: inspector.captures(),
        });
    }
    // Restored devices go on from here: every vCPU's LAPIC is back, so
    // the interrupts they raise now reach the guest.
    if saved.is_some() {
        snapshot_restore::resume_devices(&platform)?;
    }
    for vcpu in vcpus {
        vm.vcpu_threads
            .push(vcpu.spawn().map_err(|e| Error::Thread {
                what: "vCPU",
                error: e,
            })?);
    }
    let pauser = Arc::new(VcpuPauser::new(
        control.clone(),
        vm.vcpu_threads.iter().map(|t| t.as_pthread_t()).collect(),
    ));
    // A migrated-in VM runs from here: tell the source (postcopy: RAM
    // keeps coming in the background and on demand).
    if let Some(received) = &mut received {
        received.started(pauser.clone())?;
    }

    // Interactive console unless the guest runs a command for us.
    let _raw_terminal = if config.exec.is_none() {
        let raw = RawTerminal::enable();
        if raw.is_some() {
            say!("hakoniwa: console on COM1; Ctrl-A x quits, Ctrl-A h for help");
        }
        spawn_input_thread(
            platform.serial.clone(),
            platform.serial_input_space,
            events.clone(),
        )
        .map_err(|e| Error::Thread {
            what: "console",
            error: e,
        })?;
        raw
    } else {
        None
    };
    signals::spawn_signal_thread(events.clone())?;

    let snapshot_source = Arc::new(
        SnapshotSource::new(
            vm_fd.clone(),
            memory.clone(),
            platform.serial.clone(),
            snapshot_restore::machine_state(
                config,
                &platform.devices,
                boot_protocol,
                kernel.clone(),
                cmdline.clone(),
            ),
            msr_indices,
            snapshot_restore::unsupported(config),
        )
        .with_virtio(platform.virtio.clone()),
    );
    drop(restore);
    let description = VmDescription {
        vcpus: config.vcpus,
        memory_bytes: config.memory_bytes,
        kernel,
        cmdline,
        boot_protocol,
        devices: platform.devices,
    };
    let migrations = Arc::new(MigrationReports {
        source: Arc::new(MigrationSource::new(
            vm_fd.clone(),
            snapshot_source.clone(),
            pauser.clone(),
            events.clone(),
        )),
        incoming: received.as_ref().map(|r| r.status()),
    });
    inspector.set_migrations(migrations.clone());
    // Periodic metrics (--metrics): "mmu", "kvm" and "migration"; a device
    // with figures of its own (the display: "display") adds its
    // MetricsSource here.
    let mut metrics_sources: Vec<Arc<dyn MetricsSource>> =
        vec![mmu.clone(), mmu.shared_stats(), migrations.clone()];
    if let Some(display) = &display {
        metrics_sources.push(Arc::new(DisplayMetrics(display.control())));
    }
    let metrics = match (metrics_sink, &config.metrics) {
        (Some(sink), Some(m)) => Some(MetricsWriter::start(sink, m.interval, metrics_sources)?),
        _ => None,
    };
    let vm_control = Arc::new(
        VmControl::new(
            description,
            control.clone(),
            pauser,
            events.clone(),
            virtio_devices.balloon.clone(),
        )
        .with_mmu(mmu)
        .with_display(display.as_ref().map(|d| d.control()))
        .with_snapshot(snapshot_source)
        .with_migration(migrations)
        .with_inspector(inspector.clone()),
    );
    let _api_server = match &config.api_socket {
        Some(path) => Some(crate::controller::start_api_server(
            path,
            vm_control.clone(),
        )?),
        None => None,
    };

    let event = ending
        .recv()
        .unwrap_or(VmmEvent::Error("event channel closed".into()));
    // A vCPU failed (triple fault, KVM internal error): the others read
    // their state as they stop, for the report.
    let failed = inspector.captures().has_failure();
    if failed {
        control.capture_on_stop();
    }
    vm.stop();
    if failed {
        let reason = match &event {
            VmmEvent::TripleFault => "the guest triple-faulted".to_string(),
            VmmEvent::Error(message) => message.clone(),
            other => format!("{other:?}"),
        };
        if let Some((summary, path)) = inspector.report_failure(&reason) {
            match path {
                Some(path) => say!("hakoniwa: {summary}; report: {}", path.display()),
                None => say!("hakoniwa: {summary}"),
            }
        }
    }
    // The last metrics line, with the vCPUs' final counts.
    if let Some(metrics) = metrics {
        metrics.stop();
    }
    Ok(outcome(&event, config.exec.is_some()))
}

impl Vm {
    /// Stops every vCPU: asks them to stop, kicks them out of KVM_RUN
    /// until they have all left their loops, then joins them.
    fn stop(&mut self) {
        self.control.set(Desired::Stop);
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.vcpu_threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            for thread in self.vcpu_threads.iter().filter(|t| !t.is_finished()) {
                kick(thread.as_pthread_t());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for thread in self.vcpu_threads.drain(..) {
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

/// Sends the kick signal to a vCPU thread that has not been joined.
pub fn kick(thread: libc::pthread_t) {
    // SAFETY: `thread` comes from a JoinHandle that has not been joined, so
    // the pthread_t is still valid; the signal's handler is installed.
    unsafe { libc::pthread_kill(thread, kick_signal()) };
}

fn create_vm(kvm: &Kvm) -> Result<VmFd, Error> {
    let vm = kvm
        .create_vm()
        .map_err(|e| Error::Kvm("KVM_CREATE_VM", e))?;
    vm.set_tss_address(KVM_TSS_ADDRESS as usize)
        .map_err(|e| Error::Kvm("KVM_SET_TSS_ADDR", e))?;
    vm.set_identity_map_address(KVM_IDENTITY_MAP_ADDRESS)
        .map_err(|e| Error::Kvm("KVM_SET_IDENTITY_MAP_ADDR", e))?;
    // In-kernel PIC, IOAPIC and local APICs; then the PIT, whose speaker
    // port (0x61) KVM also emulates, so timer calibration never exits.
    vm.create_irq_chip()
        .map_err(|e| Error::Kvm("KVM_CREATE_IRQCHIP", e))?;
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(pit)
        .map_err(|e| Error::Kvm("KVM_CREATE_PIT2", e))?;
    Ok(vm)
}

/// The display's options, checked before any KVM work.
fn parse_display(config: &VmConfig) -> Result<Option<DisplayConfig>, Error> {
    config
        .display
        .as_deref()
        .map(DisplayConfig::parse)
        .transpose()
        .map_err(|e| Error::Device("--display".into(), e.to_string()))
}

/// The guest agent's listener (vsock port 1024) when the VM has a vsock:
/// required for `--spt-pages auto`, otherwise best effort (it also lets an
/// API switch to auto at run time follow the guest).
fn start_mmu_agent(
    config: &VmConfig,
    mmu: &Arc<MmuControl>,
) -> Result<Option<AgentListener>, Error> {
    let auto = config.spt_budget == SptBudget::Auto;
    let Some(vsock) = &config.virtio.vsock else {
        return if auto {
            Err(crate::mmu::MmuError::AutoNeedsVsock.into())
        } else {
            Ok(None)
        };
    };
    match AgentListener::start(vsock, mmu.clone()) {
        Ok(listener) => Ok(Some(listener)),
        Err(e) if auto => Err(e.into()),
        Err(e) => {
            tracing::warn!("no guest agent for the shadow-page budget: {e}");
            Ok(None)
        }
    }
}

/// Device exits stop the vCPUs at once (so the guest runs no further after
/// e.g. writing its exit status) and tell the main thread.
fn exit_notifier(control: Arc<RunControl>, events: EventSender) -> ExitNotifier {
    Arc::new(move |exit| {
        control.set(Desired::Stop);
        events.send(VmmEvent::Guest(exit));
    })
}

/// The command line the guest gets: the user's (or the default), plus the
/// command to run, base64-encoded so it survives the kernel's parser.
pub fn guest_cmdline(config: &VmConfig) -> String {
    match &config.exec {
        Some(command) => format!(
            "{} hk.cmd={}",
            config.cmdline,
            BASE64.encode(command.as_bytes())
        ),
        None => config.cmdline.clone(),
    }
}

/// Refuses guests larger than the host's RAM.
fn check_host_memory(requested: u64) -> Result<(), Error> {
    let Some(host) = host_memory_bytes() else {
        return Ok(());
    };
    if requested > host {
        return Err(Error::MemoryAboveHost {
            given: format_size(requested),
            host: format_size(host),
        });
    }
    Ok(())
}

fn host_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
