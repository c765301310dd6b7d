//! The vsock worker thread: moves packets between the queues and the muxer.
//!
//! One epoll set holds the stop eventfd, the three kick eventfds and the
//! muxer's fds (listener and host streams, which come and go). After each
//! wake-up: guest packets (tx) go to the muxer, then packets for the guest
//! fill rx buffers while there are both. If too many control packets wait
//! for rx buffers, tx is left alone until the guest gives some.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vmm_sys_util::epoll::{ControlOperation, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::muxer::VsockMuxer;
use super::packet::{VsockHeader, HDR_LEN, MAX_PKT_PAYLOAD};
use super::{EVENT_QUEUE, RX_QUEUE, TX_QUEUE};
use crate::virtio::lifecycle::QueueLoop;
use crate::virtio::worker::WorkerLoop;
use crate::virtio::{QueueEvents, QueuePosition, VirtioInterrupt};
use crate::GuestMemoryMmap;

const STOP: u64 = 0;
const RX_KICK: u64 = 1;
const TX_KICK: u64 = 2;
const EVENT_KICK: u64 = 3;
/// `virtio_vsock_event.id` of a transport reset: the guest drops every
/// connection and reads the CID again.
const VIRTIO_VSOCK_EVENT_TRANSPORT_RESET: u32 = 0;

pub(crate) struct VsockHandler {
    mem: GuestMemoryMmap,
    interrupt: Arc<dyn VirtioInterrupt>,
    rxq: Queue,
    rx_kick: EventFd,
    txq: Queue,
    tx_kick: EventFd,
    /// The event queue: only used for the TRANSPORT_RESET a restored
    /// device sends.
    evq: Queue,
    ev_kick: EventFd,
    /// A restored device owes the guest a TRANSPORT_RESET: its connections
    /// were to host sockets this VMM does not have.
    transport_reset_pending: bool,
    muxer: VsockMuxer,
    /// tx was left because the rx backlog is full.
    tx_deferred: bool,
    tx_buf: Vec<u8>,
}

impl VsockHandler {
    pub(super) fn new(
        mem: GuestMemoryMmap,
        interrupt: Arc<dyn VirtioInterrupt>,
        rx: QueueEvents,
        tx: QueueEvents,
        ev: QueueEvents,
        muxer: VsockMuxer,
    ) -> VsockHandler {
        VsockHandler {
            mem,
            interrupt,
            rxq: rx.queue,
            rx_kick: rx.kick,
            txq: tx.queue,
            tx_kick: tx.kick,
            evq: ev.queue,
            ev_kick: ev.kick,
            transport_reset_pending: false,
            muxer,
            tx_deferred: false,
            tx_buf: vec![0; MAX_PKT_PAYLOAD],
        }
    }

    /// The muxer, for the fuzz target's host turns.
    pub(super) fn muxer(&mut self) -> &mut VsockMuxer {
        &mut self.muxer
    }

    /// Sends a TRANSPORT_RESET event on the first run (a restored device).
    pub(super) fn owe_transport_reset(&mut self) {
        self.transport_reset_pending = true;
    }

    /// Whether the TRANSPORT_RESET is still to be sent.
    pub(super) fn owes_transport_reset(&self) -> bool {
        self.transport_reset_pending
    }

    /// Tells the guest, in a buffer of the event queue, that the transport
    /// was reset; without a buffer, waits for the guest to post one.
    pub(super) fn send_transport_reset(&mut self) {
        if !self.transport_reset_pending {
            return;
        }
        let Some(chain) = self.evq.pop_descriptor_chain(&self.mem) else {
            if let Err(e) = self.evq.enable_notification(&self.mem) {
                tracing::warn!("vsock event queue: {e}");
            }
            return;
        };
        let head = chain.head_index();
        let written = chain
            .writer(&self.mem)
            .ok()
            .filter(|w| w.available_bytes() >= 4)
            .map(|mut w| {
                w.write_all(&VIRTIO_VSOCK_EVENT_TRANSPORT_RESET.to_le_bytes())
                    .is_ok()
            })
            .unwrap_or(false);
        if !written {
            tracing::warn!("vsock event queue: buffer {head} cannot hold an event");
        }
        if let Err(e) = self
            .evq
            .add_used(&self.mem, head, if written { 4 } else { 0 })
        {
            tracing::warn!("vsock event queue: add_used: {e}");
        }
        // A buffer too small is given back; the next one is tried when the
        // guest posts it.
        self.transport_reset_pending = !written;
        notify(&mut self.evq, &self.mem, &*self.interrupt, EVENT_QUEUE);
    }

    /// Hands every guest packet on tx to the muxer.
    pub(super) fn process_tx(&mut self) {
        self.tx_deferred = false;
        let mut used = 0usize;
        loop {
            if let Err(e) = self.txq.disable_notification(&self.mem) {
                tracing::warn!("vsock tx: cannot disable notifications: {e}");
            }
            let mut popped = 0usize;
            while !self.muxer.rx_backlog_full() {
                let Some(chain) = self.txq.pop_descriptor_chain(&self.mem) else {
                    break;
                };
                popped += 1;
                let head = chain.head_index();
                match chain.reader(&self.mem) {
                    Ok(mut reader) => handle_packet(&mut self.muxer, &mut self.tx_buf, &mut reader),
                    Err(_) => {
                        tracing::debug!("vsock tx: chain {head} outside guest memory");
                        self.muxer.count_dropped();
                    }
                }
                if let Err(e) = self.txq.add_used(&self.mem, head, 0) {
                    tracing::warn!("vsock tx: add_used: {e}");
                } else {
                    used += 1;
                }
            }
            if self.muxer.rx_backlog_full() {
                // Resumed once rx drains (notifications stay off).
                self.tx_deferred = true;
                break;
            }
            match self.txq.enable_notification(&self.mem) {
                Ok(true) if popped > 0 => continue,
                _ => break,
            }
        }
        if used > 0 {
            notify(&mut self.txq, &self.mem, &*self.interrupt, TX_QUEUE);
        }
    }

    /// Fills rx buffers with packets for the guest.
    pub(super) fn process_rx(&mut self) {
        let mut used = false;
        let mut retried = false;
        while self.muxer.has_rx() {
            let Some(chain) = self.rxq.pop_descriptor_chain(&self.mem) else {
                // Ask for a kick when buffers come; look once more first.
                match self.rxq.enable_notification(&self.mem) {
                    Ok(true) if !retried => {
                        retried = true;
                        continue;
                    }
                    _ => break,
                }
            };
            let head = chain.head_index();
            let writer = if chain.clone().readable().next().is_some() {
                None
            } else {
                chain.writer(&self.mem).ok()
            };
            let Some(mut writer) = writer.filter(|w| w.available_bytes() >= HDR_LEN) else {
                tracing::debug!("vsock rx: malformed rx chain {head}");
                let _ = self.rxq.add_used(&self.mem, head, 0);
                used = true;
                continue;
            };
            let room = writer.available_bytes() - HDR_LEN;
            match self.muxer.next_rx(room) {
                Some((hdr, payload)) => {
                    let ok = writer.write_all(&hdr.to_bytes()).is_ok()
                        && writer.write_all(payload).is_ok();
                    if !ok {
                        tracing::warn!("vsock rx: writing chain {head} failed");
                    }
                    let len = (HDR_LEN + payload.len()) as u32;
                    if let Err(e) = self.rxq.add_used(&self.mem, head, len) {
                        tracing::warn!("vsock rx: add_used: {e}");
                    }
                    used = true;
                }
                None => {
                    self.rxq.go_to_previous_position();
                    break;
                }
            }
        }
        if used {
            notify(&mut self.rxq, &self.mem, &*self.interrupt, RX_QUEUE);
        }
    }

    fn serve(&mut self, stop: &EventFd) {
        let mut events = vec![EpollEvent::default(); 64];
        self.send_transport_reset();
        self.process_tx();
        self.process_rx();
        loop {
            let timeout = match self.muxer.next_deadline() {
                None => -1,
                Some(d) => {
                    let ms = d.saturating_duration_since(Instant::now()).as_millis() + 1;
                    ms.min(i32::MAX as u128) as i32
                }
            };
            let ready = match self.muxer.epoll().wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("vsock worker: epoll failed: {e}");
                    return;
                }
            };
            let mut tx = false;
            // The host streams are edge-triggered: every event of the batch
            // is handled even when told to stop, or its edge would be lost.
            let mut stopping = false;
            for event in &events[..ready] {
                match event.data() {
                    STOP => {
                        let _ = stop.read();
                        stopping = true;
                    }
                    RX_KICK => {
                        let _ = self.rx_kick.read();
                    }
                    TX_KICK => {
                        let _ = self.tx_kick.read();
                        tx = true;
                    }
                    EVENT_KICK => {
                        let _ = self.ev_kick.read();
                        self.send_transport_reset();
                    }
                    token => self.muxer.handle_event(token, event.event_set()),
                }
            }
            self.muxer.expire(Instant::now());
            if tx || self.tx_deferred {
                self.process_tx();
            }
            self.process_rx();
            // rx may have made room for deferred tx, which may queue more rx.
            while self.tx_deferred && !self.muxer.rx_backlog_full() {
                self.process_tx();
                self.process_rx();
            }
            if stopping {
                return;
            }
        }
    }
}

/// Reads one guest packet (header, then `len` payload bytes) and gives it
/// to the muxer; malformed ones are dropped (and their connection reset).
pub(super) fn handle_packet<R: Read + ReaderLen>(
    muxer: &mut VsockMuxer,
    buf: &mut [u8],
    reader: &mut R,
) {
    let mut raw = [0u8; HDR_LEN];
    if reader.remaining() < HDR_LEN || reader.read_exact(&mut raw).is_err() {
        tracing::debug!("vsock tx: packet shorter than its header");
        muxer.count_dropped();
        return;
    }
    let hdr = VsockHeader::from_bytes(&raw);
    let len = hdr.len as usize;
    if len > MAX_PKT_PAYLOAD || len > reader.remaining() || len > buf.len() {
        tracing::debug!("vsock tx: len {len} beyond the packet");
        muxer.reset_from_guest(&hdr);
        return;
    }
    if reader.read_exact(&mut buf[..len]).is_err() {
        muxer.reset_from_guest(&hdr);
        return;
    }
    muxer.send_to_host(&hdr, &buf[..len]);
}

fn notify(q: &mut Queue, mem: &GuestMemoryMmap, interrupt: &dyn VirtioInterrupt, index: u16) {
    match q.needs_notification(mem) {
        Ok(false) => {}
        Ok(true) => interrupt.notify_queue(index),
        Err(e) => {
            tracing::warn!("vsock: needs_notification: {e}");
            interrupt.notify_queue(index);
        }
    }
}

/// What is left to read of a descriptor chain.
pub(super) trait ReaderLen {
    fn remaining(&self) -> usize;
}

impl<B: vm_memory::bitmap::BitmapSlice> ReaderLen for virtio_queue::Reader<'_, B> {
    fn remaining(&self) -> usize {
        self.available_bytes()
    }
}

impl WorkerLoop for VsockHandler {
    fn prepare(&mut self, stop: &EventFd) -> io::Result<()> {
        let epoll = self.muxer.epoll();
        let add = |fd, token| {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
        };
        add(stop.as_raw_fd(), STOP)?;
        add(self.rx_kick.as_raw_fd(), RX_KICK)?;
        add(self.tx_kick.as_raw_fd(), TX_KICK)?;
        add(self.ev_kick.as_raw_fd(), EVENT_KICK)
    }

    fn run(&mut self, stop: &EventFd) {
        self.serve(stop);
    }
}

/// Packets are moved whole on the worker thread; host connections stay
/// open (their data waits in the sockets) while it is parked.
impl QueueLoop for VsockHandler {
    fn positions(&self) -> Vec<QueuePosition> {
        vec![
            QueuePosition::of(RX_QUEUE, &self.rxq),
            QueuePosition::of(TX_QUEUE, &self.txq),
            QueuePosition::of(EVENT_QUEUE, &self.evq),
        ]
    }
}
