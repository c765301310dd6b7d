//! virtio-blk: a disk image (regular file or host block device) as a
//! virtio 1.x block device (virtio 1.2 §5.2).
//!
//! The device is split the way Firecracker splits it:
//! - this module: the `--disk` options ([`BlockConfig`]) and the errors of
//!   opening an image ([`BlockError`]);
//! - [`device`]: [`Block`], the [`VirtioDevice`](super::VirtioDevice): its
//!   features and configuration space, the queue thread and the I/O pool;
//! - [`request`]: parsing one descriptor chain into a request and running
//!   it, never trusting the guest;
//! - [`io`]: the disk back ends ([`FileDisk`] with the cache modes and
//!   O_DIRECT, [`MemDisk`] for tests and fuzzing) and aligned buffers;
//! - [`metrics`]: request counters;
//! - [`stats`]: the statistics of `vm.counters` (docs/devices.md,
//!   "Counters"): per request kind and stage, recorded lock-free by the
//!   queue threads from each request's [`StageTimes`]; [`counters`] the
//!   values read and how queues add up, [`histogram`] the latency
//!   histograms with settable boundaries.
//! - [`lock`]: image locking in QEMU's byte-lock scheme;
//! - [`sticky`]: a failed flush fails every later one;
//! - [`error_policy`]: `werror=`/`rerror=`, what a host I/O error does.
//!
//! The VMM builds a disk from `--disk` text with
//! `Block::new(text.parse::<BlockConfig>()?)?` (naming it with
//! [`Block::set_name`], e.g. "disk1", when there are several) and hands it
//! to the virtio transport like any other
//! [`VirtioDevice`](super::VirtioDevice).
//!
//! `cache=none` opens the image with O_DIRECT. Guest buffers are never
//! handed to the kernel directly: data goes through aligned bounce buffers,
//! so guest addresses need no alignment. A request whose disk offset or
//! length is not aligned to the host's logical block size (probed at open:
//! 512 or 4096) goes through a second, buffered descriptor of the same
//! image, serialised against the O_DIRECT accesses; a flush (fdatasync)
//! covers both.

pub mod counters;
pub mod device;
pub mod error_policy;
pub mod histogram;
pub mod io;
pub mod lock;
pub mod metrics;
pub mod request;
pub mod stats;
pub mod sticky;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::affinity::CpuSet;
use crate::options::{invalid, Options, OptionsError};
use error_policy::{ErrorAction, ErrorPolicy};

pub use counters::{DiskCounters, KindCounters, Outcome, RequestKind, Stage, StageCounters};
pub use device::{Block, BlockState};
pub use histogram::HistogramSnapshot;
pub use io::{AlignedBuf, DiskBackend, FileDisk, Locking, MemDisk};
pub use metrics::BlockMetrics;
pub use request::{
    process_chain, process_chain_counted, Processed, Request, RequestContext, RequestError,
    RequestType,
};
pub use stats::{now_ns, DiskStats, RequestRecord, StageTimes};

/// Bytes in a virtio-blk sector: offsets and the capacity are counted in
/// these whatever the block size.
pub const SECTOR_SIZE: u64 = 512;
/// Sector size as a shift.
pub const SECTOR_SHIFT: u32 = 9;
/// Length of the GET_ID serial (VIRTIO_BLK_ID_BYTES).
pub const SERIAL_LEN: usize = 20;

/// How the host caches the image, as QEMU and Cloud Hypervisor name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// Through the host page cache; a guest flush is an fdatasync.
    #[default]
    Writeback,
    /// O_DIRECT (no host page cache); a guest flush is an fdatasync.
    None,
    /// Host page cache, flushes ignored: fast and unsafe on a host crash.
    Unsafe,
}

impl CacheMode {
    const NAMES: [&'static str; 3] = ["writeback", "none", "unsafe"];

    fn from_name(name: &str) -> Option<CacheMode> {
        match name {
            "writeback" => Some(CacheMode::Writeback),
            "none" => Some(CacheMode::None),
            "unsafe" => Some(CacheMode::Unsafe),
            _ => None,
        }
    }
}

impl fmt::Display for CacheMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheMode::Writeback => "writeback",
            CacheMode::None => "none",
            CacheMode::Unsafe => "unsafe",
        })
    }
}

/// One `--disk path=FILE[,readonly=on][,cache=writeback|none|unsafe][,id=NAME]
/// [,werror=report|stop][,rerror=report|stop]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockConfig {
    /// The image: a regular file or a block device.
    pub path: PathBuf,
    /// Offer VIRTIO_BLK_F_RO and open the image read-only.
    pub readonly: bool,
    /// Host caching of the image.
    pub cache: CacheMode,
    /// The device's name and its GET_ID serial (at most 20 bytes); when
    /// absent the serial is derived from the image file.
    pub id: Option<String>,
    /// The host CPUs the disk's queue and I/O threads run on
    /// (`iothread_affinity=[1-2]`); anywhere when absent.
    pub iothread_affinity: Option<CpuSet>,
    /// What host write and read errors do (`werror=`, `rerror=`).
    pub errors: ErrorPolicy,
}

impl BlockConfig {
    /// A writable, writeback-cached disk on `path`.
    pub fn new(path: impl Into<PathBuf>) -> BlockConfig {
        BlockConfig {
            path: path.into(),
            readonly: false,
            cache: CacheMode::Writeback,
            id: None,
            iothread_affinity: None,
            errors: ErrorPolicy::default(),
        }
    }

    /// Parses the text of one `--disk` option; a bare value is the path.
    pub fn parse(text: &str) -> Result<BlockConfig, OptionsError> {
        let mut o = Options::parse(text, Some("path"))?;
        let path = o.require("path")?;
        if path.is_empty() {
            return Err(invalid("path", &path, "the path is empty"));
        }
        let readonly = o.flag("readonly", false)?;
        let cache = o.choice("cache", &CacheMode::NAMES, "writeback")?;
        let cache = CacheMode::from_name(cache).expect("choice() returns one of NAMES");
        let id = o.take("id");
        if let Some(id) = &id {
            check_id(id)?;
        }
        let iothread_affinity = o.cpu_set("iothread_affinity")?;
        let action = |name| ErrorAction::from_name(name).expect("choice() returns one of NAMES");
        let errors = ErrorPolicy {
            werror: action(o.choice("werror", &ErrorAction::NAMES, "report")?),
            rerror: action(o.choice("rerror", &ErrorAction::NAMES, "report")?),
        };
        o.finish()?;
        Ok(BlockConfig {
            path: PathBuf::from(path),
            readonly,
            cache,
            id,
            iothread_affinity,
            errors,
        })
    }
}

impl FromStr for BlockConfig {
    type Err = OptionsError;

    fn from_str(text: &str) -> Result<BlockConfig, OptionsError> {
        BlockConfig::parse(text)
    }
}

fn check_id(id: &str) -> Result<(), OptionsError> {
    if id.is_empty() {
        return Err(invalid("id", id, "the id is empty"));
    }
    if id.len() > SERIAL_LEN {
        return Err(invalid(
            "id",
            id,
            &format!("at most {SERIAL_LEN} bytes (it is the disk's serial)"),
        ));
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid("id", id, "only printable ASCII without spaces"));
    }
    Ok(())
}

/// Why a disk image could not be opened; each names the image.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("option iothread_affinity: {0}")]
    Affinity(String),
    #[error("disk image {0}: no such file")]
    NotFound(PathBuf),
    #[error("disk image {path} is {kind}, not a regular file or block device")]
    NotADisk { path: PathBuf, kind: &'static str },
    #[error("disk image {path} cannot be opened for writing ({source}); add readonly=on to use it read-only")]
    NotWritable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("disk image {0}: its file system does not support O_DIRECT (cache=none); use cache=writeback")]
    DirectIoUnsupported(PathBuf),
    #[error("disk image {path} is {conflict}")]
    Locked {
        path: PathBuf,
        conflict: lock::Conflict,
    },
    #[error("disk image {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
}
