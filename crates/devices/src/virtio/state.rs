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
#[serde(tag = "kind", rename_all = "snake_case")]
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
