//! `hakoniwa`: the command line of the VMM.
//!
//! `hakoniwa run` boots a VM (the default guest unless `--kernel` is
//! given); `hakoniwa ctl` talks to a running one over its API socket.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod log;
mod progress;

use clap::{Parser, Subcommand};
use vmm::config::{parse_memory_size, VirtioConfig, VmConfig, DEFAULT_CMDLINE};
use vmm::VMM_FAILURE_STATUS;

#[derive(Parser)]
#[command(name = "hakoniwa", version, about = "A KVM virtual machine monitor")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Boot a VM and attach its serial console to this terminal.
    Run(Box<RunArgs>),
    /// Control a running VM through its API socket.
    Ctl(CtlArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Kernel: a bzImage, or an ELF vmlinux (PVH entry used if present).
    /// Default: the default guest's kernel (scripts/build-guest).
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,
    /// Initramfs. Default: the default guest's, when --kernel is not given.
    #[arg(long, value_name = "PATH")]
    initramfs: Option<PathBuf>,
    /// Kernel command line, replacing the default.
    #[arg(long, value_name = "STR", default_value = DEFAULT_CMDLINE)]
    cmdline: String,
    /// Number of vCPUs, or with the host CPUs each may run on
    /// (docs/running.md): boot=N[,affinity=[0@[2],1@[3-4]]]
    #[arg(long, value_name = "N|OPTIONS", default_value = "1")]
    cpus: String,
    /// Guest RAM: 512M, 2G, ... (a bare number is MiB), or with how the host
    /// backs it (docs/running.md):
    /// size=2G[,hugepages=on|off][,thp=on|off][,prefault=on|off][,shared=on|off]
    #[arg(long, value_name = "SIZE|OPTIONS", default_value = "512M")]
    memory: String,
    /// Run COMMAND in the default guest instead of a shell, print its
    /// output and exit with its exit status.
    #[arg(long, value_name = "COMMAND")]
    exec: Option<String>,
    /// Serve the control API on this Unix socket.
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,
    /// Add a virtio-blk disk backed by a raw image. Repeatable.
    /// path=FILE[,readonly=on][,cache=writeback|none|unsafe][,id=NAME]
    #[arg(long, value_name = "OPTIONS")]
    disk: Vec<String>,
    /// Pass a host PCI function bound to vfio-pci through to the guest
    /// (docs/passthrough.md). Repeatable.
    /// path=/sys/bus/pci/devices/DDDD:BB:DD.F[,id=NAME][,irq_affinity=on]
    #[arg(long, value_name = "OPTIONS")]
    device: Vec<String>,
    /// Add a virtio-net interface on a TAP device. Repeatable.
    /// tap=NAME[,mac=52:54:00:..][,mtu=N][,id=NAME]
    #[arg(long, value_name = "OPTIONS")]
    net: Vec<String>,
    /// Add a virtio-vsock device; the host reaches the guest through a Unix
    /// socket (Firecracker's hybrid model). cid=N,uds=PATH[,id=NAME]
    #[arg(long, value_name = "OPTIONS")]
    vsock: Option<String>,
    /// Add a virtio entropy device (/dev/hwrng in the guest): [id=NAME].
    #[arg(long, value_name = "OPTIONS", num_args = 0..=1, default_missing_value = "")]
    rng: Option<String>,
    /// Add a virtio balloon: [size=MIB][,deflate_on_oom=on][,stats=on|off].
    #[arg(long, value_name = "OPTIONS", num_args = 0..=1, default_missing_value = "")]
    balloon: Option<String>,
    /// Add a virtio input device: keyboard, or tablet[,width=W,height=H]. Repeatable.
    #[arg(long, value_name = "KIND[,OPTIONS]")]
    input: Vec<String>,
    /// Offer KVM asynchronous page faults to the guest (on|off).
    // ArgAction::Set: a bool field would otherwise be a flag (SetTrue).
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off,
          action = clap::ArgAction::Set)]
    async_pf: bool,
    /// Shadow-paging budget in 4 KiB pages (KVM_SET_NR_MMU_PAGES), or auto
    /// to size it from the guest's page tables (needs --vsock and the guest
    /// agent; docs/shadow-paging.md). Default: KVM's own.
    #[arg(long, value_name = "N|auto")]
    spt_pages: Option<String>,
    /// Write metrics to this file or FIFO: one JSON object per line
    /// (mmu, kvm, ...) every --metrics-interval (docs/running.md).
    #[arg(long, value_name = "PATH")]
    metrics: Option<PathBuf>,
    /// Seconds between metrics lines, fractions allowed (default 1).
    #[arg(
        long,
        value_name = "SECONDS",
        requires = "metrics",
        allow_hyphen_values = true
    )]
    metrics_interval: Option<String>,
    /// A virtual display served over VNC (docs/display.md):
    /// vnc=[HOST]:PORT[,width=1024,height=768][,layout=linear|tiled]
    /// [,dirty=compare|dirtylog|wp][,refresh=timer|event][,password_file=PATH]
    /// [,websocket=[HOST:]PORT][,origins=[ORIGIN,...]][,handshake_timeout=SECONDS]
    /// [,pending_per_address=N]
    #[arg(long, value_name = "OPTIONS")]
    display: Option<String>,
    /// Continue the VM saved in FILE (`ctl snapshot`) instead of booting;
    /// give the same --cpus, --memory and devices as the VM had
    /// (docs/snapshot.md).
    #[arg(long, value_name = "FILE", conflicts_with = "incoming")]
    restore: Option<PathBuf>,
    /// Wait for a live migration from another hakoniwa on this address and
    /// continue the VM it sends (`ctl migrate` there); give the same
    /// --cpus, --memory and devices (docs/migration.md).
    /// Say how the source is authenticated: `,tls=DIR` (certificates) or
    /// `,auth=none`.
    #[arg(long, value_name = "tcp:ADDR:PORT,tls=DIR|auth=none", value_parser = parse_migration_address)]
    incoming: Option<vmm::migration::MigrationAddress>,
    /// Write a failure report (JSON: vCPU registers, where RIP and the
    /// stack are, the pages involved and, after a migration, where they
    /// came from) into this directory when a vCPU triple-faults or KVM
    /// fails it; also `ctl dump`'s default place.
    #[arg(long, value_name = "DIR")]
    dump_dir: Option<PathBuf>,
    /// Seccomp filters on every thread (docs/security.md): on, the default
    /// (a forbidden system call stops the VMM with one line), log (the
    /// kernel logs it and it goes ahead) or off.
    #[arg(long, value_name = "on|log|off", default_value = "on",
          value_parser = parse_choice::<choices::SeccompMode>)]
    seccomp: choices::SeccompMode,
}

#[derive(clap::Args)]
struct CtlArgs {
    /// The VM's API socket (its --api-socket).
    #[arg(long, value_name = "PATH")]
    api_socket: PathBuf,
    #[command(subcommand)]
    command: CtlCommandArg,
}

#[derive(Subcommand, Clone)]
enum CtlCommandArg {
    /// Show the balloon (target, actual, guest statistics), or set its target.
    Balloon {
        /// Memory the balloon should hold, e.g. 256M or 1G.
        #[arg(long, value_name = "SIZE", conflicts_with = "guest_memory")]
        target: Option<SizeArg>,
        /// Or the memory the guest should be left with, e.g. 128M: as much
        /// as a guest booted with that much has (the balloon is sized for
        /// what the kernel spent at boot on the memory it takes).
        #[arg(long, value_name = "SIZE")]
        guest_memory: Option<SizeArg>,
    },
    /// Show the paging mode, shadow-page budget and KVM MMU statistics, or
    /// change the budget.
    Mmu {
        /// New budget: a number of 4 KiB pages, or auto.
        #[arg(long, value_name = "N|auto")]
        spt_pages: Option<api::SptPages>,
    },
    /// Show the display's configuration and figures, or switch its update
    /// detection or refresh mode at run time.
    Display {
        /// Update detection: compare, dirtylog or wp.
        #[arg(long, value_name = "METHOD", value_parser = parse_choice::<api::DirtyMethod>)]
        dirty: Option<api::DirtyMethod>,
        /// Refresh: timer or event.
        #[arg(long, value_name = "MODE", value_parser = parse_choice::<api::RefreshMode>)]
        refresh: Option<api::RefreshMode>,
    },
    /// Check that the VMM answers.
    Ping,
    /// Print the VM's state, vCPUs, memory and devices as JSON.
    Info,
    /// Stop all vCPUs.
    Pause,
    /// Let paused vCPUs run again.
    Resume,
    /// End the VM and its VMM.
    Shutdown,
    /// Migrate the VM to a hakoniwa waiting with `run --incoming` and
    /// follow its progress until it is done (docs/migration.md).
    Migrate {
        /// The destination's --incoming address and how to authenticate:
        /// `,tls=DIR[,tls-name=NAME]` (certificates) or `,auth=none`.
        #[arg(long, value_name = "tcp:HOST:PORT,tls=DIR|auth=none", value_parser = parse_migration_address)]
        to: vmm::migration::MigrationAddress,
        /// precopy, postcopy or hybrid.
        #[arg(long, value_name = "MODE", value_parser = parse_choice::<api::MigrationMode>, required_unless_present = "resume")]
        mode: Option<api::MigrationMode>,
        /// Postcopy: pages sent on each side of a demanded page (default 8).
        #[arg(long, value_name = "N")]
        prefetch: Option<u32>,
        /// Precopy: the downtime to aim for, ms (default 300).
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        max_downtime: Option<u64>,
        /// Precopy rounds before precopy stops anyway or hybrid switches
        /// to postcopy (default 30).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        max_rounds: Option<u32>,
        /// Postcopy: send only what the destination asks for (and its
        /// neighbours), no background push.
        #[arg(long)]
        no_background: bool,
        /// Cap the precopy rounds and the background push at this many
        /// MiB/s (demanded pages are never held back).
        #[arg(long, value_name = "MIB_S", value_parser = clap::value_parser!(u32).range(1..))]
        max_bandwidth: Option<u32>,
        /// Return once started instead of following the progress.
        #[arg(long)]
        no_wait: bool,
        /// Resume a postcopy whose connection dropped, to --to (the
        /// destination's --incoming address, or another path to it).
        #[arg(long, conflicts_with_all = ["prefetch", "max_downtime", "max_rounds", "no_background", "max_bandwidth", "verify_pages"])]
        resume: bool,
        /// Check every page: the source sends the checksum of each page
        /// once the guest is stopped, the destination compares each page
        /// it has or places with it and refuses (or stops) the VM on a
        /// difference. A test and diagnosis mode: it adds a pass over RAM
        /// to the downtime.
        #[arg(long)]
        verify_pages: bool,
    },
    /// Show the current or last migration's report (JSON), on either side.
    Migration,
    /// Write a failure report of the VM as it is now (vCPU registers,
    /// where RIP and the stack are, the pages involved and, after a
    /// migration, where they came from), for a guest that seems stuck.
    Dump {
        /// The report's file (default: a new file in the VM's --dump-dir).
        #[arg(long, value_name = "FILE")]
        path: Option<PathBuf>,
    },
    /// Check whether the pinned vCPUs' host CPUs are the VM's own: shared
    /// with other hakoniwa VMs, isolated by the host, where passed-through
    /// devices' interrupts go (docs/running.md, "Isolation check").
    Isolation {
        /// Print the report as JSON (the API's answer) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show every disk's and network device's counters (a table, or the
    /// API's JSON), or set a disk's latency histogram boundaries
    /// (docs/devices.md, "Counters").
    Counters {
        /// Print the API's JSON instead of the table.
        #[arg(long, conflicts_with = "boundaries")]
        json: bool,
        /// Set the boundaries of this disk's histograms (its id, e.g. disk0).
        #[arg(long, value_name = "DISK", requires = "boundaries")]
        disk: Option<String>,
        /// Only this histogram (read, write, flush, discard, write_zeroes,
        /// kick_to_dequeue, dequeue_to_submit, submit_to_complete,
        /// complete_to_interrupt); all of the disk's without it.
        #[arg(long, value_name = "NAME", requires = "boundaries", value_parser = parse_choice::<api::LatencyHistogram>)]
        histogram: Option<api::LatencyHistogram>,
        /// Increasing durations (10us,100us,1ms,1s; bare numbers are ns),
        /// or "default".
        #[arg(long, value_name = "LIST", value_parser = parse_choice::<api::Boundaries>)]
        boundaries: Option<api::Boundaries>,
    },
    /// Trace a disk's I/O layer by layer: the named guest processes' I/O
    /// (the guest agent), the virtual disk's requests and the host page
    /// cache's share of its reads, the host device under the image
    /// (docs/iotrace.md). `stop` and `report` print the window's
    /// report (a table, or the API's JSON).
    Iotrace {
        #[arg(value_enum)]
        action: IoTraceActionArg,
        /// The disk's id (default: the VM's only disk).
        #[arg(long, value_name = "ID")]
        disk: Option<String>,
        /// Print the API's JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// start only: write the window's records to this file as JSON
        /// lines at the stop (relative paths are made absolute here).
        #[arg(long, value_name = "PATH")]
        trace_file: Option<PathBuf>,
        /// start only: a guest process whose file I/O is the application
        /// layer (asked of the guest agent over --vsock; a shell counts
        /// the commands it has waited for). Repeatable.
        #[arg(long = "pid", value_name = "P")]
        pids: Vec<u32>,
        /// start only: every guest process of this name. Repeatable.
        #[arg(long = "comm", value_name = "NAME")]
        comms: Vec<String>,
        /// start only: the disk's device in the guest (default: the
        /// virtio-blk name of its place among the disks, /dev/vda first);
        /// "none": do not measure the guest cache's residency of it.
        #[arg(long, value_name = "DEV")]
        guest_dev: Option<String>,
    },
    /// Recommend the guest's memory, I/O mode and swap and the disk's cache
    /// mode from a traced disk's window (seed 002's advisor,
    /// docs/iotrace.md); --apply sets the guest's memory through the
    /// balloon.
    Advise {
        /// The traced disk's id (default: the VM's only disk).
        #[arg(long, value_name = "ID")]
        disk: Option<String>,
        /// Set the balloon so the guest has the recommended memory.
        #[arg(long)]
        apply: bool,
        /// Print the API's JSON instead of the text.
        #[arg(long)]
        json: bool,
    },
    /// Save the whole VM to a file (pausing it meanwhile); `run --restore
    /// FILE` continues it (docs/snapshot.md).
    Snapshot {
        /// The snapshot file to write (a path as the VMM sees it; relative
        /// paths are made absolute here).
        #[arg(long, value_name = "FILE")]
        path: PathBuf,
    },
}

/// `ctl iotrace`'s actions.
#[derive(Clone, Copy, clap::ValueEnum)]
enum IoTraceActionArg {
    Start,
    Stop,
    Report,
}

impl From<IoTraceActionArg> for api::IoTraceAction {
    fn from(action: IoTraceActionArg) -> Self {
        match action {
            IoTraceActionArg::Start => api::IoTraceAction::Start,
            IoTraceActionArg::Stop => api::IoTraceAction::Stop,
            IoTraceActionArg::Report => api::IoTraceAction::Report,
        }
    }
}

/// A memory size on the command line (parsed like --memory).
#[derive(Clone, Copy)]
struct SizeArg(u64);

impl std::str::FromStr for SizeArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.trim() == "0" {
            return Ok(SizeArg(0));
        }
        parse_memory_size(text)
            .map(SizeArg)
            .map_err(|e| e.to_string())
    }
}

fn parse_on_off(text: &str) -> Result<bool, String> {
    parse_choice::<choices::OnOff>(text).map(bool::from)
}

/// A switchable choice's word (the `choices` crate says which words and
/// what the error is, for `run`, `ctl` and the API alike).
fn parse_choice<T: std::str::FromStr>(text: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e: T::Err| e.to_string())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    log::init();
    let result = match cli.command {
        Command::Run(args) => run(*args),
        Command::Ctl(args) => ctl(args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("hakoniwa: {message}");
            ExitCode::from(VMM_FAILURE_STATUS as u8)
        }
    }
}

/// Help and version go to stdout as usual; a usage error is one line.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
        || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    {
        let _ = e.print();
        return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    let rendered = e.render().to_string();
    let mut lines = rendered.lines();
    let first = lines.next().unwrap_or("invalid arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    // "...were not provided:" names the arguments on the next line.
    let what = match lines.next().map(str::trim) {
        Some(next) if first.ends_with(':') && !next.is_empty() => format!("{first} {next}"),
        _ => first.to_string(),
    };
    eprintln!("hakoniwa: {what} (see hakoniwa --help)");
    ExitCode::from(2)
}

fn run(args: RunArgs) -> Result<ExitCode, String> {
    let config = vm_config(args)?;
    let outcome = vmm::run(&config).map_err(|e| e.to_string())?;
    if let Some(message) = outcome.message {
        eprintln!("hakoniwa: {message}");
    }
    Ok(ExitCode::from(outcome.status.clamp(0, 255) as u8))
}

fn vm_config(args: RunArgs) -> Result<VmConfig, String> {
    let memory =
        vmm::memory::backing::MemoryConfig::parse(&args.memory).map_err(|e| e.to_string())?;
    let memory_bytes = memory.size;
    let cpus = vmm::cpus::CpusConfig::parse(&args.cpus).map_err(|e| e.to_string())?;
    let vcpus = cpus.boot;
    let spt_budget = match &args.spt_pages {
        Some(text) => vmm::mmu::SptBudget::parse(text, memory_bytes)
            .map_err(|e| format!("--spt-pages: {e}"))?,
        None => vmm::mmu::SptBudget::Default,
    };
    if spt_budget == vmm::mmu::SptBudget::Auto && args.vsock.is_none() {
        return Err(format!(
            "--spt-pages: {}",
            vmm::mmu::MmuError::AutoNeedsVsock
        ));
    }
    let metrics = match args.metrics {
        Some(path) => Some(vmm::metrics::MetricsConfig {
            path,
            interval: match &args.metrics_interval {
                Some(text) => vmm::metrics::parse_interval(text).map_err(|e| e.to_string())?,
                None => vmm::metrics::DEFAULT_INTERVAL,
            },
        }),
        None => None,
    };
    let (kernel, initramfs) = match args.kernel {
        Some(kernel) => (kernel, args.initramfs),
        None => {
            let guest = default_guest_dir();
            let kernel = guest.join("vmlinuz");
            if !kernel.exists() {
                return Err(format!(
                    "no --kernel given and the default guest is not built ({} is missing; run scripts/build-guest)",
                    kernel.display()
                ));
            }
            let initramfs = args
                .initramfs
                .unwrap_or_else(|| guest.join("initramfs.cpio.gz"));
            (kernel, Some(initramfs))
        }
    };
    Ok(VmConfig {
        kernel,
        initramfs,
        cmdline: args.cmdline,
        vcpus,
        cpus,
        memory_bytes,
        memory,
        exec: args.exec,
        api_socket: args.api_socket,
        async_pf: args.async_pf,
        spt_budget,
        metrics,
        display: args.display,
        restore: args.restore,
        incoming: args.incoming,
        dump_dir: args.dump_dir,
        seccomp: args.seccomp,
        passthrough: args.device,
        virtio: VirtioConfig {
            disks: args.disk,
            nets: args.net,
            vsock: args.vsock,
            rng: args.rng,
            balloon: args.balloon,
            inputs: args.input,
        },
    })
}

/// The default guest: `$HAKONIWA_GUEST_DIR`, else `build/guest` of the
/// project this binary was built in (target/<profile>/hakoniwa), else
/// `build/guest` under the current directory.
fn default_guest_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HAKONIWA_GUEST_DIR") {
        return PathBuf::from(dir);
    }
    let from_exe = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent()?.parent().map(Path::to_path_buf))
        .map(|project| project.join("build/guest"));
    match from_exe {
        Some(dir) if dir.join("vmlinuz").exists() => dir,
        _ => PathBuf::from("build/guest"),
    }
}

fn ctl(args: CtlArgs) -> Result<ExitCode, String> {
    let command = match args.command {
        CtlCommandArg::Ping => api::CtlCommand::Ping,
        CtlCommandArg::Info => api::CtlCommand::Info,
        CtlCommandArg::Pause => api::CtlCommand::Pause,
        CtlCommandArg::Resume => api::CtlCommand::Resume,
        CtlCommandArg::Shutdown => api::CtlCommand::Shutdown,
        CtlCommandArg::Balloon {
            target: None,
            guest_memory: None,
        } => api::CtlCommand::Balloon,
        CtlCommandArg::Balloon {
            target: Some(SizeArg(bytes)),
            ..
        } => api::CtlCommand::BalloonSet(api::BalloonTarget::balloon(bytes >> 20)),
        CtlCommandArg::Balloon {
            guest_memory: Some(SizeArg(bytes)),
            ..
        } => api::CtlCommand::BalloonSet(api::BalloonTarget::guest(bytes >> 20)),
        CtlCommandArg::Mmu { spt_pages: None } => api::CtlCommand::Mmu,
        CtlCommandArg::Mmu {
            spt_pages: Some(pages),
        } => api::CtlCommand::MmuSet(pages),
        CtlCommandArg::Display {
            dirty: None,
            refresh: None,
        } => api::CtlCommand::Display,
        CtlCommandArg::Display { dirty, refresh } => {
            api::CtlCommand::DisplaySet(api::DisplaySettings { dirty, refresh })
        }
        CtlCommandArg::Snapshot { path } => {
            api::CtlCommand::Snapshot(absolute_utf8("--path", &path)?)
        }
        CtlCommandArg::Migration => api::CtlCommand::Migration,
        CtlCommandArg::Dump { path } => api::CtlCommand::Dump(match path {
            Some(path) => Some(absolute_utf8("--path", &path)?),
            None => None,
        }),
        CtlCommandArg::Counters {
            disk: Some(id),
            histogram,
            boundaries,
            ..
        } => api::CtlCommand::LatencyHistogramSet(api::LatencyHistogramRequest {
            id,
            histogram,
            boundaries,
        }),
        CtlCommandArg::Counters {
            boundaries: Some(_),
            ..
        } => return Err("ctl counters --boundaries: name the disk with --disk".into()),
        CtlCommandArg::Counters { json, .. } => {
            let output = api::run_ctl(&args.api_socket, &api::CtlCommand::Counters)
                .map_err(|e| e.to_string())?;
            if json {
                println!("{output}");
            } else {
                let value: serde_json::Value = serde_json::from_str(&output)
                    .map_err(|e| format!("bad counters report: {e}"))?;
                let report = vmm::counters::wire::from_json(&value)
                    .map_err(|e| format!("bad counters report: {e}"))?;
                print!("{}", vmm::counters::table::render(&report));
            }
            return Ok(ExitCode::SUCCESS);
        }
        CtlCommandArg::Iotrace {
            action,
            disk,
            json,
            trace_file,
            pids,
            comms,
            guest_dev,
        } => {
            let action = api::IoTraceAction::from(action);
            if trace_file.is_some() && action != api::IoTraceAction::Start {
                return Err("ctl iotrace: --trace-file is given with start".into());
            }
            if (!pids.is_empty() || !comms.is_empty() || guest_dev.is_some())
                && action != api::IoTraceAction::Start
            {
                return Err(
                    "ctl iotrace: --pid, --comm and --guest-dev are given with start".into(),
                );
            }
            let trace_file = match trace_file {
                Some(path) => Some(absolute_utf8("--trace-file", &path)?),
                None => None,
            };
            let command = api::CtlCommand::IoTrace(api::IoTraceRequest {
                action,
                disk,
                trace_file,
                pids,
                comms,
                guest_dev,
            });
            let output = api::run_ctl(&args.api_socket, &command).map_err(|e| e.to_string())?;
            if json || action == api::IoTraceAction::Start {
                println!("{output}");
            } else {
                let report: vmm::iotrace::IoTraceReport = serde_json::from_str(&output)
                    .map_err(|e| format!("bad iotrace report: {e}"))?;
                print!("{}", vmm::iotrace::table::render(&report));
            }
            return Ok(ExitCode::SUCCESS);
        }
        CtlCommandArg::Advise { disk, apply, json } => {
            let command = api::CtlCommand::Advise(api::AdviseRequest { disk, apply });
            let output = api::run_ctl(&args.api_socket, &command).map_err(|e| e.to_string())?;
            if json {
                println!("{output}");
            } else {
                let report: vmm::iotrace::advise::AdviceReport =
                    serde_json::from_str(&output).map_err(|e| format!("bad advice: {e}"))?;
                print!("{}", vmm::iotrace::advise::render(&report));
            }
            return Ok(ExitCode::SUCCESS);
        }
        CtlCommandArg::Isolation { json } => {
            let output = api::run_ctl(&args.api_socket, &api::CtlCommand::Isolation)
                .map_err(|e| e.to_string())?;
            if json {
                println!("{output}");
            } else {
                let report: vmm::isolation::IsolationReport = serde_json::from_str(&output)
                    .map_err(|e| format!("bad isolation report: {e}"))?;
                print!("{report}");
            }
            return Ok(ExitCode::SUCCESS);
        }
        CtlCommandArg::Migrate {
            to,
            mode,
            prefetch,
            max_downtime,
            max_rounds,
            no_background,
            max_bandwidth,
            no_wait,
            resume,
            verify_pages,
        } => {
            // The VMM reads the tls= directory from its own working
            // directory: hand it an absolute one.
            let here = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
            let request = api::MigrateRequest {
                to: to.with_dir_under(&here).to_string(),
                // A resume goes on in the paused migration's mode.
                mode: mode.unwrap_or(api::MigrationMode::Postcopy),
                prefetch,
                max_downtime_ms: max_downtime,
                max_rounds,
                background: no_background.then_some(false),
                resume: resume.then_some(true),
                max_bandwidth_mib: max_bandwidth,
                verify_pages: verify_pages.then_some(true),
            };
            api::run_ctl(&args.api_socket, &api::CtlCommand::Migrate(request))
                .map_err(|e| e.to_string())?;
            if no_wait {
                println!("migration started");
                return Ok(ExitCode::SUCCESS);
            }
            return progress::follow_migration(&args.api_socket);
        }
    };
    let output = api::run_ctl(&args.api_socket, &command).map_err(|e| e.to_string())?;
    if !output.is_empty() {
        println!("{output}");
    }
    Ok(ExitCode::SUCCESS)
}

/// A path option (`flag`) made absolute (the VMM may run elsewhere), as
/// UTF-8.
fn absolute_utf8(flag: &str, path: &Path) -> Result<String, String> {
    let absolute =
        std::path::absolute(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    absolute
        .to_str()
        .map(String::from)
        .ok_or_else(|| format!("{flag} {} is not UTF-8", absolute.display()))
}

/// `tcp:HOST:PORT,tls=DIR|auth=none` (--incoming, ctl migrate --to).
fn parse_migration_address(text: &str) -> Result<vmm::migration::MigrationAddress, String> {
    text.parse()
}
