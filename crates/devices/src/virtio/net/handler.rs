//! The net device's worker: moves frames between the queues and the back
//! end on its own thread.
//!
//! The thread waits (epoll) on the rx and tx kicks, the back end's fd
//! (edge-triggered: readiness is remembered in `backend_readable`) and a
//! stop eventfd. A frame read from the back end while the guest has no rx
//! buffer is kept (`pending`) and the back end is not read again until the
//! guest kicks rx: no busy loop and no frame lost to a full ring.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::{NetBackend, NetMetrics, MAX_FRAME_LEN, NET_HDR_LEN, NUM_BUFFERS_OFFSET};
use super::{RX_QUEUE, TX_QUEUE};
use crate::virtio::worker::WorkerLoop;
use crate::virtio::{QueueEvents, QueuePosition, VirtioInterrupt};
use crate::GuestMemoryMmap;

const STOP: u64 = 0;
const RX_KICK: u64 = 1;
const TX_KICK: u64 = 2;
const BACKEND: u64 = 3;

/// Frames moved per direction before the loop looks at other events.
const BUDGET: usize = 256;

/// What became of one frame offered to the rx queue.
enum Rx {
    Delivered,
    Dropped,
    NoBuffers,
}

/// The queue state and buffers the worker thread owns.
pub(crate) struct NetHandler {
    mem: GuestMemoryMmap,
    interrupt: Arc<dyn VirtioInterrupt>,
    rx: Queue,
    rx_kick: EventFd,
    tx: Queue,
    tx_kick: EventFd,
    backend: Arc<dyn NetBackend>,
    mrg_rxbuf: bool,
    metrics: Arc<NetMetrics>,
    /// A frame read from the back end (`pending` bytes long, 0 = none).
    frame: Vec<u8>,
    pending: usize,
    /// The back end may have frames to read (edge-triggered readiness).
    backend_readable: bool,
    /// The guest had no rx buffer; wait for an rx kick.
    rx_stalled: bool,
    /// tx stopped at its budget with chains left.
    tx_more: bool,
    tx_buf: Vec<u8>,
    /// A frame to send before anything else when the loop next runs.
    announcement: Option<Vec<u8>>,
}

impl NetHandler {
    pub(super) fn new(
        mem: GuestMemoryMmap,
        interrupt: Arc<dyn VirtioInterrupt>,
        rx: QueueEvents,
        tx: QueueEvents,
        backend: Arc<dyn NetBackend>,
        mrg_rxbuf: bool,
        metrics: Arc<NetMetrics>,
    ) -> NetHandler {
        NetHandler {
            mem,
            interrupt,
            rx: rx.queue,
            rx_kick: rx.kick,
            tx: tx.queue,
            tx_kick: tx.kick,
            backend,
            mrg_rxbuf,
            metrics,
            frame: vec![0; MAX_FRAME_LEN],
            pending: 0,
            backend_readable: true,
            rx_stalled: false,
            tx_more: false,
            tx_buf: vec![0; MAX_FRAME_LEN],
            announcement: None,
        }
    }

    /// Sends `frame` to the back end first thing when the loop runs.
    pub(super) fn announce(&mut self, frame: Vec<u8>) {
        self.announcement = Some(frame);
    }

    /// Whether rx work is waiting that does not need a new event.
    fn wants_rx(&self) -> bool {
        !self.rx_stalled && (self.pending > 0 || self.backend_readable)
    }

    /// Whether any work is waiting that does not need a new event.
    fn has_work(&self) -> bool {
        self.tx_more || self.wants_rx()
    }

    /// Sends every frame the guest queued on tx to the back end.
    pub(super) fn process_tx(&mut self) {
        let mut used = 0usize;
        self.tx_more = false;
        'outer: loop {
            if let Err(e) = self.tx.disable_notification(&self.mem) {
                tracing::warn!("net tx: cannot disable notifications: {e}");
            }
            let mut popped = 0usize;
            while let Some(chain) = self.tx.pop_descriptor_chain(&self.mem) {
                popped += 1;
                let head = chain.head_index();
                let ok = (|| {
                    if chain.clone().writable().next().is_some() {
                        return Err("tx chain has device-writable descriptors");
                    }
                    let mut reader = chain
                        .reader(&self.mem)
                        .map_err(|_| "tx chain is outside guest memory")?;
                    let len = reader.available_bytes();
                    if len < NET_HDR_LEN {
                        return Err("tx chain is shorter than the vnet header");
                    }
                    if len > MAX_FRAME_LEN {
                        return Err("tx frame is larger than 65562 bytes");
                    }
                    reader
                        .read_exact(&mut self.tx_buf[..len])
                        .map_err(|_| "tx chain could not be read")?;
                    Ok(len)
                })();
                match ok {
                    Ok(len) => match self.backend.write_frame(&self.tx_buf[..len]) {
                        Ok(_) => {
                            NetMetrics::add(&self.metrics.tx_frames, 1);
                            NetMetrics::add(&self.metrics.tx_bytes, (len - NET_HDR_LEN) as u64);
                        }
                        Err(e) => {
                            tracing::trace!("net tx: {}: write failed: {e}", self.backend.name());
                            NetMetrics::add(&self.metrics.tx_dropped, 1);
                        }
                    },
                    Err(why) => {
                        tracing::debug!("net tx: dropped: {why}");
                        NetMetrics::add(&self.metrics.tx_dropped, 1);
                    }
                }
                if let Err(e) = self.tx.add_used(&self.mem, head, 0) {
                    tracing::warn!("net tx: add_used: {e}");
                } else {
                    used += 1;
                }
                if used >= BUDGET {
                    // Let rx run; come back without waiting for a kick
                    // (notifications stay off meanwhile).
                    self.tx_more = true;
                    break 'outer;
                }
            }
            match self.tx.enable_notification(&self.mem) {
                // More arrived while notifications were off.
                Ok(true) if popped > 0 => continue,
                _ => break,
            }
        }
        if used > 0 {
            self.notify(TX_QUEUE);
        }
    }

    /// Delivers frames from the back end while the guest has buffers.
    pub(super) fn process_rx(&mut self) {
        let mut attempts = 0usize;
        let mut used_any = false;
        let mut retried = false;
        while attempts < BUDGET && !self.rx_stalled {
            attempts += 1;
            if self.pending == 0 {
                if !self.backend_readable {
                    break;
                }
                match self.backend.read_frame(&mut self.frame) {
                    Ok(n) if n >= NET_HDR_LEN => self.pending = n,
                    Ok(_) => {
                        NetMetrics::add(&self.metrics.rx_dropped, 1);
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.backend_readable = false;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::warn!("net rx: {}: read failed: {e}", self.backend.name());
                        self.backend_readable = false;
                        break;
                    }
                }
            }
            match self.deliver(&mut used_any) {
                Rx::Delivered => {
                    NetMetrics::add(&self.metrics.rx_frames, 1);
                    NetMetrics::add(&self.metrics.rx_bytes, (self.pending - NET_HDR_LEN) as u64);
                    self.pending = 0;
                }
                Rx::Dropped => {
                    NetMetrics::add(&self.metrics.rx_dropped, 1);
                    self.pending = 0;
                }
                Rx::NoBuffers => {
                    // Ask for a kick when more buffers come; if some came
                    // while we looked, try once more before sleeping.
                    match self.notify_on_next_rx_buffer() {
                        Ok(true) if !retried => retried = true,
                        _ => self.rx_stalled = true,
                    }
                }
            }
        }
        if used_any {
            self.notify(RX_QUEUE);
        }
    }

    /// Arms the rx kick for the driver's *next* buffer.
    ///
    /// When the frame needs more merged buffers than the driver posted,
    /// `deliver` steps back over the ones it looked at, so our position is
    /// behind the driver's avail index. Plain `enable_notification` would
    /// publish that position as the EVENT_IDX avail_event, which the driver
    /// has already passed: it would never kick again and rx would stall for
    /// good. So the event is published at the driver's current index, and our
    /// position restored. Returns whether buffers arrived meanwhile.
    fn notify_on_next_rx_buffer(&mut self) -> Result<bool, virtio_queue::Error> {
        let position = self.rx.next_avail();
        let posted = self.rx.avail_idx(&self.mem, Ordering::Acquire)?;
        self.rx.set_next_avail(posted.0);
        let result = self.rx.enable_notification(&self.mem);
        self.rx.set_next_avail(position);
        result
    }

    /// Puts the pending frame into the guest's rx buffers.
    fn deliver(&mut self, used_any: &mut bool) -> Rx {
        let len = self.pending;
        let mem = &self.mem;
        // Chains taken from the ring for this frame: (head, writer).
        let mut chains = Vec::new();
        let mut room = 0usize;
        while room < len {
            let Some(chain) = self.rx.pop_descriptor_chain(mem) else {
                // Put them back: the frame waits for more buffers.
                for _ in 0..chains.len() {
                    self.rx.go_to_previous_position();
                }
                return Rx::NoBuffers;
            };
            let head = chain.head_index();
            let writer = if chain.clone().readable().next().is_some() {
                None
            } else {
                chain.writer(mem).ok()
            };
            let Some(writer) = writer else {
                // A malformed chain: give it back empty, drop the frame if
                // it was split across it.
                tracing::debug!("net rx: malformed rx chain {head}");
                let _ = self.rx.add_used(mem, head, 0);
                *used_any = true;
                if chains.is_empty() {
                    continue;
                }
                for (h, _) in chains {
                    let _ = self.rx.add_used(mem, h, 0);
                }
                return Rx::Dropped;
            };
            room += writer.available_bytes();
            chains.push((head, writer));
            if !self.mrg_rxbuf {
                break;
            }
            if chains.len() >= usize::from(self.rx.size()) {
                break;
            }
        }
        if room < len {
            // Too big for the buffers the guest gives: keep the buffers,
            // drop the frame.
            tracing::debug!("net rx: {len}-byte frame does not fit the guest's buffers");
            for _ in 0..chains.len() {
                self.rx.go_to_previous_position();
            }
            return Rx::Dropped;
        }
        let num_buffers = chains.len() as u16;
        self.frame[NUM_BUFFERS_OFFSET..NUM_BUFFERS_OFFSET + 2]
            .copy_from_slice(&num_buffers.to_le_bytes());
        let mut off = 0usize;
        for (head, mut writer) in chains {
            let n = writer.available_bytes().min(len - off);
            if writer.write_all(&self.frame[off..off + n]).is_err() {
                tracing::warn!("net rx: writing chain {head} failed");
            }
            off += n;
            if let Err(e) = self.rx.add_used(mem, head, n as u32) {
                tracing::warn!("net rx: add_used: {e}");
            }
            *used_any = true;
        }
        Rx::Delivered
    }

    fn notify(&mut self, queue: u16) {
        let q = if queue == RX_QUEUE {
            &mut self.rx
        } else {
            &mut self.tx
        };
        match q.needs_notification(&self.mem) {
            Ok(false) => {}
            Ok(true) => self.interrupt.notify_queue(queue),
            Err(e) => {
                tracing::warn!("net: needs_notification: {e}");
                self.interrupt.notify_queue(queue);
            }
        }
    }
}

/// The worker's loop: the handler and the epoll set it waits on.
pub(crate) struct NetLoop {
    epoll: Epoll,
    pub(super) handler: NetHandler,
}

impl NetLoop {
    pub(super) fn new(handler: NetHandler) -> io::Result<NetLoop> {
        let epoll = Epoll::new()?;
        let add = |fd, events, token| {
            epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))
        };
        add(handler.rx_kick.as_raw_fd(), EventSet::IN, RX_KICK)?;
        add(handler.tx_kick.as_raw_fd(), EventSet::IN, TX_KICK)?;
        add(
            handler.backend.as_raw_fd(),
            EventSet::IN | EventSet::EDGE_TRIGGERED,
            BACKEND,
        )?;
        Ok(NetLoop { epoll, handler })
    }
}

impl NetHandler {
    /// Where the rx and tx queues stand.
    pub(super) fn positions(&self) -> Vec<QueuePosition> {
        vec![
            QueuePosition::of(RX_QUEUE, &self.rx),
            QueuePosition::of(TX_QUEUE, &self.tx),
        ]
    }
}

impl WorkerLoop for NetLoop {
    fn prepare(&mut self, stop: &EventFd) -> io::Result<()> {
        self.epoll.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, STOP),
        )
    }

    fn run(&mut self, stop: &EventFd) {
        let handler = &mut self.handler;
        let mut events = vec![EpollEvent::default(); 8];
        if let Some(frame) = handler.announcement.take() {
            if let Err(e) = handler.backend.write_frame(&frame) {
                tracing::warn!(
                    "net: {}: cannot announce the guest's MAC: {e}",
                    handler.backend.name()
                );
            }
        }
        // Buffers may have been queued before we started (or while parked;
        // the back end's edge, if any came meanwhile, is still pending in
        // the epoll set).
        handler.process_tx();
        handler.process_rx();
        loop {
            let timeout = if handler.has_work() { 0 } else { -1 };
            let ready = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("net worker: epoll failed: {e}");
                    return;
                }
            };
            let mut tx = false;
            // The back end is edge-triggered: every event of the batch is
            // noted even when told to stop, or its edge would be lost.
            let mut stopping = false;
            for event in &events[..ready] {
                match event.data() {
                    STOP => {
                        let _ = stop.read();
                        stopping = true;
                    }
                    RX_KICK => {
                        let _ = handler.rx_kick.read();
                        handler.rx_stalled = false;
                    }
                    TX_KICK => {
                        let _ = handler.tx_kick.read();
                        tx = true;
                    }
                    BACKEND => handler.backend_readable = true,
                    _ => {}
                }
            }
            if stopping {
                return;
            }
            if tx || handler.tx_more {
                handler.process_tx();
            }
            if handler.wants_rx() {
                handler.process_rx();
            }
        }
    }
}
