//! Virtio devices (virtio 1.x) and what they share.
//!
//! A device is split the way the specification splits it:
//! - the **transport** (`pci`): how the guest finds the device, negotiates
//!   features, sets up queues, kicks them and receives interrupts — it is
//!   the same for every device;
//! - the **device** (`rng`, `block`, ...): a [`VirtioDevice`] that, once
//!   the driver is ready, gets its queues and serves them on its own
//!   worker thread, never on a vCPU thread;
//! - the **lifecycle** (`lifecycle`): how every device starts, resets,
//!   pauses, resumes and is restored, done once around what is each
//!   device's own.

pub mod balloon;
pub mod block;
pub mod device;
#[doc(hidden)]
pub mod fuzzing;
pub mod input;
pub(crate) mod lifecycle;
pub mod net;
pub mod pci;
pub mod rng;
pub mod state;
#[cfg(test)]
pub(crate) mod testing;
pub mod vsock;
pub mod worker;

pub use device::{
    read_config_bytes, ActivateError, Activation, QueueEvents, VirtioDevice, VirtioInterrupt,
};
pub use state::{DeviceState, QueuePosition, StateError};
pub use virtio_queue::{Queue, QueueT};

/// The device's features must always include this: virtio 1.x, not legacy.
pub const VIRTIO_F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
/// Features every hakoniwa device offers on top of its own.
pub const COMMON_FEATURES: u64 = VIRTIO_F_VERSION_1
    | (1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX)
    | (1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC);
