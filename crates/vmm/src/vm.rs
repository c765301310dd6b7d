//! Building a VM top to bottom and running it until something ends it:
//! KVM → memory manager → platform devices → the start (boot, restore or
//! migration in) → display → vCPUs → console, signals and API → wait for
//! the first ending event → stop.

use std::os::unix::thread::JoinHandleExt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use api::ApiServer;
use arch::cpuid::{patch_cpuid, CpuidOptions};
use arch::layout::{KVM_IDENTITY_MAP_ADDRESS, KVM_TSS_ADDRESS};
use devices::virtio::balloon::BalloonControl;
use devices::ExitNotifier;
use display::{DisplayConfig, DisplayControl};
use kvm_bindings::{kvm_pit_config, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Kvm, VmFd};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::config::{format_size, VirtioConfig, VmConfig};
use crate::console::{spawn_input_thread, RawTerminal};
use crate::controller::{VcpuPauser, VmControl, VmDescription};
use crate::counters::VmCounters;
use crate::cpus::VcpuThreadIds;
use crate::display::{default_inputs, layout_cmdline_word, DisplayMetrics, Framebuffer};
use crate::dump::Inspector;
use crate::event::{channel, outcome, EventSender, Outcome, VmmEvent, VMM_FAILURE_STATUS};
use crate::iotrace::VmIoTrace;
use crate::memory::backing::{self, Backing};
use crate::memory::MemoryManager;
use crate::metrics::{MetricsSink, MetricsSource, MetricsWriter};
use crate::migration::{MigrationReports, MigrationSource};
use crate::mmu::{AgentListener, MmuControl, SptBudget};
use crate::passthrough::{PassthroughDevices, PassthroughPlan};
use crate::platform::{create_virtio_devices, Platform, VirtioDevices};
use crate::snapshot::restore as snapshot_restore;
use crate::snapshot::SnapshotSource;
use crate::start::{Loaded, Start, Target, VcpuStart};
use crate::vcpu::{install_kick_handler, kick_signal, Desired, RunControl, Vcpu};
use crate::{signals, Error};

/// A built VM: what the control API, snapshots and migrations act on.
pub struct Vm {
    pub description: VmDescription,
    pub memory: Arc<MemoryManager>,
    /// Host PCI functions passed through (crate::passthrough).
    pub passthrough: PassthroughDevices,
    pub run: Arc<RunControl>,
    pub pauser: Arc<VcpuPauser>,
    /// Each vCPU thread's id (and so its CPU affinity), for `vm.info`.
    pub vcpu_threads: VcpuThreadIds,
    pub events: EventSender,
    /// The shadow-page budget (docs/shadow-paging.md).
    pub mmu: Arc<MmuControl>,
    pub display: Option<Arc<DisplayControl>>,
    pub balloon: Option<Arc<BalloonControl>>,
    /// The disk images: their held requests (werror/rerror=stop).
    pub disks: crate::disks::Disks,
    pub snapshot: Arc<SnapshotSource>,
    pub migrations: Arc<MigrationReports>,
    /// Failure reports (--dump-dir, ctl dump).
    pub inspector: Arc<Inspector>,
    /// Disks' and network devices' counters (vm.counters).
    pub counters: Arc<VmCounters>,
    /// The disks' I/O tracer (vm.iotrace).
    pub iotrace: Arc<VmIoTrace>,
}

impl Vm {
    /// The sections of the `--metrics` file: "mmu", "kvm", "migration",
    /// "counters", and "display" when there is one.
    pub fn metrics_sources(&self) -> Vec<Arc<dyn MetricsSource>> {
        let mut sources: Vec<Arc<dyn MetricsSource>> = vec![
            self.mmu.clone(),
            self.mmu.shared_stats(),
            self.migrations.clone(),
            self.counters.clone(),
        ];
        if let Some(display) = &self.display {
            sources.push(Arc::new(DisplayMetrics(display.clone())));
        }
        sources
    }
}

/// Builds the VM from `config`, runs it, and returns how hakoniwa should end.
pub fn run(config: &VmConfig) -> Result<Outcome, Error> {
    // Everything that can be checked without KVM fails first.
    signals::block_stop_signals()?;
    // The filters compile before any thread that enters one starts.
    sandbox::init(config.seccomp, VMM_FAILURE_STATUS).map_err(|e| Error::Sandbox(e.to_string()))?;
    check_host_memory(config.memory_bytes)?;
    let display_config = parse_display(config)?;
    let passthrough = PassthroughPlan::check(config)?;
    let start = Start::prepare(config)?;
    let mut virtio = create_virtio_devices(
        &virtio_options(config, display_config.as_ref()),
        crate::disks::locking(config.incoming.is_some()),
        usize::from(config.vcpus),
    )?;
    let metrics_sink = open_metrics(config)?;

    let (events, ending) = channel();
    let core = Core::create(config, events)?;
    let framebuffer = match &display_config {
        Some(c) => Some(Arc::new(Framebuffer::map(c, &core.memory)?)),
        None => None,
    };
    let _mmu_agent = start_mmu_agent(config, &core.mmu)?;
    let (platform, passthrough) = build_platform(&core, &mut virtio, passthrough)?;
    let cmdline = guest_cmdline(config, display_config.as_ref());
    let mut loaded = start.load(&Target {
        config,
        memory: &core.memory,
        platform: &platform,
        framebuffer: framebuffer.as_deref(),
        cmdline: &cmdline,
        disks: &virtio.disks,
    })?;
    let display = match &framebuffer {
        Some(fb) => Some(fb.start_display(&virtio.inputs)?),
        None => None,
    };
    let inspector = inspector(config, &core, &platform, &loaded);
    let vcpus = create_vcpus(config, &core, &platform, &loaded.vcpus, &inspector)?;
    // Restored devices go on from here: every vCPU's LAPIC is back, so
    // the interrupts they raise now reach the guest.
    if loaded.vcpus.restored() {
        snapshot_restore::resume_devices(&platform)?;
    }
    let mut threads = VcpuThreads::spawn(vcpus, &core)?;
    let pauser = Arc::new(VcpuPauser::new(core.control.clone(), threads.pthreads()));
    stop_on_disk_errors(&virtio.disks, &pauser);
    // A migrated-in VM runs from here: tell the source (postcopy: RAM
    // keeps coming in the background and on demand).
    if let Some(received) = &mut loaded.received {
        received.started(pauser.clone())?;
    }
    let _raw_terminal = start_console(config, &platform, &core.events)?;
    signals::spawn_signal_thread(core.events.clone())?;

    let vm = Arc::new(assemble(
        config,
        &core,
        Parts {
            platform,
            passthrough,
            loaded,
            framebuffer,
            display: display.as_ref().map(|d| d.control()),
            balloon: virtio.balloon.clone(),
            counters: Arc::new(VmCounters::new(std::mem::take(&mut virtio.counted))),
            iotrace: Arc::new(VmIoTrace::new(
                std::mem::take(&mut virtio.traceable),
                vsock_uds(config),
            )),
            disks: virtio.disks.clone(),
            pauser,
            inspector: inspector.clone(),
        },
    )?);
    let metrics = start_metrics(metrics_sink, config, &vm)?;
    let _api_server = start_api(config, &vm)?;
    // Every thread of the running VM has started (later ones start from
    // threads with filters of their own): the main thread only waits,
    // stops the vCPUs and tears down from here.
    sandbox::enter(sandbox::ThreadKind::Main).map_err(|e| Error::Sandbox(e.to_string()))?;

    let event = ending
        .recv()
        .unwrap_or(VmmEvent::Error("event channel closed".into()));
    finish(
        event,
        &mut threads,
        &core.control,
        &inspector,
        metrics,
        config,
    )
}

/// A disk whose `werror`/`rerror=stop` holds a failed request pauses the
/// VM and says why, once per stop (`ctl resume` retries, docs/devices.md).
/// The `--vsock` Unix socket, through which the I/O tracer asks the guest
/// agent (a bad `--vsock` was refused when its device was made).
fn vsock_uds(config: &VmConfig) -> Option<std::path::PathBuf> {
    let options = config.virtio.vsock.as_deref()?;
    devices::virtio::vsock::VsockConfig::parse(options)
        .ok()
        .map(|c| c.uds)
}

fn stop_on_disk_errors(disks: &crate::disks::Disks, pauser: &Arc<VcpuPauser>) {
    let pauser = pauser.clone();
    disks.on_stop(Arc::new(move |reason| {
        say!("hakoniwa: VM paused: {reason}; `hakoniwa ctl resume` retries");
        if let Err(e) = crate::migration::source::VmPauser::pause(&*pauser) {
            say!("hakoniwa: cannot pause the VM for the disk error: {e}");
        }
    }));
}

/// The KVM VM and what every later step of the build needs.
struct Core {
    kvm: Kvm,
    /// Each vCPU thread's id, for `vm.info`.
    vcpu_threads: VcpuThreadIds,
    /// How the host backs guest RAM, for `vm.info`.
    backing: Backing,
    memory: Arc<MemoryManager>,
    control: Arc<RunControl>,
    events: EventSender,
    /// The shadow-page budget, set before any vCPU runs
    /// (docs/shadow-paging.md).
    mmu: Arc<MmuControl>,
}

impl Core {
    fn create(config: &VmConfig, events: EventSender) -> Result<Core, Error> {
        // A migration destination places 4 KiB pages through userfaultfd.
        let incoming = config.incoming.is_some();
        // The host's huge-page pool and CPUs are checked before any KVM
        // work.
        let backing = backing::check_host(&config.memory, incoming)?;
        config.cpus.check_host()?;
        let kvm = Kvm::new().map_err(Error::OpenKvm)?;
        let vm_fd = Arc::new(create_vm(&kvm)?);
        let ram = backing.map_ram()?;
        let memory = MemoryManager::new(vm_fd.clone(), ram)?;
        let mmu = MmuControl::new(vm_fd, config.memory_bytes, config.spt_budget)?;
        Ok(Core {
            kvm,
            vcpu_threads: VcpuThreadIds::default(),
            backing,
            memory,
            control: Arc::new(RunControl::default()),
            events,
            mmu: Arc::new(mmu),
        })
    }
}

/// What the build made besides the core, for [`assemble`].
struct Parts {
    platform: Platform,
    passthrough: PassthroughDevices,
    loaded: Loaded,
    framebuffer: Option<Arc<Framebuffer>>,
    display: Option<Arc<DisplayControl>>,
    balloon: Option<Arc<BalloonControl>>,
    counters: Arc<VmCounters>,
    iotrace: Arc<VmIoTrace>,
    disks: crate::disks::Disks,
    pauser: Arc<VcpuPauser>,
    inspector: Arc<Inspector>,
}

/// The metrics file, opened before any KVM work so a bad path fails early.
fn open_metrics(config: &VmConfig) -> Result<Option<MetricsSink>, Error> {
    Ok(match &config.metrics {
        Some(metrics) => Some(MetricsSink::open(&metrics.path)?),
        None => None,
    })
}

/// The periodic metrics writer (--metrics), over the VM's own sources.
fn start_metrics(
    sink: Option<MetricsSink>,
    config: &VmConfig,
    vm: &Vm,
) -> Result<Option<MetricsWriter>, Error> {
    Ok(match (sink, &config.metrics) {
        (Some(sink), Some(m)) => Some(MetricsWriter::start(
            sink,
            m.interval,
            vm.metrics_sources(),
        )?),
        _ => None,
    })
}

/// The control API (--api-socket), acting on `vm`.
fn start_api(config: &VmConfig, vm: &Arc<Vm>) -> Result<Option<ApiServer>, Error> {
    Ok(match &config.api_socket {
        Some(path) => Some(crate::controller::start_api_server(
            path,
            Arc::new(VmControl::new(vm.clone())),
        )?),
        None => None,
    })
}

/// Failure reports (--dump-dir, ctl dump); a migrated-in VM's say where
/// its pages came from.
fn inspector(
    config: &VmConfig,
    core: &Core,
    platform: &Platform,
    loaded: &Loaded,
) -> Arc<Inspector> {
    Arc::new(
        Inspector::new(
            core.memory.ram().clone(),
            core.memory.vm_fd().clone(),
            platform.serial.clone(),
            platform.console_tail.clone(),
            config.vcpus,
            config.dump_dir.clone(),
        )
        .with_history(loaded.received.as_ref().map(|r| r.history())),
    )
}

/// The virtio devices' options: the user's, plus a keyboard and a tablet
/// for a display when the user named no input device.
fn virtio_options(config: &VmConfig, display: Option<&DisplayConfig>) -> VirtioConfig {
    let mut options = config.virtio.clone();
    if let Some(display) = display {
        if options.inputs.is_empty() {
            options.inputs = default_inputs(display);
        }
    }
    options
}

/// Platform devices on the port bus, virtio and passthrough devices on PCI.
fn build_platform(
    core: &Core,
    virtio: &mut VirtioDevices,
    passthrough: PassthroughPlan,
) -> Result<(Platform, PassthroughDevices), Error> {
    let memory = &core.memory;
    let notifier = exit_notifier(core.control.clone(), core.events.clone());
    let mut platform = Platform::new(memory.vm_fd(), notifier)?;
    for device in std::mem::take(&mut virtio.devices) {
        platform.attach_virtio(memory.vm_fd(), memory.ram(), device)?;
    }
    let passthrough = passthrough.attach(memory, &mut platform)?;
    Ok((platform, passthrough))
}

/// Creates and configures every vCPU before any runs: once the boot CPU
/// runs, it may send INIT/SIPI to the others at any time, and their LAPIC
/// and MSR setup must not land on top of that.
fn create_vcpus(
    config: &VmConfig,
    core: &Core,
    platform: &Platform,
    start: &VcpuStart,
    inspector: &Inspector,
) -> Result<Vec<Vcpu>, Error> {
    let memory = &core.memory;
    let cpuid_options = CpuidOptions {
        vcpu_count: config.vcpus,
        async_pf: config.async_pf,
    };
    let supported_cpuid = core
        .kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(|e| Error::Kvm("KVM_GET_SUPPORTED_CPUID", e))?;
    let mut vcpus = Vec::with_capacity(usize::from(config.vcpus));
    for index in 0..config.vcpus {
        let fd = memory
            .vm_fd()
            .create_vcpu(u64::from(index))
            .map_err(|e| Error::Kvm("KVM_CREATE_VCPU", e))?;
        core.mmu.stats().add_vcpu(&fd);
        let mut cpuid = supported_cpuid.clone();
        patch_cpuid(&mut cpuid, index, cpuid_options);
        fd.set_cpuid2(&cpuid)
            .map_err(|e| Error::Kvm("KVM_SET_CPUID2", e))?;
        start.setup(index, &fd, memory)?;
        vcpus.push(Vcpu {
            index,
            fd,
            pio: platform.pio.clone(),
            mmio: platform.mmio.clone(),
            control: core.control.clone(),
            events: core.events.clone(),
            captures: inspector.captures(),
            affinity: config.cpus.affinity.get(&index).cloned(),
            thread_ids: core.vcpu_threads.clone(),
        });
    }
    Ok(vcpus)
}

/// The interactive console, unless the guest runs a command for us.
fn start_console(
    config: &VmConfig,
    platform: &Platform,
    events: &EventSender,
) -> Result<Option<RawTerminal>, Error> {
    if config.exec.is_some() {
        return Ok(None);
    }
    let raw = RawTerminal::enable();
    if raw.is_some() {
        say!("hakoniwa: console on COM1; Ctrl-A x quits, Ctrl-A h for help");
    }
    spawn_input_thread(
        platform.serial.clone(),
        platform
            .serial_input_space
            .try_clone()
            .map_err(|e| Error::Thread {
                what: "console",
                error: e,
            })?,
        events.clone(),
    )
    .map_err(|e| Error::Thread {
        what: "console",
        error: e,
    })?;
    Ok(raw)
}

/// Puts the running VM's parts together: its description, snapshot and
/// migration sources, and the handles the API acts through.
fn assemble(config: &VmConfig, core: &Core, parts: Parts) -> Result<Vm, Error> {
    let Parts {
        platform,
        passthrough,
        loaded,
        framebuffer,
        display,
        balloon,
        counters,
        iotrace,
        disks,
        pauser,
        inspector,
    } = parts;
    let memory = core.memory.clone();
    // The MSRs a snapshot saves (docs/snapshot.md).
    let msr_indices = core
        .kvm
        .get_msr_index_list()
        .map_err(|e| Error::Kvm("KVM_GET_MSR_INDEX_LIST", e))?
        .as_slice()
        .to_vec();
    let boot = loaded.boot;
    let machine = snapshot_restore::machine_state(
        config,
        &platform.devices,
        boot.protocol,
        boot.kernel.clone(),
        boot.cmdline.clone(),
    );
    let snapshot = Arc::new(
        SnapshotSource::new(
            memory.clone(),
            platform.serial.clone(),
            machine,
            msr_indices,
        )
        .with_virtio(platform.virtio.clone())
        .with_disks(disks.clone())
        .with_framebuffer(framebuffer),
    );
    let migrations = Arc::new(MigrationReports {
        source: Arc::new(MigrationSource::new(
            memory.clone(),
            snapshot.clone(),
            pauser.clone(),
            core.events.clone(),
        )),
        incoming: loaded.received.as_ref().map(|r| r.status()),
    });
    inspector.set_migrations(migrations.clone());
    Ok(Vm {
        description: VmDescription {
            vcpus: config.vcpus,
            memory_bytes: config.memory_bytes,
            memory_backing: core.backing.clone(),
            cpus: config.cpus.clone(),
            kernel: boot.kernel,
            cmdline: boot.cmdline,
            boot_protocol: boot.protocol,
            devices: platform.devices,
        },
        memory,
        passthrough,
        run: core.control.clone(),
        pauser,
        vcpu_threads: core.vcpu_threads.clone(),
        events: core.events.clone(),
        mmu: core.mmu.clone(),
        display,
        balloon,
        disks,
        snapshot,
        migrations,
        inspector,
        counters,
        iotrace,
    })
}

/// After the first ending event: stops the vCPUs, writes a failure report
/// if one failed, the last metrics line, and says how hakoniwa ends.
fn finish(
    event: VmmEvent,
    threads: &mut VcpuThreads,
    control: &RunControl,
    inspector: &Inspector,
    metrics: Option<MetricsWriter>,
    config: &VmConfig,
) -> Result<Outcome, Error> {
    // A vCPU failed (triple fault, KVM internal error): the others read
    // their state as they stop, for the report.
    let failed = inspector.captures().has_failure();
    if failed {
        control.capture_on_stop();
    }
    threads.stop();
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

/// The running vCPU threads.
struct VcpuThreads {
    // Field order is drop order: threads first, then the memory (and the
    // VM fd it holds) they run in.
    threads: Vec<JoinHandle<()>>,
    control: Arc<RunControl>,
    _memory: Arc<MemoryManager>,
}

impl VcpuThreads {
    fn spawn(vcpus: Vec<Vcpu>, core: &Core) -> Result<VcpuThreads, Error> {
        install_kick_handler()?;
        let mut threads = Vec::with_capacity(vcpus.len());
        for vcpu in vcpus {
            threads.push(vcpu.spawn().map_err(|e| Error::Thread {
                what: "vCPU",
                error: e,
            })?);
        }
        Ok(VcpuThreads {
            threads,
            control: core.control.clone(),
            _memory: core.memory.clone(),
        })
    }

    fn pthreads(&self) -> Vec<libc::pthread_t> {
        self.threads.iter().map(|t| t.as_pthread_t()).collect()
    }
}

impl VcpuThreads {
    /// Stops every vCPU: asks them to stop, kicks them out of KVM_RUN
    /// until they have all left their loops, then joins them.
    fn stop(&mut self) {
        self.control.set(Desired::Stop);
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            for thread in self.threads.iter().filter(|t| !t.is_finished()) {
                kick(thread.as_pthread_t());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for thread in self.threads.drain(..) {
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
    let vm = loop {
        match kvm.create_vm() {
            Ok(vm) => break vm,
            // KVM_CREATE_VM registers an MMU notifier, which gives up with
            // EINTR when the thread has anything signal-like pending. The
            // io_uring probe of a disk (engine::select) leaves just that:
            // closing a ring queues its teardown, which later adds task
            // work to the thread that created it with TWA_SIGNAL. Nothing
            // was created; asking again is what Cloud Hypervisor does.
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(e) => return Err(Error::Kvm("KVM_CREATE_VM", e)),
        }
    };
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
/// command to run, base64-encoded so it survives the kernel's parser, and
/// the framebuffer's layout when there is a display.
pub fn guest_cmdline(config: &VmConfig, display: Option<&DisplayConfig>) -> String {
    let mut cmdline = config.cmdline.clone();
    if let Some(command) = &config.exec {
        cmdline = format!("{cmdline} hk.cmd={}", BASE64.encode(command.as_bytes()));
    }
    if let Some(display) = display {
        cmdline = format!("{cmdline} {}", layout_cmdline_word(display));
    }
    cmdline
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
