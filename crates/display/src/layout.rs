//! How pixels are laid out in the guest framebuffer: linear or page-tiled.
//!
//! Linear is what every display adapter does: row after row. Page-tiled is
//! the paper's layout: the screen is cut into tiles of exactly one page
//! (32x32 pixels at 32 bpp = 4 KiB), tiles in raster order, pixels row-major
//! inside a tile. A 64x64 icon then dirties at most 9 pages instead of 64.

use crate::Rect;

/// Bytes per pixel: the framebuffer is always 32 bpp XRGB.
pub const BYTES_PER_PIXEL: usize = 4;
/// A guest page, the unit of update detection.
pub const PAGE_SIZE: usize = 4096;
/// Side of a page tile in pixels: 32 x 32 x 4 bytes = one page.
pub const TILE_SIDE: usize = 32;

/// `layout=` of `--display` (defined once, in the `choices` crate).
pub use choices::Layout;

/// One horizontal run of pixels inside a page: row `y`, columns `x0..x1`,
/// starting at byte `offset` of the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub y: u16,
    pub x0: u16,
    pub x1: u16,
    pub offset: usize,
}

/// The framebuffer's geometry and layout: maps pages to screen pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FbGeometry {
    pub width: u16,
    pub height: u16,
    pub layout: Layout,
}

impl FbGeometry {
    /// Checks the size fits the layout: tiles must cover the screen exactly,
    /// and rows of a linear framebuffer are `width * 4` bytes.
    pub fn new(width: u16, height: u16, layout: Layout) -> Result<FbGeometry, String> {
        if !(64..=4096).contains(&width) || !(64..=4096).contains(&height) {
            return Err(format!(
                "display size {width}x{height} is out of range (64..4096 each way)"
            ));
        }
        if layout == Layout::Tiled
            && (usize::from(width) % TILE_SIDE != 0 || usize::from(height) % TILE_SIDE != 0)
        {
            return Err(format!(
                "a tiled display needs width and height divisible by {TILE_SIDE} (got {width}x{height})"
            ));
        }
        Ok(FbGeometry {
            width,
            height,
            layout,
        })
    }

    /// Bytes per row of a linear framebuffer (what the guest is told).
    pub fn stride(&self) -> usize {
        usize::from(self.width) * BYTES_PER_PIXEL
    }

    /// Bytes of pixels.
    pub fn bytes(&self) -> usize {
        self.stride() * usize::from(self.height)
    }

    /// Size of the framebuffer memory: whole pages.
    pub fn mapped_bytes(&self) -> usize {
        self.bytes().next_multiple_of(PAGE_SIZE)
    }

    pub fn pages(&self) -> usize {
        self.mapped_bytes() / PAGE_SIZE
    }

    fn tiles_x(&self) -> usize {
        usize::from(self.width) / TILE_SIDE
    }

    /// Byte offset of pixel (`x`, `y`) in the framebuffer.
    pub fn offset(&self, x: usize, y: usize) -> usize {
        match self.layout {
            Layout::Linear => y * self.stride() + x * BYTES_PER_PIXEL,
            Layout::Tiled => {
                let tile = (y / TILE_SIDE) * self.tiles_x() + x / TILE_SIDE;
                tile * PAGE_SIZE + ((y % TILE_SIDE) * TILE_SIDE + x % TILE_SIDE) * BYTES_PER_PIXEL
            }
        }
    }

    /// Calls `f` for each horizontal run of pixels page `page` holds, in
    /// page order.
    pub fn page_runs(&self, page: usize, mut f: impl FnMut(Run)) {
        let start = page * PAGE_SIZE;
        let end = (start + PAGE_SIZE).min(self.bytes());
        if start >= end {
            return;
        }
        match self.layout {
            Layout::Linear => {
                let stride = self.stride();
                let mut pos = start;
                while pos < end {
                    let y = pos / stride;
                    let row_end = ((y + 1) * stride).min(end);
                    f(Run {
                        y: y as u16,
                        x0: ((pos % stride) / BYTES_PER_PIXEL) as u16,
                        x1: ((row_end - y * stride) / BYTES_PER_PIXEL) as u16,
                        offset: pos - start,
                    });
                    pos = row_end;
                }
            }
            Layout::Tiled => {
                let tx = page % self.tiles_x() * TILE_SIDE;
                let ty = page / self.tiles_x() * TILE_SIDE;
                for row in 0..TILE_SIDE {
                    f(Run {
                        y: (ty + row) as u16,
                        x0: tx as u16,
                        x1: (tx + TILE_SIDE) as u16,
                        offset: row * TILE_SIDE * BYTES_PER_PIXEL,
                    });
                }
            }
        }
    }

    /// The pages holding any pixel of `rect`, ascending (for tests and
    /// for the paper's useful-detection figures).
    pub fn pages_of(&self, rect: Rect) -> Vec<usize> {
        let mut pages = Vec::new();
        for y in usize::from(rect.y)..rect.bottom() as usize {
            for x in [usize::from(rect.x), rect.right() as usize - 1] {
                pages.push(self.offset(x, y) / PAGE_SIZE);
            }
            if self.layout == Layout::Tiled {
                let mut x = usize::from(rect.x).next_multiple_of(TILE_SIDE);
                while x < rect.right() as usize {
                    pages.push(self.offset(x, y) / PAGE_SIZE);
                    x += TILE_SIDE;
                }
            } else {
                let first = self.offset(usize::from(rect.x), y) / PAGE_SIZE;
                let last = self.offset(rect.right() as usize - 1, y) / PAGE_SIZE;
                pages.extend(first..=last);
            }
        }
        pages.sort_unstable();
        pages.dedup();
        pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_needs_whole_tiles() {
        assert!(FbGeometry::new(1024, 768, Layout::Tiled).is_ok());
        assert!(FbGeometry::new(1000, 768, Layout::Tiled).is_err());
        assert!(FbGeometry::new(1000, 750, Layout::Linear).is_ok());
        assert!(FbGeometry::new(10, 768, Layout::Linear).is_err());
    }

    #[test]
    fn tiled_offsets_follow_the_paper() {
        let g = FbGeometry::new(1024, 768, Layout::Tiled).unwrap();
        assert_eq!(g.offset(0, 0), 0);
        assert_eq!(g.offset(31, 0), 31 * 4);
        assert_eq!(g.offset(0, 1), 32 * 4);
        assert_eq!(g.offset(32, 0), 4096);
        assert_eq!(g.offset(0, 32), 32 * 4096);
        assert_eq!(g.offset(1023, 767), g.bytes() - 4);
    }

    /// Every pixel belongs to exactly one run of exactly one page, at the
    /// offset `offset()` gives: the two descriptions agree.
    #[test]
    fn runs_cover_every_pixel_once() {
        for (w, h, layout) in [
            (1024, 768, Layout::Linear),
            (640, 480, Layout::Linear),
            (200, 100, Layout::Linear),
            (1024, 768, Layout::Tiled),
            (640, 480, Layout::Tiled),
        ] {
            let g = FbGeometry::new(w, h, layout).unwrap();
            let mut seen = vec![0u8; usize::from(w) * usize::from(h)];
            for page in 0..g.pages() {
                g.page_runs(page, |run| {
                    for x in run.x0..run.x1 {
                        let i = usize::from(run.y) * usize::from(w) + usize::from(x);
                        seen[i] += 1;
                        let expect = run.offset + usize::from(x - run.x0) * 4 + page * PAGE_SIZE;
                        assert_eq!(g.offset(usize::from(x), usize::from(run.y)), expect);
                    }
                });
            }
            assert!(seen.iter().all(|&n| n == 1), "{w}x{h} {layout}");
        }
    }

    /// The paper's example: a 64x64 icon dirties 64 pages linear (one row
    /// per page at 1024 wide) and at most 9 tiled.
    #[test]
    fn icon_pages_linear_vs_tiled() {
        let icon = Rect::new(100, 100, 64, 64);
        let linear = FbGeometry::new(1024, 768, Layout::Linear).unwrap();
        let tiled = FbGeometry::new(1024, 768, Layout::Tiled).unwrap();
        assert_eq!(linear.pages_of(icon).len(), 64);
        assert_eq!(tiled.pages_of(icon).len(), 9);
        assert_eq!(tiled.pages_of(Rect::new(64, 64, 64, 64)).len(), 4);
        // The paper's worst case for its 640x480 canvas: 336 tiles, 480 rows.
        let canvas = Rect::new(100, 100, 640, 480);
        assert_eq!(tiled.pages_of(canvas).len(), 336);
        assert_eq!(linear.pages_of(canvas).len(), 480);
    }
}
