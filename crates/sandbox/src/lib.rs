//! hakoniwa's sandbox: a seccomp filter per kind of thread
//! (docs/security.md).
//!
//! [`init`] compiles every kind's filter once, with seccompiler, for the
//! `--seccomp` mode; each thread calls [`enter`] with its kind once its
//! own set-up is done (files opened, sockets bound) and before the guest
//! can reach it. From then on a call outside the kind's list:
//!
//! - `on`: traps (SIGSYS); the handler writes one line naming the thread's
//!   kind and the call and ends the process (see [`trap`] for why a trap
//!   and not the kernel's kill);
//! - `log`: is logged by the kernel (audit, or dmesg) and goes ahead;
//! - `off`: there is no filter.
//!
//! seccompiler sets `no_new_privs` on the thread before its filter, as the
//! kernel requires of an unprivileged filter; it is set for root too, so
//! nothing the VMM could exec gains privileges.

mod allow;
mod kinds;
mod syscall_names;
pub mod trap;

use std::collections::HashMap;
use std::sync::OnceLock;

pub use allow::AllowList;
pub use choices::SeccompMode;
pub use kinds::ThreadKind;
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// Why the sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("seccomp: the {0} filter does not compile: {1}")]
    Compile(ThreadKind, String),
    #[error("seccomp: cannot catch SIGSYS: {0}")]
    Handler(std::io::Error),
    #[error("seccomp: cannot install the {0} filter: {1}")]
    Install(ThreadKind, String),
    #[error("seccomp: the sandbox is already set up")]
    AlreadySet,
}

/// The compiled filters of a mode.
struct Sandbox {
    mode: SeccompMode,
    filters: HashMap<ThreadKind, BpfProgram>,
}

static SANDBOX: OnceLock<Sandbox> = OnceLock::new();

/// The running architecture, for seccompiler (and the filter's own check
/// that a call comes from it: a 32-bit call of another number is refused).
#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

/// Compiles `kind`'s filter for `mode` (`off` has none).
pub fn compile(kind: ThreadKind, mode: SeccompMode) -> Result<Option<BpfProgram>, SandboxError> {
    let mismatch = match mode {
        SeccompMode::Off => return Ok(None),
        SeccompMode::On => SeccompAction::Trap,
        SeccompMode::Log => SeccompAction::Log,
    };
    let error = |e: &dyn std::fmt::Display| SandboxError::Compile(kind, e.to_string());
    let rules = kind.allow_list().map_err(|e| error(&e))?.into_rules();
    let filter =
        SeccompFilter::new(rules, mismatch, SeccompAction::Allow, ARCH).map_err(|e| error(&e))?;
    BpfProgram::try_from(filter)
        .map(Some)
        .map_err(|e| error(&e))
}

/// Sets the process's sandbox up: compiles every kind's filter for `mode`
/// and, for `on`, installs the SIGSYS handler that reports a stopped call
/// and exits with `exit_status`. Before any thread calls [`enter`].
pub fn init(mode: SeccompMode, exit_status: i32) -> Result<(), SandboxError> {
    if mode != SeccompMode::Off {
        settle_malloc();
    }
    let mut filters = HashMap::new();
    for kind in ThreadKind::ALL {
        if let Some(program) = compile(*kind, mode)? {
            filters.insert(*kind, program);
        }
    }
    if mode == SeccompMode::On {
        trap::install(exit_status).map_err(SandboxError::Handler)?;
    }
    SANDBOX
        .set(Sandbox { mode, filters })
        .map_err(|_| SandboxError::AlreadySet)
}

/// Makes glibc read, now and from this thread, the two files its malloc
/// would otherwise open later from whichever filtered thread got there
/// first. Both are needed: a workload of many threads can reach either.
pub(crate) fn settle_malloc() {
    settle_malloc_arenas();
    settle_heap_shrink_check();
}

/// Fixes glibc's limit on malloc arenas now, before any filter: glibc
/// works it out the first time a thread wants a new arena beyond the
/// eighth, from `/sys/devices/system/cpu/online` — an `openat` from
/// whichever thread that is, which no list allows (under `on`, a VM with a
/// display or multi-queue disks stopped at it: docs/security.md). The
/// limit set is glibc's own default, 8 arenas per CPU (those this
/// process may run on).
fn settle_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    {
        // The CPUs this process may run on, from the kernel, not from a
        // file (std's available_parallelism reads cgroup files).
        // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
        let cpus = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
                libc::CPU_COUNT(&set).max(1)
            } else {
                1
            }
        };
        let arenas = cpus.saturating_mul(8);
        // SAFETY: mallopt only sets a malloc parameter; called before the
        // VM's threads start.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
    }
}

/// Has glibc read `/proc/sys/vm/overcommit_memory` now, before any
/// filter: it reads it once per process, the first time it gives back the
/// top of a thread arena's heap (its `check_may_shrink_heap`), from
/// whichever thread frees then — under `on`, a VNC client thread of a VM
/// with a display stopped at that `openat` (docs/security.md). A thread
/// of its own gets an arena and frees into it more than glibc's trim
/// threshold (128 KiB by default; up to 16 MiB here, in case earlier
/// frees have raised it), in pieces below the mmap threshold so they come
/// from the arena. Nothing is touched but malloc's headers; the memory
/// goes back as the heap shrinks.
pub(crate) fn settle_heap_shrink_check() {
    #[cfg(target_env = "gnu")]
    {
        let _ = std::thread::Builder::new()
            .name("malloc-settle".into())
            .spawn(|| free_into_the_heap(160))
            .map(|t| t.join());
    }
}

/// Allocates `pieces` of 100 KiB (below glibc's mmap threshold, so from
/// the calling thread's arena) and frees them, last first: each free joins
/// the heap's top, which grows past the trim threshold and is trimmed.
pub(crate) fn free_into_the_heap(pieces: usize) {
    let held: Vec<Vec<u8>> = (0..pieces)
        .map(|_| std::hint::black_box(Vec::with_capacity(100 << 10)))
        .collect();
    for piece in held.into_iter().rev() {
        drop(std::hint::black_box(piece));
    }
}

/// The mode [`init`] set (`off` before it).
pub fn mode() -> SeccompMode {
    SANDBOX.get().map_or(SeccompMode::Off, |s| s.mode)
}

/// Puts the calling thread under `kind`'s filter: from here on it, and
/// every thread it starts, may only make `kind`'s calls. Without [`init`]
/// (unit tests, examples) or with `off`, nothing happens.
pub fn enter(kind: ThreadKind) -> Result<(), SandboxError> {
    let Some(sandbox) = SANDBOX.get() else {
        return Ok(());
    };
    let Some(program) = sandbox.filters.get(&kind) else {
        return Ok(());
    };
    trap::set_thread_kind(kind);
    seccompiler::apply_filter(program).map_err(|e| SandboxError::Install(kind, e.to_string()))
}

/// [`enter`] for a thread that has nobody to return an error to: if the
/// filter cannot be installed, the process ends with one line rather than
/// run the thread unsandboxed.
pub fn enter_or_exit(kind: ThreadKind) {
    if let Err(e) = enter(kind) {
        eprintln!("hakoniwa: {e}");
        std::process::exit(trap::exit_status());
    }
}

#[cfg(test)]
mod tests;
