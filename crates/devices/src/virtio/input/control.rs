//! The host's handle on an input device: sends events, reads LEDs.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::event::codes::EV_LED;
use super::{InputEvent, InputKind};

/// How many events wait for the guest at most; older ones are dropped.
pub const EVENT_QUEUE_CAPACITY: usize = 1024;

pub(super) struct State {
    pub pending: VecDeque<InputEvent>,
    /// A driver runs the device.
    pub active: bool,
    pub dropped: u64,
    pub delivered: u64,
    /// Bit n: LED n is on, as the guest last set it.
    pub leds: u32,
}

/// The host's handle on an input device, shared with the device (which
/// the transport owns) and its worker. Cheap to call from any thread.
pub struct InputControl {
    kind: InputKind,
    abs_max: (u32, u32),
    state: Mutex<State>,
    /// Wakes the worker to deliver pending events.
    pub(super) wake: EventFd,
}

impl InputControl {
    pub(super) fn new(kind: InputKind, abs_max: (u32, u32)) -> std::io::Result<InputControl> {
        Ok(InputControl {
            kind,
            abs_max,
            state: Mutex::new(State {
                pending: VecDeque::new(),
                active: false,
                dropped: 0,
                delivered: 0,
                leds: 0,
            }),
            wake: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keyboard or tablet.
    pub fn kind(&self) -> InputKind {
        self.kind
    }

    /// The largest ABS_X and ABS_Y (tablet): positions go from 0 to these.
    pub fn abs_max(&self) -> (u32, u32) {
        self.abs_max
    }

    /// Queues `events` for the guest, in order, and wakes the device.
    /// When the queue is full the oldest events are dropped; with no driver
    /// running, the events are dropped. Both are counted in
    /// [`dropped`](Self::dropped).
    pub fn send_events(&self, events: &[InputEvent]) {
        if events.is_empty() {
            return;
        }
        let mut state = self.lock();
        if !state.active {
            state.dropped += events.len() as u64;
            return;
        }
        for event in events {
            if state.pending.len() >= EVENT_QUEUE_CAPACITY {
                state.pending.pop_front();
                state.dropped += 1;
            }
            state.pending.push_back(*event);
        }
        drop(state);
        let _ = self.wake.write(1);
    }

    /// A key press or release (evdev code, e.g. `codes::KEY_A`), then
    /// SYN_REPORT.
    pub fn key(&self, code: u16, pressed: bool) {
        self.send_events(&InputEvent::key(code, pressed));
    }

    /// A pointer button press or release (`codes::BTN_LEFT`, ...), then
    /// SYN_REPORT.
    pub fn button(&self, code: u16, pressed: bool) {
        self.send_events(&InputEvent::button(code, pressed));
    }

    /// Moves the absolute pointer, clamped to [`abs_max`](Self::abs_max),
    /// then SYN_REPORT.
    pub fn pointer_abs(&self, x: u32, y: u32) {
        let (mx, my) = self.abs_max;
        self.send_events(&InputEvent::pointer_abs(x.min(mx), y.min(my)));
    }

    /// Vertical wheel clicks (positive: away from the user), then
    /// SYN_REPORT.
    pub fn wheel(&self, clicks: i32) {
        self.send_events(&InputEvent::wheel(clicks));
    }

    /// Events dropped so far (queue overflow, or no driver).
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Events the guest has been given so far.
    pub fn delivered(&self) -> u64 {
        self.lock().delivered
    }

    /// Events waiting for guest buffers.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Whether a driver runs the device.
    pub fn is_active(&self) -> bool {
        self.lock().active
    }

    /// Keyboard LEDs as the guest set them: bit `codes::LED_NUML`,
    /// `LED_CAPSL`, `LED_SCROLLL`, ...
    pub fn leds(&self) -> u32 {
        self.lock().leds
    }

    /// Records an event the guest sent on the status queue.
    pub(super) fn status_event(&self, event: InputEvent) {
        if event.event_type == EV_LED && event.code < 32 {
            let mut state = self.lock();
            if event.value != 0 {
                state.leds |= 1 << event.code;
            } else {
                state.leds &= !(1 << event.code);
            }
        } else {
            tracing::trace!("virtio-input: status event {event:?} ignored");
        }
    }
}
