//! The isolation check (issue 13; `GET /api/v1/vm.isolation`, `hakoniwa
//! ctl isolation`): for the host CPUs this VM's vCPUs are pinned to, which
//! other threads of this host's hakoniwa VMs may run there, whether the
//! host isolates them from the scheduler (`isolcpus=`, `nohz_full=`), and
//! where the host delivers each interrupt of each passed-through device;
//! with the list of what was checked and what hakoniwa changed.
//!
//! It only reads `/proc` and `/sys` (under a root path, so the tests run
//! over fake trees): [`check`] reads ([`Observed`]) and then judges
//! ([`assess`], pure). Steering a device's interrupts to the VM's CPUs
//! (`irq_affinity=on`) is the VFIO device's, with
//! [`devices::host_irq::IrqSteering`]; the check reports what that
//! changed.

use std::fmt;
use std::path::{Path, PathBuf};

use devices::affinity::CpuSet;
use devices::host_irq::{self, IrqChange};
use serde::{Deserialize, Serialize};

use crate::cpus::threads_of;

/// A device passed through to the guest (`--device`,
/// [`crate::passthrough::PassthroughDevice`]), as the check is given it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckedDevice {
    /// The device's id in this VM (`vfio0`).
    pub id: String,
    /// Its PCI address on the host (`0000:00:04.0`).
    pub host_address: String,
    /// `irq_affinity=on`: hakoniwa steers its host IRQs to the VM's CPUs.
    pub irq_affinity: bool,
    /// What that steering did so far, oldest first
    /// ([`devices::host_irq::IrqSteering::changes`]).
    pub irq_changes: Vec<IrqChange>,
}

/// One vCPU of this VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VcpuPin {
    pub index: u8,
    /// Its host thread, once it runs.
    pub thread_id: Option<i32>,
    /// The host CPUs `--cpus affinity=` pinned it to.
    pub pinned: Option<CpuSet>,
}

/// This VM, as the check is given it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThisVm {
    /// The VMM's process id.
    pub pid: u32,
    pub vcpus: Vec<VcpuPin>,
    pub devices: Vec<CheckedDevice>,
}

/// The check's overall answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// No problem found: no other VM's thread nor another vCPU may run on
    /// the VM's CPUs, the host isolates them, and every device interrupt
    /// is delivered inside them.
    Isolated,
    /// At least one problem (listed).
    NotIsolated,
    /// No vCPU is pinned (`--cpus boot=N,affinity=[...]`): there are no
    /// CPUs of the VM's own to check.
    NeedsPinning,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Isolated => "isolated",
            Verdict::NotIsolated => "not isolated",
            Verdict::NeedsPinning => "needs pinning",
        }
    }
}

/// Whose a thread that may run on a VM's CPU is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Owner {
    /// Another hakoniwa VM on this host.
    OtherVm,
    /// Another vCPU of this VM (unpinned, or pinned elsewhere but allowed
    /// here).
    ThisVmVcpu,
    /// One of this VMM's other threads (main, API, console, device
    /// threads).
    ThisVm,
}

/// A thread that may run on one of the VM's CPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharingThread {
    pub owner: Owner,
    pub pid: u32,
    pub thread_id: i32,
    /// `/proc/PID/task/TID/comm`.
    pub name: String,
    /// Its `Cpus_allowed_list`.
    pub cpus_allowed: String,
}

/// One host CPU a vCPU is pinned to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuReport {
    pub cpu: usize,
    /// The vCPUs pinned to it.
    pub vcpus: Vec<u8>,
    /// In `/sys/devices/system/cpu/isolated` (`isolcpus=`): the scheduler
    /// puts no other task there by itself.
    pub isolated: bool,
    /// In `/sys/devices/system/cpu/nohz_full` (`nohz_full=`).
    pub nohz_full: bool,
    /// Every other thread of a hakoniwa VM that may run on it.
    pub shared_with: Vec<SharingThread>,
}

/// One vCPU as found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuReport {
    pub index: u8,
    pub thread_id: Option<i32>,
    /// `--cpus affinity=`'s CPUs for it.
    pub pinned: Option<String>,
    /// Its thread's `Cpus_allowed_list` now.
    pub cpus_allowed: Option<String>,
}

/// What the host says about isolating CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostIsolation {
    /// `/sys/devices/system/cpu/isolated` (null: unreadable).
    pub isolated: Option<String>,
    /// `/sys/devices/system/cpu/nohz_full` (null: absent, a kernel without
    /// NO_HZ_FULL).
    pub nohz_full: Option<String>,
    /// `isolcpus=` of `/proc/cmdline`.
    pub cmdline_isolcpus: Option<String>,
    /// `nohz_full=` of `/proc/cmdline`.
    pub cmdline_nohz_full: Option<String>,
    /// `irqaffinity=` of `/proc/cmdline`: where host IRQs go by default.
    pub cmdline_irqaffinity: Option<String>,
}

/// Another hakoniwa VM on this host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherVm {
    pub pid: u32,
    /// How it was recognized: `"exe"` (`/proc/PID/exe` is this binary) or
    /// `"comm"` (its name is this one's: another build, or an exe this
    /// process may not read).
    pub matched_by: String,
    /// Its threads.
    pub threads: usize,
}

/// One host IRQ of a passed-through device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqReport {
    pub irq: u32,
    /// Its handler's name in `/proc/interrupts` (`vfio-msix[0](0000:00:04.0)`).
    pub name: String,
    /// `/proc/irq/N/smp_affinity_list`.
    pub smp_affinity: Option<String>,
    /// `/proc/irq/N/effective_affinity_list`: where it is delivered now.
    pub effective_affinity: Option<String>,
    /// Whether it is delivered inside the VM's CPUs (the effective
    /// affinity, else the allowed one); null without pinned vCPUs or
    /// either list.
    pub inside_vm_cpus: Option<bool>,
}

/// One passed-through device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReport {
    pub id: String,
    pub host_address: String,
    pub irq_affinity: bool,
    pub irqs: Vec<IrqReport>,
    /// What `irq_affinity=on` changed, oldest first.
    pub irq_changes: Vec<IrqChange>,
    /// Why its IRQs could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Answer to `GET /api/v1/vm.isolation` (docs/running.md, "Isolation
/// check").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolationReport {
    pub verdict: Verdict,
    /// The host CPUs the vCPUs are pinned to (kernel list format; empty
    /// when none is).
    pub vm_cpus: String,
    pub vcpus: Vec<VcpuReport>,
    /// Each of `vm_cpus`.
    pub cpus: Vec<CpuReport>,
    pub host: HostIsolation,
    pub other_vms: Vec<OtherVm>,
    pub devices: Vec<DeviceReport>,
    /// Why the verdict is not `isolated`, one line each.
    pub problems: Vec<String>,
    /// What is worth knowing but does not change the verdict.
    pub notes: Vec<String>,
    /// What the check read.
    pub checked: Vec<String>,
    /// What hakoniwa changed on the host for this VM (the check itself
    /// changes nothing).
    pub changed: Vec<String>,
}

/// A thread as `/proc` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thread {
    pub tid: i32,
    pub name: String,
    pub cpus_allowed: Option<String>,
}

/// Another hakoniwa VM's process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherProcess {
    pub pid: u32,
    pub matched_by: &'static str,
    pub threads: Vec<Thread>,
}

/// One passed-through device's IRQs as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceIrqs {
    pub irqs: Vec<(host_irq::HostIrq, host_irq::IrqAffinity)>,
    pub error: Option<String>,
}

/// Everything the check reads from the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Where `/proc` is (for the statements of what was checked).
    pub proc: PathBuf,
    /// This process's threads.
    pub threads: Vec<Thread>,
    /// `/proc/self/exe` and comm.
    pub exe: Option<String>,
    pub comm: Option<String>,
    pub others: Vec<OtherProcess>,
    pub host: HostIsolation,
    /// By device, in `ThisVm::devices`' order.
    pub devices: Vec<DeviceIrqs>,
}

/// Reads the host under `root` (`/` on a real host) and judges this VM.
pub fn check(root: &Path, vm: &ThisVm) -> IsolationReport {
    assess(vm, &Observed::read(root, vm))
}

fn threads_in(process: &Path) -> Vec<Thread> {
    threads_of(process)
        .into_iter()
        .map(|(tid, name, cpus_allowed)| Thread {
            tid,
            name,
            cpus_allowed,
        })
        .collect()
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|t| t.trim().to_string())
}

/// `/proc/PID/exe`'s target, without the " (deleted)" a rebuilt binary
/// gets.
fn exe_of(process: &Path) -> Option<String> {
    let target = std::fs::read_link(process.join("exe")).ok()?;
    let text = target.to_string_lossy();
    Some(text.strip_suffix(" (deleted)").unwrap_or(&text).to_string())
}

/// `hakoniwa run ...` (a VM), not `hakoniwa ctl ...` (such as the very
/// `ctl isolation` asking).
fn runs_a_vm(process: &Path) -> bool {
    std::fs::read(process.join("cmdline"))
        .map(|c| c.split(|&b| b == 0).nth(1) == Some(b"run"))
        .unwrap_or(false)
}

/// The value of `key=` on the kernel's command line (before `--`).
fn cmdline_value(cmdline: &str, key: &str) -> Option<String> {
    cmdline
        .split_whitespace()
        .take_while(|w| *w != "--")
        .filter_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .last()
        .map(str::to_string)
}

/// A CPU list as the kernel prints it; empty and `(null)` are no CPUs;
/// `isolcpus=`'s flags (`nohz,domain,managed_irq,2-3`) are skipped.
fn cpu_list(text: &str) -> Option<CpuSet> {
    let cpus: Vec<&str> = text
        .trim()
        .split(',')
        .filter(|p| p.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    if cpus.is_empty() {
        return Some(CpuSet::from(Vec::new()));
    }
    CpuSet::parse(&cpus.join(",")).ok()
}

impl Observed {
    /// Reads everything the check needs under `root`.
    ///
    /// Other hakoniwa VMs are the processes that run `hakoniwa run` (their
    /// `/proc/PID/cmdline`), whose `/proc/PID/exe` is the same binary as
    /// this one's, or, failing that, whose comm (the executable's name) is
    /// this one's: a different build, or a process whose exe link this one
    /// may not read (another user's). The name alone would miss a renamed
    /// copy; the exe alone would miss other builds.
    pub fn read(root: &Path, vm: &ThisVm) -> Observed {
        let proc = root.join("proc");
        let own = proc.join(vm.pid.to_string());
        let exe = exe_of(&own);
        let comm = read_trimmed(&own.join("comm"));
        let mut others = Vec::new();
        if let Ok(dir) = std::fs::read_dir(&proc) {
            for entry in dir.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let process = proc.join(pid.to_string());
                if pid == vm.pid || !runs_a_vm(&process) {
                    continue;
                }
                let matched_by = if exe.is_some() && exe_of(&process) == exe {
                    "exe"
                } else if comm.is_some() && read_trimmed(&process.join("comm")) == comm {
                    "comm"
                } else {
                    continue;
                };
                others.push(OtherProcess {
                    pid,
                    matched_by,
                    threads: threads_in(&process),
                });
            }
        }
        others.sort_by_key(|o| o.pid);
        let cpu = root.join("sys/devices/system/cpu");
        let cmdline = read_trimmed(&proc.join("cmdline")).unwrap_or_default();
        let host = HostIsolation {
            isolated: read_trimmed(&cpu.join("isolated")),
            nohz_full: read_trimmed(&cpu.join("nohz_full")),
            cmdline_isolcpus: cmdline_value(&cmdline, "isolcpus"),
            cmdline_nohz_full: cmdline_value(&cmdline, "nohz_full"),
            cmdline_irqaffinity: cmdline_value(&cmdline, "irqaffinity"),
        };
        let devices = vm
            .devices
            .iter()
            .map(|d| match host_irq::device_irqs(&proc, &d.host_address) {
                Ok(irqs) => DeviceIrqs {
                    irqs: irqs
                        .into_iter()
                        .map(|i| {
                            let affinity = host_irq::irq_affinity(&proc, i.irq);
                            (i, affinity)
                        })
                        .collect(),
                    error: None,
                },
                Err(e) => DeviceIrqs {
                    irqs: Vec::new(),
                    error: Some(e),
                },
            })
            .collect();
        Observed {
            threads: threads_in(&own),
            proc,
            exe,
            comm,
            others,
            host,
            devices,
        }
    }
}

/// Up to four names, then how many more.
fn some_names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    let mut text = names.iter().take(4).copied().collect::<Vec<_>>().join(", ");
    if names.len() > 4 {
        text.push_str(&format!(", +{}", names.len() - 4));
    }
    text
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// "CPU 2" or "CPUs 2-3".
fn cpus_word(set: &CpuSet) -> String {
    match set.cpus().len() {
        1 => format!("CPU {set}"),
        _ => format!("CPUs {set}"),
    }
}

/// Judges what was read: the report.
pub fn assess(vm: &ThisVm, seen: &Observed) -> IsolationReport {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let mut checked = Vec::new();
    let mut changed = Vec::new();
    let allowed_of = |tid: i32| {
        seen.threads
            .iter()
            .find(|t| t.tid == tid)
            .and_then(|t| t.cpus_allowed.clone())
    };

    // The VM's CPUs: every pinned vCPU's.
    let vm_cpus = CpuSet::union(vm.vcpus.iter().filter_map(|v| v.pinned.as_ref()));
    let vcpus: Vec<VcpuReport> = vm
        .vcpus
        .iter()
        .map(|v| VcpuReport {
            index: v.index,
            thread_id: v.thread_id,
            pinned: v.pinned.as_ref().map(|s| s.to_string()),
            cpus_allowed: v.thread_id.and_then(allowed_of),
        })
        .collect();
    let pinned_vcpus: Vec<&VcpuReport> = vcpus.iter().filter(|v| v.pinned.is_some()).collect();
    checked.push(format!(
        "this VM's threads: {} in {}/{}/task, each with its Cpus_allowed_list; vCPUs: {}",
        seen.threads.len(),
        seen.proc.display(),
        vm.pid,
        vcpus
            .iter()
            .map(|v| match &v.pinned {
                Some(p) => format!("{} pinned to {p}", v.index),
                None => format!("{} not pinned", v.index),
            })
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for v in &vcpus {
        match (&v.pinned, v.thread_id) {
            (Some(p), Some(tid)) => {
                changed.push(format!(
                    "vCPU {}'s thread {tid} pinned itself to {} (--cpus affinity=) before it first entered the guest",
                    v.index,
                    cpus_word(&CpuSet::parse(p).unwrap_or_else(|_| CpuSet::from(vec![])))
                ));
                if let Some(allowed) = &v.cpus_allowed {
                    if cpu_list(allowed).map(|a| a.to_string()) != Some(p.clone()) {
                        problems.push(format!(
                            "vCPU {} was pinned to {p} but its thread {tid} may run on {allowed} now (Cpus_allowed_list)",
                            v.index
                        ));
                    }
                }
            }
            (None, tid) if !pinned_vcpus.is_empty() => notes.push(format!(
                "vCPU {} is not pinned{}: pin it with --cpus affinity= to have it checked",
                v.index,
                match tid.and_then(allowed_of) {
                    Some(a) => format!(" (it may run on {a})"),
                    None => String::new(),
                }
            )),
            _ => {}
        }
    }

    // Host isolation: sysfs, else the command line.
    let host = seen.host.clone();
    let isolated = host
        .isolated
        .as_deref()
        .or(host.cmdline_isolcpus.as_deref())
        .and_then(cpu_list);
    let nohz_full = host
        .nohz_full
        .as_deref()
        .or(host.cmdline_nohz_full.as_deref())
        .and_then(cpu_list);
    let shown = |v: &Option<String>| match v {
        Some(t) if t.is_empty() => "empty".to_string(),
        Some(t) => format!("'{t}'"),
        None => "absent".to_string(),
    };
    checked.push(format!(
        "host isolation: /sys/devices/system/cpu/isolated ({}), /sys/devices/system/cpu/nohz_full ({}), and isolcpus= ({}), nohz_full= ({}), irqaffinity= ({}) in {}/cmdline",
        shown(&host.isolated),
        shown(&host.nohz_full),
        shown(&host.cmdline_isolcpus),
        shown(&host.cmdline_nohz_full),
        shown(&host.cmdline_irqaffinity),
        seen.proc.display()
    ));
    if isolated.is_none() {
        notes.push("which CPUs the host isolates is unknown (neither /sys/devices/system/cpu/isolated nor isolcpus= could be read)".into());
    }

    // Other VMs.
    let other_vms: Vec<OtherVm> = seen
        .others
        .iter()
        .map(|o| OtherVm {
            pid: o.pid,
            matched_by: o.matched_by.into(),
            threads: o.threads.len(),
        })
        .collect();
    checked.push(format!(
        "other hakoniwa VMs: processes running `hakoniwa run` whose /proc/PID/exe is {} or whose comm is '{}': {}, each thread's Cpus_allowed_list",
        seen.exe.as_deref().unwrap_or("(unreadable)"),
        seen.comm.as_deref().unwrap_or("?"),
        if other_vms.is_empty() {
            "none".to_string()
        } else {
            other_vms
                .iter()
                .map(|o| format!("pid {} ({})", o.pid, plural(o.threads, "thread", "threads")))
                .collect::<Vec<_>>()
                .join(", ")
        }
    ));

    // Each CPU of the VM.
    let mut cpus = Vec::new();
    let mut not_isolated = Vec::new();
    let mut not_nohz = Vec::new();
    for &cpu in vm_cpus.cpus() {
        let here: Vec<u8> = vm
            .vcpus
            .iter()
            .filter(|v| v.pinned.as_ref().is_some_and(|s| s.cpus().contains(&cpu)))
            .map(|v| v.index)
            .collect();
        let may_run = |t: &Thread| {
            t.cpus_allowed
                .as_deref()
                .and_then(cpu_list)
                .is_some_and(|s| s.cpus().contains(&cpu))
        };
        let mut shared_with = Vec::new();
        for t in seen.threads.iter().filter(|t| may_run(t)) {
            let vcpu = vm.vcpus.iter().find(|v| v.thread_id == Some(t.tid));
            let owner = match vcpu {
                Some(v) if here.contains(&v.index) => continue,
                Some(_) => Owner::ThisVmVcpu,
                None => Owner::ThisVm,
            };
            shared_with.push(SharingThread {
                owner,
                pid: vm.pid,
                thread_id: t.tid,
                name: t.name.clone(),
                cpus_allowed: t.cpus_allowed.clone().unwrap_or_default(),
            });
        }
        for other in &seen.others {
            let threads: Vec<&Thread> = other.threads.iter().filter(|t| may_run(t)).collect();
            if !threads.is_empty() {
                problems.push(format!(
                    "CPU {cpu} is shared with another hakoniwa VM: pid {}, {} ({})",
                    other.pid,
                    plural(threads.len(), "thread", "threads"),
                    some_names(threads.iter().map(|t| t.name.as_str()))
                ));
            }
            shared_with.extend(threads.into_iter().map(|t| SharingThread {
                owner: Owner::OtherVm,
                pid: other.pid,
                thread_id: t.tid,
                name: t.name.clone(),
                cpus_allowed: t.cpus_allowed.clone().unwrap_or_default(),
            }));
        }
        // Other VMs first, then this VM's vCPUs, then this VMM's threads.
        shared_with.sort_by_key(|t| (t.owner, t.pid, t.thread_id));
        if here.len() > 1 {
            problems.push(format!(
                "CPU {cpu} is shared by vCPUs {} of this VM",
                here.iter()
                    .map(u8::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for t in shared_with.iter().filter(|t| t.owner == Owner::ThisVmVcpu) {
            problems.push(format!(
                "CPU {cpu} may also run this VM's {} (thread {}, allowed {})",
                t.name, t.thread_id, t.cpus_allowed
            ));
        }
        let own: Vec<&str> = shared_with
            .iter()
            .filter(|t| t.owner == Owner::ThisVm)
            .map(|t| t.name.as_str())
            .collect();
        if !own.is_empty() {
            notes.push(format!(
                "CPU {cpu} may also run {} of this VMM ({}); device threads take iothread_affinity=",
                plural(own.len(), "other thread", "other threads"),
                some_names(own.iter().copied())
            ));
        }
        let is_isolated = isolated.as_ref().is_some_and(|s| s.cpus().contains(&cpu));
        let is_nohz = nohz_full.as_ref().is_some_and(|s| s.cpus().contains(&cpu));
        if !is_isolated {
            not_isolated.push(cpu);
        }
        if !is_nohz {
            not_nohz.push(cpu);
        }
        cpus.push(CpuReport {
            cpu,
            vcpus: here,
            isolated: is_isolated,
            nohz_full: is_nohz,
            shared_with,
        });
    }
    if !not_isolated.is_empty() {
        let set = CpuSet::from(not_isolated);
        problems.push(format!(
            "{} not isolated from the scheduler (not in /sys/devices/system/cpu/isolated): other host tasks may run there (boot the host with isolcpus={set})",
            match set.cpus().len() {
                1 => format!("CPU {set} is"),
                _ => format!("CPUs {set} are"),
            }
        ));
    }
    if !not_nohz.is_empty() {
        let set = CpuSet::from(not_nohz);
        notes.push(format!(
            "{} not nohz_full: the scheduler tick still interrupts the vCPUs there (nohz_full={set})",
            match set.cpus().len() {
                1 => format!("CPU {set} is"),
                _ => format!("CPUs {set} are"),
            }
        ));
    }
    if !vm_cpus.cpus().is_empty() {
        match host.cmdline_irqaffinity.as_deref().map(|t| (t, cpu_list(t))) {
            None => notes.push(format!(
                "no irqaffinity= on the host's command line: the host's own device interrupts may be delivered to {}",
                cpus_word(&vm_cpus)
            )),
            Some((text, Some(set))) if set.cpus().iter().any(|c| vm_cpus.cpus().contains(c)) => {
                notes.push(format!(
                    "irqaffinity={text} lets the host's own device interrupts go to the VM's {}",
                    cpus_word(&vm_cpus)
                ))
            }
            Some(_) => {}
        }
    }

    // Devices.
    let mut devices = Vec::new();
    if vm.devices.is_empty() {
        checked.push("passed-through devices: none".into());
    }
    for (device, read) in vm.devices.iter().zip(&seen.devices) {
        let address = host_irq::normalize_pci_address(&device.host_address)
            .unwrap_or_else(|_| device.host_address.clone());
        let label = format!("device {} ({address})", device.id);
        let irqs: Vec<IrqReport> = read
            .irqs
            .iter()
            .map(|(irq, affinity)| {
                let delivered = affinity
                    .effective
                    .as_deref()
                    .or(affinity.affinity.as_deref());
                let inside = match (vm_cpus.cpus().is_empty(), delivered.and_then(cpu_list)) {
                    (false, Some(set)) => {
                        Some(set.cpus().iter().all(|c| vm_cpus.cpus().contains(c)))
                    }
                    _ => None,
                };
                if inside == Some(false) {
                    problems.push(format!(
                        "{label}: IRQ {} {} is delivered to {}, outside the VM's {}{}",
                        irq.irq,
                        irq.name,
                        cpus_word(
                            &delivered
                                .and_then(cpu_list)
                                .unwrap_or_else(|| CpuSet::from(vec![]))
                        ),
                        cpus_word(&vm_cpus),
                        format_args!(
                            " (to move it: echo {vm_cpus} > /proc/irq/{}/smp_affinity_list)",
                            irq.irq
                        )
                    ));
                }
                IrqReport {
                    irq: irq.irq,
                    name: irq.name.clone(),
                    smp_affinity: affinity.affinity.clone(),
                    effective_affinity: affinity.effective.clone(),
                    inside_vm_cpus: inside,
                }
            })
            .collect();
        match &read.error {
            Some(e) => problems.push(format!("{label}: its host IRQs cannot be checked: {e}")),
            None => checked.push(format!(
                "{label}: {} in {}/interrupts, with their /proc/irq/N/smp_affinity_list and effective_affinity_list",
                plural(irqs.len(), "host IRQ", "host IRQs"),
                seen.proc.display()
            )),
        }
        if irqs.is_empty() && read.error.is_none() {
            notes.push(format!(
                "{label}: no host IRQs yet (vfio-pci requests them when the guest enables MSI, MSI-X or INTx)"
            ));
        }
        for change in &device.irq_changes {
            changed.push(format!("{label}: {change} (irq_affinity=on)"));
        }
        devices.push(DeviceReport {
            id: device.id.clone(),
            host_address: address,
            irq_affinity: device.irq_affinity,
            irqs,
            irq_changes: device.irq_changes.clone(),
            error: read.error.clone(),
        });
    }

    let verdict = if vm_cpus.cpus().is_empty() {
        problems.insert(
            0,
            "no vCPU is pinned: the check needs pinning (--cpus boot=N,affinity=[0@[2],1@[3]])"
                .into(),
        );
        Verdict::NeedsPinning
    } else if problems.is_empty() {
        Verdict::Isolated
    } else {
        Verdict::NotIsolated
    };
    IsolationReport {
        verdict,
        vm_cpus: vm_cpus.to_string(),
        vcpus,
        cpus,
        host,
        other_vms,
        devices,
        problems,
        notes,
        checked,
        changed,
    }
}

impl fmt::Display for IsolationReport {
    /// The report for people (`hakoniwa ctl isolation`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.verdict {
            Verdict::NeedsPinning => writeln!(f, "verdict: needs pinning (no vCPU is pinned)")?,
            v => writeln!(
                f,
                "verdict: {} (vCPUs on host CPUs {})",
                v.name(),
                self.vm_cpus
            )?,
        }
        for c in &self.cpus {
            let vcpus: Vec<String> = c.vcpus.iter().map(u8::to_string).collect();
            writeln!(
                f,
                "CPU {}: vCPU {}; {}, {}",
                c.cpu,
                vcpus.join(", "),
                if c.isolated {
                    "isolated"
                } else {
                    "not isolated"
                },
                if c.nohz_full {
                    "nohz_full"
                } else {
                    "not nohz_full"
                }
            )?;
            let mut owners: Vec<(Owner, u32)> =
                c.shared_with.iter().map(|t| (t.owner, t.pid)).collect();
            owners.sort();
            owners.dedup();
            for (owner, pid) in owners {
                let names: Vec<&str> = c
                    .shared_with
                    .iter()
                    .filter(|t| (t.owner, t.pid) == (owner, pid))
                    .map(|t| t.name.as_str())
                    .collect();
                let whose = match owner {
                    Owner::OtherVm => format!("other VM, pid {pid}"),
                    Owner::ThisVmVcpu => "this VM's other vCPUs".into(),
                    Owner::ThisVm => "this VMM".into(),
                };
                writeln!(
                    f,
                    "  shared with {whose}: {} ({})",
                    plural(names.len(), "thread", "threads"),
                    some_names(names.into_iter())
                )?;
            }
        }
        for v in &self.vcpus {
            writeln!(
                f,
                "vCPU {}: {}, thread {}, may run on {}",
                v.index,
                v.pinned
                    .as_ref()
                    .map(|p| format!("pinned to {p}"))
                    .unwrap_or_else(|| "not pinned".into()),
                v.thread_id
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "not started".into()),
                v.cpus_allowed.as_deref().unwrap_or("?")
            )?;
        }
        if self.devices.is_empty() {
            writeln!(f, "devices: none passed through")?;
        }
        for d in &self.devices {
            writeln!(f, "device {} ({}):", d.id, d.host_address)?;
            for i in &d.irqs {
                writeln!(
                    f,
                    "  IRQ {} {}: allowed {}, delivered to {}{}",
                    i.irq,
                    i.name,
                    i.smp_affinity.as_deref().unwrap_or("?"),
                    i.effective_affinity.as_deref().unwrap_or("?"),
                    match i.inside_vm_cpus {
                        Some(true) => ", inside the VM's CPUs",
                        Some(false) => ", OUTSIDE the VM's CPUs",
                        None => "",
                    }
                )?;
            }
        }
        let lists = [
            ("problems", &self.problems),
            ("notes", &self.notes),
            ("checked", &self.checked),
            ("changed", &self.changed),
        ];
        for (title, list) in lists {
            if list.is_empty() {
                writeln!(f, "{title}: none")?;
                continue;
            }
            writeln!(f, "{title}:")?;
            for line in list {
                writeln!(f, "  - {line}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake host: `/proc` and `/sys` under a fresh temporary directory.
    struct FakeHost(PathBuf);

    impl FakeHost {
        fn new(test: &str) -> FakeHost {
            let root = std::env::temp_dir()
                .join(format!("hakoniwa-isolation-{test}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("proc")).unwrap();
            std::fs::create_dir_all(root.join("sys/devices/system/cpu")).unwrap();
            std::fs::write(root.join("proc/cmdline"), "console=ttyS0 quiet\n").unwrap();
            std::fs::write(root.join("sys/devices/system/cpu/isolated"), "\n").unwrap();
            FakeHost(root)
        }

        fn write(&self, path: &str, text: &str) {
            let path = self.0.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }

        /// A process: its exe, argv, and threads (tid, name, CPUs).
        fn process(&self, pid: u32, exe: &str, argv: &[&str], threads: &[(i32, &str, &str)]) {
            let dir = format!("proc/{pid}");
            std::fs::create_dir_all(self.0.join(&dir)).unwrap();
            std::os::unix::fs::symlink(exe, self.0.join(&dir).join("exe")).unwrap();
            let name = Path::new(exe.trim_end_matches(" (deleted)"))
                .file_name()
                .unwrap()
                .to_str()
                .unwrap();
            self.write(&format!("{dir}/comm"), &format!("{name}\n"));
            self.write(&format!("{dir}/cmdline"), &(argv.join("\0") + "\0"));
            for (tid, name, cpus) in threads {
                self.write(&format!("{dir}/task/{tid}/comm"), &format!("{name}\n"));
                self.write(
                    &format!("{dir}/task/{tid}/status"),
                    &format!("Name:\t{name}\nCpus_allowed:\tff\nCpus_allowed_list:\t{cpus}\nMems_allowed:\t1\n"),
                );
            }
        }

        /// This VM: pid 100, vCPU 0 pinned to CPU 2 and vCPU 1 to CPU 3,
        /// and the VMM's main thread anywhere.
        fn this_vm(&self) -> ThisVm {
            self.process(
                100,
                "/usr/bin/hakoniwa",
                &["hakoniwa", "run", "--cpus", "boot=2,affinity=[0@[2],1@[3]]"],
                &[
                    (100, "hakoniwa", "0-3"),
                    (101, "vcpu0", "2"),
                    (102, "vcpu1", "3"),
                ],
            );
            ThisVm {
                pid: 100,
                vcpus: vec![
                    VcpuPin {
                        index: 0,
                        thread_id: Some(101),
                        pinned: Some(CpuSet::from(vec![2])),
                    },
                    VcpuPin {
                        index: 1,
                        thread_id: Some(102),
                        pinned: Some(CpuSet::from(vec![3])),
                    },
                ],
                devices: Vec::new(),
            }
        }
    }

    impl Drop for FakeHost {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_cpu_shared_with_another_vm_is_found() {
        let host = FakeHost::new("shared");
        let vm = host.this_vm();
        // Another VM (a rebuilt binary: its exe reads "(deleted)") runs on
        // CPU 3 alone.
        host.process(
            200,
            "/usr/bin/hakoniwa (deleted)",
            &[
                "/usr/bin/hakoniwa",
                "run",
                "--cpus",
                "boot=1,affinity=[0@[3]]",
            ],
            &[(200, "hakoniwa", "3"), (201, "vcpu0", "3")],
        );
        // Another build, recognized by its name; pinned away from 2-3.
        host.process(
            300,
            "/home/u/target/debug/hakoniwa",
            &["hakoniwa", "run"],
            &[(300, "hakoniwa", "0-1"), (301, "vcpu0", "0")],
        );
        // Neither `ctl isolation` itself nor anything else is a VM.
        host.process(
            400,
            "/usr/bin/hakoniwa",
            &["hakoniwa", "ctl", "isolation"],
            &[(400, "hakoniwa", "0-3")],
        );
        host.process(
            500,
            "/usr/bin/qemu-system-x86_64",
            &["qemu", "run"],
            &[(500, "qemu", "0-3")],
        );

        let report = check(&host.0, &vm);
        assert_eq!(report.verdict, Verdict::NotIsolated);
        assert_eq!(report.vm_cpus, "2-3");
        let pids: Vec<(u32, &str, usize)> = report
            .other_vms
            .iter()
            .map(|o| (o.pid, o.matched_by.as_str(), o.threads))
            .collect();
        assert_eq!(pids, [(200, "exe", 2), (300, "comm", 2)]);

        let cpu3 = &report.cpus[1];
        assert_eq!((cpu3.cpu, cpu3.vcpus.as_slice()), (3, &[1u8][..]));
        let sharing: Vec<(Owner, u32, i32)> = cpu3
            .shared_with
            .iter()
            .map(|t| (t.owner, t.pid, t.thread_id))
            .collect();
        assert_eq!(
            sharing,
            [
                (Owner::OtherVm, 200, 200),
                (Owner::OtherVm, 200, 201),
                (Owner::ThisVm, 100, 100),
            ]
        );
        assert!(
            report
                .problems
                .iter()
                .any(|p| p == "CPU 3 is shared with another hakoniwa VM: pid 200, 2 threads (hakoniwa, vcpu0)"),
            "{:#?}",
            report.problems
        );
        // CPU 2: only this VMM's main thread, a note, not a problem.
        assert!(report.cpus[0]
            .shared_with
            .iter()
            .all(|t| t.owner == Owner::ThisVm));
        assert!(!report
            .problems
            .iter()
            .any(|p| p.starts_with("CPU 2 is shared")));
        assert!(report
            .notes
            .iter()
            .any(|n| n.starts_with("CPU 2 may also run 1 other thread of this VMM (hakoniwa)")));
        assert!(report.changed[0].starts_with("vCPU 0's thread 101 pinned itself to CPU 2"));
        assert!(report
            .checked
            .iter()
            .any(|c| c.contains("pid 200 (2 threads), pid 300 (2 threads)")));
        let text = report.to_string();
        assert!(
            text.starts_with("verdict: not isolated (vCPUs on host CPUs 2-3)\n"),
            "{text}"
        );
        assert!(text.contains("CPU 3: vCPU 1; not isolated, not nohz_full\n  shared with other VM, pid 200: 2 threads (hakoniwa, vcpu0)\n  shared with this VMM: 1 thread (hakoniwa)\n"), "{text}");
    }

    #[test]
    fn isolated_cpus_are_found_and_a_clean_vm_is_isolated() {
        let host = FakeHost::new("isolated");
        let mut vm = host.this_vm();
        // The VMM's main thread is kept off the vCPUs' CPUs.
        host.write("proc/100/task/100/status", "Cpus_allowed_list:\t0-1\n");
        host.write("sys/devices/system/cpu/isolated", "2-3\n");
        host.write("sys/devices/system/cpu/nohz_full", "3\n");
        host.write(
            "proc/cmdline",
            "quiet isolcpus=nohz,domain,2-3 nohz_full=3 irqaffinity=0-1 -- init-arg irqaffinity=2\n",
        );
        let report = check(&host.0, &vm);
        assert_eq!(report.verdict, Verdict::Isolated, "{:#?}", report.problems);
        assert!(report
            .cpus
            .iter()
            .all(|c| c.isolated && c.shared_with.is_empty()));
        assert_eq!(
            report.cpus.iter().map(|c| c.nohz_full).collect::<Vec<_>>(),
            [false, true]
        );
        assert_eq!(
            report.host.cmdline_isolcpus.as_deref(),
            Some("nohz,domain,2-3")
        );
        assert_eq!(report.host.cmdline_irqaffinity.as_deref(), Some("0-1"));
        assert!(report
            .notes
            .iter()
            .any(|n| n.starts_with("CPU 2 is not nohz_full")));
        assert!(!report.notes.iter().any(|n| n.contains("irqaffinity")));

        // Without the sysfs file, isolcpus= says it.
        std::fs::remove_file(host.0.join("sys/devices/system/cpu/isolated")).unwrap();
        assert_eq!(check(&host.0, &vm).verdict, Verdict::Isolated);
        // Two vCPUs on one CPU, one not isolated.
        vm.vcpus[1].pinned = Some(CpuSet::from(vec![2]));
        host.write("proc/100/task/102/status", "Cpus_allowed_list:\t2\n");
        host.write("proc/cmdline", "isolcpus=3\n");
        let report = check(&host.0, &vm);
        assert_eq!(report.verdict, Verdict::NotIsolated);
        assert_eq!(report.cpus[0].vcpus, [0, 1]);
        assert!(report
            .problems
            .contains(&"CPU 2 is shared by vCPUs 0, 1 of this VM".to_string()));
        assert!(report
            .problems
            .iter()
            .any(|p| p.starts_with("CPU 2 is not isolated from the scheduler")));
    }

    #[test]
    fn an_irq_outside_the_vms_cpus_is_flagged() {
        let host = FakeHost::new("irq");
        let mut vm = host.this_vm();
        host.write(
            "proc/interrupts",
            "           CPU0       CPU1       CPU2       CPU3\n\
             \x2024:          0          5          0          0  PCI-MSI 49152-edge      vfio-msix[0](0000:00:04.0)\n\
             \x2025:          0          0          7          0  PCI-MSI 49153-edge      vfio-msix[1](0000:00:04.0)\n\
             \x2026:          0          0          7          0  PCI-MSI 49154-edge      vfio-msix[0](0000:00:05.0)\n\
             garbage line\n 27 no colon\n",
        );
        host.write("proc/irq/24/smp_affinity_list", "0-3\n");
        host.write("proc/irq/24/effective_affinity_list", "1\n");
        host.write("proc/irq/25/smp_affinity_list", "2-3\n");
        host.write("proc/irq/25/effective_affinity_list", "2\n");
        vm.devices = vec![
            CheckedDevice {
                id: "vfio0".into(),
                host_address: "00:04.0".into(),
                irq_affinity: false,
                irq_changes: Vec::new(),
            },
            CheckedDevice {
                id: "vfio1".into(),
                host_address: "0000:00:06.0".into(),
                irq_affinity: true,
                irq_changes: vec![IrqChange {
                    irq: 30,
                    name: "vfio-msi[0](0000:00:06.0)".into(),
                    old: Some("0-3".into()),
                    new: Some("2-3".into()),
                    error: None,
                }],
            },
        ];
        let report = check(&host.0, &vm);
        let d = &report.devices[0];
        assert_eq!(d.host_address, "0000:00:04.0");
        let inside: Vec<(u32, Option<bool>)> =
            d.irqs.iter().map(|i| (i.irq, i.inside_vm_cpus)).collect();
        assert_eq!(inside, [(24, Some(false)), (25, Some(true))]);
        assert!(report.problems.contains(
            &"device vfio0 (0000:00:04.0): IRQ 24 vfio-msix[0](0000:00:04.0) is delivered to CPU 1, outside the VM's CPUs 2-3 (to move it: echo 2-3 > /proc/irq/24/smp_affinity_list)".to_string()
        ), "{:#?}", report.problems);
        assert!(report
            .notes
            .iter()
            .any(|n| n.starts_with("device vfio1 (0000:00:06.0): no host IRQs yet")));
        assert_eq!(
            report.changed.last().unwrap(),
            "device vfio1 (0000:00:06.0): IRQ 30 vfio-msi[0](0000:00:06.0): 0-3 -> 2-3 (irq_affinity=on)"
        );
        let text = report.to_string();
        assert!(text.contains("  IRQ 24 vfio-msix[0](0000:00:04.0): allowed 0-3, delivered to 1, OUTSIDE the VM's CPUs\n"), "{text}");

        // Unreadable /proc/interrupts: said, not a panic.
        std::fs::remove_file(host.0.join("proc/interrupts")).unwrap();
        let report = check(&host.0, &vm);
        assert!(report.devices[0]
            .error
            .as_deref()
            .unwrap()
            .starts_with("cannot read "));
    }

    #[test]
    fn unpinned_vcpus_need_pinning_and_the_rest_is_still_reported() {
        let host = FakeHost::new("unpinned");
        let mut vm = host.this_vm();
        for v in &mut vm.vcpus {
            v.pinned = None;
        }
        let report = check(&host.0, &vm);
        assert_eq!(report.verdict, Verdict::NeedsPinning);
        assert!(
            report.problems[0].starts_with("no vCPU is pinned: the check needs pinning (--cpus")
        );
        assert!(report.cpus.is_empty() && report.changed.is_empty());
        assert_eq!(report.vcpus[1].cpus_allowed.as_deref(), Some("3"));
        assert!(report.to_string().starts_with("verdict: needs pinning"));

        // One pinned, one not: the other may run on the pinned CPU.
        vm.vcpus[0].pinned = Some(CpuSet::from(vec![2]));
        host.write("proc/100/task/102/status", "Cpus_allowed_list:\t0-3\n");
        let report = check(&host.0, &vm);
        assert_eq!(report.verdict, Verdict::NotIsolated);
        assert_eq!(report.cpus[0].shared_with[0].owner, Owner::ThisVmVcpu);
        assert!(report
            .problems
            .contains(&"CPU 2 may also run this VM's vcpu1 (thread 102, allowed 0-3)".to_string()));
        assert!(report.notes.contains(
            &"vCPU 1 is not pinned (it may run on 0-3): pin it with --cpus affinity= to have it checked".to_string()
        ));
    }

    #[test]
    fn the_report_has_stable_field_names_and_round_trips() {
        let host = FakeHost::new("serde");
        let vm = host.this_vm();
        let report = check(&host.0, &vm);
        let value = serde_json::to_value(&report).unwrap();
        let keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        for key in [
            "verdict",
            "vm_cpus",
            "vcpus",
            "cpus",
            "host",
            "other_vms",
            "devices",
            "problems",
            "notes",
            "checked",
            "changed",
        ] {
            assert!(keys.contains(&key), "{key} in {keys:?}");
        }
        assert_eq!(value["verdict"], "not_isolated");
        assert_eq!(value["cpus"][0]["shared_with"][0]["owner"], "this_vm");
        assert_eq!(value["host"]["isolated"], "");
        let back: IsolationReport = serde_json::from_value(value).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn this_hosts_own_proc_reads_without_panicking() {
        // The real /proc: this test process is no VM; the report says so.
        let vm = ThisVm {
            pid: std::process::id(),
            vcpus: vec![VcpuPin {
                index: 0,
                thread_id: None,
                pinned: Some(CpuSet::of_this_process().unwrap()),
            }],
            devices: vec![CheckedDevice {
                id: "vfio0".into(),
                host_address: "0000:ff:1f.7".into(),
                ..Default::default()
            }],
        };
        let report = check(Path::new("/"), &vm);
        assert!(!report.cpus.is_empty());
        assert!(report
            .checked
            .iter()
            .any(|c| c.starts_with("this VM's threads: ")));
        assert!(report.devices[0].irqs.is_empty());
    }
}
