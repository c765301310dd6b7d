//! [`Block`]: the virtio-blk [`VirtioDevice`].
//!
//! Once activated, each queue has a thread of its own (a worker, see
//! `virtio::lifecycle`) and an I/O engine of its own (`engine`: an
//! io_uring, or a few threads). The queue thread takes chains off the
//! available ring, parses each and hands its read, write or flush to the
//! engine ([`QueueHandler::dequeue`], [`QueueHandler::submit_to_host`]),
//! so many requests are in flight at once; it reaps the engine's
//! completions when the engine's eventfd fires
//! ([`QueueHandler::on_host_completion`]), puts them in the used ring and
//! decides, EVENT_IDX-aware, whether to interrupt the guest
//! ([`QueueHandler::inject_interrupt`]). A pause waits for every queue's
//! requests in flight to complete (`QueueLoop::quiesce`).
//!
//! Each request carries its [`StageTimes`], stamped in those four steps
//! (kick, dequeue, submit, complete, interrupt); the queue thread counts
//! it in its own queue's share of the disk's [`DiskStats`] once the guest
//! has been told. A host error whose `werror`/`rerror` policy is `stop`
//! leaves the request unanswered: the queue thread keeps its chain in the
//! disk's [`DiskErrors`], the VM is paused, and the resume's retry event
//! runs it again through the same steps on the same queue.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ,
    VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_TOPOLOGY, VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::engine::threads::{ThreadsEngine, THREADS_PER_QUEUE};
use super::engine::uring::UringEngine;
use super::engine::OpKind;
use super::engine::{
    self as engines, wait_for_completions, Done, EngineKind, IoEngine, IoOp, KernelRings, RingSetup,
};
use super::error_policy::{ErrorPolicy, HeldRequests, StopHandler, StopReason};
use super::io::{AlignedBuf, DiskBackend, FileDisk, Locking};
use super::request::{
    begin, HoldCause, PendingIo, Processed, Request, RequestContext, Started,
    DISCARD_SECTOR_ALIGNMENT, MAX_DISCARD_SECTORS, MAX_DISCARD_SEG, MAX_WRITE_ZEROES_SECTORS,
};
use super::stats::{now_ns, DiskStats, RequestRecord, StageTimes};
use super::sticky::StickyFlush;
use super::trace::{self, DiskTracer};
use super::{BlockConfig, BlockError, CacheMode, SECTOR_SHIFT, SECTOR_SIZE, SERIAL_LEN};
use crate::affinity::{CpuSet, IoThreadSched, ThreadPlacement};
use crate::virtio::lifecycle::{self, ActiveQueues, DeviceLifecycle, QueueDevice, QueueLoop};
use crate::virtio::worker::{EpollLoop, WorkerHandler};
use crate::virtio::{
    ActivateError, Activation, DeviceState, QueueEvents, QueuePosition, StateError, VirtioDevice,
    VirtioInterrupt, COMMON_FEATURES,
};
use crate::GuestMemoryMmap;

#[doc(hidden)]
pub mod fuzzing;

/// The bounce buffer of a request run alone; larger ones go through it in
/// pieces.
const SCRATCH_LEN: usize = 512 * 1024;
/// The configuration space served: `struct virtio_blk_config` up to and
/// including `write_zeroes_may_unmap` and its padding. Reads past it (the
/// secure-erase and zoned fields, which are not offered) are zeroes.
pub const CONFIG_LEN: usize = 60;
/// Physical block size advertised (VIRTIO_BLK_F_TOPOLOGY), as a power of
/// two of logical blocks: 4 KiB, what host page caches and O_DIRECT on
/// 4K-sector disks prefer.
const PHYSICAL_BLOCK_EXP: u8 = 3;

const KICK_TOKEN: usize = 0;
const DONE_TOKEN: usize = 1;
/// Held requests (werror/rerror=stop) are to run again.
const RETRY_TOKEN: usize = 2;
/// How long a pause waits for the requests in flight to complete: a
/// flush of a large writeback cache can take a while.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// What a snapshot keeps of a disk: what the guest's driver learned of it
/// at probe time and still relies on. The data is in the image, which a
/// snapshot does not copy (see docs/snapshot.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    /// The capacity in 512-byte sectors.
    pub capacity: u64,
    /// Offered VIRTIO_BLK_F_RO.
    pub readonly: bool,
    /// The feature bits offered.
    pub features: u64,
    /// Request queues offered (1 in snapshots older than multi-queue).
    #[serde(default = "one_queue")]
    pub num_queues: u16,
}

fn one_queue() -> u16 {
    1
}

/// A virtio-blk device on a disk image.
pub struct Block {
    name: String,
    config: BlockConfig,
    /// The image when the disk is one (see [`Block::from_backend`]).
    file: Option<Arc<FileDisk>>,
    backend: Arc<dyn DiskBackend>,
    serial: [u8; SERIAL_LEN],
    capacity: u64,
    features: u64,
    config_space: [u8; CONFIG_LEN],
    queue_sizes: Vec<u16>,
    /// The engine the disk's queues get, and why not the one asked for.
    engine: EngineKind,
    engine_fallback: Option<String>,
    rings: Arc<dyn RingSetup>,
    /// The statistics of `vm.counters`, a share per queue.
    stats: Arc<DiskStats>,
    /// The I/O tracer's virtual-disk layer (`ctl iotrace`).
    tracer: Arc<DiskTracer>,
    errors: Arc<DiskErrors>,
    lifecycle: DeviceLifecycle<EpollLoop<QueueHandler>>,
}

/// A disk's requests held by a `stop` error policy (see
/// [`super::error_policy`]), for the VMM to report and resume.
#[derive(Default)]
pub struct DiskErrors {
    held: HeldRequests<Held>,
    /// Each active queue's retry event and the held requests handed back
    /// to it at the resume, by queue index: a request completes in the
    /// used ring of the queue it came from.
    queues: Mutex<Vec<RetryMailbox>>,
}

/// What a resume hands one queue thread.
struct RetryMailbox {
    index: u16,
    evt: EventFd,
    jobs: Vec<Held>,
}

impl DiskErrors {
    /// Installs what pauses the VM when a request is held.
    pub fn set_handler(&self, handler: StopHandler) {
        self.held.set_handler(handler);
    }

    /// Why the disk stopped the VM, while it holds requests.
    pub fn reason(&self) -> Option<StopReason> {
        self.held.reason()
    }

    /// How many requests are held.
    pub fn held(&self) -> usize {
        self.held.count()
    }

    /// Runs the held requests again (the VM resumes); one failing again
    /// stops the VM again. They are taken here, all at once, so that a
    /// failure on one queue before another queue took its own pauses the
    /// VM again (the reason is cleared with the taking).
    pub fn retry(&self) {
        if self.held.count() == 0 {
            return;
        }
        let jobs = self.held.take();
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        for job in jobs {
            // A queue that is gone (a reset) took its driver with it.
            if let Some(q) = queues.iter_mut().find(|q| q.index == job.queue) {
                q.jobs.push(job);
            }
        }
        for q in queues.iter().filter(|q| !q.jobs.is_empty()) {
            let _ = q.evt.write(1);
        }
    }

    /// Takes the requests a resume handed back to queue `index`.
    fn take_retries(&self, index: u16) -> Vec<Held> {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        queues
            .iter_mut()
            .find(|q| q.index == index)
            .map(|q| std::mem::take(&mut q.jobs))
            .unwrap_or_default()
    }
}

/// A request held by a `stop` policy: its chain, to parse and start again
/// at the resume (nothing of it was answered), on its own queue.
struct Held {
    queue: u16,
    chain: DescriptorChain<Arc<GuestMemoryMmap>>,
    /// When it was first kicked: its later stamps restart at the retry.
    kick: u64,
}

impl Block {
    /// Opens the image of `config` (see [`FileDisk::open`] for what is
    /// checked). The device is named after `config.id`, or "disk".
    pub fn new(config: BlockConfig) -> Result<Block, BlockError> {
        Block::open(config, Locking::Now)
    }

    /// [`Block::new`], locking the image now or later (see
    /// [`FileDisk::lock_image`]).
    pub fn open(config: BlockConfig, locking: Locking) -> Result<Block, BlockError> {
        if let Some(cpus) = &config.iothread_affinity {
            cpus.check_allowed().map_err(BlockError::Affinity)?;
        }
        let disk = Arc::new(FileDisk::open_with(&config, locking)?);
        let mut block = Block::from_backend(config, disk.clone(), disk.size(), *disk.serial());
        tracing::info!(
            "disk {}: {} bytes, cache={}, {}, engine={}, {} queue(s) of {}",
            block.config.path.display(),
            disk.size(),
            block.config.cache,
            access_name(block.config.readonly),
            block.engine,
            block.queue_sizes.len(),
            block.config.queue_size,
        );
        block.tracer = Arc::new(DiskTracer::new(
            Some(block.config.path.clone()),
            block.config.cache,
        ));
        block.file = Some(disk);
        Ok(block)
    }

    /// A device on any back end of `size` bytes (rounded down to whole
    /// sectors); `config` gives the name, read-only and the cache mode
    /// label, its path is not opened.
    pub fn from_backend(
        config: BlockConfig,
        backend: Arc<dyn DiskBackend>,
        size: u64,
        serial: [u8; SERIAL_LEN],
    ) -> Block {
        let capacity = size >> SECTOR_SHIFT;
        let num_queues = config.queues();
        let mut features = COMMON_FEATURES
            | (1 << VIRTIO_BLK_F_FLUSH)
            | (1 << VIRTIO_BLK_F_BLK_SIZE)
            | (1 << VIRTIO_BLK_F_SEG_MAX)
            | (1 << VIRTIO_BLK_F_TOPOLOGY);
        if config.readonly {
            features |= 1 << VIRTIO_BLK_F_RO;
        } else {
            features |= (1 << VIRTIO_BLK_F_DISCARD) | (1 << VIRTIO_BLK_F_WRITE_ZEROES);
        }
        // Offered only with several queues, so a one-queue disk offers
        // what it offered before multi-queue (snapshots compare features).
        if num_queues > 1 {
            features |= 1 << VIRTIO_BLK_F_MQ;
        }
        // The image's sticky flush state counts its syncs.
        let syncs = backend.sticky().map(StickyFlush::stats).unwrap_or_default();
        let mut block = Block {
            name: config.id.clone().unwrap_or_else(|| "disk".to_string()),
            config_space: config_space(capacity, &config),
            queue_sizes: vec![config.queue_size; usize::from(num_queues)],
            config,
            file: None,
            backend,
            serial,
            capacity,
            features,
            engine: EngineKind::Threads,
            engine_fallback: None,
            rings: Arc::new(KernelRings),
            stats: Arc::new(DiskStats::with_syncs(usize::from(num_queues), syncs)),
            tracer: Arc::new(DiskTracer::new(None, CacheMode::None)),
            errors: Arc::new(DiskErrors::default()),
            lifecycle: DeviceLifecycle::default(),
        };
        block.choose_engine(Arc::new(KernelRings));
        block
    }

    /// Decides the engine with `rings` setting up io_uring rings (the
    /// kernel's, or a test's), saying once why when it falls back.
    pub fn choose_engine(&mut self, rings: Arc<dyn RingSetup>) {
        let (engine, fallback) = engines::select(self.config.engine, &*self.backend, &*rings);
        if let Some(why) = &fallback {
            tracing::warn!(
                "disk {}: engine={} is not available, using {engine}: {why}",
                self.config.path.display(),
                self.config.engine
            );
        }
        (self.engine, self.engine_fallback, self.rings) = (engine, fallback, rings);
    }

    /// The engine the disk's queues use.
    pub fn engine(&self) -> EngineKind {
        self.engine
    }

    /// Why the disk does not use the engine asked for, if it does not.
    pub fn engine_fallback(&self) -> Option<&str> {
        self.engine_fallback.as_deref()
    }

    /// Renames the device (e.g. "disk1" when there are several), for logs
    /// and `vm.info`. The GET_ID serial does not change.
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }

    /// What it was opened with.
    pub fn config(&self) -> &BlockConfig {
        &self.config
    }

    /// The capacity in 512-byte sectors.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The opened image (None for [`Block::from_backend`] devices).
    pub fn disk(&self) -> Option<&FileDisk> {
        self.file.as_deref()
    }

    /// Its held requests (werror/rerror=stop).
    pub fn errors(&self) -> Arc<DiskErrors> {
        self.errors.clone()
    }

    /// The opened image, for the VMM to flush, lock and unlock it around
    /// migrations and snapshots.
    pub fn shared_disk(&self) -> Option<Arc<FileDisk>> {
        self.file.clone()
    }

    /// Whether the queues are being served.
    pub fn is_active(&self) -> bool {
        self.lifecycle.is_active()
    }

    /// The statistics (per kind and stage, histograms), live: the VMM
    /// keeps this to read them and set histogram boundaries.
    pub fn stats(&self) -> Arc<DiskStats> {
        self.stats.clone()
    }

    /// Its I/O tracer (off until started), for the VMM's `vm.iotrace`.
    pub fn tracer(&self) -> Arc<DiskTracer> {
        self.tracer.clone()
    }
}

/// `struct virtio_blk_config`, little-endian.
fn config_space(capacity: u64, config: &BlockConfig) -> [u8; CONFIG_LEN] {
    let readonly = config.readonly;
    let mut c = [0u8; CONFIG_LEN];
    let mut put =
        |offset: usize, bytes: &[u8]| c[offset..offset + bytes.len()].copy_from_slice(bytes);
    put(0, &capacity.to_le_bytes());
    // size_max (8) is not offered; seg_max leaves room for header and status.
    put(12, &(u32::from(config.queue_size) - 2).to_le_bytes());
    // geometry (16) is not offered.
    put(20, &(SECTOR_SIZE as u32).to_le_bytes());
    put(24, &[PHYSICAL_BLOCK_EXP, 0]); // physical_block_exp, alignment_offset
    put(26, &(1u16 << PHYSICAL_BLOCK_EXP).to_le_bytes()); // min_io_size
    put(34, &config.queues().to_le_bytes()); // num_queues (with F_MQ)
    if !readonly {
        put(36, &MAX_DISCARD_SECTORS.to_le_bytes());
        put(40, &MAX_DISCARD_SEG.to_le_bytes());
        put(44, &DISCARD_SECTOR_ALIGNMENT.to_le_bytes());
        put(48, &MAX_WRITE_ZEROES_SECTORS.to_le_bytes());
        put(52, &MAX_DISCARD_SEG.to_le_bytes());
        put(56, &[1]); // write_zeroes_may_unmap
    }
    c
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn id(&self) -> &str {
        &self.name
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn device_features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::virtio::read_config_bytes(&self.config_space, offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // Nothing is writable: `wce` needs VIRTIO_BLK_F_CONFIG_WCE.
        tracing::debug!(
            "{}: ignoring a {}-byte config write at {offset}",
            self.name,
            data.len()
        );
    }

    lifecycle::lifecycle_methods!();

    fn save_state(&self) -> DeviceState {
        DeviceState::Block(BlockState {
            capacity: self.capacity,
            readonly: self.config.readonly,
            features: self.features,
            num_queues: self.config.queues(),
        })
    }

    fn describe(&self) -> Vec<String> {
        let mut engine = format!("engine {}", self.engine);
        if let Some(why) = &self.engine_fallback {
            engine.push_str(&format!(" ({} asked for: {why})", self.config.engine));
        }
        vec![
            engine,
            format!(
                "queues {} x {}",
                self.queue_sizes.len(),
                self.config.queue_size
            ),
            format!("cache {}", self.config.cache),
        ]
    }
}

fn access_name(readonly: bool) -> &'static str {
    if readonly {
        "read-only"
    } else {
        "read-write"
    }
}

impl QueueDevice for Block {
    type Loop = EpollLoop<QueueHandler>;
    const WORKER_SUFFIX: &'static str = "queue";

    fn lifecycle(&mut self) -> &mut DeviceLifecycle<Self::Loop> {
        &mut self.lifecycle
    }

    fn thread_affinity(&self) -> Option<CpuSet> {
        self.config.iothread_affinity.clone()
    }

    fn thread_sched(&self) -> IoThreadSched {
        self.config.iothread_sched
    }

    /// Queue 0 is always there; a driver may use fewer queues than
    /// offered (Linux uses at most one per CPU).
    fn queues_needed(&self, _acked_features: u64) -> usize {
        1
    }

    fn serves_optional_queues(&self) -> bool {
        true
    }

    /// Each queue's loop, with its own engine.
    fn serve_each(
        &mut self,
        queues: ActiveQueues,
        _restoring: Option<&DeviceState>,
    ) -> Result<Vec<Self::Loop>, ActivateError> {
        let several = queues.queues.len() > 1;
        let shared = Arc::new(Shared {
            disk: self.backend.clone(),
            serial: self.serial,
            capacity: self.capacity,
            readonly: self.config.readonly,
            acked_features: queues.acked_features & self.features,
            policy: self.config.errors,
        });
        let mem = Arc::new(queues.memory);
        // Requests held before a reset belong to a driver that is gone.
        drop(self.errors.held.take());
        self.errors
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let mut loops = Vec::with_capacity(queues.queues.len());
        for QueueEvents { index, queue, kick } in queues.queues {
            let io_name = if several {
                format!("{}-q{index}-io", self.name)
            } else {
                format!("{}-io", self.name)
            };
            let engine = self.queue_engine(&io_name, queue.size())?;
            let retry_evt = EventFd::new(EFD_NONBLOCK)?;
            self.errors
                .queues
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(RetryMailbox {
                    index,
                    evt: retry_evt.try_clone()?,
                    jobs: Vec::new(),
                });
            let fds = [kick.as_raw_fd(), engine.notifier(), retry_evt.as_raw_fd()];
            let handler = QueueHandler {
                engine,
                pending: std::iter::repeat_with(|| None)
                    .take(usize::from(queue.size()))
                    .collect(),
                reaped: Vec::new(),
                scratch: None,
                name: self.name.clone(),
                index,
                shared: shared.clone(),
                mem: mem.clone(),
                queue,
                kick,
                retry_evt,
                errors: self.errors.clone(),
                in_flight: 0,
                stats: self.stats.clone(),
                tracer: self.tracer.clone(),
                finished: Vec::new(),
                interrupt: queues.interrupt.clone(),
            };
            loops.push(EpollLoop::new(&fds, handler)?);
        }
        Ok(loops)
    }

    /// Serves one queue (see [`serve_each`](QueueDevice::serve_each)).
    fn serve(
        &mut self,
        queues: ActiveQueues,
        restoring: Option<&DeviceState>,
    ) -> Result<Self::Loop, ActivateError> {
        let got = queues.queues.len();
        let mut loops = self.serve_each(queues, restoring)?;
        match (loops.pop(), loops.is_empty()) {
            (Some(one), true) => Ok(one),
            _ => Err(ActivateError::QueueCount { got, needed: 1 }),
        }
    }

    fn check_state(&self, state: &DeviceState, _: Option<&Activation>) -> Result<(), StateError> {
        let DeviceState::Block(saved) = state else {
            return Err(state.wrong_kind("block"));
        };
        // The guest's driver sized its disk and chose its features when it
        // probed: another image size or read-only setting would go unseen.
        if saved.capacity != self.capacity {
            return Err(StateError::Mismatch(format!(
                "the disk had {} sectors, {} has {}",
                saved.capacity,
                self.config.path.display(),
                self.capacity
            )));
        }
        if saved.readonly != self.config.readonly {
            return Err(StateError::Mismatch(format!(
                "the disk was {}, --disk makes it {}",
                access_name(saved.readonly),
                access_name(self.config.readonly)
            )));
        }
        if saved.num_queues != self.config.queues() {
            return Err(StateError::Mismatch(format!(
                "the disk had {} queues, this one has {} (num_queues=, by default one per vCPU)",
                saved.num_queues,
                self.config.queues()
            )));
        }
        if saved.features != self.features {
            return Err(StateError::Mismatch(format!(
                "the disk offered features {:#x}, this one offers {:#x}",
                saved.features, self.features
            )));
        }
        Ok(())
    }
}

impl QueueLoop for EpollLoop<QueueHandler> {
    fn positions(&self) -> Vec<QueuePosition> {
        let handler = self.handler();
        vec![QueuePosition::of(handler.index, &handler.queue)]
    }

    /// The engine may still be running requests the queue thread took:
    /// waits for them, so that everything the guest submitted is in the
    /// used ring (or still in the available ring) when the state is
    /// taken. The engine stays, idle, for the resume.
    fn quiesce(&mut self) -> Result<(), StateError> {
        // Held requests (werror/rerror=stop) complete only at a resume:
        // no saved state can carry them, and waiting would time out.
        let held = self.handler().errors.held();
        if held > 0 {
            return Err(StateError::Pause(format!(
                "{held} requests are held after a host I/O error (werror/rerror=stop); resume the VM first"
            )));
        }
        self.handler_mut().drain(DRAIN_TIMEOUT).map_err(|left| {
            StateError::Pause(format!(
                "{left} requests still in flight after {}s",
                DRAIN_TIMEOUT.as_secs()
            ))
        })
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("capacity", &self.capacity)
            .field("active", &self.is_active())
            .finish()
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.reset();
    }
}

impl Block {
    /// The engine for a queue of `entries` entries: the disk's, or
    /// threads if its ring cannot be set up after all (said once per
    /// queue).
    fn queue_engine(&self, io_name: &str, entries: u16) -> std::io::Result<Box<dyn IoEngine>> {
        if self.engine == EngineKind::IoUring {
            match UringEngine::new(&*self.rings, u32::from(entries), self.backend.clone()) {
                Ok(engine) => return Ok(Box::new(engine)),
                Err(e) => tracing::warn!(
                    "{}: cannot set up an io_uring for a queue ({e}); it uses threads",
                    self.name
                ),
            }
        }
        Ok(Box::new(ThreadsEngine::new(
            io_name,
            THREADS_PER_QUEUE,
            self.backend.clone(),
            ThreadPlacement {
                affinity: self.thread_affinity(),
                sched: self.thread_sched(),
            },
        )?))
    }
}

/// What every queue of an active disk shares.
struct Shared {
    disk: Arc<dyn DiskBackend>,
    serial: [u8; SERIAL_LEN],
    capacity: u64,
    readonly: bool,
    acked_features: u64,
    policy: ErrorPolicy,
}

impl Shared {
    fn ctx(&self) -> RequestContext<'_> {
        RequestContext {
            disk: &*self.disk,
            capacity: self.capacity,
            readonly: self.readonly,
            acked_features: self.acked_features,
            serial: self.serial,
            errors: self.policy,
        }
    }
}

/// A request with the engine.
struct InFlight {
    io: PendingIo,
    /// Its chain, kept to run it again if its error policy holds it.
    chain: DescriptorChain<Arc<GuestMemoryMmap>>,
    times: StageTimes,
    /// Its trace, while the disk is traced.
    trace: Option<trace::Pending>,
    /// It holds the disk's direct gate until its completion is reaped.
    gated: bool,
}

/// One queue thread's state.
pub(crate) struct QueueHandler {
    /// Dropped first (fields drop in order): it waits for the host to
    /// finish with guest memory, which `mem` keeps mapped.
    engine: Box<dyn IoEngine>,
    /// The requests with the engine, by head index (the engine's token).
    pending: Vec<Option<InFlight>>,
    /// Completions reaped, kept to reuse the allocation.
    reaped: Vec<Done>,
    /// The buffer of requests run alone, made when first needed.
    scratch: Option<AlignedBuf>,
    name: String,
    index: u16,
    shared: Arc<Shared>,
    mem: Arc<GuestMemoryMmap>,
    queue: Queue,
    kick: EventFd,
    retry_evt: EventFd,
    errors: Arc<DiskErrors>,
    /// Requests taken off the ring and not yet in the used ring (held
    /// ones included), for the statistics' in-flight count at a reset.
    in_flight: usize,
    stats: Arc<DiskStats>,
    tracer: Arc<DiskTracer>,
    /// The requests put in the used ring since the last interrupt
    /// decision, counted (and traced) once it is made (reused, not
    /// reallocated).
    finished: Vec<(RequestRecord, Option<trace::Pending>)>,
    interrupt: Arc<dyn VirtioInterrupt>,
}

impl QueueHandler {
    /// Takes every available chain, starts each, and hands the engine
    /// the batch; interrupts for what completed at once. `kick` is when
    /// the queue thread woke for them.
    fn take_requests(&mut self, kick: u64) {
        let mut added = false;
        loop {
            if let Err(e) = self.queue.disable_notification(&*self.mem) {
                tracing::warn!("{}: cannot disable notifications: {e}", self.name);
            }
            let mut taken = 0;
            while let Some(chain) = self.queue.pop_descriptor_chain(self.mem.clone()) {
                taken += 1;
                added |= self.dequeue(chain, kick);
            }
            self.engine.kick();
            match self.queue.enable_notification(&*self.mem) {
                // More arrived meanwhile; but if nothing could be taken the
                // ring is broken (e.g. an avail index out of range) and
                // looping would spin.
                Ok(true) if taken > 0 => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!("{}: cannot enable notifications: {e}", self.name);
                    break;
                }
            }
        }
        self.inject_interrupt(added);
    }

    /// A chain taken off the available ring: counted in flight, stamped,
    /// parsed and started. Returns whether it completed at once (and is
    /// in the used ring).
    fn dequeue(&mut self, chain: DescriptorChain<Arc<GuestMemoryMmap>>, kick: u64) -> bool {
        let head = chain.head_index();
        if self
            .pending
            .get(usize::from(head))
            .is_some_and(Option::is_some)
        {
            // The driver made the chain available again while its request
            // is still with the host (virtio forbids it). Taking it would
            // replace the request under its head: the first would never
            // be answered, nor leave the O_DIRECT gate (and a later
            // buffered access would wait on the gate forever), and the
            // first op's completion would finish the second request. Its
            // used entry comes when the first completes.
            tracing::warn!(
                "{}: the driver offered request {head} again while it is in flight; ignored",
                self.name
            );
            return false;
        }
        let mut times = StageTimes::kicked_at(kick);
        times.dequeue = now_ns();
        self.in_flight += 1;
        self.stats.dequeued();
        self.start(chain, times)
    }

    /// Parses and starts a chain (taken now, or held and run again):
    /// done at once, handed to the engine, or run alone.
    fn start(
        &mut self,
        chain: DescriptorChain<Arc<GuestMemoryMmap>>,
        mut times: StageTimes,
    ) -> bool {
        let head = chain.head_index();
        let again = chain.clone();
        let (shared, mem) = (self.shared.clone(), self.mem.clone());
        let ctx = shared.ctx();
        let trace = self.tracer.current().map(trace::Pending::new);
        // What completes without an engine is "submitted" as it starts.
        times.submit = now_ns();
        match begin(chain, &mem, &ctx) {
            Started::Done(processed) => self.complete(head, again, processed, times, trace),
            Started::Io(io, op) => {
                let request = InFlight {
                    io,
                    chain: again,
                    times,
                    trace,
                    gated: false,
                };
                self.submit_to_host(head, request, op);
                false
            }
            Started::Alone(request) => {
                let trace = trace.map(|mut t| {
                    t.running_alone(request.sector << SECTOR_SHIFT);
                    t
                });
                self.run_alone(head, again, request, &ctx, times, trace)
            }
        }
    }

    /// Hands a request's op to the host (through the engine).
    fn submit_to_host(&mut self, head: u16, mut request: InFlight, op: IoOp) {
        // With cache=none, a read or write of the O_DIRECT descriptor must
        // not run beside another queue's access through the buffered one
        // (see super::gate); this may wait for that access to end.
        if let (OpKind::Read | OpKind::Write, Some(gate)) =
            (op.kind, self.shared.disk.direct_gate())
        {
            gate.enter_direct();
            request.gated = true;
        }
        if let Some(trace) = &mut request.trace {
            trace.submitting(&op);
        }
        request.times.submit = now_ns();
        match self.pending.get_mut(usize::from(head)) {
            Some(slot) => *slot = Some(request),
            // virtio-queue hands out heads below the queue size only.
            None => return tracing::error!("{}: head {head} beyond the queue", self.name),
        }
        self.engine.submit(head, op);
    }

    /// The host finished an op: the request completes (or is held).
    fn on_host_completion(&mut self, done: Done) -> bool {
        let Some(request) = self
            .pending
            .get_mut(usize::from(done.token))
            .and_then(Option::take)
        else {
            tracing::error!(
                "{}: completion of unknown request {}",
                self.name,
                done.token
            );
            return false;
        };
        let shared = self.shared.clone();
        if request.gated {
            if let Some(gate) = shared.disk.direct_gate() {
                gate.leave_direct();
            }
        }
        let processed = request
            .io
            .finish(done.op, done.result, &self.mem, &shared.ctx());
        self.complete(
            done.token,
            request.chain,
            processed,
            request.times,
            request.trace,
        )
    }

    /// A request's host part is over: holds it if its error policy says
    /// stop, else stamps and counts it and puts it in the used ring;
    /// whether it went in.
    fn complete(
        &mut self,
        head: u16,
        chain: DescriptorChain<Arc<GuestMemoryMmap>>,
        processed: Processed,
        mut times: StageTimes,
        trace: Option<trace::Pending>,
    ) -> bool {
        if let Some(cause) = processed.completion.hold {
            self.hold(chain, times.kick, cause);
            return false;
        }
        times.complete = now_ns();
        self.in_flight = self.in_flight.saturating_sub(1);
        let record = RequestRecord {
            kind: processed.kind,
            outcome: processed.outcome,
            bytes: processed.bytes,
            times,
        };
        self.finished.push((record, trace));
        match self
            .queue
            .add_used(&*self.mem, head, processed.completion.used_len)
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("{}: cannot complete request {head}: {e}", self.name);
                false
            }
        }
    }

    /// Keeps a failed request unanswered for the resume and, the first
    /// time since the last resume, has the VM paused. It stays in flight.
    fn hold(&self, chain: DescriptorChain<Arc<GuestMemoryMmap>>, kick: u64, cause: HoldCause) {
        let reason = StopReason {
            disk: self.name.clone(),
            what: cause.what,
            errno: cause.errno,
        };
        let held = Held {
            queue: self.index,
            chain,
            kick,
        };
        if let Some((handler, reason)) = self.errors.held.hold(held, reason) {
            handler(&reason);
        }
    }

    /// Runs again the held requests a resume handed this queue, through
    /// the same steps as new ones; whether any completed at once.
    fn retry_held(&mut self) -> bool {
        let mut added = false;
        for held in self.errors.take_retries(self.index) {
            let mut times = StageTimes::kicked_at(held.kick);
            times.dequeue = now_ns();
            added |= self.start(held.chain, times);
        }
        self.engine.kick();
        added
    }

    /// Interrupts the guest if requests were completed and the driver
    /// wants to hear of it (EVENT_IDX), then stamps the requests just put
    /// in the used ring with that moment (interrupt injected or not) and
    /// counts them in this queue's share of the statistics.
    fn inject_interrupt(&mut self, added: bool) {
        if added {
            match self.queue.needs_notification(&*self.mem) {
                Ok(false) => {}
                Ok(true) | Err(_) => self.interrupt.notify_queue(self.index),
            }
        }
        let interrupt = now_ns();
        for (mut record, trace) in self.finished.drain(..) {
            record.times.interrupt = interrupt;
            self.stats.completed(self.index, &record);
            if let Some(trace) = trace {
                trace.record(self.index, &record);
            }
        }
    }

    /// Completes what the engine finished; whether any went in the used
    /// ring.
    fn reap(&mut self) -> bool {
        let mut reaped = std::mem::take(&mut self.reaped);
        self.engine.reap(&mut reaped);
        let mut added = false;
        for done in reaped.drain(..) {
            added |= self.on_host_completion(done);
        }
        self.reaped = reaped;
        added
    }

    /// Runs a request that must not overlap the queue's other accesses
    /// (see [`Started::Alone`]) once they are done.
    fn run_alone(
        &mut self,
        head: u16,
        chain: DescriptorChain<Arc<GuestMemoryMmap>>,
        request: Request<'_>,
        ctx: &RequestContext,
        mut times: StageTimes,
        trace: Option<trace::Pending>,
    ) -> bool {
        let mut added = false;
        self.engine.kick();
        while self.engine.in_flight() > 0 {
            wait_for_completions(&*self.engine, DRAIN_TIMEOUT);
            added |= self.reap();
        }
        // This queue's ops are done; the other queues' O_DIRECT ones are
        // waited for and kept out while this one runs (see super::gate).
        let shared = self.shared.clone();
        let _buffered = shared.disk.direct_gate().map(|gate| gate.buffered());
        let scratch = self
            .scratch
            .get_or_insert_with(|| AlignedBuf::new(SCRATCH_LEN));
        times.submit = now_ns();
        let processed = request.execute_counted(&self.mem, ctx, scratch);
        added |= self.complete(head, chain, processed, times, trace);
        added
    }

    /// Waits (on the caller's thread, the queue thread being parked) until
    /// every request in flight is in the used ring, then interrupts if the
    /// driver wants it. On timeout, returns how many are still out.
    fn drain(&mut self, timeout: Duration) -> Result<(), usize> {
        let deadline = Instant::now() + timeout;
        // Held requests a resume handed back and the queue thread has not
        // started yet are started now, so that they are drained too.
        let mut added = self.retry_held();
        let mut result = Ok(());
        self.engine.kick();
        while self.engine.in_flight() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !wait_for_completions(&*self.engine, left) {
                result = Err(self.engine.in_flight());
                break;
            }
            added |= self.reap();
        }
        self.inject_interrupt(added);
        result
    }
}

impl Drop for QueueHandler {
    /// A reset drops the requests still in flight (held ones included)
    /// unanswered: they are no longer in flight.
    fn drop(&mut self) {
        self.stats.abandoned(self.in_flight as u64);
        // Ops the reset leaves unreaped no longer hold the gate: every
        // queue of the disk is being reset with this one.
        if let Some(gate) = self.shared.disk.direct_gate() {
            for _ in self.pending.iter().flatten().filter(|p| p.gated) {
                gate.leave_direct();
            }
        }
    }
}

impl WorkerHandler for QueueHandler {
    fn handle(&mut self, token: usize, _events: EventSet) {
        match token {
            KICK_TOKEN => {
                let kick = now_ns();
                let _ = self.kick.read();
                self.take_requests(kick);
            }
            DONE_TOKEN => {
                let added = self.reap();
                // A submission the kernel deferred goes now.
                self.engine.kick();
                self.inject_interrupt(added);
            }
            RETRY_TOKEN => {
                let _ = self.retry_evt.read();
                let added = self.retry_held();
                self.inject_interrupt(added);
            }
            _ => {}
        }
    }
}
