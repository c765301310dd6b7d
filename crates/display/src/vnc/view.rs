//! The server's copy of what one client's framebuffer holds, in Screen
//! pixels: everything sent so far, with CopyRects replayed.
//!
//! It makes CopyRect safe however the Screen and `copy()` calls race with
//! encoding. A CopyRect moves the client's pixels, which are only right if
//! the client got the source's pre-move content; an update read from the
//! Screen after the move but before `copy()` was called would break that.
//! Replaying each CopyRect here and comparing the destination with the
//! Screen finds any such pixels, which then go out in the same update.

use super::client::CopyOp;
use crate::geometry::Rect;

pub struct ClientView {
    width: usize,
    pixels: Vec<u32>,
}

/// Start of row `y` of `r` in a buffer `stride` pixels wide, if the whole
/// row span lies inside `len` pixels.
fn span(r: &Rect, stride: usize, y: usize, len: usize) -> Option<std::ops::Range<usize>> {
    let start = y * stride + usize::from(r.x);
    let end = start + usize::from(r.w);
    (usize::from(r.x) + usize::from(r.w) <= stride && end <= len).then_some(start..end)
}

/// Copies rectangle `r` out of the Screen's pixels (`stride` per row).
/// Rows that do not fit (never, for a clipped rectangle) stay black.
pub fn read_rect(screen: &[u32], stride: usize, r: &Rect) -> Vec<u32> {
    let mut out = vec![0u32; r.area() as usize];
    let w = usize::from(r.w);
    for (i, y) in (usize::from(r.y)..r.bottom() as usize).enumerate() {
        if let Some(range) = span(r, stride, y, screen.len()) {
            out[i * w..(i + 1) * w].copy_from_slice(&screen[range]);
        }
    }
    out
}

impl ClientView {
    pub fn new(width: u16, height: u16) -> ClientView {
        ClientView {
            width: usize::from(width),
            pixels: vec![0; usize::from(width) * usize::from(height)],
        }
    }

    /// Replays a CopyRect. Rows are walked away from the overlap (bottom
    /// up when moving down) so a scroll does not read rows it already
    /// overwrote; within a row `copy_within` handles overlap.
    pub fn apply_copy(&mut self, op: &CopyOp) {
        let (src, dst) = (op.src, op.dst);
        let rows = usize::from(src.h.min(dst.h));
        let w = usize::from(src.w.min(dst.w));
        let len = self.pixels.len();
        let copy_row = |pixels: &mut Vec<u32>, i: usize| {
            let from = span(&src, self.width, usize::from(src.y) + i, len);
            let to = span(&dst, self.width, usize::from(dst.y) + i, len);
            if let (Some(from), Some(to)) = (from, to) {
                pixels.copy_within(from.start..from.start + w, to.start);
            }
        };
        if dst.y > src.y {
            for i in (0..rows).rev() {
                copy_row(&mut self.pixels, i);
            }
        } else {
            for i in 0..rows {
                copy_row(&mut self.pixels, i);
            }
        }
    }

    /// Bounding box of the pixels of `r` where the view differs from the
    /// Screen's `screen` (same width as the view).
    pub fn mismatch(&self, screen: &[u32], r: &Rect) -> Option<Rect> {
        let mut found: Option<Rect> = None;
        for y in usize::from(r.y)..r.bottom() as usize {
            let (Some(mine), Some(theirs)) = (
                span(r, self.width, y, self.pixels.len()).map(|s| &self.pixels[s]),
                span(r, self.width, y, screen.len()).map(|s| &screen[s]),
            ) else {
                continue;
            };
            if mine == theirs {
                continue;
            }
            let first = mine
                .iter()
                .zip(theirs)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            let last = mine
                .iter()
                .zip(theirs)
                .rposition(|(a, b)| a != b)
                .unwrap_or(first);
            let row = Rect::new(r.x + first as u16, y as u16, (last - first + 1) as u16, 1);
            found = Some(found.map_or(row, |f| f.union(&row)));
        }
        found
    }

    /// Records that the client was sent `pixels` for `r`.
    pub fn store(&mut self, r: &Rect, pixels: &[u32]) {
        let w = usize::from(r.w);
        let len = self.pixels.len();
        for (i, y) in (usize::from(r.y)..r.bottom() as usize).enumerate() {
            if let (Some(range), Some(src)) =
                (span(r, self.width, y, len), pixels.get(i * w..(i + 1) * w))
            {
                self.pixels[range].copy_from_slice(src);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_scroll_and_mismatch() {
        // 4x4 view, rows filled with their row number.
        let mut v = ClientView::new(4, 4);
        let screen: Vec<u32> = (0..16).map(|i| i / 4).collect();
        v.store(&Rect::new(0, 0, 4, 4), &screen);
        assert_eq!(v.mismatch(&screen, &Rect::new(0, 0, 4, 4)), None);

        // Scroll up by one row: rows 1..4 move to 0..3.
        v.apply_copy(&CopyOp {
            src: Rect::new(0, 1, 4, 3),
            dst: Rect::new(0, 0, 4, 3),
        });
        let scrolled: Vec<u32> = (0..16).map(|i| (i / 4 + 1).min(3)).collect();
        assert_eq!(v.pixels, scrolled);

        // Scroll down by one: rows walked bottom-up.
        let mut v = ClientView::new(4, 4);
        v.store(&Rect::new(0, 0, 4, 4), &screen);
        v.apply_copy(&CopyOp {
            src: Rect::new(0, 0, 4, 3),
            dst: Rect::new(0, 1, 4, 3),
        });
        let down: Vec<u32> = (0..16).map(|i| (i / 4).max(1) - 1).collect();
        assert_eq!(v.pixels, down);

        let mut other = down.clone();
        other[6] = 99;
        other[9] = 98;
        assert_eq!(
            v.mismatch(&other, &Rect::new(0, 0, 4, 4)),
            Some(Rect::new(1, 1, 2, 2))
        );
    }

    #[test]
    fn read_rect_copies_rows() {
        let screen: Vec<u32> = (0..20).collect();
        assert_eq!(
            read_rect(&screen, 5, &Rect::new(1, 2, 3, 2)),
            vec![11, 12, 13, 16, 17, 18]
        );
        // Out of range rows stay zero instead of panicking.
        assert_eq!(read_rect(&screen, 5, &Rect::new(4, 3, 2, 2)), vec![0; 4]);
    }
}
