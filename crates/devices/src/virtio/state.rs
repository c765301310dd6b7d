//! Saved state of virtio devices (snapshots and migration,
//! docs/snapshot.md): what a device keeps outside guest memory, and where
//! each of its queues stood.
//!
//! The contract (see [`VirtioDevice`](super::VirtioDevice)):
//! `pause` quiesces a device and returns its queues' positions,
//! `save_state` describes the rest, `resume` continues it where it stopped;
//! on a new VM, `restore_state` rebuilds a device from its state, parked
//! until `resume`. The transport (`pci`) adds its own registers around it.

use serde::{Deserialize, Serialize};

use super::balloon::BalloonState;
use super::block::BlockState;
use super::input::InputState;
use super::net::NetState;
use super::vsock::VsockState;

#[doc(hidden)]
pub mod fuzzing;

/// Why a device's state could not be taken or put back; one line each.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("the saved state is of a {found} device, this is a {expected} device")]
    WrongKind {
        found: &'static str,
        expected: &'static str,
    },
    /// The state is well-formed but does not fit this device (e.g. a disk
    /// of another size).
    #[error("{0}")]
    Mismatch(String),
    /// The state cannot be right whatever the device (a foreign or damaged
    /// snapshot).
    #[error("invalid saved state: {0}")]
    Invalid(String),
    /// The device could not be brought to rest.
    #[error("cannot pause: {0}")]
    Pause(String),
    /// The device could not start serving again.
    #[error("cannot resume: {0}")]
    Resume(String),
    /// KVM or the bus refused what the restored state needs (an
    /// ioeventfd, an MSI route, the BAR's place).
    #[error("{0}")]
    Platform(String),
}

/// Where the device side of one queue stood: the next available entry to
/// take and the next used entry to fill. The rings themselves are in guest
/// memory, which a snapshot saves whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuePosition {
    /// The queue's index in the device.
    pub index: u16,
    pub next_avail: u16,
    pub next_used: u16,
}

impl QueuePosition {
    /// The position of `queue`, number `index`.
    pub fn of(index: u16, queue: &impl virtio_queue::QueueT) -> QueuePosition {
        QueuePosition {
            index,
            next_avail: queue.next_avail(),
            next_used: queue.next_used(),
        }
    }
}

/// A device's own state: its configuration and whatever it holds that the
/// guest gave it and that is not in guest memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "device", rename_all = "snake_case")]
pub enum DeviceState {
    /// virtio-rng holds nothing between requests.
    Rng,
    Block(BlockState),
    Net(NetState),
    Vsock(VsockState),
    Balloon(BalloonState),
    Input(InputState),
}

impl DeviceState {
    /// The kind of device the state belongs to, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            DeviceState::Rng => "rng",
            DeviceState::Block(_) => "block",
            DeviceState::Net(_) => "net",
            DeviceState::Vsock(_) => "vsock",
            DeviceState::Balloon(_) => "balloon",
            DeviceState::Input(_) => "input",
        }
    }

    /// The refusal of a state of the wrong kind by an `expected` device.
    pub fn wrong_kind(&self, expected: &'static str) -> StateError {
        StateError::WrongKind {
            found: self.kind(),
            expected,
        }
    }
}

/// Helpers for the devices' snapshot tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::{DeviceState, QueuePosition};
    use crate::virtio::{QueueEvents, QueueT};

    /// `state` written and read back as a snapshot file's metadata is.
    pub(crate) fn through_json(state: &DeviceState) -> DeviceState {
        let text = serde_json::to_string(state).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// `events` with its queue at the position saved for its index, as the
    /// transport hands queues to a restored device.
    pub(crate) fn at_saved_position(
        mut events: QueueEvents,
        positions: &[QueuePosition],
    ) -> QueueEvents {
        let p = positions
            .iter()
            .find(|p| p.index == events.index)
            .unwrap_or_else(|| panic!("no position saved for queue {}", events.index));
        events.queue.set_next_avail(p.next_avail);
        events.queue.set_next_used(p.next_used);
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_and_foreign_state_is_an_error() {
        let states = [
            DeviceState::Rng,
            DeviceState::Block(BlockState {
                capacity: 2048,
                readonly: true,
                features: 0x1234,
                num_queues: 2,
            }),
            DeviceState::Net(NetState {
                config: vec![0x52, 0x54, 0, 1, 2, 3, 1, 0, 1, 0, 0, 0],
                features: 1 << 32,
            }),
            DeviceState::Vsock(VsockState { cid: 3 }),
            DeviceState::Balloon(BalloonState {
                features: 2,
                num_pages: 256,
                actual: 128,
                held_stats: Some(3),
                inflated_pages: 1,
                deflated_pages: 2,
                invalid_pfns: 3,
                discard_errors: 4,
            }),
            DeviceState::Input(InputState {
                kind: "tablet".into(),
                abs_max: (1023, 767),
                select: 1,
                subsel: 2,
                leds: 3,
                pending: vec![(3, 0, 512), (0, 0, 0)],
            }),
        ];
        for state in &states {
            assert_eq!(&testing::through_json(state), state);
        }
        let json = serde_json::to_string(&states[0]).unwrap();
        assert_eq!(json, r#"{"device":"rng"}"#);

        // Unknown kinds, wrong types, missing fields: errors, never panics.
        for text in [
            r#"{"device":"teapot"}"#,
            r#"{"device":"block","capacity":"big","readonly":false,"features":0}"#,
            r#"{"device":"block","capacity":1}"#,
            r#"{"device":"vsock","cid":-3}"#,
            r#"{"device":"balloon","features":0,"num_pages":99999999999,"actual":0,"held_stats":null,"inflated_pages":0,"deflated_pages":0,"invalid_pfns":0,"discard_errors":0}"#,
            r#"[1,2,3]"#,
            "",
        ] {
            assert!(
                serde_json::from_str::<DeviceState>(text).is_err(),
                "{text} was accepted"
            );
        }
        let err = states[1].wrong_kind("rng").to_string();
        assert_eq!(
            err,
            "the saved state is of a block device, this is a rng device"
        );
    }
}
