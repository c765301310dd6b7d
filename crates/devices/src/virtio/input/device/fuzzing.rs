//! Entry point for the fuzz target in `fuzz/` (not an API): a guest's
//! event and status queues, corrupt as it likes, through the input
//! worker's handler, events the host sends in between, and the driver's
//! `select`/`subsel` configuration queries, over a small guest memory with
//! a hole.

use std::sync::Arc;

use vmm_sys_util::epoll::EventSet;

use super::{
    Input, InputConfig, InputEvent, InputHandler, InputKind, QUEUE_SIZE, TOKEN_EVENTQ,
    TOKEN_STATUSQ, TOKEN_WAKE,
};
use crate::virtio::fuzzing::{
    guest_memory, rings_from, write_data, CountingInterrupt, Input as Bytes, Ring, RING_INPUT_LEN,
    RING_SIZE,
};
use crate::virtio::input::config::{CONFIG_SIZE, PAYLOAD_SIZE};
use crate::virtio::worker::WorkerHandler;
use crate::virtio::VirtioDevice;

/// Input byte 0: a tablet (else a keyboard).
pub const TABLET: u8 = 1;
/// Input byte 0: the driver accepted VIRTIO_RING_F_EVENT_IDX.
pub const EVENT_IDX: u8 = 2;
/// Bytes of input for one queue.
pub const RING_BYTES: usize = RING_INPUT_LEN;
/// Ops (see [`queues`]).
pub const OP_SEND: u8 = 0;
pub const OP_EVENTQ: u8 = 1;
pub const OP_STATUSQ: u8 = 2;
pub const OP_WAKE: u8 = 3;
pub const OP_CONFIG: u8 = 4;
/// Ops one input makes at most.
const MAX_OPS: usize = 64;

/// Runs `input` through the input device. Layout:
/// - byte 0: [`TABLET`], [`EVENT_IDX`];
/// - the event queue, then the status queue, [`RING_BYTES`] each
///   ([`Ring::write_from`]);
/// - a byte n (mod [`MAX_OPS`]), then n ops, a byte (mod 5) and operands:
///   - [`OP_SEND`]: the host sends events: a count byte (mod 8) and that
///     many 8-byte events (type, code, value, little-endian);
///   - [`OP_EVENTQ`], [`OP_STATUSQ`]: the driver kicks that queue;
///   - [`OP_WAKE`]: the host wakes the worker;
///   - [`OP_CONFIG`]: the driver writes the configuration space (an
///     offset byte, a length byte mod 9, that many bytes) and reads it
///     back whole;
/// - the rest: guest memory contents from [`crate::virtio::fuzzing::DATA`]
///   (event buffers and status events).
///
/// Panics if the configuration space says an answer is longer than its
/// room, if more events reach the guest than the host sent, or (when no
/// event was written into guest memory, which could hold the rings) if a
/// used entry names a chain the ring cannot have or a length other than
/// an event's (0 on the status queue). Returns the events delivered.
pub fn queues(input: &[u8]) -> std::io::Result<u64> {
    let mut input = Bytes(input);
    let control = input.u8();
    let mem = guest_memory();
    let rings: [Ring; 2] = rings_from(&mem, &mut input);
    let ops_count = usize::from(input.u8()) % MAX_OPS;
    let kind = if control & TABLET != 0 {
        InputKind::Tablet
    } else {
        InputKind::Keyboard
    };
    let (mut device, input_control) = Input::new(InputConfig::new(kind))?;
    // As activation does: events from now on wait for the guest's buffers.
    input_control.lock().active = true;
    let event_idx = control & EVENT_IDX != 0;
    let queue = |index: u16| rings[usize::from(index)].queue_events(index, QUEUE_SIZE, event_idx);
    let mut handler = InputHandler {
        memory: mem.clone(),
        interrupt: Arc::new(CountingInterrupt::default()),
        control: input_control.clone(),
        eventq: queue(0)?,
        statusq: queue(1)?,
    };
    // The ops come before the guest memory in the input; run them after.
    let mut ops = Vec::new();
    for _ in 0..ops_count {
        let op = input.u8() % 5;
        let operands = match op {
            OP_SEND => {
                let n = usize::from(input.u8() % 8);
                input.bytes(8 * n)
            }
            OP_CONFIG => {
                let offset = input.u8();
                let len = usize::from(input.u8() % 9);
                let bytes = input.bytes(len);
                ops.push((op, vec![offset], bytes));
                continue;
            }
            _ => &[],
        };
        ops.push((op, Vec::new(), operands));
    }
    write_data(&mem, &mut input);

    let mut sent = 0u64;
    for (op, extra, operands) in ops {
        match op {
            OP_SEND => {
                let events: Vec<InputEvent> = operands
                    .chunks_exact(8)
                    .map(|b| InputEvent::from_bytes(b.try_into().unwrap_or([0; 8])))
                    .collect();
                sent += events.len() as u64;
                input_control.send_events(&events);
            }
            OP_EVENTQ => handler.handle(TOKEN_EVENTQ, EventSet::IN),
            OP_STATUSQ => handler.handle(TOKEN_STATUSQ, EventSet::IN),
            OP_WAKE => handler.handle(TOKEN_WAKE, EventSet::IN),
            _ => {
                device.write_config(u64::from(extra[0]), operands);
                let mut space = [0u8; CONFIG_SIZE + 8];
                device.read_config(0, &mut space);
                assert!(usize::from(space[2]) <= PAYLOAD_SIZE, "size {}", space[2]);
                assert!(space[CONFIG_SIZE..].iter().all(|&b| b == 0));
            }
        }
    }

    let delivered = input_control.delivered();
    assert!(
        delivered <= sent,
        "{delivered} events delivered, {sent} sent"
    );
    // The used rings say what the device did only if no event went into
    // guest memory: event buffers may lie over the rings.
    let checked: &[Ring] = if delivered == 0 { &rings } else { &[] };
    for (ring, event_len) in checked.iter().zip([InputEvent::SIZE as u32, 0]) {
        for (id, len) in ring.used_entries(&mem) {
            assert!(
                id < u32::from(RING_SIZE) && (len == 0 || len == event_len),
                "used ({id}, {len})"
            );
        }
    }
    Ok(delivered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::fuzzing::{ring_input, DATA};

    #[test]
    fn events_reach_buffers_and_leds_come_back() {
        const W: u16 = 2;
        let mut input = vec![0];
        // Event buffers: one too small, two good.
        input.extend_from_slice(&ring_input(&[
            &[(DATA, 4, W)],
            &[(DATA + 0x10, 8, W)],
            &[(DATA + 0x20, 8, W)],
        ]));
        // A status buffer: caps lock on.
        input.extend_from_slice(&ring_input(&[&[(DATA + 0x40, 8, 0)]]));
        input.extend_from_slice(&[5, OP_SEND, 2]);
        input.extend_from_slice(&InputEvent::new(1, 30, 1).to_bytes());
        input.extend_from_slice(&InputEvent::syn().to_bytes());
        input.extend_from_slice(&[OP_EVENTQ, OP_STATUSQ, OP_CONFIG, 0, 2, 0x11, 1, OP_WAKE]);
        input.resize(input.len() + 0x40, 0);
        input.extend_from_slice(&InputEvent::new(0x11, 1, 1).to_bytes());
        assert_eq!(queues(&input).unwrap(), 2);
    }
}
