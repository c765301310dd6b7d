//! What a host I/O error does: `--disk ...,werror=report|stop,rerror=report|stop`
//! (QEMU's names and meaning; default report).
//!
//! - `report`: the guest gets VIRTIO_BLK_S_IOERR, the VMM goes on;
//! - `stop`: the request is held, unanswered, the VM is paused (every
//!   vCPU), the reason is printed and shown in the API, and `ctl resume`
//!   runs the held requests again: an operator can free space (ENOSPC) or
//!   fix a path and go on without the guest ever seeing an error.
//!
//! `werror` covers what writes to the image (writes, flushes, discards,
//! write-zeroes), `rerror` reads, as in QEMU's virtio-blk. Only errors of
//! the host's I/O are subject to the policy: a malformed or out-of-range
//! request is the guest's mistake and always gets its error status.
//!
//! [`decide`] is the pure decision; [`HeldRequests`] keeps what `stop`
//! holds until the resume.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

/// One of `report` or `stop`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ErrorAction {
    #[default]
    Report,
    Stop,
}

impl ErrorAction {
    /// The names `werror=` and `rerror=` take.
    pub const NAMES: [&'static str; 2] = ["report", "stop"];

    /// The action named `name` (one of [`NAMES`](Self::NAMES)).
    pub fn from_name(name: &str) -> Option<ErrorAction> {
        match name {
            "report" => Some(ErrorAction::Report),
            "stop" => Some(ErrorAction::Stop),
            _ => None,
        }
    }
}

impl fmt::Display for ErrorAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorAction::Report => "report",
            ErrorAction::Stop => "stop",
        })
    }
}

/// A disk's `werror` and `rerror`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ErrorPolicy {
    pub werror: ErrorAction,
    pub rerror: ErrorAction,
}

/// What failed, as the policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    /// A write, flush, discard or write-zeroes.
    Write,
}

impl ErrorPolicy {
    /// What to do with a host I/O error of an `access`.
    pub fn decide(&self, access: Access) -> ErrorAction {
        match access {
            Access::Read => self.rerror,
            Access::Write => self.werror,
        }
    }
}

/// Why a disk stopped the VM: what failed and the host's errno.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopReason {
    /// The device's name (`disk0`, or its `id=`).
    pub disk: String,
    /// "read", "write", "flush", "discard" or "write-zeroes".
    pub what: &'static str,
    pub errno: i32,
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // io::Error's text ends in " (os error N)": the name says it.
        let text = std::io::Error::from_raw_os_error(self.errno).to_string();
        let text = text.split(" (os error").next().unwrap_or_default();
        let name = errno_name(self.errno);
        write!(
            f,
            "disk {}: {} failed: {name} ({text})",
            self.disk, self.what
        )
    }
}

/// The symbolic name of the errors a disk meets, for messages that name
/// the errno as the C headers do.
fn errno_name(errno: i32) -> String {
    match errno {
        libc::EIO => "EIO".into(),
        libc::ENOSPC => "ENOSPC".into(),
        libc::EDQUOT => "EDQUOT".into(),
        libc::EROFS => "EROFS".into(),
        libc::EFBIG => "EFBIG".into(),
        libc::ENODEV => "ENODEV".into(),
        libc::ENXIO => "ENXIO".into(),
        libc::EBADF => "EBADF".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::EAGAIN => "EAGAIN".into(),
        libc::ETIMEDOUT => "ETIMEDOUT".into(),
        n => format!("errno {n}"),
    }
}

/// Who pauses the VM when a disk's policy says stop (the VMM installs it).
pub type StopHandler = Arc<dyn Fn(&StopReason) + Send + Sync>;

/// Requests held by `stop` policies until the resume, with the handler
/// that pauses the VM. Shared between the device's I/O threads (which
/// hold), its queue thread (which resubmits) and the VMM (which resumes).
pub struct HeldRequests<J> {
    inner: Mutex<Held<J>>,
}

struct Held<J> {
    jobs: Vec<J>,
    reason: Option<StopReason>,
    handler: Option<StopHandler>,
}

impl<J> Default for HeldRequests<J> {
    fn default() -> Self {
        HeldRequests {
            inner: Mutex::new(Held {
                jobs: Vec::new(),
                reason: None,
                handler: None,
            }),
        }
    }
}

impl<J> HeldRequests<J> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held<J>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Installs what pauses the VM.
    pub fn set_handler(&self, handler: StopHandler) {
        self.lock().handler = Some(handler);
    }

    /// Holds `job`, which failed for `reason`. The first failure since the
    /// last resume calls the handler (returned so that the caller calls it
    /// without the lock held); later ones only join the held requests.
    pub fn hold(&self, job: J, reason: StopReason) -> Option<(StopHandler, StopReason)> {
        let mut held = self.lock();
        held.jobs.push(job);
        if held.reason.is_some() {
            return None;
        }
        held.reason = Some(reason.clone());
        held.handler.clone().map(|h| (h, reason))
    }

    /// The reason the disk stopped the VM, while requests are held.
    pub fn reason(&self) -> Option<StopReason> {
        self.lock().reason.clone()
    }

    /// How many requests are held.
    pub fn count(&self) -> usize {
        self.lock().jobs.len()
    }

    /// Takes the held requests to run them again (the resume), clearing
    /// the reason: a failure again stops the VM again.
    pub fn take(&self) -> Vec<J> {
        let mut held = self.lock();
        held.reason = None;
        std::mem::take(&mut held.jobs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn writes_follow_werror_and_reads_rerror() {
        let p = ErrorPolicy {
            werror: ErrorAction::Stop,
            rerror: ErrorAction::Report,
        };
        assert_eq!(p.decide(Access::Write), ErrorAction::Stop);
        assert_eq!(p.decide(Access::Read), ErrorAction::Report);
        let d = ErrorPolicy::default();
        assert_eq!(d.decide(Access::Write), ErrorAction::Report);
        assert_eq!(d.decide(Access::Read), ErrorAction::Report);
    }

    #[test]
    fn names_round_trip() {
        for name in ErrorAction::NAMES {
            assert_eq!(ErrorAction::from_name(name).unwrap().to_string(), name);
        }
        assert_eq!(ErrorAction::from_name("ignore"), None);
    }

    #[test]
    fn the_reason_names_the_disk_and_the_errno() {
        let r = StopReason {
            disk: "disk1".into(),
            what: "write",
            errno: libc::ENOSPC,
        };
        assert_eq!(
            r.to_string(),
            "disk disk1: write failed: ENOSPC (No space left on device)"
        );
    }

    #[test]
    fn the_first_failure_stops_later_ones_wait_and_a_resume_retries_all() {
        let held = HeldRequests::<u32>::default();
        let stops = Arc::new(AtomicUsize::new(0));
        let counted = stops.clone();
        held.set_handler(Arc::new(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        }));
        let reason = |what| StopReason {
            disk: "disk0".into(),
            what,
            errno: libc::EIO,
        };
        let (h, r) = held.hold(1, reason("write")).unwrap();
        h(&r);
        assert!(held.hold(2, reason("flush")).is_none());
        assert_eq!(stops.load(Ordering::SeqCst), 1);
        assert_eq!(held.reason().unwrap().what, "write");
        assert_eq!(held.count(), 2);
        assert_eq!(held.take(), vec![1, 2]);
        assert_eq!(held.reason(), None);
        // Failing again after the resume stops again.
        assert!(held.hold(1, reason("write")).is_some());
    }
}
