//! virtio-input (virtio 1.2, 5.8 "Input Device"): a keyboard and an
//! absolute pointer (tablet), fed by the host (the VNC display).
//!
//! The device describes itself through the configuration space (name,
//! serial, ids, which evdev events it sends, the axes' ranges); events go
//! to the guest on the event queue, one 8-byte `virtio_input_event` per
//! buffer the driver posts; the status queue brings back what the guest
//! sends the device (keyboard LEDs), which the device records and returns.
//!
//! The VMM keeps the [`InputControl`] returned by [`Input::new`] and sends
//! events through it; they wait in a bounded queue (oldest dropped, and
//! counted, on overflow) until the guest has posted buffers. Events sent
//! while no driver runs the device are dropped (counted too): a key pressed
//! before the driver started must not come out of the queue later.

mod config;
mod control;
mod device;
mod event;
#[cfg(test)]
mod tests;

pub use config::{
    CFG_ABS_INFO, CFG_EV_BITS, CFG_ID_DEVIDS, CFG_ID_NAME, CFG_ID_SERIAL, CFG_PROP_BITS, CFG_UNSET,
    CONFIG_SIZE,
};
pub use control::{InputControl, EVENT_QUEUE_CAPACITY};
#[doc(hidden)]
pub use device::fuzzing;
pub use device::{Input, InputState};
pub use event::{codes, InputEvent};

use crate::options::{invalid, Options, OptionsError};

/// The virtio device id of an input device.
pub const VIRTIO_ID_INPUT: u32 = 18;
/// The default range of the tablet's axes: 0..=32767.
pub const DEFAULT_ABS_SIZE: u32 = 32768;
/// The largest width or height accepted.
pub const MAX_ABS_SIZE: u32 = 1 << 16;

/// Which input device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// A keyboard: every key code 1..=255, LEDs, autorepeat.
    Keyboard,
    /// An absolute pointer: ABS_X/ABS_Y, five buttons, wheels.
    Tablet,
}

impl InputKind {
    /// `keyboard` or `tablet`.
    pub fn name(self) -> &'static str {
        match self {
            InputKind::Keyboard => "keyboard",
            InputKind::Tablet => "tablet",
        }
    }
}

/// `--input keyboard|tablet[,width=W,height=H][,id=NAME]` (also
/// `kind=keyboard|tablet`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputConfig {
    /// The device's name; `keyboard0` / `tablet0` when not given.
    pub id: Option<String>,
    pub kind: InputKind,
    /// Tablet only: positions go from 0 to `width - 1` (`height - 1`);
    /// [`DEFAULT_ABS_SIZE`] when not given.
    pub width: u32,
    pub height: u32,
}

impl InputConfig {
    /// A keyboard or a tablet with the default ranges.
    pub fn new(kind: InputKind) -> InputConfig {
        InputConfig {
            id: None,
            kind,
            width: DEFAULT_ABS_SIZE,
            height: DEFAULT_ABS_SIZE,
        }
    }

    /// Parses the `--input` option string.
    pub fn parse(text: &str) -> Result<InputConfig, OptionsError> {
        let mut options = Options::parse(text, Some("kind"))?;
        let kind = match options.require("kind")?.as_str() {
            "keyboard" => InputKind::Keyboard,
            "tablet" => InputKind::Tablet,
            other => return Err(invalid("kind", other, "expected keyboard or tablet")),
        };
        let id = options.take("id");
        let mut config = InputConfig::new(kind);
        for (key, slot) in [("width", &mut config.width), ("height", &mut config.height)] {
            let Some(value) = options.parsed::<u32>(key)? else {
                continue;
            };
            if kind != InputKind::Tablet {
                return Err(invalid(key, &value.to_string(), "only for a tablet"));
            }
            if value == 0 || value > MAX_ABS_SIZE {
                return Err(invalid(
                    key,
                    &value.to_string(),
                    &format!("expected 1 to {MAX_ABS_SIZE}"),
                ));
            }
            *slot = value;
        }
        options.finish()?;
        if let Some(id) = &id {
            super::rng::check_id(id)?;
        }
        config.id = id;
        Ok(config)
    }
}
