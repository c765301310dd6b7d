//! Failure reports: what a guest that failed or seems stuck was doing, so
//! a failure says more than "the guest triple-faulted".
//!
//! A report holds every vCPU's registers, pending events and LAPIC, where
//! RIP, the stack, CR2, the IDT, GDT and TSS lie in guest-physical memory
//! (walked through the guest's own page tables), the bytes there, and for
//! every page involved whether it is in memory and — for a VM that came in
//! by migration — how and when it arrived and whether it still equals the
//! source's copy (`ctl migrate --verify-pages`). Also the guest's last
//! console output, COM1's registers, the IOAPIC's live pins, the newest
//! migration report and the VMM's threads with their kernel wait points.
//!
//! Written as JSON to `run --dump-dir DIR` when a vCPU triple-faults or
//! KVM fails it, and on demand by `ctl dump` (for a guest that hangs).
//!
//! - [`capture`]: one vCPU's state, read on its own thread;
//! - [`report`]: the report's contents, built from captures and memory.

pub mod capture;
pub mod report;

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;

use devices::legacy::Serial;
use kvm_bindings::{kvm_irqchip, KVM_IRQCHIP_IOAPIC};
use kvm_ioctls::VmFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::console::ConsoleTail;
use crate::memory::GuestMemoryMmap;
use crate::migration::history::PageHistory;
use crate::migration::source::VmPauser;
use crate::migration::MigrationReports;
use crate::private_file::{write_private, PrivateFileError};
use crate::vcpu::{RunControl, Vcpu};
pub use capture::{capture_vcpu, Captures, VcpuCapture};
use report::{GuestPages, PageRead, ReportInput};

/// How long each parked vCPU may take to read its state for `ctl dump`.
const CAPTURE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a running VM keeps to write reports.
pub struct Inspector {
    memory: GuestMemoryMmap,
    vm_fd: Arc<VmFd>,
    serial: Arc<Mutex<Serial>>,
    console: ConsoleTail,
    history: Option<Arc<PageHistory>>,
    migrations: OnceLock<Arc<MigrationReports>>,
    dump_dir: Option<PathBuf>,
    captures: Captures,
    vcpus: u8,
    /// One report at a time.
    busy: Mutex<()>,
}

impl Inspector {
    pub fn new(
        memory: GuestMemoryMmap,
        vm_fd: Arc<VmFd>,
        serial: Arc<Mutex<Serial>>,
        console: ConsoleTail,
        vcpus: u8,
        dump_dir: Option<PathBuf>,
    ) -> Inspector {
        Inspector {
            memory,
            vm_fd,
            serial,
            console,
            history: None,
            migrations: OnceLock::new(),
            dump_dir,
            captures: Captures::default(),
            vcpus,
            busy: Mutex::new(()),
        }
    }

    /// A migrated-in VM: reports say how each page arrived.
    pub fn with_history(mut self, history: Option<Arc<PageHistory>>) -> Self {
        self.history = history;
        self
    }

    /// The VM's migration reports (they exist once the VM runs).
    pub fn set_migrations(&self, migrations: Arc<MigrationReports>) {
        let _ = self.migrations.set(migrations);
    }

    /// Where vCPU threads put their captures.
    pub fn captures(&self) -> Captures {
        self.captures.clone()
    }

    /// After a vCPU failed and every vCPU thread stopped (each captured
    /// its state on the way out): the report's summary line and, with
    /// `--dump-dir`, the file written. None if no vCPU recorded a failure.
    pub fn report_failure(&self, reason: &str) -> Option<(String, Option<PathBuf>)> {
        if !self.captures.has_failure() {
            return None;
        }
        let _busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let report = self.build(reason, self.captures.take());
        let path = self
            .dump_dir
            .as_deref()
            .map(|dir| write_report(dir, None, &report));
        match path {
            Some(Err(e)) => Some((format!("{}; the report: {e}", report.summary), None)),
            Some(Ok(path)) => Some((report.summary, Some(path))),
            None => Some((report.summary, None)),
        }
    }

    /// `ctl dump`: pauses the VM (if it runs), has every vCPU read its
    /// state, writes the report to `path` (or into `--dump-dir`) and lets
    /// the VM run again. A vCPU that does not park (stuck in the kernel,
    /// e.g. waiting for a page) is reported as such, with the kernel's
    /// wait point of its thread. Returns the file and the summary line.
    pub fn dump_running(
        &self,
        pauser: &dyn VmPauser,
        path: Option<&Path>,
    ) -> Result<(PathBuf, String), String> {
        if path.is_none() && self.dump_dir.is_none() {
            return Err("give a path, or start the VM with --dump-dir".into());
        }
        let _busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let control = pauser.run_control();
        let was_running = control.desired() == crate::vcpu::Desired::Run;
        let paused = if was_running { pauser.pause() } else { Ok(()) };
        let mut captures = Vec::new();
        for index in 0..self.vcpus {
            captures.push(match &paused {
                Ok(()) => capture_parked(control, index),
                Err(e) => unparked(index, e),
            });
        }
        if was_running {
            pauser.resume();
        }
        let report = self.build("requested (ctl dump)", captures);
        let file = write_report(
            self.dump_dir.as_deref().unwrap_or(Path::new(".")),
            path,
            &report,
        )
        .map_err(|e| format!("cannot write the report: {e}"))?;
        Ok((file, report.summary))
    }

    fn build(&self, reason: &str, captures: Vec<VcpuCapture>) -> report::DumpReport {
        let mut chip = kvm_irqchip {
            chip_id: KVM_IRQCHIP_IOAPIC,
            ..Default::default()
        };
        let ioapic = match self.vm_fd.get_irqchip(&mut chip) {
            // SAFETY: KVM filled the union's IOAPIC member for chip 2.
            Ok(()) => report::ioapic_pins(unsafe { &chip.chip.ioapic }),
            Err(_) => Vec::new(),
        };
        let com1 = self
            .serial
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .state()
            .into();
        let migration = self
            .migrations
            .get()
            .and_then(|m| m.latest())
            .and_then(|s| serde_json::to_value(s).ok())
            .map(|mut v| {
                // The per-100 ms list is long and says nothing here.
                if let Some(o) = v.as_object_mut() {
                    o.remove("run_fraction");
                }
                v
            });
        report::build(ReportInput {
            reason: reason.to_string(),
            captures,
            memory: &MemoryPages(&self.memory),
            history: self.history.as_deref(),
            console_tail: self.console.text(),
            com1: Some(com1),
            ioapic,
            migration,
            threads: threads(),
        })
    }
}

/// Has parked vCPU `index` read its own state.
fn capture_parked(control: &RunControl, index: u8) -> VcpuCapture {
    let (reply, answer) = mpsc::channel();
    let sent = control.run_on_vcpu(
        index,
        Box::new(move |vcpu: &mut Vcpu| {
            let _ = reply.send(capture_vcpu(&vcpu.fd, vcpu.index, "paused"));
        }),
    );
    match sent {
        Err(e) => unparked(index, &e),
        Ok(()) => answer
            .recv_timeout(CAPTURE_TIMEOUT)
            .unwrap_or_else(|_| unparked(index, "it did not read its state in time")),
    }
}

fn unparked(index: u8, why: &str) -> VcpuCapture {
    VcpuCapture {
        index,
        exit: "not parked".into(),
        regs: None,
        sregs: None,
        events: None,
        mp_state: None,
        lapic: None,
        errors: vec![why.to_string()],
    }
}

/// Writes `report` as JSON to `path`, or to a new file in `dir`: a
/// private file (0600, never through a symbolic link), since it holds
/// guest memory — code bytes, stack words, page contents' checksums.
fn write_report(
    dir: &Path,
    path: Option<&Path>,
    report: &report::DumpReport,
) -> Result<PathBuf, PrivateFileError> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| PrivateFileError::io(dir, e))?;
            dir.join(format!(
                "hakoniwa-{}-{}.json",
                std::process::id(),
                report.written_at_unix_ms
            ))
        }
    };
    let json = serde_json::to_vec_pretty(report)
        .map_err(|e| PrivateFileError::io(&path, std::io::Error::other(e)))?;
    write_private(&path, &json)?;
    Ok(path)
}

/// The VMM's threads: id, name, scheduler state and the kernel function
/// each waits in (its kernel stack where readable, as root).
fn threads() -> Vec<String> {
    threads_of("self")
}

/// [`threads`] of process `pid` ("self" or a number): also what a test
/// prints of a VMM that did not answer in time, from outside it.
pub fn threads_of(pid: &str) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out: Vec<String> = tasks
        .flatten()
        .map(|task| {
            let dir = task.path();
            let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
            let stat = read("stat");
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("?")
                .to_string();
            let stack: Vec<String> = read("stack")
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .map(|f| f.split('+').next().unwrap_or(f).to_string())
                .take(8)
                .collect();
            format!(
                "{} {} {} wchan={} [{}]",
                task.file_name().to_string_lossy(),
                read("comm").trim(),
                state,
                read("wchan").trim(),
                stack.join(" < ")
            )
        })
        .collect();
    out.sort();
    out
}

/// Guest RAM for a report: a page is read only if it is in memory, so a
/// report never waits on a postcopy fault.
struct MemoryPages<'a>(&'a GuestMemoryMmap);

impl GuestPages for MemoryPages<'_> {
    fn read(&self, address: u64, buf: &mut [u8]) -> PageRead {
        let Some(region) = self.0.find_region(GuestAddress(address)) else {
            return PageRead::NotRam;
        };
        let page = address & !0xfff;
        let Some(host) = region
            .to_region_addr(GuestAddress(page))
            .and_then(|offset| region.get_host_address(offset).ok())
        else {
            return PageRead::NotRam;
        };
        let mut resident = 0u8;
        // SAFETY: `host` is the page-aligned address of one page inside a
        // live mapping of guest RAM; mincore writes one byte for it.
        let rc = unsafe { libc::mincore(host.cast(), 4096, &mut resident) };
        if rc != 0 || resident & 1 == 0 {
            return PageRead::NotInMemory;
        }
        match self.0.read_slice(buf, GuestAddress(address)) {
            Ok(()) => PageRead::Read,
            Err(_) => PageRead::NotRam,
        }
    }
}
