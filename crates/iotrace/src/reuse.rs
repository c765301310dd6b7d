//! Reuse distances of a block trace, and what they say about cache sizes.
//!
//! The reuse (LRU stack) distance of an access is the number of distinct
//! blocks touched since the previous access to the same block, that block
//! included: `a b c a` gives the second `a` distance 3. An LRU cache of `C`
//! blocks hits exactly the accesses whose distance is at most `C` (Mattson
//! et al., 1970), so one pass over the trace gives the hit ratio of every
//! cache size at once — the miss-ratio curve — and from it the working set:
//! the smallest cache that reaches a given hit ratio. First accesses (cold
//! misses) have no distance and miss in any cache.
//!
//! The pass keeps, in a Fenwick tree over trace positions, a 1 at the
//! position of each block's latest access; the distance of an access is the
//! number of 1s from its block's previous position to now. O(n log n) time,
//! O(n) memory for a trace of n accesses.

use std::collections::HashMap;

/// The reuse distances of one trace, as a histogram.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ReuseProfile {
    /// Bytes per block of the trace.
    pub block_bytes: u64,
    /// Accesses in the trace.
    pub accesses: u64,
    /// First accesses to a block: misses whatever the cache's size.
    pub cold_misses: u64,
    /// `hits_within[c]`: accesses whose distance is at most `c` — the hits
    /// of an LRU cache of `c` blocks. Index 0 is 0; the last index is the
    /// number of distinct blocks, where every reuse hits.
    hits_within: Vec<u64>,
}

/// One access of a block trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// An access that hits or misses: it has a distance (or is a cold
    /// miss) and counts in the hit ratios.
    Counted(u64),
    /// An access that only puts its block at the top of the LRU stack: a
    /// write, for a profile of re-reads. A write-back cache holds what was
    /// written, so the next read of it hits a cache of that distance, but
    /// the write itself is no hit or miss of the data a reader needs.
    Touch(u64),
}

impl Access {
    /// The block accessed.
    pub fn block(self) -> u64 {
        match self {
            Access::Counted(block) | Access::Touch(block) => block,
        }
    }

    /// Whether the access counts as a hit or a miss.
    pub fn is_counted(self) -> bool {
        matches!(self, Access::Counted(_))
    }
}

/// One point of a miss-ratio curve.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct CurvePoint {
    /// The LRU cache's size, in blocks.
    pub cache_blocks: u64,
    /// The fraction of accesses it would have hit.
    pub hit_ratio: f64,
}

impl ReuseProfile {
    /// Computes the profile of a trace of block numbers, every access
    /// counted.
    pub fn from_trace(blocks: impl IntoIterator<Item = u64>, block_bytes: u64) -> Self {
        Self::from_accesses(blocks.into_iter().map(Access::Counted), block_bytes)
    }

    /// Computes the profile of a trace whose uncounted accesses only move
    /// their block to the top of the stack (see [`Access`]).
    pub fn from_accesses(trace: impl IntoIterator<Item = Access>, block_bytes: u64) -> Self {
        let trace: Vec<Access> = trace.into_iter().collect();
        let mut latest = Fenwick::new(trace.len());
        let mut last_seen: HashMap<u64, usize> = HashMap::new();
        // distances[d]: counted accesses at distance exactly d.
        let mut distances: Vec<u64> = vec![0];
        let (mut accesses, mut cold_misses) = (0, 0);
        for (now, access) in trace.iter().enumerate() {
            let (block, counted) = (access.block(), access.is_counted());
            accesses += u64::from(counted);
            match last_seen.insert(block, now) {
                Some(previous) => {
                    if counted {
                        let distance = latest.sum_range(previous, now) as usize;
                        if distances.len() <= distance {
                            distances.resize(distance + 1, 0);
                        }
                        distances[distance] += 1;
                    }
                    latest.add(previous, -1);
                }
                None => cold_misses += u64::from(counted),
            }
            latest.add(now, 1);
        }
        let distinct = last_seen.len();
        distances.resize(distinct + 1, 0);
        let mut hits_within = Vec::with_capacity(distances.len());
        let mut running = 0;
        for count in distances {
            running += count;
            hits_within.push(running);
        }
        Self {
            block_bytes,
            accesses,
            cold_misses,
            hits_within,
        }
    }

    /// Distinct blocks the trace touched (its footprint).
    pub fn distinct_blocks(&self) -> u64 {
        self.hits_within.len() as u64 - 1
    }

    /// Accesses an LRU cache of `cache_blocks` blocks would have hit.
    pub fn hits(&self, cache_blocks: u64) -> u64 {
        let index = cache_blocks.min(self.distinct_blocks()) as usize;
        self.hits_within[index]
    }

    /// The hit ratio of an LRU cache of `cache_blocks` blocks (0 for an
    /// empty trace).
    pub fn hit_ratio(&self, cache_blocks: u64) -> f64 {
        ratio(self.hits(cache_blocks), self.accesses)
    }

    /// The best hit ratio any cache reaches: every reuse hits, only cold
    /// misses remain.
    pub fn max_hit_ratio(&self) -> f64 {
        ratio(self.accesses - self.cold_misses, self.accesses)
    }

    /// The miss-ratio curve at the given cache sizes (in blocks).
    pub fn curve(&self, cache_sizes: &[u64]) -> Vec<CurvePoint> {
        cache_sizes
            .iter()
            .map(|&cache_blocks| CurvePoint {
                cache_blocks,
                hit_ratio: self.hit_ratio(cache_blocks),
            })
            .collect()
    }

    /// The working set: the smallest LRU cache, in blocks, whose hit ratio
    /// reaches `target` (a fraction of all accesses). `None` if no cache
    /// does (the target is above [`max_hit_ratio`](Self::max_hit_ratio)).
    pub fn working_set(&self, target: f64) -> Option<u64> {
        let needed = (target * self.accesses as f64).ceil().max(0.0) as u64;
        self.smallest_cache_with_hits(needed)
    }

    /// The smallest LRU cache, in blocks, that catches `fraction` of the
    /// reuses (cold misses left out, so a short trace whose blocks are
    /// mostly new still has a working set).
    pub fn working_set_of_reuses(&self, fraction: f64) -> u64 {
        let reuses = self.accesses - self.cold_misses;
        let needed = (fraction.clamp(0.0, 1.0) * reuses as f64).ceil() as u64;
        self.smallest_cache_with_hits(needed.min(reuses))
            .unwrap_or_else(|| self.distinct_blocks())
    }

    /// [`working_set_of_reuses`](Self::working_set_of_reuses) in bytes.
    pub fn working_set_of_reuses_bytes(&self, fraction: f64) -> u64 {
        self.working_set_of_reuses(fraction) * self.block_bytes
    }

    fn smallest_cache_with_hits(&self, needed: u64) -> Option<u64> {
        // hits_within is non-decreasing: the first index reaching `needed`.
        let index = self.hits_within.partition_point(|&hits| hits < needed);
        (index < self.hits_within.len()).then_some(index as u64)
    }
}

/// The blocks of `block_bytes` that `len` bytes at `offset` touch, in order.
pub fn blocks_of(offset: u64, len: u64, block_bytes: u64) -> std::ops::Range<u64> {
    if len == 0 {
        return 0..0;
    }
    offset / block_bytes..(offset + len - 1) / block_bytes + 1
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// A Fenwick (binary indexed) tree of counts over positions 0..n.
struct Fenwick {
    tree: Vec<i64>,
}

impl Fenwick {
    fn new(n: usize) -> Self {
        Self {
            tree: vec![0; n + 1],
        }
    }

    fn add(&mut self, position: usize, delta: i64) {
        let mut i = position + 1;
        while i < self.tree.len() {
            self.tree[i] += delta;
            i += i & i.wrapping_neg();
        }
    }

    /// The sum over positions 0..end.
    fn prefix_sum(&self, end: usize) -> i64 {
        let mut i = end;
        let mut sum = 0;
        while i > 0 {
            sum += self.tree[i];
            i -= i & i.wrapping_neg();
        }
        sum
    }

    /// The sum over positions start..end.
    fn sum_range(&self, start: usize, end: usize) -> i64 {
        self.prefix_sum(end) - self.prefix_sum(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hits of an LRU cache of `capacity` blocks, simulated directly; a
    /// touch moves its block up without counting.
    fn simulate_lru(trace: &[Access], capacity: usize) -> u64 {
        let mut stack: Vec<u64> = Vec::new(); // most recent last
        let mut hits = 0;
        for access in trace {
            let (block, counted) = (access.block(), access.is_counted());
            if let Some(at) = stack.iter().position(|&b| b == block) {
                hits += u64::from(counted);
                stack.remove(at);
            } else if capacity > 0 && stack.len() == capacity {
                stack.remove(0);
            }
            if capacity > 0 {
                stack.push(block);
            }
        }
        hits
    }

    /// The profile's hits at every cache size up to past the universe
    /// are the simulated LRU's.
    fn assert_hits_match_lru(profile: &ReuseProfile, trace: &[Access], universe: u64, round: u64) {
        for capacity in 0..=universe as usize + 1 {
            assert_eq!(
                profile.hits(capacity as u64),
                simulate_lru(trace, capacity),
                "round {round}, capacity {capacity}, trace {trace:?}"
            );
        }
    }

    /// A small deterministic generator (xorshift64*), so the tests need no
    /// random-number crate and fail the same way every time.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    #[test]
    fn distances_of_a_hand_made_trace() {
        // a b c a b b d a
        let profile = ReuseProfile::from_trace([1, 2, 3, 1, 2, 2, 4, 1], 4096);
        assert_eq!(profile.accesses, 8);
        assert_eq!(profile.cold_misses, 4);
        assert_eq!(profile.distinct_blocks(), 4);
        // Distances: a=3, b=3, b=1, a=3 (b, d and a itself since a).
        assert_eq!(profile.hits(0), 0);
        assert_eq!(profile.hits(1), 1);
        assert_eq!(profile.hits(2), 1);
        assert_eq!(profile.hits(3), 4);
        assert_eq!(profile.hits(100), 4);
        assert_eq!(profile.max_hit_ratio(), 0.5);
        assert_eq!(profile.working_set(0.5), Some(3));
        assert_eq!(profile.working_set(0.1), Some(1));
        assert_eq!(profile.working_set(0.6), None);
        assert_eq!(profile.working_set_of_reuses(1.0), 3);
        assert_eq!(profile.working_set_of_reuses_bytes(0.25), 4096);
    }

    #[test]
    fn hits_match_a_simulated_lru_on_random_traces() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for round in 0..40u64 {
            let universe = 1 + rng.next() % 60;
            let len = (rng.next() % 400) as usize;
            // Skewed traces (a hot subset) as well as uniform ones.
            let trace: Vec<u64> = (0..len)
                .map(|_| {
                    let r = rng.next();
                    if round.is_multiple_of(2) && !r.is_multiple_of(3) {
                        r % (universe / 4 + 1)
                    } else {
                        r % universe
                    }
                })
                .collect();
            let profile = ReuseProfile::from_trace(trace.iter().copied(), 512);
            let counted: Vec<Access> = trace.iter().copied().map(Access::Counted).collect();
            assert_hits_match_lru(&profile, &counted, universe, round);
            // The working set reaches its target, and one block less does not.
            let target = profile.max_hit_ratio() * 0.8;
            if let Some(ws) = profile.working_set(target) {
                assert!(profile.hit_ratio(ws) >= target);
                if ws > 0 {
                    assert!(profile.hit_ratio(ws - 1) < target);
                }
            }
        }
    }

    #[test]
    fn writes_keep_their_blocks_cached_without_counting() {
        // w1 r2 r1 w3 w3 r1: the reads of 1 find it written (distance 2,
        // then 2 again: 3 and 1 since); rewriting 3 is no re-read.
        let trace = [
            Access::Touch(1),
            Access::Counted(2),
            Access::Counted(1),
            Access::Touch(3),
            Access::Touch(3),
            Access::Counted(1),
        ];
        let profile = ReuseProfile::from_accesses(trace, 4096);
        assert_eq!(profile.accesses, 3);
        assert_eq!(profile.cold_misses, 1);
        assert_eq!(profile.distinct_blocks(), 3);
        assert_eq!(profile.hits(1), 0);
        assert_eq!(profile.hits(2), 2);
        assert_eq!(profile.max_hit_ratio(), 2.0 / 3.0);
        // Counted, the same trace would be mostly re-accesses of 1 and 3.
        let all = ReuseProfile::from_trace([1, 2, 1, 3, 3, 1], 4096);
        assert_eq!(all.max_hit_ratio(), 0.5);
        assert_eq!(all.hits(1), 1);

        // And on random mixes, against a simulated LRU.
        let mut rng = XorShift(0x51_7cc1_b727_220a);
        for round in 0..40u64 {
            let universe = 1 + rng.next() % 40;
            let trace: Vec<Access> = (0..rng.next() % 300)
                .map(|_| {
                    let block = rng.next() % universe;
                    if rng.next().is_multiple_of(2) {
                        Access::Touch(block)
                    } else {
                        Access::Counted(block)
                    }
                })
                .collect();
            let profile = ReuseProfile::from_accesses(trace.iter().copied(), 512);
            assert_hits_match_lru(&profile, &trace, universe, round);
        }
    }

    #[test]
    fn a_loop_larger_than_the_cache_always_misses() {
        // LRU's worst case: a cyclic scan of 10 blocks hits nothing below 10.
        let trace: Vec<u64> = (0..100).map(|i| i % 10).collect();
        let profile = ReuseProfile::from_trace(trace, 4096);
        assert_eq!(profile.hit_ratio(9), 0.0);
        assert_eq!(profile.hit_ratio(10), 0.9);
        let curve = profile.curve(&[1, 9, 10, 20]);
        assert_eq!(
            curve.iter().map(|p| p.hit_ratio).collect::<Vec<_>>(),
            [0.0, 0.0, 0.9, 0.9]
        );
        assert_eq!(profile.working_set(0.9), Some(10));
    }

    #[test]
    fn an_empty_trace_has_no_hits() {
        let profile = ReuseProfile::from_trace([], 4096);
        assert_eq!(profile.hit_ratio(10), 0.0);
        assert_eq!(profile.distinct_blocks(), 0);
        assert_eq!(profile.working_set_of_reuses(0.9), 0);
    }

    #[test]
    fn blocks_of_a_byte_range() {
        assert_eq!(blocks_of(0, 4096, 4096), 0..1);
        assert_eq!(blocks_of(4095, 2, 4096), 0..2);
        assert_eq!(blocks_of(16384, 16384, 4096), 4..8);
        assert_eq!(blocks_of(100, 0, 4096), 0..0);
    }
}
