//! Raw encoding (RFC 6143 7.7.1): every pixel of the rectangle, row by row,
//! in the client's pixel format.

use crate::vnc::pixel_format::PixelConverter;

/// Appends the Raw data for a rectangle whose Screen pixels are `rgb`
/// (row-major, the rectangle's width per row).
pub fn encode(rgb: &[u32], converter: &PixelConverter, out: &mut Vec<u8>) {
    converter.put_pixels(out, rgb);
}
