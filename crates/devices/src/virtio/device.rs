//! The contract between the virtio transport and a virtio device.

use std::sync::Arc;

use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

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

/// A virtio device back end.
///
/// The transport owns the lifecycle: it asks for the device's features and
/// queue sizes, forwards configuration-space accesses, calls [`activate`]
/// once the driver sets DRIVER_OK, and [`reset`] when the driver resets the
/// device (or the VM stops). A malformed request from the guest must fail
/// that request (or put the device in an error state), never panic and
/// never touch memory outside the guest.
///
/// [`activate`]: VirtioDevice::activate
/// [`reset`]: VirtioDevice::reset
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
