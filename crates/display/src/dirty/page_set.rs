//! A set of framebuffer pages, as a bitmap (KVM's dirty-log format).

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageSet {
    bits: Vec<u64>,
    pages: usize,
}

impl PageSet {
    pub fn new(pages: usize) -> PageSet {
        PageSet {
            bits: vec![0; pages.div_ceil(64)],
            pages,
        }
    }

    /// Capacity in pages.
    pub fn pages(&self) -> usize {
        self.pages
    }

    pub fn insert(&mut self, page: usize) {
        if page < self.pages {
            self.bits[page / 64] |= 1 << (page % 64);
        }
    }

    pub fn contains(&self, page: usize) -> bool {
        page < self.pages && self.bits[page / 64] & (1 << (page % 64)) != 0
    }

    pub fn insert_all(&mut self) {
        for (i, word) in self.bits.iter_mut().enumerate() {
            let left = self.pages - i * 64;
            *word = if left >= 64 { !0 } else { (1 << left) - 1 };
        }
    }

    /// Adds the pages of a KVM-style bitmap (bit n of word n/64 = page n).
    pub fn merge_words(&mut self, words: &[u64]) {
        for (mine, theirs) in self.bits.iter_mut().zip(words) {
            *mine |= theirs;
        }
        self.trim();
    }

    pub fn merge(&mut self, other: &PageSet) {
        self.merge_words(&other.bits);
    }

    pub fn clear(&mut self) {
        self.bits.iter_mut().for_each(|w| *w = 0);
    }

    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&w| w == 0)
    }

    pub fn len(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn words(&self) -> &[u64] {
        &self.bits
    }

    /// Pages in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.bits.iter().enumerate().flat_map(|(i, &word)| {
            let mut w = word;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros() as usize;
                w &= w - 1;
                Some(i * 64 + bit)
            })
        })
    }

    /// Maximal runs of consecutive pages, as (first, count).
    pub fn runs(&self) -> Vec<(usize, usize)> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for page in self.iter() {
            match runs.last_mut() {
                Some((first, count)) if *first + *count == page => *count += 1,
                _ => runs.push((page, 1)),
            }
        }
        runs
    }

    fn trim(&mut self) {
        let extra = self.bits.len() * 64 - self.pages;
        if extra > 0 {
            if let Some(last) = self.bits.last_mut() {
                *last &= !0u64 >> extra;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let mut s = PageSet::new(130);
        s.insert(0);
        s.insert(64);
        s.insert(65);
        s.insert(129);
        s.insert(130); // out of range: ignored
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 64, 65, 129]);
        assert_eq!(s.runs(), vec![(0, 1), (64, 2), (129, 1)]);
        assert_eq!(s.len(), 4);
        s.insert_all();
        assert_eq!(s.len(), 130);
        s.clear();
        assert!(s.is_empty());
        s.merge_words(&[1, 0, !0]);
        assert_eq!(s.len(), 3, "bits past the end are dropped");
    }
}
