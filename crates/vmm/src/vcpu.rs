//! vCPU threads: each runs `KVM_RUN` in a loop and hands port I/O and MMIO
//! exits to the buses; everything interrupt-related stays in KVM's
//! in-kernel irqchip.
//!
//! To stop or pause a vCPU that may be inside `KVM_RUN` (e.g. halted),
//! the VMM sends its thread a real-time signal. The handler sets the
//! thread's `kvm_run.immediate_exit`, so a signal that lands just before
//! `KVM_RUN` is entered still makes it return at once, with EINTR.

use std::cell::Cell;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use devices::{Bus, PlatformExit};
use kvm_bindings::{kvm_run, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

use crate::cpus::{CpuSet, VcpuThreadIds};
use crate::dump::{capture_vcpu, Captures};
use crate::event::{EventSender, VmmEvent};

/// Offset from SIGRTMIN of the signal that kicks a vCPU out of KVM_RUN.
const KICK_SIGNAL_OFFSET: i32 = 0;

thread_local! {
    /// This thread's `kvm_run`, for the kick signal handler. Const
    /// initialised so reading it from a signal handler never allocates.
    static KVM_RUN_PTR: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn handle_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let run = KVM_RUN_PTR.with(|p| p.get());
    if !run.is_null() {
        // SAFETY: the pointer was set by this same thread to its VcpuFd's
        // mmapped kvm_run, which stays mapped while the thread runs its loop
        // (the pointer is cleared before the VcpuFd is dropped). A volatile
        // one-byte store is async-signal-safe.
        unsafe { std::ptr::addr_of_mut!((*run).immediate_exit).write_volatile(1) };
    }
}

/// The kick signal number.
pub fn kick_signal() -> i32 {
    SIGRTMIN() + KICK_SIGNAL_OFFSET
}

/// Installs the kick handler (once per process).
pub fn install_kick_handler() -> Result<(), crate::Error> {
    register_signal_handler(kick_signal(), handle_kick)
        .map_err(|e| crate::Error::Signal(e.to_string()))
}

/// What the VMM wants the vCPUs to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Desired {
    Run,
    Pause,
    Stop,
}

/// Work for one paused vCPU, run on its own thread (where its fd is used),
/// e.g. saving its state for a snapshot.
pub type VcpuJob = Box<dyn FnOnce(&mut Vcpu) + Send>;

/// Shared between the VMM and its vCPU threads: the desired state and how
/// many vCPUs are parked in it, and jobs for parked vCPUs.
pub struct RunControl {
    state: Mutex<(Desired, usize)>,
    changed: Condvar,
    /// (vCPU index, job); locked only with `state` held.
    jobs: Mutex<Vec<(u8, VcpuJob)>>,
    /// Each vCPU thread reads its state as it stops (for the report on a
    /// failure of another vCPU; crate::dump).
    capture_on_stop: std::sync::atomic::AtomicBool,
}

impl Default for RunControl {
    fn default() -> Self {
        RunControl {
            state: Mutex::new((Desired::Run, 0)),
            changed: Condvar::new(),
            jobs: Mutex::new(Vec::new()),
            capture_on_stop: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl RunControl {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Desired, usize)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on each vCPU thread reads its state as it stops.
    pub fn capture_on_stop(&self) {
        self.capture_on_stop
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Sets the desired state and wakes parked vCPUs.
    pub fn set(&self, desired: Desired) {
        self.lock().0 = desired;
        self.changed.notify_all();
    }

    pub fn desired(&self) -> Desired {
        self.lock().0
    }

    /// Waits until `count` vCPUs are parked (paused), or the timeout ends;
    /// returns whether they all are.
    pub fn wait_parked(&self, count: usize, timeout: std::time::Duration) -> bool {
        let guard = self.lock();
        let (guard, _) = self
            .changed
            .wait_timeout_while(guard, timeout, |(desired, parked)| {
                *desired == Desired::Pause && *parked < count
            })
            .unwrap_or_else(|e| e.into_inner());
        guard.0 == Desired::Pause && guard.1 >= count
    }

    /// Sets the desired state to `to` if it is `from`; returns whether it
    /// was.
    pub fn set_if(&self, from: Desired, to: Desired) -> bool {
        let mut guard = self.lock();
        if guard.0 != from {
            return false;
        }
        guard.0 = to;
        self.changed.notify_all();
        true
    }

    /// Hands `job` to vCPU `index`'s thread, which runs it while parked.
    /// The VM must be paused; if it stops or resumes before the vCPU gets
    /// to the job, the job is dropped unrun.
    pub fn run_on_vcpu(&self, index: u8, job: VcpuJob) -> Result<(), String> {
        let guard = self.lock();
        if guard.0 != Desired::Pause {
            return Err("the VM is not paused".into());
        }
        self.jobs_lock().push((index, job));
        self.changed.notify_all();
        drop(guard);
        Ok(())
    }

    fn jobs_lock(&self) -> std::sync::MutexGuard<'_, Vec<(u8, VcpuJob)>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_job(&self, index: u8) -> Option<VcpuJob> {
        let mut jobs = self.jobs_lock();
        let at = jobs.iter().position(|(i, _)| *i == index)?;
        Some(jobs.remove(at).1)
    }

    /// Called by a vCPU thread: parks while paused, running the jobs given
    /// to it meanwhile; returns false to stop.
    fn park_while_paused(&self, vcpu: &mut Vcpu) -> bool {
        let mut guard = self.lock();
        if guard.0 == Desired::Pause {
            guard.1 += 1;
            self.changed.notify_all();
            loop {
                guard = self
                    .changed
                    .wait_while(guard, |(desired, _)| {
                        *desired == Desired::Pause
                            && !self.jobs_lock().iter().any(|(i, _)| *i == vcpu.index)
                    })
                    .unwrap_or_else(|e| e.into_inner());
                if guard.0 != Desired::Pause {
                    break;
                }
                if let Some(job) = self.take_job(vcpu.index) {
                    drop(guard);
                    job(vcpu);
                    guard = self.lock();
                }
            }
            // Jobs that came too late are dropped, never run at a later pause.
            self.jobs_lock().retain(|(i, _)| *i != vcpu.index);
            guard.1 -= 1;
        }
        guard.0 != Desired::Stop
    }
}

/// One vCPU and what its exits are dispatched to.
pub struct Vcpu {
    pub index: u8,
    pub fd: VcpuFd,
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pub control: Arc<RunControl>,
    pub events: EventSender,
    /// Where this vCPU's state goes when it fails, or stops after a
    /// failure (crate::dump).
    pub captures: Captures,
    /// The host CPUs this vCPU's thread is pinned to (`--cpus
    /// affinity=`), applied before it first enters the guest.
    pub affinity: Option<CpuSet>,
    /// Where the thread records its id, for `vm.info`.
    pub thread_ids: VcpuThreadIds,
}

impl Vcpu {
    /// Starts the vCPU's thread.
    pub fn spawn(self) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name(format!("vcpu{}", self.index))
            .spawn(move || self.run_loop())
    }

    fn run_loop(mut self) {
        self.thread_ids.record_this_thread(self.index);
        if let Some(cpus) = &self.affinity {
            if let Err(e) = cpus.pin_this_thread() {
                self.events.send(VmmEvent::Error(format!(
                    "vCPU {}: cannot pin its thread to host CPUs {cpus}: {e}",
                    self.index
                )));
                return;
            }
        }
        // Pinned, so the filter need not allow sched_setaffinity.
        if let Err(e) = sandbox::enter(sandbox::ThreadKind::Vcpu) {
            self.events
                .send(VmmEvent::Error(format!("vCPU {}: {e}", self.index)));
            return;
        }
        KVM_RUN_PTR.with(|p| p.set(self.fd.get_kvm_run() as *mut kvm_run));
        let control = self.control.clone();
        while control.park_while_paused(&mut self) {
            match self.run_once() {
                Ok(None) => {}
                Ok(Some(event)) => {
                    self.events.send(event);
                    break;
                }
                Err(message) => {
                    self.events
                        .send(VmmEvent::Error(format!("vCPU {}: {message}", self.index)));
                    break;
                }
            }
        }
        if control
            .capture_on_stop
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            self.captures
                .put(capture_vcpu(&self.fd, self.index, "stopped"));
        }
        KVM_RUN_PTR.with(|p| p.set(std::ptr::null_mut()));
    }

    /// Runs the guest until one exit; returns an event if the VM must end.
    fn run_once(&mut self) -> Result<Option<VmmEvent>, String> {
        let exit = match self.fd.run() {
            Ok(exit) => exit,
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                // Kicked: clear the request and let the loop look at the
                // desired state.
                self.fd.set_kvm_immediate_exit(0);
                return Ok(None);
            }
            Err(e) => return Err(format!("KVM_RUN failed: {e}")),
        };
        // Exits that end the VM because of the guest's own state: read
        // that state now, before anything changes it, for the report.
        let failure = match &exit {
            VcpuExit::Shutdown => Some("shutdown (triple fault)".to_string()),
            VcpuExit::InternalError => Some("KVM internal error".to_string()),
            VcpuExit::FailEntry(reason, _) => Some(format!("VM entry failed ({reason:#x})")),
            _ => None,
        };
        let result = dispatch(&self.pio, &self.mmio, exit);
        if let Some(mut what) = failure {
            if what == "KVM internal error" {
                what += &internal_error_detail(&mut self.fd);
            }
            self.captures.put(capture_vcpu(&self.fd, self.index, what));
        }
        result
    }

    /// Completes an I/O or MMIO exit the guest has not seen the end of: KVM
    /// finishes it (advances RIP, stores IN data) only when KVM_RUN is
    /// entered again. Entering with `immediate_exit` set does that without
    /// running guest code. Call on this vCPU's thread while it is paused.
    pub fn complete_pending_io(&mut self) -> Result<(), String> {
        // A string I/O instruction may need several round trips.
        for _ in 0..64 {
            self.fd.set_kvm_immediate_exit(1);
            let result = self.fd.run();
            match result {
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.fd.set_kvm_immediate_exit(0);
                    return Ok(());
                }
                Err(e) => {
                    self.fd.set_kvm_immediate_exit(0);
                    return Err(format!("KVM_RUN failed: {e}"));
                }
                Ok(exit) => {
                    if let Some(event) = dispatch(&self.pio, &self.mmio, exit)? {
                        self.fd.set_kvm_immediate_exit(0);
                        return Err(format!("the guest ended while pausing: {event:?}"));
                    }
                }
            }
        }
        self.fd.set_kvm_immediate_exit(0);
        Err("pending I/O did not complete".into())
    }
}

/// The suberror and data words of the KVM_EXIT_INTERNAL_ERROR just taken.
fn internal_error_detail(fd: &mut VcpuFd) -> String {
    let run = fd.get_kvm_run();
    // SAFETY: the last exit was KVM_EXIT_INTERNAL_ERROR, for which KVM
    // fills the `internal` member of kvm_run's exit union.
    let internal = unsafe { run.__bindgen_anon_1.internal };
    let n = (internal.ndata as usize).min(internal.data.len());
    let data: Vec<String> = internal.data[..n]
        .iter()
        .map(|d| format!("{d:#x}"))
        .collect();
    format!(
        ": suberror {} data [{}]",
        internal.suberror,
        data.join(", ")
    )
}

/// Hands one exit to the buses; returns an event if the VM must end.
fn dispatch(pio: &Bus, mmio: &Bus, exit: VcpuExit) -> Result<Option<VmmEvent>, String> {
    match exit {
        VcpuExit::IoIn(port, data) => {
            if !pio.read(u64::from(port), data) {
                // Nothing decodes the port: the bus floats high.
                data.fill(0xff);
            }
        }
        VcpuExit::IoOut(port, data) => {
            pio.write(u64::from(port), data);
        }
        VcpuExit::MmioRead(addr, data) => {
            if !mmio.read(addr, data) {
                data.fill(0xff);
            }
        }
        VcpuExit::MmioWrite(addr, data) => {
            mmio.write(addr, data);
        }
        VcpuExit::Intr => {}
        VcpuExit::Shutdown => return Ok(Some(VmmEvent::TripleFault)),
        VcpuExit::SystemEvent(kind, _) => match kind {
            KVM_SYSTEM_EVENT_SHUTDOWN => return Ok(Some(VmmEvent::Guest(PlatformExit::PowerOff))),
            KVM_SYSTEM_EVENT_RESET => return Ok(Some(VmmEvent::Guest(PlatformExit::Reboot))),
            other => return Err(format!("unexpected system event {other}")),
        },
        VcpuExit::Hlt => return Err("halted with the irqchip in userspace".into()),
        VcpuExit::FailEntry(reason, cpu) => {
            return Err(format!(
                "VM entry failed (hardware reason {reason:#x}, cpu {cpu})"
            ))
        }
        VcpuExit::InternalError => return Err("KVM internal error (emulation failure)".into()),
        other => return Err(format!("unexpected exit {other:?}")),
    }
    Ok(None)
}
