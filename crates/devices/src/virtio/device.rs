//! The contract between the virtio transport and a virtio device.

use std::sync::Arc;

use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

use super::state::{DeviceState, QueuePosition, StateError};
use crate::GuestMemoryMmap;

/// How a device raises interrupts, whatever the transport does underneath
/// (MSI-X vectors through KVM irqfds for virtio-pci).
pub trait VirtioInterrupt: Send + Sync {
    /// The device put buffers in the used ring of queue `queue`.
    fn notify_queue(&self, queue: u16);
    /// The device changed its configuration space.
    fn notify_config(&self);
}

/// One queue handed to a device when the driver is ready.
pub struct QueueEvents {
    /// The queue's index in the device.
    pub index: u16,
    /// The queue as the driver set it up (addresses, size, event index).
    pub queue: Queue,
    /// Signalled when the driver kicks the queue (an ioeventfd: the kick
    /// does not stop the vCPU in userspace).
    pub kick: EventFd,
}

/// What a device serves once the driver is ready: everything
/// [`VirtioDevice::activate`] gets, in one value, so a restore can hand the
/// same to [`VirtioDevice::restore_state`].
pub struct Activation {
    pub memory: GuestMemoryMmap,
    pub interrupt: Arc<dyn VirtioInterrupt>,
    /// The queues the driver made ready (for a restore, already at their
    /// saved positions).
    pub queues: Vec<QueueEvents>,
    /// The features the driver accepted.
    pub acked_features: u64,
}

/// Why a device could not start.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("the driver set up {got} queues, the device needs {needed}")]
    QueueCount { got: usize, needed: usize },
    #[error("queue {0} is not valid in guest memory")]
    InvalidQueue(u16),
    #[error("cannot start the device worker: {0}")]
    Worker(String),
    #[error("{0}")]
    Backend(String),
}

/// The device's worker (its thread, its epoll set, its eventfds) could not
/// be set up.
impl From<std::io::Error> for ActivateError {
    fn from(e: std::io::Error) -> ActivateError {
        ActivateError::Worker(e.to_string())
    }
}

/// A virtio device back end.
///
/// The transport owns the lifecycle: it asks for the device's features and
/// queue sizes, forwards configuration-space accesses, calls [`activate`]
/// once the driver sets DRIVER_OK, and [`reset`] when the driver resets the
/// device (or the VM stops). A malformed request from the guest must fail
/// that request (or put the device in an error state), never panic and
/// never touch memory outside the guest.
///
/// For snapshots and migration a device can be brought to rest and its
/// state taken ([`pause`], [`save_state`]), then either continued where it
/// stopped ([`resume`]) or rebuilt on another VM ([`restore_state`], then
/// [`resume`]). The guest never sees any of it: no queue is reset, no
/// request is lost or served twice.
///
/// [`activate`]: VirtioDevice::activate
/// [`reset`]: VirtioDevice::reset
/// [`pause`]: VirtioDevice::pause
/// [`save_state`]: VirtioDevice::save_state
/// [`resume`]: VirtioDevice::resume
/// [`restore_state`]: VirtioDevice::restore_state
pub trait VirtioDevice: Send {
    /// The virtio device id (VIRTIO_ID_*).
    fn device_type(&self) -> u32;

    /// A short name for logs and `vm.info`, e.g. "rng0".
    fn id(&self) -> &str;

    /// The largest size of each queue; its length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];

    /// Feature bits offered to the driver (include
    /// [`super::COMMON_FEATURES`]).
    fn device_features(&self) -> u64;

    /// How the device is set up on the host, for `vm.info`'s resources
    /// (a disk's engine and queues, say); nothing by default.
    fn describe(&self) -> Vec<String> {
        Vec::new()
    }

    /// Reads the device-specific configuration space.
    fn read_config(&self, offset: u64, data: &mut [u8]);

    /// Writes the device-specific configuration space.
    fn write_config(&mut self, offset: u64, data: &[u8]);

    /// Starts serving the queues with the features the driver accepted.
    fn activate(
        &mut self,
        memory: GuestMemoryMmap,
        interrupt: Arc<dyn VirtioInterrupt>,
        queues: Vec<QueueEvents>,
        acked_features: u64,
    ) -> Result<(), ActivateError>;

    /// Stops serving (joins the worker); the device may be activated again.
    fn reset(&mut self);

    /// Brings an active device to rest: its threads stop (parked, not
    /// torn down), every request it took off a queue is completed into the
    /// used ring (with the interrupt the driver asked for), and it touches
    /// neither guest memory nor its queues until [`resume`] or [`reset`].
    /// Returns the position of each queue it serves; an inactive device
    /// returns none. Pausing a paused device is harmless.
    ///
    /// [`resume`]: VirtioDevice::resume
    /// [`reset`]: VirtioDevice::reset
    fn pause(&mut self) -> Result<Vec<QueuePosition>, StateError>;

    /// Serves again, on the same queues from the same positions, after
    /// [`pause`](VirtioDevice::pause) or
    /// [`restore_state`](VirtioDevice::restore_state). A device that is not
    /// active does nothing.
    fn resume(&mut self) -> Result<(), StateError>;

    /// The device's own state (configuration, and what it holds outside
    /// guest memory). Taken while paused or inactive.
    fn save_state(&self) -> DeviceState;

    /// Puts `state` back into a device that no driver has touched. With
    /// `activation` (the device was active when saved) it gets its queues
    /// as [`activate`](VirtioDevice::activate) would, but stays paused
    /// until [`resume`](VirtioDevice::resume) and does none of what a new
    /// driver needs (the guest's driver is in the middle of its work).
    /// Refuses state of another kind or of a device configured otherwise.
    fn restore_state(
        &mut self,
        state: &DeviceState,
        activation: Option<Activation>,
    ) -> Result<(), StateError>;
}

/// Copies `config[offset..offset+data.len()]` into `data`, zeros past the
/// end; any offset and length are fine. Devices whose configuration space
/// is a plain byte array answer `VirtioDevice::read_config` with it.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if start >= config.len() {
        return;
    }
    let n = data.len().min(config.len() - start);
    data[..n].copy_from_slice(&config[start..start + n]);
}

#[cfg(test)]
mod tests {
    use super::read_config_bytes;

    #[test]
    fn config_reads_are_clipped_and_zero_filled() {
        let config = [1u8, 2, 3, 4];
        let mut data = [0xffu8; 3];
        read_config_bytes(&config, 2, &mut data);
        assert_eq!(data, [3, 4, 0]);
        read_config_bytes(&config, 4, &mut data);
        assert_eq!(data, [0, 0, 0]);
        read_config_bytes(&config, u64::MAX, &mut data);
        assert_eq!(data, [0, 0, 0]);
    }
}
