//! Allow-lists as seccompiler rules: groups of system calls a kind of
//! thread needs together (the calls every Rust thread makes, networking,
//! files, KVM's ioctls, ...), and their union.

use std::collections::BTreeMap;

use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};

/// System calls and, per call, the argument rules of which one must hold
/// (no rules: any arguments).
#[derive(Clone, Debug, Default)]
pub struct AllowList {
    calls: BTreeMap<i64, Vec<SeccompRule>>,
}

/// Why a list cannot be built (a rule seccompiler refuses: a bug here).
pub type RuleError = seccompiler::BackendError;

impl AllowList {
    /// These calls with any arguments.
    pub fn calls(mut self, calls: &[libc::c_long]) -> Self {
        for call in calls {
            self.calls.insert(*call, Vec::new());
        }
        self
    }

    /// `call` when one of `rules` holds; a call already allowed with any
    /// arguments stays so.
    fn call_when(mut self, call: libc::c_long, rules: Vec<SeccompRule>) -> Self {
        match self.calls.get_mut(&call) {
            Some(existing) if existing.is_empty() => {}
            Some(existing) => existing.extend(rules),
            None => {
                self.calls.insert(call, rules);
            }
        }
        self
    }

    /// `call` when its argument `arg` (32 bits) is one of `values`.
    pub fn call_with_arg(
        self,
        call: libc::c_long,
        arg: u8,
        values: &[u64],
    ) -> Result<Self, RuleError> {
        let rules = values
            .iter()
            .map(|v| rule(arg, SeccompCmpOp::Eq, *v))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.call_when(call, rules))
    }

    /// `call` when `arg & mask == value`.
    pub fn call_with_masked_arg(
        self,
        call: libc::c_long,
        arg: u8,
        mask: u64,
        value: u64,
    ) -> Result<Self, RuleError> {
        let rules = vec![rule(arg, SeccompCmpOp::MaskedEq(mask), value)?];
        Ok(self.call_when(call, rules))
    }

    /// Everything either list allows.
    pub fn union(mut self, other: &AllowList) -> Self {
        for (call, rules) in &other.calls {
            if rules.is_empty() {
                self.calls.insert(*call, Vec::new());
            } else {
                self = self.call_when(*call, rules.clone());
            }
        }
        self
    }

    /// Whether `call` is allowed with some arguments (for tests and docs).
    pub fn mentions(&self, call: libc::c_long) -> bool {
        self.calls.contains_key(&call)
    }

    pub(crate) fn into_rules(self) -> BTreeMap<i64, Vec<SeccompRule>> {
        self.calls
    }
}

fn rule(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompRule, RuleError> {
    SeccompRule::new(vec![SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        op,
        value,
    )?])
}

/// What every thread does: memory (never executable: no thread maps
/// code after start-up), locks, time, signals (the vCPU kick and the
/// sandbox's own SIGSYS), polling its fds, reading and writing fds it
/// already holds, logging, and ending (also by abort: tgkill). `mincore`:
/// which pages of its own mappings are in memory (migration's page
/// sets, the I/O tracer's host-cache residency).
pub fn every_thread() -> Result<AllowList, RuleError> {
    let no_exec = libc::PROT_EXEC as u64;
    AllowList::default()
        .calls(&[
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_readv,
            libc::SYS_writev,
            libc::SYS_pread64,
            libc::SYS_pwrite64,
            libc::SYS_close,
            libc::SYS_lseek,
            libc::SYS_futex,
            libc::SYS_munmap,
            libc::SYS_mremap,
            libc::SYS_madvise,
            libc::SYS_mincore,
            libc::SYS_brk,
            libc::SYS_rt_sigprocmask,
            libc::SYS_rt_sigreturn,
            libc::SYS_sigaltstack,
            libc::SYS_exit,
            libc::SYS_exit_group,
            libc::SYS_clock_gettime,
            libc::SYS_clock_nanosleep,
            libc::SYS_nanosleep,
            libc::SYS_gettimeofday,
            libc::SYS_gettid,
            libc::SYS_getpid,
            libc::SYS_tgkill,
            libc::SYS_sched_yield,
            libc::SYS_sched_getaffinity,
            libc::SYS_getrandom,
            libc::SYS_restart_syscall,
            libc::SYS_fstat,
            libc::SYS_newfstatat,
            libc::SYS_statx,
            libc::SYS_fcntl,
            libc::SYS_dup,
            libc::SYS_epoll_create1,
            libc::SYS_epoll_ctl,
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_epoll_pwait2,
            libc::SYS_poll,
            libc::SYS_ppoll,
            libc::SYS_eventfd2,
        ])
        .call_with_masked_arg(libc::SYS_mmap, 2, no_exec, 0)?
        .call_with_masked_arg(libc::SYS_mprotect, 2, no_exec, 0)
}

/// Starting threads: the clone itself, and what a new thread does before
/// its own filter is in place (glibc's robust list and rseq, Rust's
/// stack guard and name, the placement of I/O threads, installing the
/// filter).
pub fn spawning() -> Result<AllowList, RuleError> {
    AllowList::default()
        .calls(&[
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_set_robust_list,
            libc::SYS_rseq,
            libc::SYS_sched_setaffinity,
            libc::SYS_sched_setscheduler,
            libc::SYS_sched_getscheduler,
            libc::SYS_sched_getparam,
            libc::SYS_seccomp,
        ])
        .call_with_arg(
            libc::SYS_prctl,
            0,
            &[
                libc::PR_SET_NAME as u64,
                libc::PR_GET_NAME as u64,
                libc::PR_SET_NO_NEW_PRIVS as u64,
            ],
        )
}

/// Sockets of the given families (`AF_UNIX`, `AF_INET`, ...) and the
/// calls on them; `FIONBIO` and `FIONREAD` are how std sets a socket
/// non-blocking and asks what is waiting.
pub fn sockets(families: &[libc::c_int]) -> Result<AllowList, RuleError> {
    let families: Vec<u64> = families.iter().map(|f| *f as u64).collect();
    AllowList::default()
        .calls(&[
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_accept,
            libc::SYS_accept4,
            libc::SYS_connect,
            libc::SYS_getsockname,
            libc::SYS_getpeername,
            libc::SYS_setsockopt,
            libc::SYS_getsockopt,
            libc::SYS_sendto,
            libc::SYS_recvfrom,
            libc::SYS_sendmsg,
            libc::SYS_recvmsg,
            libc::SYS_shutdown,
        ])
        .call_with_arg(libc::SYS_socket, 0, &families)?
        .call_with_arg(libc::SYS_socketpair, 0, &families)?
        .call_with_arg(libc::SYS_ioctl, 1, &[libc::FIONBIO, libc::FIONREAD])
}

/// Reading and writing the contents of files already open, and making
/// them durable.
pub fn file_data() -> AllowList {
    AllowList::default().calls(&[
        libc::SYS_preadv,
        libc::SYS_pwritev,
        libc::SYS_preadv2,
        libc::SYS_pwritev2,
        libc::SYS_fsync,
        libc::SYS_fdatasync,
        libc::SYS_fallocate,
        libc::SYS_sync_file_range,
        libc::SYS_ftruncate,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ])
}

/// Naming files: opening, creating, removing and renaming them
/// (snapshots, dumps, traces, metrics, sockets' paths), and reading
/// `/proc` and `/sys`.
pub fn file_names() -> Result<AllowList, RuleError> {
    AllowList::default()
        .calls(&[
            libc::SYS_open,
            libc::SYS_openat,
            libc::SYS_stat,
            libc::SYS_lstat,
            libc::SYS_access,
            libc::SYS_faccessat,
            libc::SYS_faccessat2,
            libc::SYS_unlink,
            libc::SYS_unlinkat,
            libc::SYS_mkdir,
            libc::SYS_mkdirat,
            libc::SYS_rename,
            libc::SYS_renameat,
            libc::SYS_renameat2,
            libc::SYS_linkat,
            libc::SYS_fchmod,
            libc::SYS_fchmodat,
            libc::SYS_getdents64,
            libc::SYS_readlink,
            libc::SYS_readlinkat,
            libc::SYS_statfs,
            libc::SYS_fstatfs,
            libc::SYS_getcwd,
            libc::SYS_flock,
            libc::SYS_umask,
            libc::SYS_mknodat,
            libc::SYS_memfd_create,
            libc::SYS_timerfd_create,
            libc::SYS_timerfd_settime,
            libc::SYS_timerfd_gettime,
        ])
        .union(&file_data())
        // Reading a resource limit (a new limit of NULL), never setting one.
        .call_with_arg(libc::SYS_prlimit64, 2, &[0])
}

/// What of `openat`'s flags the open rules look at: the access mode,
/// O_CREAT and O_TRUNC.
const OPEN_MODE_MASK: u64 = (libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC) as u64;

/// Opening files only to read them (no write access, no O_CREAT or
/// O_TRUNC): a thread's name in `/proc/self/task/TID/comm`.
pub fn read_only_opens() -> Result<AllowList, RuleError> {
    AllowList::default().call_with_masked_arg(
        libc::SYS_openat,
        2,
        OPEN_MODE_MASK,
        libc::O_RDONLY as u64,
    )
}

/// Opening existing files to read them, or to write them anew (O_WRONLY
/// with O_TRUNC; no O_CREAT, no O_RDWR): `/proc/interrupts` and
/// `/proc/irq/N/*`.
pub fn existing_file_opens() -> Result<AllowList, RuleError> {
    read_only_opens()?.call_with_masked_arg(
        libc::SYS_openat,
        2,
        OPEN_MODE_MASK,
        (libc::O_WRONLY | libc::O_TRUNC) as u64,
    )
}

/// `ioctl`s of one driver: the request's type byte (`_IOC_TYPE`).
pub fn ioctl_type(kind: u8) -> Result<AllowList, RuleError> {
    AllowList::default().call_with_masked_arg(libc::SYS_ioctl, 1, 0xff00, u64::from(kind) << 8)
}

/// KVM's ioctls (on /dev/kvm, the VM and vCPU fds).
pub const KVMIO: u8 = 0xAE;
/// VFIO's ioctls (passthrough devices and their container).
pub const VFIO_TYPE: u8 = b';';
/// userfaultfd's ioctls (postcopy pages, display write protection).
pub const UFFDIO: u8 = 0xAA;

/// The terminal: read and set its mode (raw console, and back), its size.
/// Not TIOCSTI: nothing may push input into the user's terminal.
pub fn terminal() -> Result<AllowList, RuleError> {
    AllowList::default().call_with_arg(
        libc::SYS_ioctl,
        1,
        &[
            libc::TCGETS,
            libc::TCSETS,
            libc::TCSETSW,
            libc::TCSETSF,
            libc::TIOCGWINSZ,
        ],
    )
}

/// A TAP device: the offloads it may use (set when the guest activates
/// the device, possibly from a vCPU).
pub fn tap() -> Result<AllowList, RuleError> {
    AllowList::default().call_with_arg(libc::SYS_ioctl, 1, &[libc::TUNSETOFFLOAD])
}

/// Sends signals to this process's own threads and waits for signals
/// (`sigwait`).
pub fn signals() -> AllowList {
    AllowList::default().calls(&[libc::SYS_rt_sigtimedwait, libc::SYS_rt_sigaction])
}
