//! The balloon device and its queue worker.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use virtio_queue::{DescriptorChain, QueueT};
use vm_memory::{Address, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::epoll::EventSet;

use super::control::{BalloonControl, BalloonCounters, BalloonStats};
use super::{
    BalloonConfig, BALLOON_PAGE_SHIFT, BALLOON_PAGE_SIZE, VIRTIO_BALLOON_F_DEFLATE_ON_OOM,
    VIRTIO_BALLOON_F_STATS_VQ, VIRTIO_ID_BALLOON,
};
use crate::options::OptionsError;
use crate::virtio::device::{
    ActivateError, Activation, QueueEvents, VirtioDevice, VirtioInterrupt,
};
use crate::virtio::lifecycle::{self, ActiveQueues, DeviceLifecycle, QueueDevice, QueueLoop};
use crate::virtio::state::{DeviceState, QueuePosition, StateError};
use crate::virtio::worker::{EpollLoop, WorkerHandler};
use crate::GuestMemoryMmap;

#[doc(hidden)]
pub mod fuzzing;

/// The size of each queue.
pub const QUEUE_SIZE: u16 = 256;
const STATS: u16 = 2;
/// The configuration space: `le32 num_pages; le32 actual;`.
const CONFIG_SIZE: usize = 8;
/// The most page frame numbers read from one inflate/deflate buffer
/// (Linux sends at most 256).
const MAX_PFNS_PER_BUFFER: usize = 256 * 1024;
/// The most statistics read from one stats buffer.
const MAX_STATS: usize = 64;

/// What a snapshot keeps of a balloon: the sizes the host asked for and
/// the guest reported, the stats buffer the device holds, and its counters.
/// The pages in the balloon are in guest memory (as zero pages).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonState {
    /// The feature bits offered (stats queue, deflate on OOM).
    pub features: u64,
    /// The target (`num_pages`), in 4 KiB pages.
    pub num_pages: u32,
    /// The balloon's size as the guest reported it (`actual`).
    pub actual: u32,
    /// The head of the stats buffer the device held, returned to the
    /// guest at the next request for statistics.
    pub held_stats: Option<u16>,
    pub inflated_pages: u64,
    pub deflated_pages: u64,
    pub invalid_pfns: u64,
    pub discard_errors: u64,
}

/// A virtio memory balloon.
pub struct Balloon {
    id: String,
    features: u64,
    queue_sizes: Vec<u16>,
    control: Arc<BalloonControl>,
    lifecycle: DeviceLifecycle<EpollLoop<BalloonHandler>>,
}

impl Balloon {
    /// The device and the host's handle on it.
    pub fn new(config: BalloonConfig) -> std::io::Result<(Balloon, Arc<BalloonControl>)> {
        let control = Arc::new(BalloonControl::new(config.size_mib)?);
        let mut features = crate::virtio::COMMON_FEATURES;
        let mut queue_sizes = vec![QUEUE_SIZE, QUEUE_SIZE];
        if config.stats {
            features |= 1 << VIRTIO_BALLOON_F_STATS_VQ;
            queue_sizes.push(QUEUE_SIZE);
        }
        if config.deflate_on_oom {
            features |= 1 << VIRTIO_BALLOON_F_DEFLATE_ON_OOM;
        }
        let balloon = Balloon {
            id: config.id.unwrap_or_else(|| "balloon0".to_string()),
            features,
            queue_sizes,
            control: control.clone(),
            lifecycle: DeviceLifecycle::default(),
        };
        Ok((balloon, control))
    }

    /// Parses `--balloon` options and builds the device; errors are one
    /// line.
    pub fn from_options(text: &str) -> Result<(Balloon, Arc<BalloonControl>), String> {
        let config = BalloonConfig::parse(text).map_err(|e: OptionsError| e.to_string())?;
        Balloon::new(config).map_err(|e| format!("cannot create the balloon: {e}"))
    }

    /// Another handle on the device's control.
    pub fn control(&self) -> Arc<BalloonControl> {
        self.control.clone()
    }

    fn config_bytes(&self) -> [u8; CONFIG_SIZE] {
        let state = self.control.lock();
        let mut bytes = [0u8; CONFIG_SIZE];
        bytes[..4].copy_from_slice(&state.num_pages.to_le_bytes());
        bytes[4..].copy_from_slice(&state.actual.to_le_bytes());
        bytes
    }
}

/// The part of a `len`-byte access at `offset` that falls in a `size`-byte
/// space: (start in the space, length).
fn overlap(offset: u64, len: usize, size: usize) -> Option<(usize, usize)> {
    if offset >= size as u64 {
        return None;
    }
    let start = offset as usize;
    let n = len.min(size - start);
    (n > 0).then_some((start, n))
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BALLOON
    }

    fn id(&self) -> &str {
        &self.id
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn device_features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::virtio::read_config_bytes(&self.config_bytes(), offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // Only `actual` (bytes 4..8) is the driver's to write.
        let Some((start, n)) = overlap(offset, data.len(), CONFIG_SIZE) else {
            return;
        };
        let mut state = self.control.lock();
        let mut actual = state.actual.to_le_bytes();
        for (i, byte) in data[..n].iter().enumerate() {
            if let Some(slot) = (start + i).checked_sub(4) {
                actual[slot] = *byte;
            }
        }
        state.actual = u32::from_le_bytes(actual);
    }

    lifecycle::lifecycle_methods!();

    fn save_state(&self) -> DeviceState {
        // Only a parked worker can be looked at; a running one's buffer
        // would be stale the moment it was read.
        let held_stats = self.lifecycle.parked().and_then(|l| l.handler().held_stats);
        let state = self.control.lock();
        DeviceState::Balloon(BalloonState {
            features: self.features,
            num_pages: state.num_pages,
            actual: state.actual,
            held_stats,
            inflated_pages: state.counters.inflated_pages,
            deflated_pages: state.counters.deflated_pages,
            invalid_pfns: state.counters.invalid_pfns,
            discard_errors: state.counters.discard_errors,
        })
    }
}

impl QueueDevice for Balloon {
    type Loop = EpollLoop<BalloonHandler>;
    const WORKER_SUFFIX: &'static str = "virtio";

    fn lifecycle(&mut self) -> &mut DeviceLifecycle<Self::Loop> {
        &mut self.lifecycle
    }

    /// The stats queue only if the driver accepted it.
    fn queues_needed(&self, acked_features: u64) -> usize {
        if self.features & acked_features & (1 << VIRTIO_BALLOON_F_STATS_VQ) != 0 {
            3
        } else {
            2
        }
    }

    /// The worker's loop over the queues, holding the stats buffer of a
    /// restored device (a new driver's holds none); the host's control
    /// learns that a driver runs the device.
    fn serve(
        &mut self,
        queues: ActiveQueues,
        restoring: Option<&DeviceState>,
    ) -> Result<Self::Loop, ActivateError> {
        let ActiveQueues {
            memory,
            interrupt,
            queues,
            ..
        } = queues;
        let got = queues.len();
        let mut queues = queues.into_iter();
        let (Some(inflate), Some(deflate)) = (queues.next(), queues.next()) else {
            return Err(ActivateError::QueueCount { got, needed: 2 });
        };
        let stats = queues.next();
        let held_stats = match restoring {
            Some(DeviceState::Balloon(saved)) => saved.held_stats,
            _ => None,
        };

        let mut fds = vec![
            inflate.kick.as_raw_fd(),
            deflate.kick.as_raw_fd(),
            self.control.wake.as_raw_fd(),
        ];
        if let Some(stats) = &stats {
            fds.push(stats.kick.as_raw_fd());
        }
        let memory_bytes = memory.iter().map(|r| r.len()).sum();
        let stats_negotiated = stats.is_some();
        let handler = BalloonHandler {
            memory,
            interrupt: interrupt.clone(),
            control: self.control.clone(),
            inflate,
            deflate,
            held_stats: held_stats.filter(|_| stats.is_some()),
            stats,
            pfns: Vec::new(),
        };
        // Forget a stale wake-up from before.
        let _ = self.control.wake.read();
        let body = EpollLoop::new(&fds, handler)?;
        let mut state = self.control.lock();
        state.interrupt = Some(interrupt);
        state.memory_bytes = Some(memory_bytes);
        state.stats_negotiated = stats_negotiated;
        state.stats_requested = false;
        Ok(body)
    }

    fn check_state(
        &self,
        state: &DeviceState,
        activation: Option<&Activation>,
    ) -> Result<(), StateError> {
        let DeviceState::Balloon(saved) = state else {
            return Err(state.wrong_kind("balloon"));
        };
        if saved.features != self.features {
            return Err(StateError::Mismatch(
                "the balloon had other features (stats, deflate_on_oom); give --balloon the same options"
                    .into(),
            ));
        }
        if let (Some(activation), Some(head)) = (activation, saved.held_stats) {
            let size = activation
                .queues
                .iter()
                .find(|q| q.index == STATS)
                .map(|q| q.queue.size());
            if size.is_none_or(|size| head >= size) {
                return Err(StateError::Invalid(format!(
                    "held stats buffer {head} is not in the stats queue"
                )));
            }
        }
        Ok(())
    }

    /// The host's target stands (the guest may be moving towards it), and
    /// so does what the guest last reported.
    fn apply_state(&mut self, state: &DeviceState) {
        let DeviceState::Balloon(saved) = state else {
            return;
        };
        let mut control = self.control.lock();
        control.num_pages = saved.num_pages;
        control.actual = saved.actual;
        control.counters = BalloonCounters {
            inflated_pages: saved.inflated_pages,
            deflated_pages: saved.deflated_pages,
            invalid_pfns: saved.invalid_pfns,
            discard_errors: saved.discard_errors,
        };
    }

    /// The driver is gone: no configuration interrupts, no statistics, no
    /// balloon (the stats buffer went with the worker).
    fn on_reset(&mut self) {
        let mut state = self.control.lock();
        state.interrupt = None;
        state.actual = 0;
        state.stats_negotiated = false;
        state.stats_requested = false;
    }
}

/// Each buffer is handled whole on the worker thread (pages are discarded
/// before it is returned): nothing is in flight once it is parked.
impl QueueLoop for EpollLoop<BalloonHandler> {
    fn positions(&self) -> Vec<QueuePosition> {
        let handler = self.handler();
        let mut positions = vec![
            QueuePosition::of(handler.inflate.index, &handler.inflate.queue),
            QueuePosition::of(handler.deflate.index, &handler.deflate.queue),
        ];
        if let Some(stats) = &handler.stats {
            positions.push(QueuePosition::of(stats.index, &stats.queue));
        }
        positions
    }
}

const TOKEN_INFLATE: usize = 0;
const TOKEN_DEFLATE: usize = 1;
const TOKEN_WAKE: usize = 2;
const TOKEN_STATS: usize = 3;

pub(crate) struct BalloonHandler {
    memory: GuestMemoryMmap,
    interrupt: Arc<dyn VirtioInterrupt>,
    control: Arc<BalloonControl>,
    inflate: QueueEvents,
    deflate: QueueEvents,
    stats: Option<QueueEvents>,
    /// The stats buffer the device holds (its head index).
    held_stats: Option<u16>,
    pfns: Vec<u32>,
}

impl WorkerHandler for BalloonHandler {
    fn handle(&mut self, token: usize, _events: EventSet) {
        match token {
            TOKEN_INFLATE => {
                let _ = self.inflate.kick.read();
                self.process_pfn_queue(true);
            }
            TOKEN_DEFLATE => {
                let _ = self.deflate.kick.read();
                self.process_pfn_queue(false);
            }
            TOKEN_WAKE => {
                let _ = self.control.wake.read();
                self.return_stats_buffer();
            }
            TOKEN_STATS => {
                if let Some(stats) = &self.stats {
                    let _ = stats.kick.read();
                }
                self.process_stats_queue();
            }
            _ => {}
        }
    }
}

/// Reads up to `max` little-endian u32s from the chain's readable buffers.
fn read_pfns(
    memory: &GuestMemoryMmap,
    chain: DescriptorChain<&GuestMemoryMmap>,
    max: usize,
    out: &mut Vec<u32>,
) -> Result<(), virtio_queue::Error> {
    out.clear();
    let mut reader = chain.reader(memory)?;
    let count = (reader.available_bytes() / 4).min(max);
    let mut chunk = [0u8; 4096];
    let mut left = count * 4;
    while left > 0 {
        let n = left.min(chunk.len());
        if reader.read_exact(&mut chunk[..n]).is_err() {
            break;
        }
        out.extend(
            chunk[..n]
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        left -= n;
    }
    Ok(())
}

impl BalloonHandler {
    fn process_pfn_queue(&mut self, inflate: bool) {
        let memory = &self.memory;
        let q = if inflate {
            &mut self.inflate
        } else {
            &mut self.deflate
        };
        let name = if inflate { "inflate" } else { "deflate" };
        let mut used = false;
        // Rounds in a row that took nothing although the driver's index
        // says there is more: a broken ring, not worth spinning on.
        let mut idle_rounds = 0u32;
        loop {
            let before = q.queue.next_avail();
            if let Err(e) = q.queue.disable_notification(memory) {
                tracing::warn!("virtio-balloon: {name} queue is broken: {e}");
                break;
            }
            while let Some(chain) = q.queue.pop_descriptor_chain(memory) {
                let head = chain.head_index();
                match read_pfns(memory, chain, MAX_PFNS_PER_BUFFER, &mut self.pfns) {
                    Ok(()) => {
                        if inflate {
                            let (invalid, errors) = discard_pfns(memory, &self.pfns);
                            let mut state = self.control.lock();
                            state.counters.inflated_pages += self.pfns.len() as u64;
                            state.counters.invalid_pfns += invalid;
                            state.counters.discard_errors += errors;
                        } else {
                            self.control.lock().counters.deflated_pages += self.pfns.len() as u64;
                        }
                    }
                    Err(e) => tracing::debug!("virtio-balloon: bad {name} chain: {e}"),
                }
                match q.queue.add_used(memory, head, 0) {
                    Ok(()) => used = true,
                    Err(e) => {
                        tracing::warn!("virtio-balloon: cannot return {name} buffer {head}: {e}")
                    }
                }
            }
            if q.queue.next_avail() == before {
                idle_rounds += 1;
            } else {
                idle_rounds = 0;
            }
            match q.queue.enable_notification(memory) {
                Ok(true) if idle_rounds < 2 => continue,
                Ok(true) => {
                    tracing::warn!("virtio-balloon: the available ring index is broken");
                    break;
                }
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!("virtio-balloon: {name} queue is broken: {e}");
                    break;
                }
            }
        }
        if used && q.queue.needs_notification(memory).unwrap_or(true) {
            self.interrupt.notify_queue(q.index);
        }
    }

    /// Takes the stats buffers the guest made available: reads each and
    /// keeps the last one (an earlier one still held is returned).
    fn process_stats_queue(&mut self) {
        let memory = &self.memory;
        let Some(q) = self.stats.as_mut() else {
            return;
        };
        let mut used = false;
        while let Some(chain) = q.queue.pop_descriptor_chain(memory) {
            let head = chain.head_index();
            if head >= q.queue.size() {
                tracing::warn!("virtio-balloon: stats buffer {head} is not in the table");
                continue;
            }
            match chain.reader(memory) {
                Ok(mut reader) => {
                    let n = reader.available_bytes().min(MAX_STATS * 10);
                    let mut bytes = vec![0u8; n];
                    match reader.read_exact(&mut bytes) {
                        Ok(()) => self.control.stats_received(BalloonStats::parse(&bytes)),
                        Err(e) => tracing::debug!("virtio-balloon: bad stats buffer: {e}"),
                    }
                }
                Err(e) => tracing::debug!("virtio-balloon: bad stats chain: {e}"),
            }
            if let Some(old) = self.held_stats.replace(head) {
                if q.queue.add_used(memory, old, 0).is_ok() {
                    used = true;
                }
            }
        }
        if let Err(e) = q.queue.enable_notification(memory) {
            tracing::warn!("virtio-balloon: stats queue is broken: {e}");
        }
        if used && q.queue.needs_notification(memory).unwrap_or(true) {
            self.interrupt.notify_queue(STATS);
        }
    }

    /// Gives the held stats buffer back to the guest if the host asked for
    /// fresh statistics; the guest answers with a new buffer.
    fn return_stats_buffer(&mut self) {
        let requested = std::mem::take(&mut self.control.lock().stats_requested);
        if !requested {
            return;
        }
        let (Some(q), Some(head)) = (self.stats.as_mut(), self.held_stats.take()) else {
            return;
        };
        let memory = &self.memory;
        match q.queue.add_used(memory, head, 0) {
            Ok(()) => {
                if q.queue.needs_notification(memory).unwrap_or(true) {
                    self.interrupt.notify_queue(q.index);
                }
            }
            Err(e) => tracing::warn!("virtio-balloon: cannot return the stats buffer: {e}"),
        }
    }
}

/// Gives back to the host the memory behind the 4 KiB guest pages `pfns`,
/// merging runs of consecutive frames. Frames outside guest RAM are
/// skipped. Returns (invalid frames, frames that could not be discarded).
pub(super) fn discard_pfns(memory: &GuestMemoryMmap, pfns: &[u32]) -> (u64, u64) {
    let mut invalid = 0;
    let mut errors = 0;
    let mut i = 0;
    while i < pfns.len() {
        let start = pfns[i];
        let mut count: u64 = 1;
        while i + (count as usize) < pfns.len()
            && u64::from(pfns[i + count as usize]) == u64::from(start) + count
        {
            count += 1;
        }
        i += count as usize;
        let (bad, failed) = discard_range(memory, u64::from(start) << BALLOON_PAGE_SHIFT, count);
        invalid += bad;
        errors += failed;
    }
    (invalid, errors)
}

/// Discards `pages` 4 KiB pages from guest address `gpa`, region by region.
fn discard_range(memory: &GuestMemoryMmap, mut gpa: u64, mut pages: u64) -> (u64, u64) {
    let mut invalid = 0;
    let mut errors = 0;
    while pages > 0 {
        let Some((region, offset)) = memory.to_region_addr(GuestAddress(gpa)) else {
            invalid += 1;
            gpa += BALLOON_PAGE_SIZE;
            pages -= 1;
            continue;
        };
        let in_region = (region.len() - offset.raw_value()) / BALLOON_PAGE_SIZE;
        if in_region == 0 {
            // The page runs past the end of the region.
            invalid += 1;
            gpa += BALLOON_PAGE_SIZE;
            pages -= 1;
            continue;
        }
        let n = pages.min(in_region);
        let len = n * BALLOON_PAGE_SIZE;
        let advice = if region.flags() & libc::MAP_SHARED != 0 {
            // Frees the shared memory (memfd, shmem) behind the mapping.
            libc::MADV_REMOVE
        } else {
            libc::MADV_DONTNEED
        };
        let ok = match region.get_host_address(offset) {
            Ok(host) if region.is_hugetlbfs() != Some(true) => {
                // SAFETY: [host, host + len) lies inside this region's
                // mapping (offset + len <= region.len()), which stays
                // mapped while `memory` is alive. Discarding only replaces
                // the contents of guest pages with zeros; the VMM reaches
                // guest memory through volatile accesses only, so no Rust
                // reference's invariants depend on those contents.
                let ret = unsafe { libc::madvise(host.cast(), len as usize, advice) };
                if ret != 0 {
                    tracing::warn!(
                        "virtio-balloon: madvise of {len:#x} bytes at guest {gpa:#x} failed: {}",
                        std::io::Error::last_os_error()
                    );
                }
                ret == 0
            }
            _ => false,
        };
        if !ok {
            errors += n;
        }
        gpa += len;
        pages -= n;
    }
    (invalid, errors)
}
