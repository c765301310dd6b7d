//! Input events as virtio-input carries them (the evdev encoding) and the
//! few evdev codes the devices use.

/// evdev event types and codes (linux/input-event-codes.h).
pub mod codes {
    pub const EV_SYN: u16 = 0x00;
    pub const EV_KEY: u16 = 0x01;
    pub const EV_REL: u16 = 0x02;
    pub const EV_ABS: u16 = 0x03;
    pub const EV_MSC: u16 = 0x04;
    pub const EV_LED: u16 = 0x11;
    pub const EV_REP: u16 = 0x14;

    pub const SYN_REPORT: u16 = 0;

    pub const KEY_ESC: u16 = 1;
    pub const KEY_1: u16 = 2;
    pub const KEY_ENTER: u16 = 28;
    pub const KEY_LEFTCTRL: u16 = 29;
    pub const KEY_A: u16 = 30;
    pub const KEY_LEFTSHIFT: u16 = 42;
    pub const KEY_SPACE: u16 = 57;
    pub const KEY_CAPSLOCK: u16 = 58;
    /// The keyboard reports codes 1..=KEYBOARD_MAX_CODE.
    pub const KEYBOARD_MAX_CODE: u16 = 255;

    pub const BTN_LEFT: u16 = 0x110;
    pub const BTN_RIGHT: u16 = 0x111;
    pub const BTN_MIDDLE: u16 = 0x112;
    pub const BTN_SIDE: u16 = 0x113;
    pub const BTN_EXTRA: u16 = 0x114;

    pub const REL_HWHEEL: u16 = 0x06;
    pub const REL_WHEEL: u16 = 0x08;

    pub const ABS_X: u16 = 0x00;
    pub const ABS_Y: u16 = 0x01;

    pub const LED_NUML: u16 = 0x00;
    pub const LED_CAPSL: u16 = 0x01;
    pub const LED_SCROLLL: u16 = 0x02;

    pub const BUS_VIRTUAL: u16 = 0x06;
}

use codes::*;

/// One `struct virtio_input_event { le16 type; le16 code; le32 value; }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InputEvent {
    pub event_type: u16,
    pub code: u16,
    pub value: i32,
}

impl InputEvent {
    /// Its size on the queues.
    pub const SIZE: usize = 8;

    pub const fn new(event_type: u16, code: u16, value: i32) -> InputEvent {
        InputEvent {
            event_type,
            code,
            value,
        }
    }

    /// SYN_REPORT: ends a group of events the guest applies together.
    pub const fn syn() -> InputEvent {
        InputEvent::new(EV_SYN, SYN_REPORT, 0)
    }

    /// The little-endian wire form.
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0..2].copy_from_slice(&self.event_type.to_le_bytes());
        b[2..4].copy_from_slice(&self.code.to_le_bytes());
        b[4..8].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    /// Parses the little-endian wire form.
    pub fn from_bytes(b: [u8; 8]) -> InputEvent {
        InputEvent {
            event_type: u16::from_le_bytes([b[0], b[1]]),
            code: u16::from_le_bytes([b[2], b[3]]),
            value: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    /// A key press (`pressed`) or release, then SYN_REPORT.
    pub fn key(code: u16, pressed: bool) -> [InputEvent; 2] {
        [
            InputEvent::new(EV_KEY, code, i32::from(pressed)),
            InputEvent::syn(),
        ]
    }

    /// A pointer button (BTN_LEFT, ...) press or release, then SYN_REPORT.
    pub fn button(code: u16, pressed: bool) -> [InputEvent; 2] {
        InputEvent::key(code, pressed)
    }

    /// An absolute pointer position, then SYN_REPORT.
    pub fn pointer_abs(x: u32, y: u32) -> [InputEvent; 3] {
        let clamp = |v: u32| v.min(i32::MAX as u32) as i32;
        [
            InputEvent::new(EV_ABS, ABS_X, clamp(x)),
            InputEvent::new(EV_ABS, ABS_Y, clamp(y)),
            InputEvent::syn(),
        ]
    }

    /// Vertical wheel clicks (positive: away from the user), then
    /// SYN_REPORT.
    pub fn wheel(clicks: i32) -> [InputEvent; 2] {
        [
            InputEvent::new(EV_REL, REL_WHEEL, clicks),
            InputEvent::syn(),
        ]
    }

    /// Horizontal wheel clicks (positive: right), then SYN_REPORT.
    pub fn hwheel(clicks: i32) -> [InputEvent; 2] {
        [
            InputEvent::new(EV_REL, REL_HWHEEL, clicks),
            InputEvent::syn(),
        ]
    }
}
