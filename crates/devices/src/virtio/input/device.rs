//! The input device and its queue worker.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use virtio_queue::QueueT;
use vmm_sys_util::epoll::EventSet;

use super::config::{Profile, CONFIG_SIZE};
use super::control::{InputControl, EVENT_QUEUE_CAPACITY};
use super::{InputConfig, InputEvent, InputKind, VIRTIO_ID_INPUT};
use crate::virtio::device::{
    ActivateError, Activation, QueueEvents, VirtioDevice, VirtioInterrupt,
};
use crate::virtio::lifecycle::{
    self, queue_array, ActiveQueues, DeviceLifecycle, QueueDevice, QueueLoop,
};
use crate::virtio::state::{DeviceState, QueuePosition, StateError};
use crate::virtio::worker::{EpollLoop, WorkerHandler};
use crate::GuestMemoryMmap;

#[doc(hidden)]
pub mod fuzzing;

/// The size of each queue.
pub const QUEUE_SIZE: u16 = 64;
const QUEUE_SIZES: [u16; 2] = [QUEUE_SIZE, QUEUE_SIZE];
const EVENTQ: u16 = 0;
const STATUSQ: u16 = 1;
/// The most status events read from one buffer.
const MAX_STATUS_EVENTS: usize = 64;

/// What a snapshot keeps of an input device: which kind it is (its
/// configuration space follows from that), the configuration selector the
/// driver last wrote, the LEDs the guest set, and the events waiting for
/// guest buffers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputState {
    /// `keyboard` or `tablet`.
    pub kind: String,
    /// The tablet's largest ABS_X and ABS_Y.
    pub abs_max: (u32, u32),
    pub select: u8,
    pub subsel: u8,
    pub leds: u32,
    /// Events not yet delivered: (type, code, value).
    pub pending: Vec<(u16, u16, i32)>,
}

/// A virtio keyboard or tablet.
pub struct Input {
    id: String,
    profile: Profile,
    select: u8,
    subsel: u8,
    control: Arc<InputControl>,
    lifecycle: DeviceLifecycle<EpollLoop<InputHandler>>,
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
            lifecycle: DeviceLifecycle::default(),
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

    lifecycle::lifecycle_methods!();

    fn save_state(&self) -> DeviceState {
        let state = self.control.lock();
        DeviceState::Input(InputState {
            kind: self.profile.kind.name().to_string(),
            abs_max: self.profile.abs_max,
            select: self.select,
            subsel: self.subsel,
            leds: state.leds,
            pending: state
                .pending
                .iter()
                .map(|e| (e.event_type, e.code, e.value))
                .collect(),
        })
    }
}

impl QueueDevice for Input {
    type Loop = EpollLoop<InputHandler>;
    const WORKER_SUFFIX: &'static str = "virtio";

    fn lifecycle(&mut self) -> &mut DeviceLifecycle<Self::Loop> {
        &mut self.lifecycle
    }

    /// The worker's loop over the queues; from now on events wait for the
    /// guest's buffers instead of being dropped.
    fn serve(
        &mut self,
        queues: ActiveQueues,
        _restoring: Option<&DeviceState>,
    ) -> Result<Self::Loop, ActivateError> {
        let [eventq, statusq] = queue_array(queues.queues)?;
        let fds = [
            eventq.kick.as_raw_fd(),
            statusq.kick.as_raw_fd(),
            self.control.wake.as_raw_fd(),
        ];
        let handler = InputHandler {
            memory: queues.memory,
            interrupt: queues.interrupt,
            control: self.control.clone(),
            eventq,
            statusq,
        };
        let body = EpollLoop::new(&fds, handler)?;
        {
            let mut state = self.control.lock();
            state.pending.clear();
            state.active = true;
        }
        let _ = self.control.wake.read();
        Ok(body)
    }

    fn check_state(&self, state: &DeviceState, _: Option<&Activation>) -> Result<(), StateError> {
        let DeviceState::Input(saved) = state else {
            return Err(state.wrong_kind("input"));
        };
        // The driver read what the device is from the configuration space.
        if saved.kind != self.profile.kind.name() || saved.abs_max != self.profile.abs_max {
            return Err(StateError::Mismatch(format!(
                "the device was a {} with axes to {:?}, --input makes a {} with axes to {:?}",
                saved.kind,
                saved.abs_max,
                self.profile.kind.name(),
                self.profile.abs_max
            )));
        }
        if saved.pending.len() > EVENT_QUEUE_CAPACITY {
            return Err(StateError::Invalid(format!(
                "{} pending input events, at most {EVENT_QUEUE_CAPACITY} are kept",
                saved.pending.len()
            )));
        }
        Ok(())
    }

    /// The configuration selector and the LEDs; the pending events if a
    /// driver runs the device (without one they would be dropped).
    fn apply_state(&mut self, state: &DeviceState) {
        let DeviceState::Input(saved) = state else {
            return;
        };
        self.select = saved.select;
        self.subsel = saved.subsel;
        let mut control = self.control.lock();
        control.active = self.lifecycle.is_active();
        control.leds = saved.leds;
        if control.active {
            control.pending = saved
                .pending
                .iter()
                .map(|&(event_type, code, value)| InputEvent::new(event_type, code, value))
                .collect();
        }
    }

    fn on_reset(&mut self) {
        let mut state = self.control.lock();
        state.active = false;
        state.pending.clear();
        state.leds = 0;
    }
}

/// Events sent while the worker is parked wait in the control's queue
/// (and are saved with it); the wake-up stays pending for the resume.
impl QueueLoop for EpollLoop<InputHandler> {
    fn positions(&self) -> Vec<QueuePosition> {
        let handler = self.handler();
        vec![
            QueuePosition::of(EVENTQ, &handler.eventq.queue),
            QueuePosition::of(STATUSQ, &handler.statusq.queue),
        ]
    }
}

const TOKEN_EVENTQ: usize = 0;
const TOKEN_STATUSQ: usize = 1;
const TOKEN_WAKE: usize = 2;

pub(crate) struct InputHandler {
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
