//! virtio-blk: a disk image (regular file or host block device) as a
//! virtio 1.x block device (virtio 1.2 §5.2).
//!
//! The device is split the way Firecracker splits it:
//! - this module: the `--disk` options ([`BlockConfig`]) and the errors of
//!   opening an image ([`BlockError`]);
//! - [`device`]: [`Block`], the [`VirtioDevice`](super::VirtioDevice): its
//!   features and configuration space, one thread per queue;
//! - [`engine`]: how a queue's reads, writes and flushes reach the host
//!   (io_uring or threads), many at once;
//! - [`request`]: parsing one descriptor chain into a request and running
//!   it, never trusting the guest;
//! - [`io`]: the disk back ends ([`FileDisk`] with the cache modes and
//!   O_DIRECT, [`MemDisk`] for tests and fuzzing) and aligned buffers;
//! - [`stats`]: the statistics of `vm.counters` (docs/devices.md,
//!   "Counters"): per request kind and stage, recorded lock-free by the
//!   queue threads from each request's [`StageTimes`]; [`counters`] the
//!   values read and how queues add up, [`histogram`] the latency
//!   histograms with settable boundaries.
//! - [`gate`]: `cache=none`'s O_DIRECT ops on every queue against an
//!   access through the page cache;
//! - [`lock`]: image locking in QEMU's byte-lock scheme;
//! - [`sticky`]: a failed flush fails every later one;
//! - [`trace`]: the I/O tracer's virtual-disk layer (docs/iotrace.md):
//!   each completed request recorded while the disk is traced;
//! - [`error_policy`]: `werror=`/`rerror=`, what a host I/O error does.
//!
//! The VMM builds a disk from `--disk` text with
//! `Block::new(text.parse::<BlockConfig>()?)?` (naming it with
//! [`Block::set_name`], e.g. "disk1", when there are several) and hands it
//! to the virtio transport like any other
//! [`VirtioDevice`](super::VirtioDevice).
//!
//! Reads and writes go to the host through the queue's I/O engine
//! ([`engine`]: io_uring, or a thread pool where the kernel refuses it)
//! with iovecs over the guest's own buffers. `cache=none` opens the image
//! with O_DIRECT; a request whose guest buffers O_DIRECT cannot take as
//! they are (an address or length not aligned to the host's logical block
//! size, probed at open: 512 or 4096) goes through an aligned bounce
//! buffer instead. One whose disk offset or length is not aligned goes
//! through a second, buffered descriptor of the same image, alone (its
//! queue's other requests drained first); a flush (fdatasync) covers
//! both.

pub mod counters;
pub mod device;
pub mod engine;
pub mod error_policy;
pub mod gate;
pub mod histogram;
pub mod io;
pub mod lock;
pub mod request;
pub mod stats;
pub mod sticky;
pub mod trace;

#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::affinity::{CpuSet, IoThreadSched};
use crate::options::{invalid, Options, OptionsError};
use error_policy::{ErrorAction, ErrorPolicy};

pub use counters::{
    DiskCounters, KindCounters, Outcome, RequestKind, Stage, StageCounters, SyncCounters,
};
#[doc(hidden)]
pub use device::fuzzing;
pub use device::{Block, BlockState};
pub use engine::EngineKind;
pub use histogram::HistogramSnapshot;
pub use io::{AlignedBuf, DiskBackend, FileDisk, Locking, MemDisk};
pub use request::{
    process_chain, process_chain_counted, Processed, Request, RequestContext, RequestError,
    RequestType,
};
pub use stats::{now_ns, DiskStats, RequestRecord, StageTimes, SyncStats};
pub use trace::{DiskTracer, TraceError, TraceRecord, TraceSession, TRACE_CAPACITY};

/// Bytes in a virtio-blk sector: offsets and the capacity are counted in
/// these whatever the block size.
pub const SECTOR_SIZE: u64 = 512;
/// Sector size as a shift.
pub const SECTOR_SHIFT: u32 = 9;
/// Length of the GET_ID serial (VIRTIO_BLK_ID_BYTES).
pub const SERIAL_LEN: usize = 20;
/// Most request queues a disk serves (`num_queues=`): each has its own
/// thread, ring and MSI-X vector.
pub const MAX_QUEUES: u16 = 64;
/// Entries per queue by default (`queue_size=`).
pub const DEFAULT_QUEUE_SIZE: u16 = 256;
/// Smallest and largest `queue_size=`: room for a header, one data buffer
/// and a status; the split ring's maximum.
pub const MIN_QUEUE_SIZE: u16 = 4;
pub const MAX_QUEUE_SIZE: u16 = 32768;

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
/// [,engine=io_uring|threads][,num_queues=N][,queue_size=N][,iothread_affinity=[..]]
/// [,iothread_sched=batch|other][,werror=report|stop][,rerror=report|stop]`.
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
    /// The scheduling policy of those threads (`iothread_sched=`, batch by
    /// default: see [`IoThreadSched`]).
    pub iothread_sched: IoThreadSched,
    /// What host write and read errors do (`werror=`, `rerror=`).
    pub errors: ErrorPolicy,
    /// The I/O engine asked for; io_uring falls back to threads where the
    /// kernel refuses it.
    pub engine: EngineKind,
    /// Request queues (VIRTIO_BLK_F_MQ); when absent the VMM gives one per
    /// vCPU ([`BlockConfig::with_default_queues`]), else 1.
    pub num_queues: Option<u16>,
    /// Entries per queue.
    pub queue_size: u16,
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
            iothread_sched: IoThreadSched::Batch,
            errors: ErrorPolicy::default(),
            engine: EngineKind::IoUring,
            num_queues: None,
            queue_size: DEFAULT_QUEUE_SIZE,
        }
    }

    /// The number of queues served: as asked, or `vcpus` (at most
    /// [`MAX_QUEUES`]) when not.
    pub fn with_default_queues(mut self, vcpus: usize) -> BlockConfig {
        if self.num_queues.is_none() {
            let n = u16::try_from(vcpus).unwrap_or(MAX_QUEUES);
            self.num_queues = Some(n.clamp(1, MAX_QUEUES));
        }
        self
    }

    /// The number of queues served (1 when not set).
    pub fn queues(&self) -> u16 {
        self.num_queues.unwrap_or(1)
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
        let iothread_sched = o.choice("iothread_sched", &IoThreadSched::NAMES, "batch")?;
        let iothread_sched =
            IoThreadSched::from_name(iothread_sched).expect("choice() returns one of NAMES");
        let action = |name| ErrorAction::from_name(name).expect("choice() returns one of NAMES");
        let errors = ErrorPolicy {
            werror: action(o.choice("werror", &ErrorAction::NAMES, "report")?),
            rerror: action(o.choice("rerror", &ErrorAction::NAMES, "report")?),
        };
        let engine = o.choice("engine", &EngineKind::NAMES, "io_uring")?;
        let engine = EngineKind::from_name(engine).expect("choice() returns one of NAMES");
        let num_queues = o.parsed::<u16>("num_queues")?;
        if let Some(n) = num_queues {
            if !(1..=MAX_QUEUES).contains(&n) {
                return Err(invalid(
                    "num_queues",
                    &n.to_string(),
                    &format!("between 1 and {MAX_QUEUES}"),
                ));
            }
        }
        let queue_size = o.parsed::<u16>("queue_size")?.unwrap_or(DEFAULT_QUEUE_SIZE);
        if !queue_size.is_power_of_two() || !(MIN_QUEUE_SIZE..=MAX_QUEUE_SIZE).contains(&queue_size)
        {
            return Err(invalid(
                "queue_size",
                &queue_size.to_string(),
                &format!("a power of two from {MIN_QUEUE_SIZE} to {MAX_QUEUE_SIZE}"),
            ));
        }
        o.finish()?;
        Ok(BlockConfig {
            path: PathBuf::from(path),
            readonly,
            cache,
            id,
            iothread_affinity,
            iothread_sched,
            errors,
            engine,
            num_queues,
            queue_size,
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
