//! Entry point for the fuzz target in `fuzz/` (not an API): a saved
//! device state, whatever a snapshot file or a migration peer says,
//! restored into a real device (rng, balloon, keyboard, tablet, net, block)
//! with or without the queues of an active driver at saved positions,
//! then resumed, kicked, paused, saved again and restored once more.

use std::os::unix::net::UnixDatagram;
use std::sync::Arc;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::DeviceState;
use crate::virtio::balloon::{Balloon, BalloonConfig, BalloonState};
use crate::virtio::block::{Block, BlockConfig, BlockState, MemDisk, SERIAL_LEN};
use crate::virtio::fuzzing::{guest_memory, CountingInterrupt, Input, Ring, RING_SIZE};
use crate::virtio::input::{Input as InputDevice, InputConfig, InputKind, InputState};
use crate::virtio::net::fuzzing::socket_backend;
use crate::virtio::net::{Net, NetState};
use crate::virtio::rng::{Rng, RngConfig};
use crate::virtio::vsock::VsockState;
use crate::virtio::{Activation, QueueEvents, VirtioDevice};
use crate::GuestMemoryMmap;

/// Bytes of input before the state: the device, the flags, the number of
/// queues, [`MAX_QUEUES`] queues of 5 bytes, the accepted features.
pub const PREFIX_LEN: usize = 3 + 5 * MAX_QUEUES + 8;
/// Queues an activation holds at most.
pub const MAX_QUEUES: usize = 4;
/// The devices byte 0 picks (mod 8).
pub const DEVICES: [&str; 8] = [
    "rng",
    "balloon",
    "balloon_stats_oom",
    "keyboard",
    "tablet",
    "net",
    "block",
    "block_readonly_2q",
];
/// Byte 1: the device was active (its queues come with the state).
pub const ACTIVE: u8 = 1;
/// Byte 1: every queue is kicked once the device resumes.
pub const KICK: u8 = 2;

/// The device named `DEVICES[kind]`, and for a net device the host's end
/// of its back end, to keep open as long as the device.
pub fn device(kind: usize) -> std::io::Result<(Box<dyn VirtioDevice>, Option<UnixDatagram>)> {
    let block = |readonly: bool, queues: u16| -> Box<dyn VirtioDevice> {
        let mut config = BlockConfig::new("fuzz.img");
        config.readonly = readonly;
        config.num_queues = Some(queues);
        config.queue_size = RING_SIZE;
        Box::new(Block::from_backend(
            config,
            Arc::new(MemDisk::new(64 * 512)),
            64 * 512,
            [b'f'; SERIAL_LEN],
        ))
    };
    let mut host = None;
    let device: Box<dyn VirtioDevice> = match DEVICES[kind % DEVICES.len()] {
        "rng" => Box::new(Rng::new(RngConfig::default())),
        "balloon" => Box::new(Balloon::new(BalloonConfig::default())?.0),
        "balloon_stats_oom" => Box::new(
            Balloon::new(BalloonConfig {
                deflate_on_oom: true,
                stats: true,
                size_mib: 1,
                id: None,
            })?
            .0,
        ),
        "keyboard" => Box::new(InputDevice::new(InputConfig::new(InputKind::Keyboard))?.0),
        "tablet" => Box::new(InputDevice::new(InputConfig::new(InputKind::Tablet))?.0),
        "net" => {
            let (backend, peer) = socket_backend()?;
            host = Some(peer);
            Box::new(Net::with_backend(
                "net0".into(),
                backend,
                [0x52, 0x54, 0, 0x12, 0x34, 0x56],
                None,
            ))
        }
        "block" => block(false, 1),
        _ => block(true, 2),
    };
    Ok((device, host))
}

/// The queues `prefix` describes, at their saved positions, in rings
/// laid out by [`Ring::nth`] (empty: guest memory is zero), and their
/// kick eventfds.
fn activation(
    prefix: &mut Input,
    mem: &GuestMemoryMmap,
    acked: u64,
) -> std::io::Result<(Activation, Vec<EventFd>)> {
    let count = usize::from(prefix.u8()) % (MAX_QUEUES + 1);
    let mut queues = Vec::new();
    let mut kicks = Vec::new();
    for i in 0..MAX_QUEUES {
        let index = u16::from(prefix.u8() % 8);
        let next_avail = prefix.u16();
        let next_used = prefix.u16();
        if i >= count {
            continue;
        }
        let mut queue = Ring::nth(u64::from(index)).queue(RING_SIZE, false);
        queue_position(&mut queue, next_avail, next_used);
        let kick = EventFd::new(EFD_NONBLOCK)?;
        kicks.push(kick.try_clone()?);
        queues.push(QueueEvents { index, queue, kick });
    }
    Ok((
        Activation {
            memory: mem.clone(),
            interrupt: Arc::new(CountingInterrupt::default()),
            queues,
            acked_features: acked,
        },
        kicks,
    ))
}

fn queue_position(queue: &mut virtio_queue::Queue, next_avail: u16, next_used: u16) {
    use virtio_queue::QueueT;
    queue.set_next_avail(next_avail);
    queue.set_next_used(next_used);
}

/// Restores `state` into the device `prefix` picks. Layout of `prefix`
/// ([`PREFIX_LEN`] bytes, zero past its end): the device (mod 8,
/// [`DEVICES`]); flags ([`ACTIVE`], [`KICK`]); the number of queues (mod
/// 5) and 4 queues, each an index byte (mod 8) and the saved next
/// available and next used positions (u16 each); the accepted features
/// (u64, cut to what the device offers, as the transport checks).
///
/// A state the device refuses is fine. One it takes must leave a device
/// that resumes, serves (with [`KICK`], every queue is kicked), pauses,
/// and whose state, taken again, a new device of the same kind takes
/// with the same queues. Panics otherwise. Returns whether the state was
/// taken.
pub fn restore(prefix: &[u8], state: &DeviceState) -> std::io::Result<bool> {
    let mut prefix = Input(prefix);
    let kind = usize::from(prefix.u8());
    let flags = prefix.u8();
    let (mut device, _host) = device(kind)?;
    let mem = guest_memory();
    let mut queue_input = Input(prefix.bytes(1 + 5 * MAX_QUEUES));
    let acked = prefix.u64() & device.device_features();
    let (activation, kicks) = activation(&mut queue_input, &mem, acked)?;
    let saved_queues: Vec<(u16, u16, u16)> = activation
        .queues
        .iter()
        .map(|q| {
            use virtio_queue::QueueT;
            (q.index, q.queue.next_avail(), q.queue.next_used())
        })
        .collect();
    let active = flags & ACTIVE != 0;
    if device
        .restore_state(state, active.then_some(activation))
        .is_err()
    {
        return Ok(false);
    }
    device
        .resume()
        .unwrap_or_else(|e| panic!("a restored {} does not resume: {e}", DEVICES[kind % 8]));
    if flags & KICK != 0 {
        for kick in &kicks {
            let _ = kick.write(1);
        }
    }
    let positions = device
        .pause()
        .unwrap_or_else(|e| panic!("a restored {} does not pause: {e}", DEVICES[kind % 8]));
    let again = device.save_state();
    device.reset();

    // What the device saved, a new one takes, with the queues where the
    // device left them.
    let (mut fresh, _fresh_host) = self::device(kind)?;
    let activation = if active {
        let mut queues = Vec::new();
        for (index, avail, used) in saved_queues {
            let p = positions.iter().find(|p| p.index == index);
            let mut queue = Ring::nth(u64::from(index)).queue(RING_SIZE, false);
            queue_position(
                &mut queue,
                p.map_or(avail, |p| p.next_avail),
                p.map_or(used, |p| p.next_used),
            );
            queues.push(QueueEvents {
                index,
                queue,
                kick: EventFd::new(EFD_NONBLOCK)?,
            });
        }
        Some(Activation {
            memory: mem.clone(),
            interrupt: Arc::new(CountingInterrupt::default()),
            queues,
            acked_features: acked,
        })
    } else {
        None
    };
    if let Err(e) = fresh.restore_state(&again, activation) {
        panic!("{again:?}, saved by a restored device, is refused: {e}");
    }
    fresh.reset();
    Ok(true)
}

/// A state for the `device_state_fields` target, built from `fields`
/// without JSON: the saved state of a new `DEVICES[kind]` (or, when the
/// first byte is 7 mod 8, of `DEVICES[second byte]`), each of whose
/// fields the next byte keeps (even) or replaces with a value read from
/// the bytes after it. Empty input keeps every field, so most inputs reach
/// the device's own checks rather than serde's, even without coverage
/// guidance.
pub fn state_from_fields(kind: usize, fields: &[u8]) -> std::io::Result<DeviceState> {
    let mut input = Input(fields);
    let from = match input.u8() % 8 {
        7 => usize::from(input.u8()),
        _ => kind,
    };
    let state = device(from)?.0.save_state();
    let input = &mut input;
    Ok(match state {
        DeviceState::Rng => DeviceState::Rng,
        DeviceState::Block(s) => DeviceState::Block(BlockState {
            capacity: field(input, s.capacity, Input::u64),
            readonly: field(input, s.readonly, |i| i.u8() & 1 == 1),
            features: field(input, s.features, Input::u64),
            num_queues: field(input, s.num_queues, Input::u16),
        }),
        DeviceState::Net(s) => DeviceState::Net(NetState {
            config: field(input, s.config, |i| {
                let len = usize::from(i.u8() % 32);
                i.bytes(len).to_vec()
            }),
            features: field(input, s.features, Input::u64),
        }),
        DeviceState::Vsock(s) => DeviceState::Vsock(VsockState {
            cid: field(input, s.cid, Input::u64),
        }),
        DeviceState::Balloon(s) => DeviceState::Balloon(BalloonState {
            features: field(input, s.features, Input::u64),
            num_pages: field(input, s.num_pages, Input::u32),
            actual: field(input, s.actual, Input::u32),
            held_stats: field(input, s.held_stats, |i| (i.u8() & 1 == 1).then(|| i.u16())),
            inflated_pages: field(input, s.inflated_pages, Input::u64),
            deflated_pages: field(input, s.deflated_pages, Input::u64),
            invalid_pfns: field(input, s.invalid_pfns, Input::u64),
            discard_errors: field(input, s.discard_errors, Input::u64),
        }),
        DeviceState::Input(s) => DeviceState::Input(InputState {
            kind: field(input, s.kind, |i| match i.u8() % 4 {
                0 => "keyboard".into(),
                1 => "tablet".into(),
                _ => {
                    let len = usize::from(i.u8() % 16);
                    String::from_utf8_lossy(i.bytes(len)).into_owned()
                }
            }),
            abs_max: field(input, s.abs_max, |i| (i.u32(), i.u32())),
            select: field(input, s.select, Input::u8),
            subsel: field(input, s.subsel, Input::u8),
            leds: field(input, s.leds, Input::u32),
            pending: field(input, s.pending, |i| {
                let len = usize::from(i.u8());
                (0..len)
                    .map(|_| (i.u16(), i.u16(), i.u32() as i32))
                    .collect()
            }),
        }),
    })
}

/// `kept`, or a value `fresh` reads from `input` when the next byte is odd.
fn field<'a, T>(input: &mut Input<'a>, kept: T, fresh: impl FnOnce(&mut Input<'a>) -> T) -> T {
    if input.u8() & 1 == 1 {
        fresh(input)
    } else {
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::balloon::BalloonState;
    use crate::virtio::input::InputState;

    /// Input for `restore`: device `kind` with `flags`, its queues at
    /// entry 3 of their rings, every feature it offers.
    fn prefix(kind: usize, flags: u8) -> Vec<u8> {
        let (dev, _host) = device(kind).unwrap();
        let queues = dev.queue_max_sizes().len().min(MAX_QUEUES);
        let mut out = vec![kind as u8, flags, queues as u8];
        for q in 0..MAX_QUEUES as u8 {
            out.extend_from_slice(&[q, 3, 0, 2, 0]);
        }
        out.extend_from_slice(&dev.device_features().to_le_bytes());
        out
    }

    #[test]
    fn saved_states_come_back_and_foreign_ones_are_refused() {
        for (kind, name) in DEVICES.iter().enumerate() {
            let state = device(kind).unwrap().0.save_state();
            for flags in [0, ACTIVE | KICK] {
                assert!(
                    restore(&prefix(kind, flags), &state).unwrap(),
                    "{name} {flags}"
                );
            }
            // Another kind's state.
            let other = device((kind + 3) % DEVICES.len()).unwrap().0.save_state();
            if other.kind() != state.kind() {
                assert!(!restore(&prefix(kind, ACTIVE), &other).unwrap());
            }
        }
        // A balloon holding a stats buffer past its queue, a tablet with
        // more pending events than it keeps: refused.
        let balloon = DeviceState::Balloon(BalloonState {
            features: device(2).unwrap().0.device_features(),
            num_pages: 256,
            actual: 0,
            held_stats: Some(RING_SIZE),
            inflated_pages: 0,
            deflated_pages: 0,
            invalid_pfns: 0,
            discard_errors: 0,
        });
        assert!(!restore(&prefix(2, ACTIVE), &balloon).unwrap());
        let DeviceState::Input(tablet) = device(4).unwrap().0.save_state() else {
            unreachable!()
        };
        let tablet = DeviceState::Input(InputState {
            pending: vec![(3, 0, 1); 5000],
            ..tablet
        });
        assert!(!restore(&prefix(4, ACTIVE), &tablet).unwrap());
    }

    #[test]
    fn fields_are_kept_unless_the_input_replaces_them() {
        for (kind, name) in DEVICES.iter().enumerate() {
            let own = device(kind).unwrap().0.save_state();
            assert_eq!(state_from_fields(kind, &[]).unwrap(), own, "{name}");
            assert!(
                restore(&prefix(kind, ACTIVE | KICK), &own).unwrap(),
                "{name}"
            );
            // 7: another device's state, DEVICES[kind + 1].
            let other = state_from_fields(kind, &[7, kind as u8 + 1]).unwrap();
            assert_eq!(other, device(kind + 1).unwrap().0.save_state(), "{name}");
        }
        // The block device's capacity replaced (odd byte, then a u64), the
        // rest kept: the device refuses a disk of another size.
        let mut fields = vec![0, 1];
        fields.extend_from_slice(&7u64.to_le_bytes());
        let DeviceState::Block(block) = state_from_fields(6, &fields).unwrap() else {
            panic!("not a block state")
        };
        let DeviceState::Block(own) = device(6).unwrap().0.save_state() else {
            unreachable!()
        };
        assert_eq!(block, BlockState { capacity: 7, ..own });
        assert!(!restore(&prefix(6, ACTIVE), &DeviceState::Block(block)).unwrap());
        // A tablet's pending events replaced by 3 events.
        let mut fields = vec![0, 0, 0, 0, 0, 0, 1, 3];
        fields.extend_from_slice(&[1, 0, 30, 0, 1, 0, 0, 0].repeat(3));
        let DeviceState::Input(tablet) = state_from_fields(4, &fields).unwrap() else {
            panic!("not an input state")
        };
        assert_eq!(tablet.pending, vec![(1, 30, 1); 3]);
        assert_eq!(tablet.kind, "tablet");
    }
}
