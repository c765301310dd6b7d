//! The VM's display (docs/display.md): where the framebuffer goes in the
//! guest, what the guest is told about it, and how VNC clients' keyboard
//! and pointer reach the guest's virtio-input devices.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use arch::bootparams::LinearFramebuffer;
use arch::layout::{FRAMEBUFFER_MAX_SIZE, FRAMEBUFFER_START};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use devices::virtio::input::{codes, InputControl, InputKind};
use display::dirty::{DirtyError, FramebufferLog, FramebufferLogReader};
use display::framebuffer::FramebufferMemory;
use display::keymap::keysym_to_evdev;
use display::{Display, DisplayConfig, DisplayControl, InputSink};

use crate::memory::{DirtyLogReader, MemoryManager};
use crate::metrics::MetricsSource;
use crate::snapshot::state::FramebufferState;
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

/// The framebuffer: its own memory, given to the guest at
/// `FRAMEBUFFER_START` in a slot the memory manager allocates.
pub struct Framebuffer {
    config: DisplayConfig,
    memory: Arc<FramebufferMemory>,
    log: Arc<dyn FramebufferLog>,
}

impl Framebuffer {
    /// Maps the framebuffer (black) and registers its slot.
    pub fn map(config: &DisplayConfig, manager: &Arc<MemoryManager>) -> Result<Framebuffer, Error> {
        let g = config.geometry;
        debug_assert!(g.mapped_bytes() as u64 <= FRAMEBUFFER_MAX_SIZE);
        let memory = Arc::new(
            FramebufferMemory::new(g)
                .map_err(|e| Error::Device("--display".into(), format!("framebuffer: {e}")))?,
        );
        // SAFETY: the mapping is `memory.len()` bytes, kept alive by the
        // Arc the manager holds; `FRAMEBUFFER_START` is a window reserved
        // for it in the memory map (above RAM below 4 GiB, in the hole).
        let slot = unsafe {
            manager.add_region(
                "framebuffer",
                memory.host_address(),
                memory.len(),
                FRAMEBUFFER_START,
                memory.clone(),
            )
        }?;
        Ok(Framebuffer {
            config: config.clone(),
            memory,
            log: Arc::new(SlotLog {
                manager: manager.clone(),
                slot,
            }),
        })
    }

    pub fn config(&self) -> &DisplayConfig {
        &self.config
    }

    /// The geometry words a snapshot and a migration check
    /// ("1024x768 tiled").
    pub fn describe(config: &DisplayConfig) -> String {
        let g = config.geometry;
        format!("{}x{} {}", g.width, g.height, g.layout)
    }

    /// Starts update detection and the VNC server over the framebuffer as
    /// it is (black, or the picture a restore or migration put back).
    pub fn start_display(&self, inputs: &[Arc<InputControl>]) -> Result<Display, Error> {
        let sink = Arc::new(VirtioInputSink::new(inputs, &self.config));
        Display::start(
            &self.config,
            self.memory.clone(),
            self.log.clone(),
            FRAMEBUFFER_START,
            sink,
        )
        .map_err(|e| Error::Device("--display".into(), e.to_string()))
    }

    /// The pixels, for a snapshot or a migration's switch-over (the vCPUs
    /// are paused, so they do not change meanwhile).
    pub fn save(&self) -> FramebufferState {
        let mut bytes = vec![0u8; self.memory.len()];
        let mut page = [0u8; display::layout::PAGE_SIZE];
        for (index, chunk) in bytes.chunks_mut(page.len()).enumerate() {
            self.memory.read_page(index, &mut page);
            chunk.copy_from_slice(&page[..chunk.len()]);
        }
        FramebufferState {
            pixels: BASE64.encode(&bytes),
        }
    }

    /// Puts saved pixels back, before the display starts and any vCPU runs.
    pub fn restore(&self, state: &FramebufferState) -> Result<(), String> {
        let bytes = BASE64
            .decode(&state.pixels)
            .map_err(|e| format!("framebuffer: {e}"))?;
        if bytes.len() != self.memory.len() {
            return Err(format!(
                "framebuffer of {} bytes, this display has {}",
                bytes.len(),
                self.memory.len()
            ));
        }
        self.memory.write(0, &bytes);
        Ok(())
    }
}

/// The framebuffer slot's dirty log, through the memory manager.
struct SlotLog {
    manager: Arc<MemoryManager>,
    slot: u32,
}

impl FramebufferLog for SlotLog {
    fn open(&self) -> Result<Box<dyn FramebufferLogReader>, DirtyError> {
        let reader = self
            .manager
            .dirty_log(&[self.slot])
            .map_err(|e| DirtyError::Log(e.to_string()))?;
        Ok(Box::new(SlotLogReader {
            reader,
            slot: self.slot,
        }))
    }

    fn manual_protect(&self) -> bool {
        self.manager.manual_protect()
    }
}

struct SlotLogReader {
    reader: DirtyLogReader,
    slot: u32,
}

impl FramebufferLogReader for SlotLogReader {
    fn harvest(&mut self) -> Result<Vec<u64>, DirtyError> {
        self.reader
            .harvest(self.slot)
            .map_err(|e| DirtyError::Log(e.to_string()))
    }
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
