//! The virtual display (seed 000: Goto and Minematsu, "Optimization Method
//! for Virtual Display Device of VM System").
//!
//! The guest draws into a framebuffer that is plain guest memory in its own
//! KVM memory slot. Once a refresh period, an update detector says which
//! framebuffer pages may have changed (`dirty`), those pages are compared
//! with the [`Screen`] (the VMM's copy of what clients were last told,
//! always in linear pixel order), and the rectangles that really changed go
//! to every VNC client (`vnc`).
//!
//! Module map:
//! - `geometry`: rectangles.
//! - `screen`: the shared linear copy of the picture clients see.
//! - `input`: what the display hands keyboard and pointer events to.
//! - `vnc`: the RFB server (protocol, security, encodings, WebSocket).

pub mod config;
pub mod device;
pub mod dirty;
pub mod framebuffer;
pub mod geometry;
pub mod input;
pub mod keymap;
pub mod layout;
pub mod metrics;
pub mod refresh;
pub mod screen;
pub mod update;
pub mod vnc;

pub use config::DisplayConfig;
pub use device::{Display, DisplayControl, DisplayError};
pub use geometry::Rect;
pub use input::InputSink;
pub use screen::Screen;
