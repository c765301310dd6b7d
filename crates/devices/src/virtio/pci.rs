//! The virtio-pci transport (virtio 1.x "modern" PCI device, spec §4.1).
//!
//! One 64-bit memory BAR holds every region the driver uses:
//!
//! ```text
//! 0x0000  common configuration (features, status, queue setup)
//! 0x1000  ISR status
//! 0x2000  device-specific configuration
//! 0x3000  queue notifications, 4 bytes per queue (ioeventfds in KVM)
//! 0x4000  MSI-X table
//! 0x5000  MSI-X pending-bit array
//! ```
//!
//! Queue notifications are KVM ioeventfds, so a kick wakes the device's
//! worker without the vCPU returning to userspace; interrupts are MSI-X
//! vectors on KVM irqfds, so the worker raises them without a vCPU either.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{Activation, DeviceState, QueueEvents, StateError, VirtioDevice, VirtioInterrupt};
use crate::bus::BusDevice;
use crate::interrupt::{InterruptError, MsiRouting};
use crate::pci::msix::{Msix, MsixState};
use crate::pci::{BarMove, PciConfigSpace, PciDevice, PciIdentity};
use crate::GuestMemoryMmap;

#[doc(hidden)]
pub mod fuzzing;

pub const BAR_SIZE: u64 = 0x8000;
const COMMON_CFG: u64 = 0x0000;
const COMMON_CFG_LEN: u64 = 0x38;
const ISR: u64 = 0x1000;
const DEVICE_CFG: u64 = 0x2000;
const DEVICE_CFG_LEN: u64 = 0x1000;
const NOTIFY: u64 = 0x3000;
const NOTIFY_MULTIPLIER: u32 = 4;
const MSIX_TABLE: u64 = 0x4000;
const MSIX_PBA: u64 = 0x5000;

const VIRTIO_PCI_VENDOR: u16 = 0x1af4;
const VIRTIO_PCI_DEVICE_BASE: u16 = 0x1040;
/// "No MSI-X vector" in the common configuration.
const NO_VECTOR: u16 = 0xffff;

/// Device status bits (spec §2.1).
const STATUS_DRIVER_OK: u8 = 4;
const STATUS_FEATURES_OK: u8 = 8;
const STATUS_NEEDS_RESET: u8 = 0x40;

/// Virtio PCI capability types (spec §4.1.4).
const CAP_COMMON: u8 = 1;
const CAP_NOTIFY: u8 = 2;
const CAP_ISR: u8 = 3;
const CAP_DEVICE: u8 = 4;
const CAP_ID_VENDOR: u8 = 0x09;

/// A queue as the driver is setting it up.
struct QueueSetup {
    max_size: u16,
    size: u16,
    ready: bool,
    desc: u64,
    driver: u64,
    device: u64,
    /// Where the device starts in the rings: 0 for a new driver, the saved
    /// position for a restored device.
    next_avail: u16,
    next_used: u16,
}

impl QueueSetup {
    fn new(max_size: u16) -> Self {
        QueueSetup {
            max_size,
            size: max_size,
            ready: false,
            desc: 0,
            driver: 0,
            device: 0,
            next_avail: 0,
            next_used: 0,
        }
    }
}

/// One queue of a virtio-pci function, saved: the registers the driver
/// wrote and where the device stood in the rings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioQueueState {
    pub size: u16,
    pub ready: bool,
    /// Guest-physical addresses of the descriptor table, the available
    /// ring ("driver area") and the used ring ("device area").
    pub desc: u64,
    pub driver: u64,
    pub device: u64,
    /// The MSI-X vector of the queue.
    pub vector: u16,
    /// The device's positions (0 unless the device was serving it).
    pub next_avail: u16,
    pub next_used: u16,
}

/// Everything about one virtio-pci function a snapshot keeps: PCI
/// configuration space, BAR, MSI-X, the common configuration registers,
/// the queues, and the device's own state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioPciState {
    /// The virtio device id (VIRTIO_ID_*).
    pub device_type: u32,
    /// The 64 dwords of PCI configuration space (command register, BAR
    /// registers, the MSI-X capability's control word, ...).
    pub config_space: Vec<u32>,
    /// Where the BAR is mapped.
    pub bar_address: u64,
    pub msix: MsixState,
    pub status: u8,
    pub device_feature_select: u32,
    pub driver_feature_select: u32,
    pub driver_features: u64,
    pub queue_select: u16,
    pub config_generation: u8,
    pub config_vector: u16,
    pub isr: u16,
    /// The device was serving its queues (DRIVER_OK, activated).
    pub activated: bool,
    pub queues: Vec<VirtioQueueState>,
    pub device: DeviceState,
}

/// Raises a device's interrupts through its MSI-X vectors.
struct MsixInterrupt {
    msix: Arc<Mutex<Msix>>,
    queue_vectors: Arc<Vec<AtomicU16>>,
    config_vector: Arc<AtomicU16>,
    isr: Arc<AtomicU16>,
}

impl MsixInterrupt {
    fn raise(&self, vector: u16, isr_bit: u16) {
        self.isr.fetch_or(isr_bit, Ordering::SeqCst);
        if vector != NO_VECTOR {
            self.msix
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .trigger(vector);
        }
    }
}

impl VirtioInterrupt for MsixInterrupt {
    fn notify_queue(&self, queue: u16) {
        if let Some(vector) = self.queue_vectors.get(usize::from(queue)) {
            self.raise(vector.load(Ordering::SeqCst), 1);
        }
    }

    fn notify_config(&self) {
        self.raise(self.config_vector.load(Ordering::SeqCst), 2);
    }
}

/// Errors while creating a virtio-pci device.
#[derive(Debug, thiserror::Error)]
pub enum VirtioPciError {
    #[error(transparent)]
    Interrupt(#[from] InterruptError),
    #[error("cannot create a queue notification eventfd: {0}")]
    EventFd(std::io::Error),
    #[error("KVM_IOEVENTFD failed: {0}")]
    IoEventFd(kvm_ioctls::Error),
}

/// A virtio device on the PCI bus.
pub struct VirtioPciDevice {
    config: PciConfigSpace,
    device: Box<dyn VirtioDevice>,
    vm: Arc<VmFd>,
    memory: GuestMemoryMmap,
    bar_address: u64,
    msix: Arc<Mutex<Msix>>,
    msix_cap_dword: usize,
    queues: Vec<QueueSetup>,
    queue_vectors: Arc<Vec<AtomicU16>>,
    config_vector: Arc<AtomicU16>,
    isr: Arc<AtomicU16>,
    kicks: Vec<EventFd>,
    status: u8,
    device_feature_select: u32,
    driver_feature_select: u32,
    driver_features: u64,
    queue_select: u16,
    config_generation: u8,
    activated: bool,
    /// Restored from a snapshot and not resumed yet: the first resume
    /// interrupts every queue once.
    restored: bool,
}

impl VirtioPciDevice {
    /// Wraps `device` as a PCI function whose BAR sits at `bar_address`,
    /// with one MSI-X vector per queue plus one for configuration changes
    /// and one ioeventfd per queue.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        vm: Arc<VmFd>,
        routing: &Arc<MsiRouting>,
        memory: GuestMemoryMmap,
        bar_address: u64,
    ) -> Result<Self, VirtioPciError> {
        let queue_count = device.queue_max_sizes().len();
        let msix = Msix::new(routing, queue_count as u16 + 1)?;
        let device_type = device.device_type() as u16;
        let mut config = PciConfigSpace::new(PciIdentity {
            vendor: VIRTIO_PCI_VENDOR,
            device: VIRTIO_PCI_DEVICE_BASE + device_type,
            class: class_of(device.device_type()),
            revision: 1,
            subsystem_vendor: VIRTIO_PCI_VENDOR,
            subsystem: 0x40,
        });
        config.add_bar64(0, bar_address, BAR_SIZE);
        for (kind, offset, length, extra) in [
            (CAP_COMMON, COMMON_CFG, COMMON_CFG_LEN, None),
            (CAP_ISR, ISR, 1, None),
            (CAP_DEVICE, DEVICE_CFG, DEVICE_CFG_LEN, None),
            (
                CAP_NOTIFY,
                NOTIFY,
                u64::from(NOTIFY_MULTIPLIER) * queue_count as u64,
                Some(NOTIFY_MULTIPLIER),
            ),
        ] {
            config.add_capability(
                &virtio_capability(kind, offset as u32, length as u32, extra),
                &[],
            );
        }
        let (cap, writable) = msix.capability(0, MSIX_TABLE as u32, MSIX_PBA as u32);
        let msix_cap_dword = config.add_capability(&cap, &writable) / 4;

        let kicks = (0..queue_count)
            .map(|_| EventFd::new(EFD_NONBLOCK).map_err(VirtioPciError::EventFd))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, kick) in kicks.iter().enumerate() {
            vm.register_ioevent(
                kick,
                &IoEventAddress::Mmio(notify_address(bar_address, i)),
                NoDatamatch,
            )
            .map_err(VirtioPciError::IoEventFd)?;
        }
        let queues = device
            .queue_max_sizes()
            .iter()
            .map(|&m| QueueSetup::new(m))
            .collect();
        Ok(VirtioPciDevice {
            config,
            device,
            vm,
            memory,
            bar_address,
            msix: Arc::new(Mutex::new(msix)),
            msix_cap_dword,
            queues,
            queue_vectors: Arc::new(
                (0..queue_count)
                    .map(|_| AtomicU16::new(NO_VECTOR))
                    .collect(),
            ),
            config_vector: Arc::new(AtomicU16::new(NO_VECTOR)),
            isr: Arc::new(AtomicU16::new(0)),
            kicks,
            status: 0,
            device_feature_select: 0,
            driver_feature_select: 0,
            driver_features: 0,
            queue_select: 0,
            config_generation: 0,
            activated: false,
            restored: false,
        })
    }

    /// The device's name, for `vm.info`.
    pub fn id(&self) -> String {
        self.device.id().to_string()
    }

    /// The virtio device type.
    pub fn device_type(&self) -> u32 {
        self.device.device_type()
    }

    fn selected_queue(&mut self) -> Option<&mut QueueSetup> {
        self.queues.get_mut(usize::from(self.queue_select))
    }

    fn read_common(&mut self, offset: u64) -> u64 {
        let features = self.device.device_features();
        let queue_select = usize::from(self.queue_select);
        let queue = self.queues.get(queue_select);
        match offset {
            0x00 => u64::from(self.device_feature_select),
            0x04 => match self.device_feature_select {
                0 => features & 0xffff_ffff,
                1 => features >> 32,
                _ => 0,
            },
            0x08 => u64::from(self.driver_feature_select),
            0x0c => match self.driver_feature_select {
                0 => self.driver_features & 0xffff_ffff,
                1 => self.driver_features >> 32,
                _ => 0,
            },
            0x10 => u64::from(self.config_vector.load(Ordering::SeqCst)),
            0x12 => self.queues.len() as u64,
            0x14 => u64::from(self.status),
            0x15 => u64::from(self.config_generation),
            0x16 => u64::from(self.queue_select),
            0x18 => queue.map_or(0, |q| u64::from(q.size)),
            0x1a => self
                .queue_vectors
                .get(queue_select)
                .map_or(u64::from(NO_VECTOR), |v| {
                    u64::from(v.load(Ordering::SeqCst))
                }),
            0x1c => queue.map_or(0, |q| u64::from(q.ready)),
            0x1e => queue.map_or(0, |_| queue_select as u64), // notify offset in multiplier units
            0x20 => queue.map_or(0, |q| q.desc),
            0x28 => queue.map_or(0, |q| q.driver),
            0x30 => queue.map_or(0, |q| q.device),
            _ => 0,
        }
    }

    fn write_common(&mut self, offset: u64, value: u64, len: usize) {
        let split = |old: u64, high: bool| {
            if len == 8 {
                value
            } else if high {
                (old & 0xffff_ffff) | (value << 32)
            } else {
                (old & !0xffff_ffff) | (value & 0xffff_ffff)
            }
        };
        let select = usize::from(self.queue_select);
        match offset {
            0x00 => self.device_feature_select = value as u32,
            0x08 => self.driver_feature_select = value as u32,
            0x0c => match self.driver_feature_select {
                0 => {
                    self.driver_features =
                        (self.driver_features & !0xffff_ffff) | (value & 0xffff_ffff)
                }
                1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (value << 32),
                _ => {}
            },
            0x10 => self
                .config_vector
                .store(self.valid_vector(value as u16), Ordering::SeqCst),
            0x14 => self.write_status(value as u8),
            0x16 => self.queue_select = value as u16,
            0x18 => {
                if let Some(q) = self.selected_queue() {
                    let size = value as u16;
                    // Split queues need a power-of-two size no bigger than the maximum.
                    if size.is_power_of_two() && size <= q.max_size {
                        q.size = size;
                    }
                }
            }
            0x1a => {
                let vector = self.valid_vector(value as u16);
                if let Some(v) = self.queue_vectors.get(select) {
                    v.store(vector, Ordering::SeqCst);
                }
            }
            0x1c => {
                if let Some(q) = self.selected_queue() {
                    q.ready = value & 1 == 1;
                }
            }
            0x20 | 0x24 => {
                if let Some(q) = self.selected_queue() {
                    q.desc = split(q.desc, offset == 0x24);
                }
            }
            0x28 | 0x2c => {
                if let Some(q) = self.selected_queue() {
                    q.driver = split(q.driver, offset == 0x2c);
                }
            }
            0x30 | 0x34 => {
                if let Some(q) = self.selected_queue() {
                    q.device = split(q.device, offset == 0x34);
                }
            }
            _ => {}
        }
    }

    /// A vector the table has; anything else reads back as NO_VECTOR, which
    /// tells the driver the assignment failed.
    fn valid_vector(&self, vector: u16) -> u16 {
        let count = self.queues.len() as u16 + 1;
        if vector < count {
            vector
        } else {
            NO_VECTOR
        }
    }

    fn write_status(&mut self, status: u8) {
        if status == 0 {
            self.reset();
            return;
        }
        let mut status = status;
        if status & STATUS_FEATURES_OK != 0 && self.status & STATUS_FEATURES_OK == 0 {
            // The driver may only accept what the device offered.
            if self.driver_features & !self.device.device_features() != 0 {
                status &= !STATUS_FEATURES_OK;
            }
        }
        self.status = status;
        if status & STATUS_DRIVER_OK != 0 && !self.activated {
            self.activate();
        }
    }

    fn interrupt(&self) -> Arc<MsixInterrupt> {
        Arc::new(MsixInterrupt {
            msix: self.msix.clone(),
            queue_vectors: self.queue_vectors.clone(),
            config_vector: self.config_vector.clone(),
            isr: self.isr.clone(),
        })
    }

    fn activate(&mut self) {
        match self.build_queues() {
            Ok(queues) => {
                let interrupt = self.interrupt();
                match self.device.activate(
                    self.memory.clone(),
                    interrupt,
                    queues,
                    self.driver_features,
                ) {
                    Ok(()) => self.activated = true,
                    Err(e) => self.fail(&e.to_string()),
                }
            }
            Err(message) => self.fail(&message),
        }
    }

    /// The device cannot go on: tell the driver it must reset it.
    fn fail(&mut self, message: &str) {
        tracing::warn!("virtio device {}: {message}", self.device.id());
        self.status |= STATUS_NEEDS_RESET;
        let vector = self.config_vector.load(Ordering::SeqCst);
        self.isr.fetch_or(2, Ordering::SeqCst);
        if vector != NO_VECTOR {
            self.msix
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .trigger(vector);
        }
    }

    fn build_queues(&self) -> Result<Vec<QueueEvents>, String> {
        let event_idx = self.driver_features
            & (1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX)
            != 0;
        let mut queues = Vec::new();
        for (i, setup) in self.queues.iter().enumerate() {
            if !setup.ready {
                continue;
            }
            let mut queue = Queue::new(setup.max_size).map_err(|e| format!("queue {i}: {e:?}"))?;
            queue.set_size(setup.size);
            queue.set_desc_table_address(Some(setup.desc as u32), Some((setup.desc >> 32) as u32));
            queue.set_avail_ring_address(
                Some(setup.driver as u32),
                Some((setup.driver >> 32) as u32),
            );
            queue.set_used_ring_address(
                Some(setup.device as u32),
                Some((setup.device >> 32) as u32),
            );
            queue.set_event_idx(event_idx);
            queue.set_next_avail(setup.next_avail);
            queue.set_next_used(setup.next_used);
            queue.set_ready(true);
            if !queue.is_valid(&self.memory) {
                return Err(format!("queue {i} does not fit in guest memory"));
            }
            let kick = self.kicks[i]
                .try_clone()
                .map_err(|e| format!("queue {i}: {e}"))?;
            queues.push(QueueEvents {
                index: i as u16,
                queue,
                kick,
            });
        }
        Ok(queues)
    }

    fn reset(&mut self) {
        if self.activated {
            self.device.reset();
            self.activated = false;
        }
        self.restored = false;
        self.status = 0;
        self.driver_features = 0;
        self.device_feature_select = 0;
        self.driver_feature_select = 0;
        self.queue_select = 0;
        self.isr.store(0, Ordering::SeqCst);
        self.config_vector.store(NO_VECTOR, Ordering::SeqCst);
        for (setup, vector) in self.queues.iter_mut().zip(self.queue_vectors.iter()) {
            *setup = QueueSetup::new(setup.max_size);
            vector.store(NO_VECTOR, Ordering::SeqCst);
        }
    }

    /// Moves the queue notification ioeventfds with the BAR; on failure
    /// names the first queue that could not follow.
    fn move_ioeventfds(&mut self, new_bar: u64) -> Result<(), String> {
        let mut result = Ok(());
        for (i, kick) in self.kicks.iter().enumerate() {
            let old = IoEventAddress::Mmio(notify_address(self.bar_address, i));
            let new = IoEventAddress::Mmio(notify_address(new_bar, i));
            let moved = self
                .vm
                .unregister_ioevent(kick, &old, NoDatamatch)
                .and_then(|_| self.vm.register_ioevent(kick, &new, NoDatamatch));
            if let Err(e) = moved {
                if result.is_ok() {
                    result = Err(format!("cannot move queue {i}'s notification: {e}"));
                }
            }
        }
        self.bar_address = new_bar;
        result
    }

    /// Brings the device to rest (see [`VirtioDevice::pause`]) and returns
    /// the function's whole state. The device stays paused until
    /// [`resume`](Self::resume); the VM's vCPUs must be paused too, so the
    /// driver changes nothing meanwhile. Taking the state of a paused
    /// device again is harmless.
    pub fn save_state(&mut self) -> Result<VirtioPciState, StateError> {
        let positions = if self.activated {
            self.device.pause()?
        } else {
            Vec::new()
        };
        let mut queues: Vec<VirtioQueueState> = self
            .queues
            .iter()
            .zip(self.queue_vectors.iter())
            .map(|(q, vector)| VirtioQueueState {
                size: q.size,
                ready: q.ready,
                desc: q.desc,
                driver: q.driver,
                device: q.device,
                vector: vector.load(Ordering::SeqCst),
                next_avail: 0,
                next_used: 0,
            })
            .collect();
        for p in positions {
            let queue = queues.get_mut(usize::from(p.index)).ok_or_else(|| {
                StateError::Invalid(format!("the device reported queue {}", p.index))
            })?;
            queue.next_avail = p.next_avail;
            queue.next_used = p.next_used;
        }
        Ok(VirtioPciState {
            device_type: self.device.device_type(),
            config_space: self.config.registers(),
            bar_address: self.bar_address,
            msix: self.msix.lock().unwrap_or_else(|e| e.into_inner()).state(),
            status: self.status,
            device_feature_select: self.device_feature_select,
            driver_feature_select: self.driver_feature_select,
            driver_features: self.driver_features,
            queue_select: self.queue_select,
            config_generation: self.config_generation,
            config_vector: self.config_vector.load(Ordering::SeqCst),
            isr: self.isr.load(Ordering::SeqCst),
            activated: self.activated,
            queues,
            device: self.device.save_state(),
        })
    }

    /// Lets a device paused by [`save_state`](Self::save_state), or
    /// restored by [`restore_state`](Self::restore_state), serve again from
    /// where it stopped. Every ready queue is kicked once: a kick the
    /// driver made while the device was paused, or into the eventfd of the
    /// VMM that took the snapshot, must not be lost (with EVENT_IDX the
    /// driver does not kick again until the device catches up). A restored
    /// device also interrupts every queue once, in case the interrupt for
    /// its last used buffers was raised after the vCPUs' state was taken.
    /// Resuming a running device only costs those kicks.
    pub fn resume(&mut self) -> Result<(), StateError> {
        self.msix
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deliver_pending();
        if !self.activated {
            return Ok(());
        }
        self.device.resume()?;
        let ready: Vec<usize> = (0..self.queues.len())
            .filter(|&i| self.queues[i].ready)
            .collect();
        for &i in &ready {
            // Fails only if the counter would overflow: then it is readable.
            let _ = self.kicks[i].write(1);
        }
        if std::mem::take(&mut self.restored) {
            let interrupt = self.interrupt();
            for &i in &ready {
                interrupt.notify_queue(i as u16);
            }
        }
        Ok(())
    }

    /// Puts a saved state into this function, freshly attached and not
    /// touched by a driver, with the same device behind it. PCI
    /// configuration, MSI-X routes, the ioeventfds (moved with the BAR if
    /// it was elsewhere) and the common configuration come back; a device
    /// that was serving gets its queues at the saved positions, without
    /// the guest doing anything, but stays paused until
    /// [`resume`](Self::resume) (its interrupts would be lost before the
    /// vCPUs are restored). Returns the BAR's move when it was elsewhere,
    /// for the MMIO bus to follow.
    pub fn restore_state(&mut self, state: &VirtioPciState) -> Result<Option<BarMove>, StateError> {
        if self.activated || self.status != 0 {
            return Err(StateError::Invalid(
                "a driver already uses this device; only a new one is restored".into(),
            ));
        }
        if state.device_type != self.device.device_type() {
            return Err(StateError::Mismatch(format!(
                "the device was of virtio type {}, this one is of type {}",
                state.device_type,
                self.device.device_type()
            )));
        }
        if state.queues.len() != self.queues.len() {
            return Err(StateError::Mismatch(format!(
                "the device had {} queues, this one has {}",
                state.queues.len(),
                self.queues.len()
            )));
        }
        let offered = self.device.device_features();
        if state.driver_features & !offered != 0 {
            return Err(StateError::Mismatch(format!(
                "the driver accepted features {:#x}, this device offers {offered:#x}",
                state.driver_features
            )));
        }
        let vector_count = self.queues.len() as u16 + 1;
        let vector_ok = |v: u16| v == NO_VECTOR || v < vector_count;
        if !vector_ok(state.config_vector) {
            return Err(StateError::Invalid(format!(
                "configuration vector {}",
                state.config_vector
            )));
        }
        for (i, (q, setup)) in state.queues.iter().zip(&self.queues).enumerate() {
            if !q.size.is_power_of_two() || q.size > setup.max_size {
                return Err(StateError::Invalid(format!(
                    "queue {i} has size {}",
                    q.size
                )));
            }
            if !vector_ok(q.vector) {
                return Err(StateError::Invalid(format!(
                    "queue {i} has vector {}",
                    q.vector
                )));
            }
        }
        if state.activated && state.status & STATUS_DRIVER_OK == 0 {
            return Err(StateError::Invalid(
                "an active device without DRIVER_OK".into(),
            ));
        }

        self.config
            .restore_registers(&state.config_space, &[state.bar_address])
            .map_err(StateError::Invalid)?;
        let old_bar = self.bar_address;
        let moved = if state.bar_address != old_bar {
            self.move_ioeventfds(state.bar_address)
                .map_err(StateError::Platform)?;
            Some(BarMove {
                old: old_bar,
                new: state.bar_address,
                size: BAR_SIZE,
            })
        } else {
            None
        };
        let control = self.config.read(self.msix_cap_dword);
        self.msix
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .restore(&state.msix, control)
            .map_err(StateError::Platform)?;

        self.status = state.status;
        self.device_feature_select = state.device_feature_select;
        self.driver_feature_select = state.driver_feature_select;
        self.driver_features = state.driver_features;
        self.queue_select = state.queue_select;
        self.config_generation = state.config_generation;
        self.config_vector
            .store(state.config_vector, Ordering::SeqCst);
        self.isr.store(state.isr, Ordering::SeqCst);
        for ((setup, vector), saved) in self
            .queues
            .iter_mut()
            .zip(self.queue_vectors.iter())
            .zip(&state.queues)
        {
            setup.size = saved.size;
            setup.ready = saved.ready;
            setup.desc = saved.desc;
            setup.driver = saved.driver;
            setup.device = saved.device;
            setup.next_avail = saved.next_avail;
            setup.next_used = saved.next_used;
            vector.store(saved.vector, Ordering::SeqCst);
        }

        let activation = if state.activated {
            let queues = self.build_queues().map_err(StateError::Invalid)?;
            Some(Activation {
                memory: self.memory.clone(),
                interrupt: self.interrupt(),
                queues,
                acked_features: self.driver_features,
            })
        } else {
            None
        };
        // Positions only ever apply to the activation they were saved with.
        for setup in &mut self.queues {
            setup.next_avail = 0;
            setup.next_used = 0;
        }
        self.device.restore_state(&state.device, activation)?;
        self.activated = state.activated;
        self.restored = state.activated;
        Ok(moved)
    }
}

impl Drop for VirtioPciDevice {
    fn drop(&mut self) {
        if self.activated {
            self.device.reset();
        }
    }
}

fn notify_address(bar: u64, queue: usize) -> u64 {
    bar + NOTIFY + u64::from(NOTIFY_MULTIPLIER) * queue as u64
}

/// A `virtio_pci_cap` (with `notify_off_multiplier` for the notify one).
fn virtio_capability(kind: u8, offset: u32, length: u32, multiplier: Option<u32>) -> Vec<u8> {
    let cap_len = if multiplier.is_some() { 20 } else { 16 };
    let mut bytes = vec![CAP_ID_VENDOR, 0, cap_len, kind, 0 /* bar */, 0, 0, 0];
    bytes.extend_from_slice(&offset.to_le_bytes());
    bytes.extend_from_slice(&length.to_le_bytes());
    if let Some(m) = multiplier {
        bytes.extend_from_slice(&m.to_le_bytes());
    }
    bytes
}

/// PCI class codes Linux expects for some virtio devices.
fn class_of(device_type: u32) -> (u8, u8, u8) {
    match device_type {
        1 => (0x02, 0x00, 0x00),  // network controller
        2 => (0x01, 0x80, 0x00),  // mass storage
        18 => (0x09, 0x80, 0x00), // input
        _ => (0xff, 0x00, 0x00),
    }
}

/// Reads `data.len()` bytes at `offset` of a little-endian `value`.
fn read_le(value: u64, offset: u64, data: &mut [u8]) {
    let bytes = value.to_le_bytes();
    for (i, b) in data.iter_mut().enumerate() {
        *b = bytes.get(offset as usize + i).copied().unwrap_or(0);
    }
}

fn le_value(data: &[u8]) -> u64 {
    data.iter()
        .rev()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Offsets of the common configuration fields, so unaligned or partial
/// accesses find the field they fall in.
const COMMON_FIELDS: [(u64, u64); 19] = [
    (0x00, 4),
    (0x04, 4),
    (0x08, 4),
    (0x0c, 4),
    (0x10, 2),
    (0x12, 2),
    (0x14, 1),
    (0x15, 1),
    (0x16, 2),
    (0x18, 2),
    (0x1a, 2),
    (0x1c, 2),
    (0x1e, 2),
    (0x20, 4),
    (0x24, 4),
    (0x28, 4),
    (0x2c, 4),
    (0x30, 4),
    (0x34, 4),
];

impl BusDevice for VirtioPciDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        match offset {
            o if o < COMMON_CFG + COMMON_CFG_LEN => {
                // 64-bit fields may be read as one 8-byte access.
                let (base, value) = if data.len() == 8 && matches!(o, 0x20 | 0x28 | 0x30) {
                    (o, self.read_common(o))
                } else {
                    let (base, _) = COMMON_FIELDS
                        .iter()
                        .rev()
                        .find(|(b, _)| *b <= o)
                        .copied()
                        .unwrap_or((0, 4));
                    let value = match base {
                        0x24 | 0x2c | 0x34 => self.read_common(base - 4) >> 32,
                        0x20 | 0x28 | 0x30 => self.read_common(base) & 0xffff_ffff,
                        _ => self.read_common(base),
                    };
                    (base, value)
                };
                read_le(value, o - base, data);
            }
            ISR => {
                // Reading the ISR acknowledges it.
                data[0] = self.isr.swap(0, Ordering::SeqCst) as u8;
            }
            o if (DEVICE_CFG..DEVICE_CFG + DEVICE_CFG_LEN).contains(&o) => {
                self.device.read_config(o - DEVICE_CFG, data)
            }
            o if (MSIX_TABLE..MSIX_PBA).contains(&o) => self
                .msix
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .read_table(o - MSIX_TABLE, data),
            o if (MSIX_PBA..BAR_SIZE).contains(&o) => self
                .msix
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .read_pba(o - MSIX_PBA, data),
            _ => {}
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        match offset {
            o if o < COMMON_CFG + COMMON_CFG_LEN => {
                let value = le_value(data);
                self.write_common(o, value, data.len());
            }
            o if (DEVICE_CFG..DEVICE_CFG + DEVICE_CFG_LEN).contains(&o) => {
                self.device.write_config(o - DEVICE_CFG, data);
            }
            o if (NOTIFY..MSIX_TABLE).contains(&o) => {
                // Only reached when the ioeventfd did not catch the write
                // (e.g. an unusual access size): kick the queue by hand.
                let queue = ((o - NOTIFY) / u64::from(NOTIFY_MULTIPLIER)) as usize;
                if let Some(kick) = self.kicks.get(queue) {
                    let _ = kick.write(1);
                }
            }
            o if (MSIX_TABLE..MSIX_PBA).contains(&o) => self
                .msix
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_table(o - MSIX_TABLE, data),
            _ => {}
        }
    }
}

impl PciDevice for VirtioPciDevice {
    fn read_config(&mut self, reg: usize) -> u32 {
        self.config.read(reg)
    }

    fn write_config(&mut self, reg: usize, value: u32, mask: u32) -> Option<BarMove> {
        let moved = self.config.write(reg, value, mask);
        if reg == self.msix_cap_dword {
            let dword = self.config.read(reg);
            self.msix
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_control(dword);
        }
        let (bar, new) = moved?;
        if let Err(e) = self.move_ioeventfds(new) {
            tracing::error!("virtio {}: {e}", self.device.id());
        }
        Some(BarMove {
            old: bar.address,
            new,
            size: bar.size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_describe_the_bar_layout() {
        let cap = virtio_capability(CAP_NOTIFY, NOTIFY as u32, 8, Some(4));
        assert_eq!(cap.len(), 20);
        assert_eq!(cap[2], 20, "cap_len");
        assert_eq!(cap[3], CAP_NOTIFY);
        assert_eq!(u32::from_le_bytes(cap[8..12].try_into().unwrap()), 0x3000);
        assert_eq!(u32::from_le_bytes(cap[16..20].try_into().unwrap()), 4);
    }

    #[test]
    fn little_endian_helpers() {
        let mut data = [0u8; 2];
        read_le(0x1234_5678, 1, &mut data);
        assert_eq!(data, [0x56, 0x34]);
        assert_eq!(le_value(&[0x78, 0x56, 0x34, 0x12]), 0x1234_5678);
    }

    #[test]
    fn regions_fit_in_the_bar() {
        const {
            assert!(
                MSIX_PBA < BAR_SIZE && NOTIFY < MSIX_TABLE && DEVICE_CFG + DEVICE_CFG_LEN <= NOTIFY
            )
        };
    }
}
