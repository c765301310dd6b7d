//! Entry point for the fuzz target in `fuzz/` (not an API): a guest's
//! inflate, deflate and statistics queues, corrupt as it likes, through
//! the balloon worker's handler, over a small guest memory with a hole.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use vmm_sys_util::epoll::EventSet;

use super::{
    BalloonControl, BalloonCounters, BalloonHandler, QUEUE_SIZE, STATS, TOKEN_DEFLATE,
    TOKEN_INFLATE, TOKEN_STATS, TOKEN_WAKE,
};
use crate::virtio::fuzzing::{
    guest_memory, rings_from, write_data, CountingInterrupt, Input, Ring, RING_INPUT_LEN, RING_SIZE,
};
use crate::virtio::worker::WorkerHandler;

/// Input byte 0: the driver accepted the statistics queue.
pub const STATS_VQ: u8 = 1;
/// Input byte 0: the driver accepted VIRTIO_RING_F_EVENT_IDX.
pub const EVENT_IDX: u8 = 2;
/// Bytes of input for one queue.
pub const RING_BYTES: usize = RING_INPUT_LEN;
/// What an event byte asks for (mod 4): the driver kicked the inflate,
/// deflate or statistics queue, or the host asked for statistics.
pub const EVENTS: [usize; 4] = [TOKEN_INFLATE, TOKEN_DEFLATE, TOKEN_STATS, TOKEN_WAKE];

/// Runs `input` through the balloon worker's handler. Layout:
/// - byte 0: [`STATS_VQ`], [`EVENT_IDX`];
/// - the inflate, deflate and statistics queues, [`RING_BYTES`] each
///   ([`Ring::write_from`]; the statistics queue only with [`STATS_VQ`]);
/// - a byte n (mod 16), then n events ([`EVENTS`]), handled in turn;
/// - the rest: guest memory contents from [`crate::virtio::fuzzing::DATA`]
///   (the page frame numbers and statistics).
///
/// Panics if a used entry names a chain the ring cannot have or a
/// length other than 0, if the device uses more chains than the driver
/// offered, or if the counters say more frames were invalid than were
/// inflated. Returns the counters.
pub fn queues(input: &[u8]) -> std::io::Result<BalloonCounters> {
    let mut input = Input(input);
    let control = input.u8();
    let mem = guest_memory();
    let rings: [Ring; 3] = rings_from(&mem, &mut input);
    let events: Vec<usize> = {
        let n = usize::from(input.u8() % 16);
        input
            .bytes(n)
            .iter()
            .map(|&b| EVENTS[usize::from(b % 4)])
            .collect()
    };
    write_data(&mem, &mut input);

    let event_idx = control & EVENT_IDX != 0;
    let queue = |index: u16| rings[usize::from(index)].queue_events(index, QUEUE_SIZE, event_idx);
    let balloon_control = Arc::new(BalloonControl::new(1)?);
    let stats = control & STATS_VQ != 0;
    balloon_control.lock().stats_negotiated = stats;
    let interrupt = Arc::new(CountingInterrupt::default());
    let mut handler = BalloonHandler {
        memory: mem.clone(),
        interrupt: interrupt.clone(),
        control: balloon_control.clone(),
        inflate: queue(0)?,
        deflate: queue(1)?,
        stats: if stats { Some(queue(STATS)?) } else { None },
        held_stats: None,
        pfns: Vec::new(),
    };
    for &token in &events {
        if token == TOKEN_WAKE {
            balloon_control.request_stats();
        }
        handler.handle(token, EventSet::IN);
    }

    let counters = balloon_control.counters();
    assert!(
        counters.invalid_pfns <= counters.inflated_pages,
        "{counters:?}"
    );
    let kicks = |token| events.iter().filter(|&&t| t == token).count() as u64;
    for (ring, token) in rings
        .iter()
        .zip([TOKEN_INFLATE, TOKEN_DEFLATE, TOKEN_STATS])
    {
        let used = ring.used_idx(&mem);
        // A kick takes at most a ring's worth of chains (the available
        // index cannot say more), and the stats queue gives back only
        // what it held.
        assert!(
            u64::from(used) <= kicks(token) * u64::from(RING_SIZE) + kicks(TOKEN_WAKE),
            "{used} chains used"
        );
        for (id, len) in ring.used_entries(&mem) {
            assert!(id < u32::from(RING_SIZE) && len == 0, "used ({id}, {len})");
        }
    }
    let _ = interrupt.queue.load(Ordering::Relaxed);
    Ok(counters)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::fuzzing::{ring_input, DATA, REGION2};

    #[test]
    fn pfns_are_discarded_and_stats_held() {
        // Inflate: one buffer of two frames (one in memory, one in the
        // hole) and one outside memory; deflate one; a stats buffer.
        let mut input = vec![STATS_VQ];
        input.extend_from_slice(&ring_input(&[&[(DATA, 8, 0)], &[(0x1_8000, 8, 0)]]));
        input.extend_from_slice(&ring_input(&[&[(DATA, 4, 0)]]));
        input.extend_from_slice(&ring_input(&[&[(DATA + 0x10, 20, 0)]]));
        input.extend_from_slice(&[4, 0, 1, 2, 3]);
        input.extend_from_slice(&((REGION2 >> 12) as u32).to_le_bytes());
        input.extend_from_slice(&0x18u32.to_le_bytes());
        input.extend_from_slice(&[0; 8]);
        // Two statistics: swap in 7, free memory 4096.
        input.extend_from_slice(&[0, 0, 7, 0, 0, 0, 0, 0, 0, 0]);
        input.extend_from_slice(&[4, 0, 0, 0x10, 0, 0, 0, 0, 0, 0]);
        let counters = queues(&input).unwrap();
        assert_eq!(counters.inflated_pages, 2);
        assert_eq!(counters.invalid_pfns, 1);
        assert_eq!(counters.deflated_pages, 1);
    }
}
