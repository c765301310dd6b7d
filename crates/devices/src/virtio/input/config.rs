//! The virtio-input configuration space (virtio 1.2, 5.8.4): the driver
//! writes `select` and `subsel`, then reads `size` and the answer.
//!
//! ```text
//! struct virtio_input_config {
//!     u8 select; u8 subsel; u8 size; u8 reserved[5];
//!     union { char string[128]; u8 bitmap[128];
//!             struct virtio_input_absinfo abs;   // le32 min, max, fuzz, flat, res
//!             struct virtio_input_devids ids;    // le16 bustype, vendor, product, version
//!     } u;
//! };
//! ```

use super::codes::*;
use super::InputKind;

pub const CFG_UNSET: u8 = 0x00;
pub const CFG_ID_NAME: u8 = 0x01;
pub const CFG_ID_SERIAL: u8 = 0x02;
pub const CFG_ID_DEVIDS: u8 = 0x03;
pub const CFG_PROP_BITS: u8 = 0x10;
pub const CFG_EV_BITS: u8 = 0x11;
pub const CFG_ABS_INFO: u8 = 0x12;

/// The size of the configuration space.
pub const CONFIG_SIZE: usize = 8 + PAYLOAD_SIZE;
/// The size of the answer union.
pub const PAYLOAD_SIZE: usize = 128;
/// Linux copies names and serials into 64-byte buffers it expects to stay
/// NUL-terminated.
const MAX_STRING: usize = 63;

/// What a device answers.
#[derive(Clone, Debug)]
pub(super) struct Profile {
    pub kind: InputKind,
    pub name: String,
    pub serial: String,
    /// ABS_X and ABS_Y maxima (tablet).
    pub abs_max: (u32, u32),
}

/// A bitmap with bit `code` set for each code, trimmed after its last
/// non-zero byte.
fn bitmap(codes: impl IntoIterator<Item = u16>) -> Vec<u8> {
    let mut bytes = vec![0u8; PAYLOAD_SIZE];
    for code in codes {
        if let Some(byte) = bytes.get_mut(usize::from(code / 8)) {
            *byte |= 1 << (code % 8);
        }
    }
    let len = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    bytes.truncate(len);
    bytes
}

fn string(s: &str) -> Vec<u8> {
    let mut end = s.len().min(MAX_STRING);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.as_bytes()[..end].to_vec()
}

impl Profile {
    /// The answer to (`select`, `subsel`); empty (size 0) when the device
    /// has nothing to say.
    pub fn query(&self, select: u8, subsel: u8) -> Vec<u8> {
        let keyboard = self.kind == InputKind::Keyboard;
        match (select, subsel) {
            (CFG_ID_NAME, 0) => string(&self.name),
            (CFG_ID_SERIAL, 0) => string(&self.serial),
            (CFG_ID_DEVIDS, 0) => {
                let product: u16 = if keyboard { 1 } else { 3 };
                [BUS_VIRTUAL, 0, product, 1]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect()
            }
            (CFG_PROP_BITS, 0) => Vec::new(),
            (CFG_EV_BITS, ev) => match (u16::from(ev), keyboard) {
                (EV_KEY, true) => bitmap(1..=KEYBOARD_MAX_CODE),
                (EV_LED, true) => bitmap([LED_NUML, LED_CAPSL, LED_SCROLLL]),
                // Any size says "autorepeat": the guest repeats held keys.
                (EV_REP, true) => vec![0],
                (EV_KEY, false) => bitmap([BTN_LEFT, BTN_RIGHT, BTN_MIDDLE, BTN_SIDE, BTN_EXTRA]),
                (EV_REL, false) => bitmap([REL_HWHEEL, REL_WHEEL]),
                (EV_ABS, false) => bitmap([ABS_X, ABS_Y]),
                _ => Vec::new(),
            },
            (CFG_ABS_INFO, axis) if !keyboard => {
                let max = match u16::from(axis) {
                    ABS_X => self.abs_max.0,
                    ABS_Y => self.abs_max.1,
                    _ => return Vec::new(),
                };
                // min, max, fuzz, flat, res
                [0, max, 0, 0, 0]
                    .iter()
                    .flat_map(|v: &u32| v.to_le_bytes())
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    /// The whole configuration space for the current selection.
    pub fn space(&self, select: u8, subsel: u8) -> [u8; CONFIG_SIZE] {
        let mut space = [0u8; CONFIG_SIZE];
        space[0] = select;
        space[1] = subsel;
        let answer = self.query(select, subsel);
        let n = answer.len().min(PAYLOAD_SIZE);
        space[2] = n as u8;
        space[8..8 + n].copy_from_slice(&answer[..n]);
        space
    }
}
