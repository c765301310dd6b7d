//! The picture display clients see: a linear copy of the framebuffer.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// What clients were last told the screen looks like, in linear order
/// (row after row, `width` pixels each), whatever the guest framebuffer's
/// layout. A pixel is a `u32` holding 0x00RRGGBB (the guest's 32 bpp
/// little-endian XRGB). The update loop writes changed pixels here and then
/// tells the VNC server which rectangles changed; client threads read it to
/// encode.
pub struct Screen {
    width: u16,
    height: u16,
    pixels: RwLock<Vec<u32>>,
}

impl Screen {
    /// A black screen.
    pub fn new(width: u16, height: u16) -> Screen {
        Screen {
            width,
            height,
            pixels: RwLock::new(vec![0; usize::from(width) * usize::from(height)]),
        }
    }

    pub fn width(&self) -> u16 {
        self.width
    }

    pub fn height(&self) -> u16 {
        self.height
    }

    /// The pixels, row-major, `width` per row.
    pub fn read(&self) -> RwLockReadGuard<'_, Vec<u32>> {
        self.pixels.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, Vec<u32>> {
        self.pixels.write().unwrap_or_else(|e| e.into_inner())
    }
}
