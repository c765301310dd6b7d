//! The input device and its queue worker.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use virtio_queue::QueueT;
use vmm_sys_util::epoll::EventSet;

use super::config::{Profile, CONFIG_SIZE};
use super::control::InputControl;
use super::{InputConfig, InputEvent, InputKind, VIRTIO_ID_INPUT};
use crate::virtio::device::{ActivateError, QueueEvents, VirtioDevice, VirtioInterrupt};
use crate::virtio::worker::{spawn_worker, Worker, WorkerHandler};
use crate::GuestMemoryMmap;

/// The size of each queue.
pub const QUEUE_SIZE: u16 = 64;
const QUEUE_SIZES: [u16; 2] = [QUEUE_SIZE, QUEUE_SIZE];
const EVENTQ: u16 = 0;
const STATUSQ: u16 = 1;
/// The most status events read from one buffer.
const MAX_STATUS_EVENTS: usize = 64;

/// A virtio keyboard or tablet.
pub struct Input {
    id: String,
    profile: Profile,
    select: u8,
    subsel: u8,
    control: Arc<InputControl>,
    worker: Option<Worker>,
}

impl Input {
    /// The device and the host's handle on it.
    pub fn new(config: InputConfig) -> std::io::Result<(Input, Arc<InputControl>)> {
        let id = config
            .id
            .unwrap_or_else(|| format!("{}0", config.kind.name()));
        let abs_max = match config.kind {
            InputKind::Keyboard => (0, 0),
            InputKind::Tablet => (
                config.width.saturating_sub(1),
                config.height.saturating_sub(1),
            ),
        };
        let control = Arc::new(InputControl::new(config.kind, abs_max)?);
        let profile = Profile {
            kind: config.kind,
            name: format!("hakoniwa virtio {}", config.kind.name()),
            serial: id.clone(),
            abs_max,
        };
        let input = Input {
            id,
            profile,
            select: 0,
            subsel: 0,
            control: control.clone(),
            worker: None,
        };
        Ok((input, control))
    }

    /// Parses `--input` options and builds the device; errors are one line.
    pub fn from_options(text: &str) -> Result<(Input, Arc<InputControl>), String> {
        let config = InputConfig::parse(text).map_err(|e| e.to_string())?;
        Input::new(config).map_err(|e| format!("cannot create the input device: {e}"))
    }

    /// Another handle on the device's control.
    pub fn control(&self) -> Arc<InputControl> {
        self.control.clone()
    }
}

impl VirtioDevice for Input {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_INPUT
    }

    fn id(&self) -> &str {
        &self.id
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn device_features(&self) -> u64 {
        crate::virtio::COMMON_FEATURES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= CONFIG_SIZE as u64 {
            return;
        }
        let space = self.profile.space(self.select, self.subsel);
        let start = offset as usize;
        let n = data.len().min(CONFIG_SIZE - start);
        data[..n].copy_from_slice(&space[start..start + n]);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // Only `select` (byte 0) and `subsel` (byte 1) are writable.
        for (i, byte) in data.iter().enumerate() {
            match offset.checked_add(i as u64) {
                Some(0) => self.select = *byte,
                Some(1) => self.subsel = *byte,
                _ => {}
            }
        }
    }

    fn activate(
        &mut self,
        memory: GuestMemoryMmap,
        interrupt: Arc<dyn VirtioInterrupt>,
        queues: Vec<QueueEvents>,
        _acked_features: u64,
    ) -> Result<(), ActivateError> {
        self.reset();
        let got = queues.len();
        let mut slots: [Option<QueueEvents>; 2] = [None, None];
        for q in queues {
            let index = q.index;
            if !q.queue.is_valid(&memory) {
                return Err(ActivateError::InvalidQueue(index));
            }
            match slots.get_mut(usize::from(index)) {
                Some(slot) => *slot = Some(q),
                None => return Err(ActivateError::InvalidQueue(index)),
            }
        }
        let [Some(eventq), Some(statusq)] = slots else {
            return Err(ActivateError::QueueCount {
                got,
                needed: QUEUE_SIZES.len(),
            });
        };
        let fds = vec![
            eventq.kick.as_raw_fd(),
            statusq.kick.as_raw_fd(),
            self.control.wake.as_raw_fd(),
        ];
        {
            let mut state = self.control.lock();
            state.pending.clear();
            state.active = true;
        }
        let _ = self.control.wake.read();
        let handler = InputHandler {
            memory,
            interrupt,
            control: self.control.clone(),
            eventq,
            statusq,
        };
        match spawn_worker(format!("{}-virtio", self.id), fds, handler) {
            Ok(worker) => {
                self.worker = Some(worker);
                Ok(())
            }
            Err(e) => {
                self.control.lock().active = false;
                Err(ActivateError::Worker(e.to_string()))
            }
        }
    }

    fn reset(&mut self) {
        self.worker = None;
        let mut state = self.control.lock();
        state.active = false;
        state.pending.clear();
        state.leds = 0;
    }
}

const TOKEN_EVENTQ: usize = 0;
const TOKEN_STATUSQ: usize = 1;
const TOKEN_WAKE: usize = 2;

struct InputHandler {
    memory: GuestMemoryMmap,
    interrupt: Arc<dyn VirtioInterrupt>,
    control: Arc<InputControl>,
    eventq: QueueEvents,
    statusq: QueueEvents,
}

impl WorkerHandler for InputHandler {
    fn handle(&mut self, token: usize, _events: EventSet) {
        match token {
            TOKEN_EVENTQ => {
                let _ = self.eventq.kick.read();
                self.deliver();
            }
            TOKEN_WAKE => {
                let _ = self.control.wake.read();
                self.deliver();
            }
            TOKEN_STATUSQ => {
                let _ = self.statusq.kick.read();
                self.process_status();
            }
            _ => {}
        }
    }
}

impl InputHandler {
    /// Writes pending events into the buffers the guest posted, one event
    /// per buffer, in order. Events stay pending when buffers run out; the
    /// guest's next kick brings more.
    fn deliver(&mut self) {
        let memory = &self.memory;
        let q = &mut self.eventq.queue;
        let mut used = false;
        // Rounds in a row that took nothing although the driver's index
        // says there is more: a broken ring, not worth spinning on.
        let mut idle_rounds = 0u32;
        loop {
            let before = q.next_avail();
            {
                let mut state = self.control.lock();
                while let Some(event) = state.pending.front().copied() {
                    let Some(chain) = q.pop_descriptor_chain(memory) else {
                        break;
                    };
                    let head = chain.head_index();
                    let written = match chain.writer(memory) {
                        Ok(mut w) if w.available_bytes() >= InputEvent::SIZE => {
                            w.write_all(&event.to_bytes()).is_ok()
                        }
                        _ => false,
                    };
                    let len = if written {
                        state.pending.pop_front();
                        state.delivered += 1;
                        InputEvent::SIZE as u32
                    } else {
                        // A buffer that cannot hold an event: return it
                        // empty, keep the event for the next one.
                        tracing::debug!("virtio-input: event buffer {head} is not usable");
                        0
                    };
                    match q.add_used(memory, head, len) {
                        Ok(()) => used = true,
                        Err(e) => {
                            tracing::warn!("virtio-input: cannot return buffer {head}: {e}")
                        }
                    }
                }
                if state.pending.is_empty() {
                    break;
                }
            }
            // Out of buffers with events left: ask for a kick when the
            // guest posts more, unless it already did.
            if q.next_avail() == before {
                idle_rounds += 1;
            } else {
                idle_rounds = 0;
            }
            match q.enable_notification(memory) {
                Ok(true) if idle_rounds < 2 => continue,
                Ok(true) => {
                    tracing::warn!("virtio-input: the available ring index is broken");
                    break;
                }
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!("virtio-input: event queue is broken: {e}");
                    break;
                }
            }
        }
        if used && q.needs_notification(memory).unwrap_or(true) {
            self.interrupt.notify_queue(EVENTQ);
        }
    }

    /// Consumes what the guest sent (LED changes) and returns the buffers.
    fn process_status(&mut self) {
        let memory = &self.memory;
        let q = &mut self.statusq.queue;
        let mut used = false;
        // Rounds in a row that took nothing although the driver's index
        // says there is more: a broken ring, not worth spinning on.
        let mut idle_rounds = 0u32;
        loop {
            let before = q.next_avail();
            if let Err(e) = q.disable_notification(memory) {
                tracing::warn!("virtio-input: status queue is broken: {e}");
                break;
            }
            while let Some(chain) = q.pop_descriptor_chain(memory) {
                let head = chain.head_index();
                if let Ok(mut reader) = chain.reader(memory) {
                    let count =
                        (reader.available_bytes() / InputEvent::SIZE).min(MAX_STATUS_EVENTS);
                    for _ in 0..count {
                        let mut bytes = [0u8; InputEvent::SIZE];
                        if reader.read_exact(&mut bytes).is_err() {
                            break;
                        }
                        self.control.status_event(InputEvent::from_bytes(bytes));
                    }
                }
                match q.add_used(memory, head, 0) {
                    Ok(()) => used = true,
                    Err(e) => tracing::warn!("virtio-input: cannot return buffer {head}: {e}"),
                }
            }
            if q.next_avail() == before {
                idle_rounds += 1;
            } else {
                idle_rounds = 0;
            }
            match q.enable_notification(memory) {
                Ok(true) if idle_rounds < 2 => continue,
                Ok(true) => {
                    tracing::warn!("virtio-input: the available ring index is broken");
                    break;
                }
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!("virtio-input: status queue is broken: {e}");
                    break;
                }
            }
        }
        if used && q.needs_notification(memory).unwrap_or(true) {
            self.interrupt.notify_queue(STATUSQ);
        }
    }
}
