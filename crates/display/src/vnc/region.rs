//! Regions of the screen a client has yet to be sent: a short list of
//! rectangles, kept bounded by coalescing, plus the split into disjoint
//! rectangles an update needs (overlapping rectangles would send the same
//! pixels twice).

use std::collections::BTreeMap;

use crate::geometry::Rect;

/// Above this many rectangles a region is coalesced, so a flood of small
/// damage costs bounded memory and time per update.
const MAX_RECTS: usize = 64;

/// Coalescing merges rectangles whose top edges fall in the same band of
/// this many rows: nearby damage merges, distant damage stays apart.
const BAND_ROWS: u32 = 64;

/// Beyond this many disjoint pieces an update sends the bounding box: a
/// bigger rectangle costs less than thousands of rectangle headers.
const MAX_PIECES: usize = 512;

/// A set of pixels as possibly overlapping rectangles.
#[derive(Clone, Debug, Default)]
pub struct Region {
    rects: Vec<Rect>,
}

impl Region {
    #[cfg(test)]
    pub fn rects(&self) -> &[Rect] {
        &self.rects
    }

    pub fn add(&mut self, r: Rect) {
        if r.is_empty() || self.rects.iter().any(|e| contains(e, &r)) {
            return;
        }
        self.rects.retain(|e| !contains(&r, e));
        self.rects.push(r);
        if self.rects.len() > MAX_RECTS {
            self.coalesce();
        }
    }

    pub fn intersects(&self, area: &Rect) -> bool {
        self.rects.iter().any(|r| !r.intersect(area).is_empty())
    }

    /// Removes the part of the region inside `area` and returns it as
    /// disjoint rectangles; the rest stays.
    pub fn take_within(&mut self, area: &Rect) -> Vec<Rect> {
        let inside: Vec<Rect> = self
            .rects
            .iter()
            .map(|r| r.intersect(area))
            .filter(|r| !r.is_empty())
            .collect();
        let outside: Vec<Rect> = self.rects.iter().flat_map(|r| subtract(r, area)).collect();
        self.rects.clear();
        for r in outside {
            self.add(r);
        }
        disjoint(&inside)
    }

    /// Bounding boxes per band of rows; one box if that is still too many.
    fn coalesce(&mut self) {
        let mut bands: BTreeMap<u32, Rect> = BTreeMap::new();
        for r in &self.rects {
            let band = bands.entry(u32::from(r.y) / BAND_ROWS).or_default();
            *band = band.union(r);
        }
        self.rects.clear();
        for r in bands.into_values() {
            if self.rects.iter().any(|e| contains(e, &r)) {
                continue;
            }
            self.rects.retain(|e| !contains(&r, e));
            self.rects.push(r);
        }
        if self.rects.len() > MAX_RECTS {
            let all = self.rects.iter().fold(Rect::default(), |a, r| a.union(r));
            self.rects = vec![all];
        }
    }
}

/// Whether `outer` covers all of `inner`.
fn contains(outer: &Rect, inner: &Rect) -> bool {
    inner.x >= outer.x
        && inner.y >= outer.y
        && inner.right() <= outer.right()
        && inner.bottom() <= outer.bottom()
}

/// `r` minus `cut`: at most four rectangles (above, below, left, right).
pub fn subtract(r: &Rect, cut: &Rect) -> Vec<Rect> {
    let i = r.intersect(cut);
    if i.is_empty() {
        return if r.is_empty() { Vec::new() } else { vec![*r] };
    }
    let mut out = Vec::with_capacity(4);
    if i.y > r.y {
        out.push(Rect::new(r.x, r.y, r.w, i.y - r.y));
    }
    if i.bottom() < r.bottom() {
        out.push(Rect::new(
            r.x,
            i.bottom() as u16,
            r.w,
            (r.bottom() - i.bottom()) as u16,
        ));
    }
    if i.x > r.x {
        out.push(Rect::new(r.x, i.y, i.x - r.x, i.h));
    }
    if i.right() < r.right() {
        out.push(Rect::new(
            i.right() as u16,
            i.y,
            (r.right() - i.right()) as u16,
            i.h,
        ));
    }
    out
}

/// The union of `rects` as disjoint rectangles: cut into bands at every
/// top and bottom edge, merge the x-intervals inside each band, then grow
/// a piece downwards while the next band has exactly the same interval.
/// Rectangles must lie within u16 coordinates (right and bottom edges up
/// to 65535), which holds for anything clipped to a screen.
pub fn disjoint(rects: &[Rect]) -> Vec<Rect> {
    let rects: Vec<&Rect> = rects.iter().filter(|r| !r.is_empty()).collect();
    if rects.len() <= 1 {
        return rects.into_iter().copied().collect();
    }
    let mut ys: Vec<u32> = rects
        .iter()
        .flat_map(|r| [u32::from(r.y), r.bottom()])
        .collect();
    ys.sort_unstable();
    ys.dedup();

    let mut out: Vec<Rect> = Vec::new();
    // Pieces that ended at the previous band's bottom: (x0, x1, index in out).
    let mut open: Vec<(u32, u32, usize)> = Vec::new();
    for band in ys.windows(2) {
        let (y0, y1) = (band[0], band[1]);
        let mut spans: Vec<(u32, u32)> = rects
            .iter()
            .filter(|r| u32::from(r.y) <= y0 && r.bottom() >= y1)
            .map(|r| (u32::from(r.x), r.right()))
            .collect();
        spans.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(spans.len());
        for (a, b) in spans {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        let mut next_open = Vec::with_capacity(merged.len());
        for (a, b) in merged {
            let same = open.iter().find(|&&(oa, ob, _)| oa == a && ob == b);
            let index = match same {
                Some(&(_, _, i)) => {
                    out[i].h = (y1 - u32::from(out[i].y)) as u16;
                    i
                }
                None => {
                    out.push(Rect::new(
                        a as u16,
                        y0 as u16,
                        (b - a) as u16,
                        (y1 - y0) as u16,
                    ));
                    out.len() - 1
                }
            };
            next_open.push((a, b, index));
        }
        open = next_open;
    }
    if out.len() > MAX_PIECES {
        let all = out.iter().fold(Rect::default(), |a, r| a.union(r));
        return vec![all];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pixel of `rects`, for comparing coverage.
    fn pixels(rects: &[Rect]) -> std::collections::BTreeSet<(u32, u32)> {
        let mut s = std::collections::BTreeSet::new();
        for r in rects {
            for y in u32::from(r.y)..r.bottom() {
                for x in u32::from(r.x)..r.right() {
                    s.insert((x, y));
                }
            }
        }
        s
    }

    fn total_area(rects: &[Rect]) -> u64 {
        rects.iter().map(Rect::area).sum()
    }

    #[test]
    fn disjoint_covers_exactly_once() {
        let rects = [
            Rect::new(0, 0, 10, 10),
            Rect::new(5, 5, 10, 10),
            Rect::new(30, 0, 4, 40),
            Rect::new(0, 20, 40, 2),
            Rect::new(2, 2, 3, 3),
        ];
        let d = disjoint(&rects);
        assert_eq!(pixels(&d), pixels(&rects));
        assert_eq!(total_area(&d), pixels(&rects).len() as u64);
    }

    #[test]
    fn disjoint_merges_vertically() {
        let d = disjoint(&[Rect::new(0, 0, 10, 5), Rect::new(0, 5, 10, 5)]);
        assert_eq!(d, vec![Rect::new(0, 0, 10, 10)]);
    }

    #[test]
    fn subtract_leaves_the_frame() {
        let r = Rect::new(0, 0, 10, 10);
        let cut = Rect::new(3, 3, 4, 4);
        let pieces = subtract(&r, &cut);
        assert_eq!(total_area(&pieces), 100 - 16);
        let mut want = pixels(&[r]);
        for p in pixels(&[cut]) {
            want.remove(&p);
        }
        assert_eq!(pixels(&pieces), want);
        assert_eq!(subtract(&r, &Rect::new(20, 20, 1, 1)), vec![r]);
        assert!(subtract(&r, &Rect::new(0, 0, 20, 20)).is_empty());
    }

    #[test]
    fn take_within_splits_inside_and_outside() {
        let mut reg = Region::default();
        reg.add(Rect::new(0, 0, 100, 10));
        let inside = reg.take_within(&Rect::new(50, 0, 100, 100));
        assert_eq!(inside, vec![Rect::new(50, 0, 50, 10)]);
        assert_eq!(reg.rects(), &[Rect::new(0, 0, 50, 10)]);
    }

    #[test]
    fn stays_bounded_and_covering() {
        let mut reg = Region::default();
        let mut added = Vec::new();
        for i in 0..1000u16 {
            let r = Rect::new((i * 37) % 600, (i * 53) % 460, 8, 8);
            added.push(r);
            reg.add(r);
            assert!(reg.rects().len() <= MAX_RECTS);
        }
        let covered = pixels(reg.rects());
        assert!(pixels(&added).is_subset(&covered));
    }

    #[test]
    fn contained_rects_are_dropped() {
        let mut reg = Region::default();
        reg.add(Rect::new(10, 10, 5, 5));
        reg.add(Rect::new(0, 0, 50, 50));
        reg.add(Rect::new(1, 1, 2, 2));
        assert_eq!(reg.rects(), &[Rect::new(0, 0, 50, 50)]);
    }
}
