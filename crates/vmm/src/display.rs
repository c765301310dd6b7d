//! The VM's display (docs/display.md): where the framebuffer goes in the
//! guest, what the guest is told about it, and how VNC clients' keyboard
//! and pointer reach the guest's virtio-input devices.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use arch::bootparams::LinearFramebuffer;
use arch::layout::{FRAMEBUFFER_MAX_SIZE, FRAMEBUFFER_START};
use devices::virtio::input::{codes, InputControl, InputKind};
use display::keymap::keysym_to_evdev;
use display::{Display, DisplayConfig, DisplayControl, InputSink};
use kvm_ioctls::VmFd;

use crate::metrics::MetricsSource;
use crate::Error;

/// The boot-time description of the framebuffer (vesafb reads it).
pub fn boot_framebuffer(config: &DisplayConfig) -> LinearFramebuffer {
    let g = config.geometry;
    LinearFramebuffer {
        address: FRAMEBUFFER_START,
        width: g.width,
        height: g.height,
        stride: g.stride() as u32,
        size: g.mapped_bytes() as u64,
    }
}

/// The command-line word telling guest tools the framebuffer's layout
/// (`hk.fb=linear|tiled`; the kernel ignores it, /proc/cmdline shows it).
pub fn layout_cmdline_word(config: &DisplayConfig) -> String {
    format!("hk.fb={}", config.geometry.layout)
}

/// Starts the display: its memory slot is the one after guest RAM's.
pub fn start_display(
    config: &DisplayConfig,
    vm: &Arc<VmFd>,
    slot: u32,
    inputs: &[Arc<InputControl>],
) -> Result<Display, Error> {
    debug_assert!(config.geometry.mapped_bytes() as u64 <= FRAMEBUFFER_MAX_SIZE);
    let sink = Arc::new(VirtioInputSink::new(inputs, config));
    Display::start(config, vm.clone(), slot, FRAMEBUFFER_START, sink)
        .map_err(|e| Error::Device("--display".into(), e.to_string()))
}

/// The virtio-input options `--display` adds when the user gave none: a
/// keyboard and a tablet whose range is the screen.
pub fn default_inputs(config: &DisplayConfig) -> Vec<String> {
    let g = config.geometry;
    vec![
        "keyboard".to_string(),
        format!("tablet,width={},height={}", g.width, g.height),
    ]
}

/// VNC keyboard and pointer → virtio-input events.
struct VirtioInputSink {
    keyboard: Option<Arc<InputControl>>,
    tablet: Option<Arc<InputControl>>,
    width: u16,
    height: u16,
    /// Whether the client holds a shift key (so a shifted keysym needs no
    /// synthetic shift).
    shift_held: AtomicBool,
    buttons: AtomicU8,
}

const KEY_LEFTSHIFT: u16 = 42;
const KEY_RIGHTSHIFT: u16 = 54;

impl VirtioInputSink {
    fn new(inputs: &[Arc<InputControl>], config: &DisplayConfig) -> VirtioInputSink {
        let find = |kind| inputs.iter().find(|c| c.kind() == kind).cloned();
        VirtioInputSink {
            keyboard: find(InputKind::Keyboard),
            tablet: find(InputKind::Tablet),
            width: config.geometry.width,
            height: config.geometry.height,
            shift_held: AtomicBool::new(false),
            buttons: AtomicU8::new(0),
        }
    }
}

/// Pointer button bits of an RFB PointerEvent and the evdev buttons.
const BUTTONS: [(u8, u16); 3] = [
    (1 << 0, codes::BTN_LEFT),
    (1 << 1, codes::BTN_MIDDLE),
    (1 << 2, codes::BTN_RIGHT),
];

impl InputSink for VirtioInputSink {
    fn key(&self, keysym: u32, down: bool) {
        let Some(keyboard) = &self.keyboard else {
            return;
        };
        let Some((code, needs_shift)) = keysym_to_evdev(keysym) else {
            tracing::debug!("display: no key for keysym {keysym:#x}");
            return;
        };
        if code == KEY_LEFTSHIFT || code == KEY_RIGHTSHIFT {
            self.shift_held.store(down, Ordering::Relaxed);
        }
        // A client may send a shifted keysym ('A', '!') without a shift key
        // (scripted clients do): press shift around it.
        let synthetic_shift = needs_shift && !self.shift_held.load(Ordering::Relaxed);
        if synthetic_shift && down {
            keyboard.key(KEY_LEFTSHIFT, true);
        }
        keyboard.key(code, down);
        if synthetic_shift && !down {
            keyboard.key(KEY_LEFTSHIFT, false);
        }
    }

    fn pointer(&self, x: u16, y: u16, buttons: u8) {
        let Some(tablet) = &self.tablet else {
            return;
        };
        let (max_x, max_y) = tablet.abs_max();
        let scale = |v: u16, size: u16, max: u32| {
            (u64::from(v.min(size - 1)) * u64::from(max) / u64::from((size - 1).max(1))) as u32
        };
        tablet.pointer_abs(scale(x, self.width, max_x), scale(y, self.height, max_y));
        let before = self.buttons.swap(buttons, Ordering::Relaxed);
        for (bit, code) in BUTTONS {
            if (before ^ buttons) & bit != 0 {
                tablet.button(code, buttons & bit != 0);
            }
        }
        // Wheel "buttons" 3 (up) and 4 (down) count on press.
        if buttons & !before & (1 << 3) != 0 {
            tablet.wheel(1);
        }
        if buttons & !before & (1 << 4) != 0 {
            tablet.wheel(-1);
        }
    }
}

/// The "display" section of the `--metrics` file: the same figures as
/// `GET /api/v1/vm.display`.
pub struct DisplayMetrics(pub Arc<DisplayControl>);

impl MetricsSource for DisplayMetrics {
    fn name(&self) -> &'static str {
        "display"
    }

    fn sample(&self) -> serde_json::Value {
        serde_json::to_value(self.0.metrics()).unwrap_or(serde_json::Value::Null)
    }
}
