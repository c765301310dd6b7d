//! From candidate pages to changed rectangles: compare each candidate page
//! with the screen copy, copy what differs into it, and cover the changes
//! with rectangles for the clients. Same-colour overwrites (a page written
//! but not changed) produce nothing.
//!
//! Large changed rectangles are also checked for a vertical move (a
//! scrolling window, the hdbench "scroll" pattern): when the new rows are
//! the old rows shifted by up to [`MAX_SCROLL`] lines, the clients get a
//! CopyRect for the moved part and pixels only for the newly exposed lines.

use crate::dirty::PageSet;
use crate::framebuffer::FramebufferMemory;
use crate::layout::{FbGeometry, BYTES_PER_PIXEL, PAGE_SIZE};
use crate::{Rect, Screen};

/// Changes are gathered in cells of this many pixels square (screen
/// coordinates, whatever the framebuffer layout), then merged into
/// rectangles: small enough to stay near the drawn shape, large enough to
/// keep the rectangle count low.
pub const CELL: usize = 16;
/// The largest vertical move looked for, in lines.
pub const MAX_SCROLL: usize = 64;
/// Rectangles smaller than this on either side are not checked for moves.
const MIN_MOVE_SIDE: u16 = 64;

/// Pixels that moved: `src` is now at (`dst_x`, `dst_y`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub src: Rect,
    pub dst_x: u16,
    pub dst_y: u16,
}

/// What one comparison found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Candidate pages compared.
    pub pages_compared: usize,
    /// Pages with at least one changed pixel.
    pub pages_changed: usize,
    /// Pixels that changed.
    pub pixels_changed: u64,
    /// Regions that moved (send first, as CopyRect).
    pub moves: Vec<Move>,
    /// Regions with new pixels.
    pub rects: Vec<Rect>,
}

/// Compares candidate pages with the screen and updates the screen.
pub struct UpdateScanner {
    geometry: FbGeometry,
    cells_x: usize,
    cells_y: usize,
    marked: Vec<bool>,
    page: Box<[u8; PAGE_SIZE]>,
    /// The framebuffer as last scanned, in its own layout (the paper's
    /// backup): an unchanged page is one 4 KiB comparison, whatever the
    /// layout; only changed pages are walked pixel run by pixel run.
    backup: Vec<u8>,
    /// The screen as it was before the current scan (kept in step with the
    /// screen after each scan), for move detection.
    before: Vec<u32>,
    /// Changed runs of the current scan: (row start index, len).
    changed_runs: Vec<(usize, usize)>,
}

impl UpdateScanner {
    pub fn new(geometry: FbGeometry) -> UpdateScanner {
        let cells_x = usize::from(geometry.width).div_ceil(CELL);
        let cells_y = usize::from(geometry.height).div_ceil(CELL);
        UpdateScanner {
            geometry,
            cells_x,
            cells_y,
            marked: vec![false; cells_x * cells_y],
            page: Box::new([0; PAGE_SIZE]),
            backup: vec![0; geometry.mapped_bytes()],
            before: vec![0; usize::from(geometry.width) * usize::from(geometry.height)],
            changed_runs: Vec::new(),
        }
    }

    /// Compares `pages` of `fb` with `screen`, writing changed pixels into
    /// `screen`.
    pub fn scan(&mut self, fb: &FramebufferMemory, pages: &PageSet, screen: &Screen) -> Changes {
        let width = usize::from(self.geometry.width);
        let mut changes = Changes::default();
        self.marked.iter_mut().for_each(|m| *m = false);
        self.changed_runs.clear();
        let mut pixels = screen.write();
        for page in pages.iter() {
            if page >= self.geometry.pages() {
                break;
            }
            fb.read_page(page, &mut self.page);
            changes.pages_compared += 1;
            let backup = &mut self.backup[page * PAGE_SIZE..(page + 1) * PAGE_SIZE];
            if backup == &self.page[..] {
                continue;
            }
            backup.copy_from_slice(&self.page[..]);
            let mut page_changed = false;
            let (marked, cells_x) = (&mut self.marked, self.cells_x);
            let changed_runs = &mut self.changed_runs;
            let buf = &self.page;
            self.geometry.page_runs(page, |run| {
                let n = usize::from(run.x1 - run.x0);
                let bytes = &buf[run.offset..run.offset + n * BYTES_PER_PIXEL];
                let row = usize::from(run.y) * width;
                let old = &mut pixels[row + usize::from(run.x0)..row + usize::from(run.x1)];
                if as_bytes(old) == bytes {
                    return;
                }
                page_changed = true;
                let mut first = usize::MAX;
                let mut last = 0;
                for (i, (px, new)) in old.iter_mut().zip(bytes.chunks_exact(4)).enumerate() {
                    let new = u32::from_le_bytes([new[0], new[1], new[2], new[3]]);
                    if *px != new {
                        *px = new;
                        first = first.min(i);
                        last = i;
                        changes.pixels_changed += 1;
                    }
                }
                changed_runs.push((row + usize::from(run.x0), n));
                let cy = usize::from(run.y) / CELL;
                let x0 = usize::from(run.x0);
                for cx in (x0 + first) / CELL..=(x0 + last) / CELL {
                    marked[cy * cells_x + cx] = true;
                }
            });
            if page_changed {
                changes.pages_changed += 1;
            }
        }
        let rects = self.rectangles();
        for rect in rects {
            match self.find_move(&pixels, rect) {
                Some((m, exposed)) => {
                    changes.moves.push(m);
                    changes.rects.extend(exposed.filter(|r| !r.is_empty()));
                }
                None => changes.rects.push(rect),
            }
        }
        // Bring the "before" copy up to date for the next scan.
        for &(start, len) in &self.changed_runs {
            self.before[start..start + len].copy_from_slice(&pixels[start..start + len]);
        }
        changes
    }

    /// Whether `rect` holds the old content of the same columns moved up or
    /// down by 1..=MAX_SCROLL lines; then the move and the exposed lines.
    fn find_move(&self, now: &[u32], rect: Rect) -> Option<(Move, Option<Rect>)> {
        if rect.w < MIN_MOVE_SIDE || rect.h < MIN_MOVE_SIDE {
            return None;
        }
        let width = usize::from(self.geometry.width);
        let (x0, x1) = (usize::from(rect.x), rect.right() as usize);
        let (top, bottom) = (usize::from(rect.y), rect.bottom() as usize);
        let same = |new_y: usize, old_y: usize| {
            now[new_y * width + x0..new_y * width + x1]
                == self.before[old_y * width + x0..old_y * width + x1]
        };
        let max = MAX_SCROLL.min(usize::from(rect.h) / 2);
        for k in 1..=max {
            // Up: new row y is old row y + k.
            if same(top, top + k) && (top..bottom - k).all(|y| same(y, y + k)) {
                let src = Rect::new(rect.x, (top + k) as u16, rect.w, rect.h - k as u16);
                let exposed = Rect::new(rect.x, (bottom - k) as u16, rect.w, k as u16);
                let m = Move {
                    src,
                    dst_x: rect.x,
                    dst_y: rect.y,
                };
                return Some((m, Some(exposed)));
            }
            // Down: new row y is old row y - k.
            if same(bottom - 1, bottom - 1 - k) && (top + k..bottom).all(|y| same(y, y - k)) {
                let src = Rect::new(rect.x, rect.y, rect.w, rect.h - k as u16);
                let exposed = Rect::new(rect.x, rect.y, rect.w, k as u16);
                let m = Move {
                    src,
                    dst_x: rect.x,
                    dst_y: (top + k) as u16,
                };
                return Some((m, Some(exposed)));
            }
        }
        None
    }

    /// Covers the marked cells with rectangles: runs of cells per cell row,
    /// merged downwards while the run below has the same extent.
    fn rectangles(&self) -> Vec<Rect> {
        let (w, h) = (
            usize::from(self.geometry.width),
            usize::from(self.geometry.height),
        );
        let mut rects: Vec<Rect> = Vec::new();
        // Index into `rects` of the open rectangle per starting cell column
        // of the previous row, to extend downwards.
        let mut open: Vec<Option<usize>> = vec![None; self.cells_x];
        for cy in 0..self.cells_y {
            let mut next_open: Vec<Option<usize>> = vec![None; self.cells_x];
            let mut cx = 0;
            while cx < self.cells_x {
                if !self.marked[cy * self.cells_x + cx] {
                    cx += 1;
                    continue;
                }
                let start = cx;
                while cx < self.cells_x && self.marked[cy * self.cells_x + cx] {
                    cx += 1;
                }
                let x = start * CELL;
                let rw = (cx * CELL).min(w) - x;
                let y = cy * CELL;
                let rh = ((cy + 1) * CELL).min(h) - y;
                match open[start] {
                    Some(i) if usize::from(rects[i].w) == rw && rects[i].bottom() as usize == y => {
                        rects[i].h += rh as u16;
                        next_open[start] = Some(i);
                    }
                    _ => {
                        rects.push(Rect::new(x as u16, y as u16, rw as u16, rh as u16));
                        next_open[start] = Some(rects.len() - 1);
                    }
                }
            }
            open = next_open;
        }
        rects
    }
}

fn as_bytes(pixels: &[u32]) -> &[u8] {
    // SAFETY: u32 has no padding and any byte pattern is a valid u8; the
    // length covers exactly the same memory; alignment of u8 is 1.
    unsafe { std::slice::from_raw_parts(pixels.as_ptr().cast(), std::mem::size_of_val(pixels)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;

    fn draw(fb: &FramebufferMemory, g: &FbGeometry, r: Rect, color: u32) {
        for y in r.y..r.y + r.h {
            for x in r.x..r.x + r.w {
                fb.write(g.offset(x.into(), y.into()), &color.to_le_bytes());
            }
        }
    }

    fn all(g: &FbGeometry) -> PageSet {
        let mut p = PageSet::new(g.pages());
        p.insert_all();
        p
    }

    #[test]
    fn finds_a_rectangle_in_both_layouts() {
        for layout in [Layout::Linear, Layout::Tiled] {
            let g = FbGeometry::new(1024, 768, layout).unwrap();
            let fb = FramebufferMemory::new(g).unwrap();
            let screen = Screen::new(1024, 768);
            let mut scanner = UpdateScanner::new(g);
            let icon = Rect::new(100, 100, 64, 64);
            draw(&fb, &g, icon, 0x00ff8000);
            let c = scanner.scan(&fb, &all(&g), &screen);
            assert_eq!(c.pixels_changed, 64 * 64);
            assert_eq!(
                c.pages_changed,
                if layout == Layout::Tiled { 9 } else { 64 }
            );
            // 100..164 in 16-pixel cells: 96..176.
            assert_eq!(c.rects, vec![Rect::new(96, 96, 80, 80)], "{layout}");
            let px = screen.read();
            assert_eq!(px[120 * 1024 + 130], 0x00ff8000);
            assert_eq!(px[99 * 1024 + 130], 0);
            drop(px);
            // Nothing new: nothing found.
            let c = scanner.scan(&fb, &all(&g), &screen);
            assert_eq!((c.pages_changed, c.rects.len()), (0, 0));
        }
    }

    /// A scroll (the canvas moved up by 8 lines, a new stripe below) becomes
    /// a move plus the exposed lines, in both layouts; the screen copy then
    /// equals the framebuffer.
    #[test]
    fn scrolling_is_found_as_a_move() {
        for layout in [Layout::Linear, Layout::Tiled] {
            let g = FbGeometry::new(1024, 768, layout).unwrap();
            let fb = FramebufferMemory::new(g).unwrap();
            let screen = Screen::new(1024, 768);
            let mut scanner = UpdateScanner::new(g);
            let canvas = Rect::new(96, 96, 640, 480);
            // Stripes of varying height and colour, so only one shift fits.
            let color = |y: u16| 0x010203u32.wrapping_mul(u32::from(y) * u32::from(y) % 251);
            for y in canvas.y..canvas.y + canvas.h {
                draw(&fb, &g, Rect::new(canvas.x, y, canvas.w, 1), color(y));
            }
            scanner.scan(&fb, &all(&g), &screen);
            for y in canvas.y..canvas.y + canvas.h {
                let c = if y + 8 < canvas.y + canvas.h {
                    color(y + 8)
                } else {
                    0xffffff
                };
                draw(&fb, &g, Rect::new(canvas.x, y, canvas.w, 1), c);
            }
            let c = scanner.scan(&fb, &all(&g), &screen);
            assert_eq!(
                c.moves,
                vec![Move {
                    src: Rect::new(96, 104, 640, 472),
                    dst_x: 96,
                    dst_y: 96
                }],
                "{layout}"
            );
            assert_eq!(c.rects, vec![Rect::new(96, 568, 640, 8)], "{layout}");
            let px = screen.read();
            assert_eq!(px[100 * 1024 + 100], color(108));
            assert_eq!(px[570 * 1024 + 100], 0xffffff);
        }
    }

    #[test]
    fn same_colour_overwrite_and_unreported_pages_give_nothing() {
        let g = FbGeometry::new(640, 480, Layout::Linear).unwrap();
        let fb = FramebufferMemory::new(g).unwrap();
        let screen = Screen::new(640, 480);
        let mut scanner = UpdateScanner::new(g);
        draw(&fb, &g, Rect::new(0, 0, 10, 10), 0);
        let c = scanner.scan(&fb, &all(&g), &screen);
        assert_eq!(
            c,
            Changes {
                pages_compared: g.pages(),
                ..Default::default()
            }
        );
        // A change on a page nobody reported stays unseen.
        draw(&fb, &g, Rect::new(0, 200, 10, 1), 7);
        let c = scanner.scan(&fb, &PageSet::new(g.pages()), &screen);
        assert_eq!(c.pixels_changed, 0);
    }

    #[test]
    fn tiled_and_linear_give_the_same_screen() {
        let mut screens = Vec::new();
        for layout in [Layout::Linear, Layout::Tiled] {
            let g = FbGeometry::new(640, 480, layout).unwrap();
            let fb = FramebufferMemory::new(g).unwrap();
            let screen = Screen::new(640, 480);
            for (i, r) in [Rect::new(3, 5, 100, 7), Rect::new(600, 400, 40, 80)]
                .iter()
                .enumerate()
            {
                draw(&fb, &g, *r, 0x123456 * (i as u32 + 1));
            }
            UpdateScanner::new(g).scan(&fb, &all(&g), &screen);
            screens.push(screen.read().clone());
        }
        assert_eq!(screens[0], screens[1]);
    }
}

#[cfg(test)]
mod timing {
    use super::*;
    use crate::layout::Layout;

    /// Not an assertion on speed (tests are not benchmarks): prints what a
    /// full-frame compare costs here, for the docs' claim.
    #[test]
    #[ignore = "prints timings; run by hand"]
    fn full_frame_compare_cost() {
        for layout in [Layout::Linear, Layout::Tiled] {
            let g = FbGeometry::new(1024, 768, layout).unwrap();
            let fb = FramebufferMemory::new(g).unwrap();
            let screen = Screen::new(1024, 768);
            let mut scanner = UpdateScanner::new(g);
            let mut all = PageSet::new(g.pages());
            all.insert_all();
            scanner.scan(&fb, &all, &screen);
            let t = std::time::Instant::now();
            for _ in 0..100 {
                scanner.scan(&fb, &all, &screen);
            }
            eprintln!("{layout}: unchanged full frame {:?}", t.elapsed() / 100);
            let t = std::time::Instant::now();
            for i in 0..20u8 {
                fb.write(0, &vec![i; g.bytes()]);
                scanner.scan(&fb, &all, &screen);
            }
            eprintln!("{layout}: all pixels changed {:?}", t.elapsed() / 20);
        }
    }
}
