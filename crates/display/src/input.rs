//! Where keyboard and pointer events from display clients go.

/// Receives user input from display clients, in the RFB protocol's terms.
/// The VMM implements it over virtio-input devices; tests record calls.
pub trait InputSink: Send + Sync {
    /// An X11 keysym went down (`down`) or up.
    fn key(&self, keysym: u32, down: bool);
    /// The pointer is at `x`, `y` (screen pixels) with these buttons held
    /// (bit 0 left, 1 middle, 2 right, 3/4 wheel up/down, 5/6 wheel left/right).
    fn pointer(&self, x: u16, y: u16, buttons: u8);
}
