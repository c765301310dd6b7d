//! [`Block`]: the virtio-blk [`VirtioDevice`].
//!
//! Once activated, one queue thread (the device's worker, see
//! `virtio::lifecycle`) takes chains off the available ring and hands
//! them to a small pool of I/O threads, so a slow request does not hold
//! up the others. An I/O thread parses and runs its request
//! ([`process_chain`]) and sends the completion back; the queue thread
//! alone puts completions in the used ring and decides (EVENT_IDX-aware)
//! whether to interrupt the guest. A pause waits for the I/O threads'
//! requests to complete (`QueueLoop::quiesce`).
//!
//! Each request carries its [`StageTimes`] (kick, dequeue, submit,
//! complete, interrupt); the queue thread counts it in the disk's
//! [`DiskStats`] once the guest has been told.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO,
    VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_TOPOLOGY, VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::error_policy::{HeldRequests, StopHandler, StopReason};
use super::io::{AlignedBuf, DiskBackend, FileDisk, Locking};
use super::metrics::{add, BlockMetrics, Metrics};
use super::request::{
    process_chain_counted, RequestContext, DISCARD_SECTOR_ALIGNMENT, MAX_DISCARD_SECTORS,
    MAX_DISCARD_SEG, MAX_WRITE_ZEROES_SECTORS,
};
use super::stats::{now_ns, DiskStats, RequestRecord, StageTimes};
use super::{BlockConfig, BlockError, SECTOR_SHIFT, SECTOR_SIZE, SERIAL_LEN};
use crate::affinity::{pinned, CpuSet};
use crate::virtio::lifecycle::{
    self, queue_array, ActiveQueues, DeviceLifecycle, QueueDevice, QueueLoop,
};
use crate::virtio::worker::{EpollLoop, WorkerHandler};
use crate::virtio::{
    ActivateError, Activation, DeviceState, QueueEvents, QueuePosition, StateError, VirtioDevice,
    VirtioInterrupt, COMMON_FEATURES,
};
use crate::GuestMemoryMmap;

/// Size of the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// I/O threads per disk.
pub const IO_THREADS: usize = 4;
/// Each I/O thread's bounce buffer; larger requests go through it in
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
    queue_sizes: [u16; 1],
    metrics: Arc<Metrics>,
    /// The statistics of `vm.counters`.
    stats: Arc<DiskStats>,
    errors: Arc<DiskErrors>,
    lifecycle: DeviceLifecycle<EpollLoop<QueueHandler>>,
}

/// A disk's requests held by a `stop` error policy (see
/// [`super::error_policy`]), for the VMM to report and resume.
#[derive(Default)]
pub struct DiskErrors {
    held: HeldRequests<Job>,
    /// The active queue thread's retry event.
    retry: Mutex<Option<EventFd>>,
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
    /// stops the VM again.
    pub fn retry(&self) {
        if self.held.count() == 0 {
            return;
        }
        if let Some(evt) = &*self.retry.lock().unwrap_or_else(PoisonError::into_inner) {
            let _ = evt.write(1);
        }
    }
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
        tracing::info!(
            "disk {}: {} bytes, cache={}, {}",
            config.path.display(),
            disk.size(),
            config.cache,
            if config.readonly {
                "read-only"
            } else {
                "read-write"
            }
        );
        let mut block = Block::from_backend(config, disk.clone(), disk.size(), *disk.serial());
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
        Block {
            name: config.id.clone().unwrap_or_else(|| "disk".to_string()),
            config_space: config_space(capacity, config.readonly),
            config,
            file: None,
            backend,
            serial,
            capacity,
            features,
            queue_sizes: [QUEUE_SIZE],
            metrics: Arc::new(Metrics::default()),
            stats: Arc::new(DiskStats::new(1)),
            errors: Arc::new(DiskErrors::default()),
            lifecycle: DeviceLifecycle::default(),
        }
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

    /// Whether the queue is being served.
    pub fn is_active(&self) -> bool {
        self.lifecycle.is_active()
    }

    /// The request counters so far.
    pub fn metrics(&self) -> BlockMetrics {
        let mut m = self.metrics.snapshot();
        if let Some(file) = &self.file {
            let f = file.flush_failures();
            m.failed_syncs = f.failed_syncs;
            m.refused_flushes = f.refused_flushes;
        }
        m
    }

    /// The statistics (per kind and stage, histograms), live: the VMM
    /// keeps this to read them and set histogram boundaries.
    pub fn stats(&self) -> Arc<DiskStats> {
        self.stats.clone()
    }
}

/// `struct virtio_blk_config`, little-endian.
fn config_space(capacity: u64, readonly: bool) -> [u8; CONFIG_LEN] {
    let mut c = [0u8; CONFIG_LEN];
    let mut put =
        |offset: usize, bytes: &[u8]| c[offset..offset + bytes.len()].copy_from_slice(bytes);
    put(0, &capacity.to_le_bytes());
    // size_max (8) is not offered; seg_max leaves room for header and status.
    put(12, &(u32::from(QUEUE_SIZE) - 2).to_le_bytes());
    // geometry (16) is not offered.
    put(20, &(SECTOR_SIZE as u32).to_le_bytes());
    put(24, &[PHYSICAL_BLOCK_EXP, 0]); // physical_block_exp, alignment_offset
    put(26, &(1u16 << PHYSICAL_BLOCK_EXP).to_le_bytes()); // min_io_size
    put(34, &1u16.to_le_bytes()); // num_queues
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
        })
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

    /// The queue thread's loop and the I/O pool (running, waiting for
    /// requests) it hands requests to.
    fn serve(
        &mut self,
        queues: ActiveQueues,
        _restoring: Option<&DeviceState>,
    ) -> Result<Self::Loop, ActivateError> {
        let [QueueEvents { index, queue, kick }] = queue_array(queues.queues)?;
        let acked = queues.acked_features & self.features;
        let mem = Arc::new(queues.memory);

        let abort = Arc::new(AtomicBool::new(false));
        // Declared before the job sender so that, on an early return, the
        // sender is dropped first and the pool's threads can be joined.
        let mut pool = Pool {
            threads: Vec::new(),
            abort: abort.clone(),
        };
        let done_evt = EventFd::new(EFD_NONBLOCK)?;
        let retry_evt = EventFd::new(EFD_NONBLOCK)?;
        // Requests held before a reset belong to a driver that is gone.
        drop(self.errors.held.take());
        *self
            .errors
            .retry
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(retry_evt.try_clone()?);
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let (done_tx, done_rx) = mpsc::channel();
        let job_rx = Arc::new(Mutex::new(job_rx));
        for i in 0..IO_THREADS {
            let io = IoThread {
                mem: mem.clone(),
                disk: self.backend.clone(),
                serial: self.serial,
                metrics: self.metrics.clone(),
                capacity: self.capacity,
                readonly: self.config.readonly,
                acked_features: acked,
                name: self.name.clone(),
                policy: self.config.errors,
                errors: self.errors.clone(),
                jobs: job_rx.clone(),
                done: done_tx.clone(),
                done_evt: done_evt.try_clone()?,
                abort: abort.clone(),
            };
            let (name, affinity) = (format!("{}-io{i}", self.name), self.thread_affinity());
            let thread = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || pinned(name, affinity, || io.run()))?;
            pool.threads.push(thread);
        }
        let fds = [
            kick.as_raw_fd(),
            done_evt.as_raw_fd(),
            retry_evt.as_raw_fd(),
        ];
        let handler = QueueHandler {
            name: self.name.clone(),
            index,
            mem,
            queue,
            kick,
            done_evt,
            done_rx,
            jobs: job_tx,
            retry_evt,
            errors: self.errors.clone(),
            in_flight: 0,
            stats: self.stats.clone(),
            finished: Vec::new(),
            interrupt: queues.interrupt,
            _pool: pool,
        };
        // On failure the handler is dropped, the job sender first, so the
        // pool winds down.
        Ok(EpollLoop::new(&fds, handler)?)
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

    /// The I/O threads may still be running requests the queue thread
    /// took: waits for them, so that everything the guest submitted is in
    /// the used ring (or still in the available ring) when the state is
    /// taken. The I/O threads stay, idle, for the resume.
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

/// The I/O threads of an active disk.
struct Pool {
    threads: Vec<JoinHandle<()>>,
    abort: Arc<AtomicBool>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Requests still waiting are dropped unanswered (the device is
        // being reset); the ones in progress complete on the disk.
        self.abort.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A chain taken off the available ring, for an I/O thread.
struct Job {
    chain: DescriptorChain<Arc<GuestMemoryMmap>>,
    head: u16,
    times: StageTimes,
}

/// A request an I/O thread finished, for the queue thread.
struct Done {
    head: u16,
    used_len: u32,
    record: RequestRecord,
}

struct IoThread {
    mem: Arc<GuestMemoryMmap>,
    disk: Arc<dyn DiskBackend>,
    serial: [u8; SERIAL_LEN],
    metrics: Arc<Metrics>,
    capacity: u64,
    readonly: bool,
    acked_features: u64,
    name: String,
    policy: super::error_policy::ErrorPolicy,
    errors: Arc<DiskErrors>,
    jobs: Arc<Mutex<Receiver<Job>>>,
    done: Sender<Done>,
    done_evt: EventFd,
    abort: Arc<AtomicBool>,
}

impl IoThread {
    fn run(self) {
        let mut scratch = AlignedBuf::new(SCRATCH_LEN);
        let ctx = RequestContext {
            disk: &*self.disk,
            capacity: self.capacity,
            readonly: self.readonly,
            acked_features: self.acked_features,
            serial: self.serial,
            metrics: &self.metrics,
            errors: self.policy,
        };
        loop {
            let job = {
                let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
                jobs.recv()
            };
            let Ok(job) = job else { return };
            if self.abort.load(Ordering::SeqCst) {
                return;
            }
            let mut times = job.times;
            times.submit = now_ns();
            // A copy to run again if the error policy holds it.
            let again = job.chain.clone();
            let processed = process_chain_counted(job.chain, &self.mem, &ctx, &mut scratch);
            if let Some(cause) = processed.completion.hold {
                // Held: its stamps restart when the resume runs it again.
                self.hold(
                    Job {
                        chain: again,
                        head: job.head,
                        times: job.times,
                    },
                    cause,
                );
                continue;
            }
            times.complete = now_ns();
            add(&self.metrics.latency_us_sum, times.service_ns() / 1000);
            add(&self.metrics.completed, 1);
            let done = Done {
                head: job.head,
                used_len: processed.completion.used_len,
                record: RequestRecord {
                    kind: processed.kind,
                    outcome: processed.outcome,
                    bytes: processed.bytes,
                    times,
                },
            };
            if self.done.send(done).is_err() {
                return;
            }
            let _ = self.done_evt.write(1);
        }
    }
}

impl IoThread {
    /// Keeps a failed request unanswered for the resume and, the first
    /// time, has the VM paused.
    fn hold(&self, job: Job, cause: super::request::HoldCause) {
        let reason = StopReason {
            disk: self.name.clone(),
            what: cause.what,
            errno: cause.errno,
        };
        if let Some((handler, reason)) = self.errors.held.hold(job, reason) {
            handler(&reason);
        }
    }
}

/// The queue thread's state.
pub(crate) struct QueueHandler {
    name: String,
    index: u16,
    mem: Arc<GuestMemoryMmap>,
    queue: Queue,
    kick: EventFd,
    done_evt: EventFd,
    done_rx: Receiver<Done>,
    jobs: Sender<Job>,
    retry_evt: EventFd,
    errors: Arc<DiskErrors>,
    /// Requests handed to the I/O threads and not yet in the used ring
    /// (held ones included).
    in_flight: usize,
    stats: Arc<DiskStats>,
    /// The requests put in the used ring since the last interrupt
    /// decision, counted once it is made (reused, not reallocated).
    finished: Vec<RequestRecord>,
    interrupt: Arc<dyn VirtioInterrupt>,
    /// Dropped after `jobs` (fields drop in order): a reset stops the
    /// queue thread, then the I/O threads see the job channel closed,
    /// finish what they are doing and are joined.
    _pool: Pool,
}

impl QueueHandler {
    /// Hands every available chain to the I/O threads; `kick` is when
    /// the queue thread woke for them.
    fn take_requests(&mut self, kick: u64) {
        loop {
            if let Err(e) = self.queue.disable_notification(&*self.mem) {
                tracing::warn!("{}: cannot disable notifications: {e}", self.name);
            }
            let mut taken = 0;
            while let Some(chain) = self.queue.pop_descriptor_chain(self.mem.clone()) {
                taken += 1;
                let mut times = StageTimes::kicked_at(kick);
                times.dequeue = now_ns();
                let job = Job {
                    head: chain.head_index(),
                    chain,
                    times,
                };
                if self.jobs.send(job).is_err() {
                    return;
                }
                self.in_flight += 1;
                self.stats.dequeued();
            }
            match self.queue.enable_notification(&*self.mem) {
                // More arrived meanwhile; but if nothing could be taken the
                // ring is broken (e.g. an avail index out of range) and
                // looping would spin.
                Ok(true) if taken > 0 => continue,
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!("{}: cannot enable notifications: {e}", self.name);
                    return;
                }
            }
        }
    }

    /// Puts finished requests in the used ring and interrupts if needed.
    fn complete(&mut self) {
        let mut added = false;
        while let Ok(done) = self.done_rx.try_recv() {
            added |= self.add_used(done);
        }
        self.notify_if_added(added);
        self.count_finished();
    }

    /// Puts one finished request in the used ring; whether it went in.
    fn add_used(&mut self, done: Done) -> bool {
        let Done {
            head,
            used_len: len,
            record,
        } = done;
        self.in_flight = self.in_flight.saturating_sub(1);
        self.finished.push(record);
        match self.queue.add_used(&*self.mem, head, len) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("{}: cannot complete request {head}: {e}", self.name);
                false
            }
        }
    }

    /// Waits (on the caller's thread, the queue thread being parked) until
    /// every request in flight is in the used ring, then interrupts if the
    /// driver wants it. On timeout, returns how many are still out.
    fn drain(&mut self, timeout: Duration) -> Result<(), usize> {
        let deadline = Instant::now() + timeout;
        let mut added = false;
        let mut result = Ok(());
        while self.in_flight > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.done_rx.recv_timeout(left) {
                Ok(done) => added |= self.add_used(done),
                Err(_) => {
                    result = Err(self.in_flight);
                    break;
                }
            }
        }
        self.notify_if_added(added);
        self.count_finished();
        result
    }

    /// Stamps the requests just put in the used ring with the interrupt
    /// (injected or not) and counts them.
    fn count_finished(&mut self) {
        let interrupt = now_ns();
        for mut record in self.finished.drain(..) {
            record.times.interrupt = interrupt;
            self.stats.completed(self.index, &record);
        }
    }

    fn notify_if_added(&mut self, added: bool) {
        if added {
            match self.queue.needs_notification(&*self.mem) {
                Ok(false) => {}
                Ok(true) | Err(_) => self.interrupt.notify_queue(self.index),
            }
        }
    }
}

impl Drop for QueueHandler {
    /// A reset drops the requests still with the I/O threads unanswered:
    /// they are no longer in flight.
    fn drop(&mut self) {
        self.stats.abandoned(self.in_flight as u64);
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
                let _ = self.done_evt.read();
                self.complete();
            }
            RETRY_TOKEN => {
                let _ = self.retry_evt.read();
                // Still in flight: they go back to the I/O threads.
                for job in self.errors.held.take() {
                    if self.jobs.send(job).is_err() {
                        return;
                    }
                }
            }
            _ => {}
        }
    }
}
