//! Rectangles in screen pixels.

/// A rectangle of pixels: `x`, `y` is its top-left corner, `w` x `h` its size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rect {
    pub x: u16,
    pub y: u16,
    pub w: u16,
    pub h: u16,
}

impl Rect {
    pub const fn new(x: u16, y: u16, w: u16, h: u16) -> Rect {
        Rect { x, y, w, h }
    }

    pub fn is_empty(&self) -> bool {
        self.w == 0 || self.h == 0
    }

    /// Number of pixels covered.
    pub fn area(&self) -> u64 {
        u64::from(self.w) * u64::from(self.h)
    }

    pub fn right(&self) -> u32 {
        u32::from(self.x) + u32::from(self.w)
    }

    pub fn bottom(&self) -> u32 {
        u32::from(self.y) + u32::from(self.h)
    }

    /// The smallest rectangle holding both.
    pub fn union(&self, other: &Rect) -> Rect {
        if self.is_empty() {
            return *other;
        }
        if other.is_empty() {
            return *self;
        }
        let x = self.x.min(other.x);
        let y = self.y.min(other.y);
        let r = self.right().max(other.right());
        let b = self.bottom().max(other.bottom());
        Rect::new(x, y, (r - u32::from(x)) as u16, (b - u32::from(y)) as u16)
    }

    /// The overlap of both (empty when they do not overlap).
    pub fn intersect(&self, other: &Rect) -> Rect {
        let x = u32::from(self.x.max(other.x));
        let y = u32::from(self.y.max(other.y));
        let r = self.right().min(other.right());
        let b = self.bottom().min(other.bottom());
        if r <= x || b <= y {
            return Rect::default();
        }
        Rect::new(x as u16, y as u16, (r - x) as u16, (b - y) as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_and_intersection() {
        let a = Rect::new(0, 0, 10, 10);
        let b = Rect::new(5, 8, 10, 10);
        assert_eq!(a.union(&b), Rect::new(0, 0, 15, 18));
        assert_eq!(a.intersect(&b), Rect::new(5, 8, 5, 2));
        assert!(a.intersect(&Rect::new(10, 0, 5, 5)).is_empty());
        assert_eq!(Rect::default().union(&b), b);
    }
}
