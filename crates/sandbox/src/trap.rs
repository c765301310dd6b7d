//! What `--seccomp on` does with a forbidden call: the filter answers
//! SECCOMP_RET_TRAP, the kernel sends the thread SIGSYS, and this handler
//! writes one line naming the thread's kind and the call, then ends the
//! process.
//!
//! Why a trap and not SECCOMP_RET_KILL_PROCESS: the kill says nothing
//! (the shell sees "Bad system call", the log only has an audit record if
//! audit is on), so a missed call in a rare path would be a riddle; the
//! handler says which thread and which call. A hostile guest that got
//! code running in the VMM could catch SIGSYS itself, but it would need a
//! forbidden call to do anything it cannot already do through the
//! allowed ones, and every such call still traps.
//!
//! The handler runs in the thread that made the call, under its filter:
//! it makes only calls every filter allows (`write`, `exit_group`), and
//! no allocation or lock: only async-signal-safe work.

use std::cell::Cell;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::syscall_names::NAMES;
use crate::ThreadKind;

static EXIT_STATUS: AtomicI32 = AtomicI32::new(1);

thread_local! {
    /// The index of the calling thread's kind in [`ThreadKind::ALL`];
    /// `u8::MAX` for a thread without a filter of its own. A const-initialised
    /// `Copy` value: reading it allocates nothing, so the handler may.
    static KIND: Cell<u8> = const { Cell::new(u8::MAX) };
}

pub(crate) fn set_thread_kind(kind: ThreadKind) {
    let index = ThreadKind::ALL.iter().position(|k| *k == kind);
    KIND.with(|k| k.set(index.map_or(u8::MAX, |i| i as u8)));
}

/// The status the process ends with when the sandbox stops it.
pub fn exit_status() -> i32 {
    EXIT_STATUS.load(Ordering::Relaxed)
}

/// Installs the SIGSYS handler for the whole process.
pub(crate) fn install(status: i32) -> std::io::Result<()> {
    EXIT_STATUS.store(status, Ordering::Relaxed);
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value,
    // filled in below.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigsys as *const () as libc::sighandler_t;
    action.sa_flags = libc::SA_SIGINFO;
    // SAFETY: `action` is initialised, the handler has the SA_SIGINFO
    // signature, and a null old-action pointer is allowed.
    let rc = unsafe { libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The start of siginfo_t as the kernel fills it for SIGSYS (`_sigsys`
/// in the union after three ints, 8-byte aligned), which the libc crate
/// does not expose.
#[repr(C)]
struct SigsysInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    _pad: libc::c_int,
    call_addr: *mut libc::c_void,
    syscall: libc::c_int,
    arch: libc::c_uint,
}

/// A line built in place, without allocating.
struct Line {
    bytes: [u8; 256],
    len: usize,
}

impl Line {
    fn new() -> Line {
        Line {
            bytes: [0; 256],
            len: 0,
        }
    }

    fn push(&mut self, text: &[u8]) {
        for b in text {
            if self.len < self.bytes.len() {
                self.bytes[self.len] = *b;
                self.len += 1;
            }
        }
    }

    fn push_number(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }

    fn push_hex(&mut self, mut n: u64) {
        let mut digits = [0u8; 16];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(n & 0xf) as usize];
            n >>= 4;
            if n == 0 {
                break;
            }
        }
        self.push(b"0x");
        self.push(&digits[i..]);
    }
}

/// The line the handler writes for call `number` with its first three
/// arguments (an ioctl's request is the second) in a thread of `kind`.
fn describe(kind: Option<ThreadKind>, number: i64, args: [u64; 3]) -> Line {
    let mut line = Line::new();
    // "\r": the console may be in raw mode.
    line.push(b"\r\nhakoniwa: seccomp: the ");
    line.push(kind.map_or("unsandboxed", |k| k.name()).as_bytes());
    line.push(b" thread made system call ");
    let name = usize::try_from(number)
        .ok()
        .and_then(|n| NAMES.get(n))
        .copied()
        .unwrap_or("?");
    line.push(name.as_bytes());
    line.push(b" (");
    if number < 0 {
        line.push(b"-");
    }
    line.push_number(number.unsigned_abs());
    line.push(b", arguments ");
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            line.push(b" ");
        }
        line.push_hex(*arg);
    }
    line.push(b"), which its filter forbids; stopping (docs/security.md)\n");
    line
}

/// The trapped call's first three arguments, from the registers the
/// kernel saved.
#[cfg(target_arch = "x86_64")]
fn arguments(context: *mut libc::c_void) -> [u64; 3] {
    // SAFETY: with SA_SIGINFO the third argument of the handler is the
    // interrupted context, a valid ucontext_t.
    let regs = unsafe { &(*(context as *const libc::ucontext_t)).uc_mcontext.gregs };
    [
        regs[libc::REG_RDI as usize] as u64,
        regs[libc::REG_RSI as usize] as u64,
        regs[libc::REG_RDX as usize] as u64,
    ]
}

#[cfg(not(target_arch = "x86_64"))]
fn arguments(_context: *mut libc::c_void) -> [u64; 3] {
    [0; 3]
}

/// Where a call that names a file has the name among its arguments: the
/// address alone does not say which file a thread wanted.
fn path_argument(number: i64, args: [u64; 3]) -> Option<u64> {
    let at = [
        libc::SYS_openat,
        libc::SYS_newfstatat,
        libc::SYS_statx,
        libc::SYS_readlinkat,
        libc::SYS_unlinkat,
        libc::SYS_mkdirat,
        libc::SYS_faccessat,
    ];
    let plain = [
        libc::SYS_open,
        libc::SYS_stat,
        libc::SYS_lstat,
        libc::SYS_access,
        libc::SYS_readlink,
        libc::SYS_unlink,
        libc::SYS_mkdir,
    ];
    let address = if at.contains(&number) {
        args[1]
    } else if plain.contains(&number) {
        args[0]
    } else {
        return None;
    };
    (address != 0).then_some(address)
}

/// The second line for a call that names a file: the name, read from the
/// thread's own memory where the call was to read it (at most 160 bytes).
fn describe_path(name: impl Iterator<Item = u8>) -> Line {
    let mut line = Line::new();
    line.push(b"hakoniwa: seccomp: the file it named: ");
    for b in name.take(160).take_while(|&b| b != 0) {
        line.push(&[b]);
    }
    line.push(b"\n");
    line
}

extern "C" fn on_sigsys(
    _signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo for SIGSYS with
    // SA_SIGINFO, whose start is laid out as SigsysInfo.
    let number = unsafe { (*(info as *const SigsysInfo)).syscall };
    let index = KIND.with(|k| k.get());
    let kind = ThreadKind::ALL.get(usize::from(index)).copied();
    let args = arguments(context);
    let line = describe(kind, i64::from(number), args);
    // SAFETY: writes bytes of a live buffer to stderr (async-signal-safe).
    unsafe { libc::write(2, line.bytes.as_ptr().cast(), line.len) };
    if let Some(address) = path_argument(i64::from(number), args) {
        let name = (0..).map(|i| {
            // SAFETY: the thread passed this address to the kernel as a
            // NUL-terminated name, which the kernel would have read: it
            // points into the thread's own memory. Read byte by byte up
            // to the NUL or 160 bytes, as volatile (another thread may be
            // changing it). The line above is already out should it not.
            unsafe { std::ptr::read_volatile((address as *const u8).add(i)) }
        });
        let path = describe_path(name);
        // SAFETY: as above.
        unsafe { libc::write(2, path.bytes.as_ptr().cast(), path.len) };
    }
    // SAFETY: exits without running anything else of this process
    // (async-signal-safe).
    unsafe { libc::_exit(exit_status()) }
}

#[cfg(test)]
pub(crate) fn describe_path_for_test(number: i64, args: [u64; 3], name: &[u8]) -> Option<String> {
    path_argument(number, args).map(|_| {
        let line = describe_path(name.iter().copied());
        String::from_utf8_lossy(&line.bytes[..line.len]).into_owned()
    })
}

#[cfg(test)]
pub(crate) fn describe_for_test(kind: Option<ThreadKind>, number: i64, args: [u64; 3]) -> String {
    let line = describe(kind, number, args);
    String::from_utf8_lossy(&line.bytes[..line.len]).into_owned()
}
