//! How a queue's reads, writes and flushes reach the host: an I/O engine.
//!
//! The queue thread turns each request into an [`IoOp`] (an offset and
//! iovecs: the guest's own buffers, or an aligned bounce buffer where
//! O_DIRECT cannot take them as they are) and hands it to its queue's
//! engine, which runs many at once and reports each completion through an
//! eventfd the queue thread waits on. Two engines sit behind
//! [`IoEngine`]:
//! - [`uring::UringEngine`]: one io_uring per queue (readv, writev, fsync
//!   with DATASYNC), its completions signalled by the eventfd registered
//!   with the ring;
//! - [`threads::ThreadsEngine`]: a few threads per queue doing
//!   `preadv`/`pwritev2`/`fdatasync`, for kernels that refuse io_uring and
//!   for back ends without a file descriptor.
//!
//! [`select`] decides which a disk gets when it is opened; a refused ring
//! falls back to threads, and says why.

pub mod threads;
pub mod uring;

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::io::{AlignedBuf, DiskBackend};

/// Which engine serves a disk, as `--disk ...,engine=` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// io_uring, where the kernel allows it (the default).
    #[default]
    IoUring,
    /// A pool of threads doing blocking system calls.
    Threads,
}

impl EngineKind {
    pub(crate) const NAMES: [&'static str; 2] = ["io_uring", "threads"];

    pub(crate) fn from_name(name: &str) -> Option<EngineKind> {
        match name {
            "io_uring" => Some(EngineKind::IoUring),
            "threads" => Some(EngineKind::Threads),
            _ => None,
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineKind::IoUring => "io_uring",
            EngineKind::Threads => "threads",
        })
    }
}

/// What an [`IoOp`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    /// fdatasync of the image.
    Flush,
}

/// One read, write or flush for the host. The iovecs point either into
/// guest memory (host addresses from vm-memory's translation of the
/// descriptor chain's buffers: the kernel moves the data, this process
/// never forms a slice over them) or into `bounce`, which the op owns.
pub struct IoOp {
    pub kind: OpKind,
    /// Byte offset in the image.
    pub offset: u64,
    pub iovecs: Vec<libc::iovec>,
    /// The aligned buffer the iovec points into, when the guest's buffers
    /// could not be used as they are.
    pub bounce: Option<AlignedBuf>,
    /// Write with RWF_DSYNC: the driver did not negotiate FLUSH, so every
    /// write must be durable when it completes.
    pub dsync: bool,
}

// SAFETY: the raw pointers in `iovecs` point into guest memory (kept
// mapped by the device's Arc<GuestMemoryMmap> for as long as any engine,
// and so any op, of the device exists) or into `bounce`, owned by the op
// itself. The op is used by one thread at a time: moved to the engine,
// then back with its completion.
unsafe impl Send for IoOp {}

impl IoOp {
    /// A flush.
    pub fn flush() -> IoOp {
        IoOp {
            kind: OpKind::Flush,
            offset: 0,
            iovecs: Vec::new(),
            bounce: None,
            dsync: false,
        }
    }

    /// Bytes the op reads or writes.
    pub fn len(&self) -> usize {
        self.iovecs.iter().map(|v| v.iov_len).sum()
    }

    /// Whether it moves no data (a flush).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The iovecs past the first `skip` bytes (to continue a short
    /// transfer).
    fn iovecs_from(&self, mut skip: usize) -> Vec<libc::iovec> {
        let mut rest = Vec::with_capacity(self.iovecs.len());
        for v in &self.iovecs {
            if skip >= v.iov_len {
                skip -= v.iov_len;
                continue;
            }
            rest.push(libc::iovec {
                // Stays inside the same buffer: skip < iov_len.
                iov_base: v.iov_base.cast::<u8>().wrapping_add(skip).cast(),
                iov_len: v.iov_len - skip,
            });
            skip = 0;
        }
        rest
    }
}

/// A finished op: the token it was submitted with, the op back, and the
/// bytes moved (a short count for a read at the end of the file) or the
/// error.
pub struct Done {
    pub token: u16,
    pub op: IoOp,
    pub result: io::Result<usize>,
}

/// Runs a queue's [`IoOp`]s, many at a time. Every method is called on the
/// queue's own thread.
pub trait IoEngine: Send {
    /// Which engine it is.
    fn kind(&self) -> EngineKind;

    /// Starts `op`; its [`Done`] carries `token`. An op that cannot even
    /// be started completes with the error.
    fn submit(&mut self, token: u16, op: IoOp);

    /// Hands what [`submit`](IoEngine::submit) queued to the host, once
    /// per batch of requests taken off the ring.
    fn kick(&mut self);

    /// Readable when ops have completed (level: until reaped).
    fn notifier(&self) -> RawFd;

    /// Moves the completed ops into `done` and clears the notifier.
    fn reap(&mut self, done: &mut Vec<Done>);

    /// Ops submitted and not yet reaped.
    fn in_flight(&self) -> usize;
}

/// Waits up to `timeout` for the engine's notifier to become readable;
/// whether it did. A signal that interrupts the wait (a vCPU kick,
/// libFuzzer's timer) does not end it: only the deadline does.
pub fn wait_for_completions(engine: &dyn IoEngine, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let mut pfd = libc::pollfd {
            fd: engine.notifier(),
            events: libc::POLLIN,
            revents: 0,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        // Rounded up, so that a wait of less than 1 ms still waits.
        let ms = left.as_micros().div_ceil(1000);
        let ms = libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX);
        // SAFETY: one pollfd, valid for the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 {
            return n > 0;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted || left.is_zero() {
            return false;
        }
    }
}

/// Sets up io_uring rings; tests put one that refuses in its place.
pub trait RingSetup: Send + Sync {
    /// A ring of `entries` entries that can read, write and sync.
    fn ring(&self, entries: u32) -> io::Result<io_uring::IoUring>;
}

/// Rings from the kernel, checked to support what the engine submits.
pub struct KernelRings;

impl RingSetup for KernelRings {
    fn ring(&self, entries: u32) -> io::Result<io_uring::IoUring> {
        use io_uring::opcode::{Fsync, Readv, Writev};
        let ring = io_uring::IoUring::new(entries)?;
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for (code, name) in [
            (Readv::CODE, "readv"),
            (Writev::CODE, "writev"),
            (Fsync::CODE, "fsync"),
        ] {
            if !probe.is_supported(code) {
                return Err(io::Error::other(format!("its io_uring has no {name}")));
            }
        }
        Ok(ring)
    }
}

/// The engine a disk on `backend` gets when `requested` is asked for, and
/// why not the one asked for when it falls back. io_uring needs the
/// image's descriptor and a ring the kernel accepts (probed with a small
/// one: seccomp, `kernel.io_uring_disabled` or an old kernel refuse it).
pub fn select(
    requested: EngineKind,
    backend: &dyn DiskBackend,
    rings: &dyn RingSetup,
) -> (EngineKind, Option<String>) {
    if requested == EngineKind::Threads {
        return (EngineKind::Threads, None);
    }
    if backend.raw_fd().is_none() {
        return (
            EngineKind::Threads,
            Some("the disk has no file descriptor for io_uring".into()),
        );
    }
    match rings.ring(4) {
        Ok(_) => (EngineKind::IoUring, None),
        Err(e) => (
            EngineKind::Threads,
            Some(format!("the kernel refuses io_uring ({e})")),
        ),
    }
}

/// Runs `op` to the end with blocking system calls, from byte `start`
/// (0, or where a short transfer stopped): what the threads engine does,
/// and how a short io_uring transfer is finished. Returns the bytes moved
/// in all, short only at the end of the file.
pub fn run_blocking(op: &mut IoOp, disk: &dyn DiskBackend, start: usize) -> io::Result<usize> {
    match op.kind {
        // fdatasync on the descriptor, as the io_uring fsync does: the
        // caller ([`PendingIo::finish`](super::request::PendingIo::finish))
        // feeds the outcome to the disk's sticky flush state, the same
        // for both engines, so it must not pass through FileDisk::flush,
        // which would record it a second time.
        OpKind::Flush => match disk.raw_fd() {
            Some(fd) => fdatasync(fd).map(|()| 0),
            None => disk.flush().map(|_| 0),
        },
        OpKind::Read | OpKind::Write => match disk.raw_fd() {
            Some(fd) => transfer(op, fd, start),
            None => copy_through(op, disk),
        },
    }
}

/// fdatasync(2) of `fd`, retried on EINTR.
fn fdatasync(fd: RawFd) -> io::Result<()> {
    loop {
        // SAFETY: fdatasync only acts on the descriptor (the image's, kept
        // open by the back end the caller holds); it touches no memory.
        if unsafe { libc::fdatasync(fd) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// preadv / pwritev2 on the image's descriptor until all is moved.
fn transfer(op: &IoOp, fd: RawFd, start: usize) -> io::Result<usize> {
    let len = op.len();
    let mut done = start;
    while done < len {
        let iov = op.iovecs_from(done);
        let count = libc::c_int::try_from(iov.len().min(1024)).unwrap_or(1024);
        let offset = libc::off_t::try_from(op.offset + done as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let n = match op.kind {
            // SAFETY: the iovecs describe memory the kernel may write:
            // guest RAM the device owns for this request, or the op's
            // bounce buffer; both outlive the call.
            OpKind::Read => unsafe { libc::preadv(fd, iov.as_ptr(), count, offset) },
            // SAFETY: as above; the kernel only reads them.
            OpKind::Write => unsafe {
                let flags = if op.dsync { libc::RWF_DSYNC } else { 0 };
                libc::pwritev2(fd, iov.as_ptr(), count, offset, flags)
            },
            OpKind::Flush => unreachable!("flushes move no data"),
        };
        match n {
            0 if op.kind == OpKind::Read => break, // the end of the file
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n if n > 0 => done += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(done)
}

/// A back end without a descriptor (in memory): through the op's bounce
/// buffer with its `read_at`/`write_at`.
fn copy_through(op: &mut IoOp, disk: &dyn DiskBackend) -> io::Result<usize> {
    let len = op.len();
    let Some(buf) = op.bounce.as_mut() else {
        return Err(io::Error::other(
            "the back end has no descriptor and the op no bounce buffer",
        ));
    };
    match op.kind {
        OpKind::Read => disk.read_at(&mut buf[..len], op.offset)?,
        OpKind::Write => {
            disk.write_at(&buf[..len], op.offset)?;
            if op.dsync {
                disk.flush()?;
            }
        }
        OpKind::Flush => unreachable!("flushes move no data"),
    }
    Ok(len)
}
