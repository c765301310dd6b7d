//! virtio-rng (virtio 1.2, 5.4 "Entropy Device"): one request queue whose
//! device-writable buffers the device fills with random bytes from the
//! host's `getrandom(2)`.
//!
//! The device has no configuration space and no feature bits of its own.
//! A request is capped at [`MAX_REQUEST_BYTES`], so a guest cannot make the
//! VMM allocate (or spend time filling) huge buffers; a chain that is not
//! valid in guest memory, or has no writable buffer, is returned with a used
//! length of 0.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use super::device::{ActivateError, Activation, QueueEvents, VirtioDevice, VirtioInterrupt};
use super::lifecycle::{self, queue_array, ActiveQueues, DeviceLifecycle, QueueDevice, QueueLoop};
use super::state::{DeviceState, QueuePosition, StateError};
use super::worker::{EpollLoop, WorkerHandler};
use crate::options::{invalid, Options, OptionsError};
use crate::GuestMemoryMmap;

/// The virtio device id of an entropy device.
pub const VIRTIO_ID_RNG: u32 = 4;
/// The most bytes written into one request.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// The size of the request queue.
pub const QUEUE_SIZE: u16 = 256;

const QUEUE_SIZES: [u16; 1] = [QUEUE_SIZE];

/// `--rng [id=NAME]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RngConfig {
    /// The device's name; `rng0` when not given.
    pub id: Option<String>,
}

impl RngConfig {
    /// Parses the `--rng` option string (empty, or `id=NAME`).
    pub fn parse(text: &str) -> Result<RngConfig, OptionsError> {
        let mut options = Options::parse(text, None)?;
        let id = options.take("id");
        options.finish()?;
        if let Some(id) = &id {
            check_id(id)?;
        }
        Ok(RngConfig { id })
    }
}

/// Rejects device names that would be awkward in logs and the API.
pub(crate) fn check_id(id: &str) -> Result<(), OptionsError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "id",
            id,
            "expected 1 to 64 letters, digits, '-', '_' or '.'",
        ))
    }
}

/// A virtio entropy device.
pub struct Rng {
    id: String,
    lifecycle: DeviceLifecycle<EpollLoop<RngHandler>>,
}

impl Rng {
    /// A device named `config.id` (default `rng0`).
    pub fn new(config: RngConfig) -> Rng {
        Rng {
            id: config.id.unwrap_or_else(|| "rng0".to_string()),
            lifecycle: DeviceLifecycle::default(),
        }
    }

    /// Parses `--rng` options and builds the device.
    pub fn from_options(text: &str) -> Result<Rng, OptionsError> {
        RngConfig::parse(text).map(Rng::new)
    }

    /// Whether a worker is serving the queue.
    pub fn is_active(&self) -> bool {
        self.lifecycle.is_active()
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn id(&self) -> &str {
        &self.id
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn device_features(&self) -> u64 {
        super::COMMON_FEATURES
    }

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        // No configuration space.
        data.fill(0);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        tracing::debug!(
            "{}: ignoring a {}-byte config write at {offset}",
            self.id,
            data.len()
        );
    }

    lifecycle::lifecycle_methods!();

    fn save_state(&self) -> DeviceState {
        DeviceState::Rng
    }
}

impl QueueDevice for Rng {
    type Loop = EpollLoop<RngHandler>;
    const WORKER_SUFFIX: &'static str = "virtio";

    fn lifecycle(&mut self) -> &mut DeviceLifecycle<Self::Loop> {
        &mut self.lifecycle
    }

    fn serve(
        &mut self,
        queues: ActiveQueues,
        _restoring: Option<&DeviceState>,
    ) -> Result<Self::Loop, ActivateError> {
        let [QueueEvents { index, queue, kick }] = queue_array(queues.queues)?;
        let fds = [kick.as_raw_fd()];
        let handler = RngHandler {
            memory: queues.memory,
            interrupt: queues.interrupt,
            queue,
            index,
            kick,
            buffer: Vec::new(),
        };
        Ok(EpollLoop::new(&fds, handler)?)
    }

    fn check_state(&self, state: &DeviceState, _: Option<&Activation>) -> Result<(), StateError> {
        match state {
            DeviceState::Rng => Ok(()),
            other => Err(other.wrong_kind("rng")),
        }
    }
}

/// A request is served whole on the worker thread, so once it is parked
/// nothing is in flight.
impl QueueLoop for EpollLoop<RngHandler> {
    fn positions(&self) -> Vec<QueuePosition> {
        let handler = self.handler();
        vec![QueuePosition::of(handler.index, &handler.queue)]
    }
}

pub(crate) struct RngHandler {
    memory: GuestMemoryMmap,
    interrupt: Arc<dyn VirtioInterrupt>,
    queue: Queue,
    index: u16,
    kick: EventFd,
    buffer: Vec<u8>,
}

impl WorkerHandler for RngHandler {
    fn handle(&mut self, _token: usize, _events: EventSet) {
        let _ = self.kick.read();
        self.process_queue();
    }
}

impl RngHandler {
    /// Serves every available request, then notifies the driver if the
    /// used ring changed and the driver wants to know.
    fn process_queue(&mut self) {
        let memory = &self.memory;
        let mut used = false;
        // Rounds in a row that took nothing although the driver's index
        // says there is more: a broken ring, not worth spinning on.
        let mut idle_rounds = 0u32;
        loop {
            let before = self.queue.next_avail();
            if let Err(e) = self.queue.disable_notification(memory) {
                tracing::warn!("virtio-rng: queue is broken: {e}");
                break;
            }
            while let Some(chain) = self.queue.pop_descriptor_chain(memory) {
                let head = chain.head_index();
                let len = match chain.writer(memory) {
                    Ok(mut writer) => {
                        let want = writer.available_bytes().min(MAX_REQUEST_BYTES);
                        self.buffer.resize(want, 0);
                        match fill_random(&mut self.buffer) {
                            Ok(()) => {
                                use std::io::Write;
                                match writer.write_all(&self.buffer) {
                                    Ok(()) => want as u32,
                                    Err(_) => writer.bytes_written() as u32,
                                }
                            }
                            Err(e) => {
                                tracing::warn!("virtio-rng: cannot get random bytes: {e}");
                                0
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!("virtio-rng: bad request chain: {e}");
                        0
                    }
                };
                match self.queue.add_used(memory, head, len) {
                    Ok(()) => used = true,
                    // A head index past the table cannot be returned: skip it.
                    Err(e) => tracing::warn!("virtio-rng: cannot return buffer {head}: {e}"),
                }
            }
            if self.queue.next_avail() == before {
                idle_rounds += 1;
            } else {
                idle_rounds = 0;
            }
            match self.queue.enable_notification(memory) {
                Ok(true) if idle_rounds < 2 => continue,
                Ok(true) => {
                    tracing::warn!("virtio-rng: the available ring index is broken");
                    break;
                }
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!("virtio-rng: queue is broken: {e}");
                    break;
                }
            }
        }
        if used && self.queue.needs_notification(memory).unwrap_or(true) {
            self.interrupt.notify_queue(self.index);
        }
    }
}

/// Fills `buf` from getrandom(2), falling back to /dev/urandom.
fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes
        // that getrandom writes at most `rest.len()` bytes into.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ENOSYS) => {
                    use std::io::Read;
                    return std::fs::File::open("/dev/urandom")?.read_exact(rest);
                }
                _ => return Err(err),
            }
        }
        filled += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::testing::{finishes, wait_until, DriverQueue, RecordingInterrupt, D};
    use vm_memory::{Bytes, GuestAddress};

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    fn activate(
        mem: &GuestMemoryMmap,
        driver: &DriverQueue,
    ) -> (Rng, Arc<RecordingInterrupt>, EventFd) {
        let mut rng = Rng::from_options("").unwrap();
        let interrupt = Arc::new(RecordingInterrupt::default());
        let queue_events = driver.queue_events(0);
        let kick = driver.kick.try_clone().unwrap();
        rng.activate(
            mem.clone(),
            interrupt.clone(),
            vec![queue_events],
            super::super::COMMON_FEATURES,
        )
        .unwrap();
        (rng, interrupt, kick)
    }

    #[test]
    fn identity_and_features() {
        let rng = Rng::from_options("id=entropy").unwrap();
        assert_eq!(rng.device_type(), 4);
        assert_eq!(rng.id(), "entropy");
        assert_eq!(Rng::new(RngConfig::default()).id(), "rng0");
        assert_eq!(rng.queue_max_sizes(), &[256]);
        assert_eq!(
            rng.device_features() & super::super::COMMON_FEATURES,
            super::super::COMMON_FEATURES
        );
        let mut data = [0xffu8; 8];
        rng.read_config(u64::MAX - 2, &mut data);
        assert_eq!(data, [0; 8]);
    }

    #[test]
    fn options_and_errors() {
        assert_eq!(RngConfig::parse("").unwrap(), RngConfig { id: None });
        assert_eq!(RngConfig::parse("id=r1").unwrap().id.as_deref(), Some("r1"));
        let err = RngConfig::parse("rate=10").unwrap_err().to_string();
        assert!(err.contains("unknown option 'rate'"), "{err}");
        assert!(RngConfig::parse("id=").is_err());
        assert!(RngConfig::parse("id=a b").is_err());
        assert!(RngConfig::parse("junk").is_err());
    }

    #[test]
    fn requests_are_filled_and_lengths_reported() {
        let mem = memory();
        let mut driver = DriverQueue::new(&mem, 0, 16);
        let (_rng, interrupt, kick) = activate(&mem, &driver);

        // Zeroed buffers: after the request they must not be all zeros.
        let a = driver.offer(&[D::w(0x2_0000, 64)]);
        let b = driver.offer(&[D::w(0x3_0000, 100), D::w(0x3_1000, 28)]);
        kick.write(1).unwrap();
        let used = driver.wait_used_n(2);
        assert_eq!(used, vec![(a as u32, 64), (b as u32, 128)]);
        wait_until("the queue interrupt", || interrupt.queue_count(0) >= 1);
        let mut out = [0u8; 64];
        mem.read_slice(&mut out, GuestAddress(0x2_0000)).unwrap();
        assert_ne!(out, [0u8; 64]);
        let mut out2 = [0u8; 28];
        mem.read_slice(&mut out2, GuestAddress(0x3_1000)).unwrap();
        assert_ne!(out2, [0u8; 28]);
        // Nothing past the buffer was written.
        let mut after = [0u8; 16];
        mem.read_slice(&mut after, GuestAddress(0x2_0000 + 64))
            .unwrap();
        assert_eq!(after, [0u8; 16]);
    }

    #[test]
    fn malformed_chains_get_zero_length() {
        let mem = memory();
        let mut driver = DriverQueue::new(&mem, 0, 16);
        let (_rng, _interrupt, kick) = activate(&mem, &driver);

        // Read-only buffer only.
        let ro = driver.offer(&[D::r(0x2_0000, 64)]);
        // Outside guest memory.
        let out = driver.offer(&[D::w(0x10_0000 - 8, 64)]);
        // Huge length.
        let huge = driver.offer(&[D::w(0x2_0000, u32::MAX)]);
        // A large but valid buffer is capped.
        let big = driver.offer(&[D::w(0x4_0000, 0x8_0000)]);
        // A chain that loops on itself.
        let looped = driver.add_looping(0x2_0000, 16, true);
        // A head index past the descriptor table: skipped by the queue.
        driver.add_bad_head();
        // A valid one after all that still works.
        let ok = driver.offer(&[D::w(0x2_0000, 16)]);
        kick.write(1).unwrap();
        let used = driver.wait_used_n(6);
        // virtio-queue bounds a looping chain by the queue size: at most 16
        // visits of the 16-byte buffer, all inside guest memory.
        assert_eq!(used[4].0, looped as u32);
        assert!(used[4].1 <= 16 * 16, "{used:?}");
        assert_eq!(
            used,
            vec![
                (ro as u32, 0),
                (out as u32, 0),
                (huge as u32, 0),
                (big as u32, MAX_REQUEST_BYTES as u32),
                (looped as u32, used[4].1),
                (ok as u32, 16),
            ]
        );
        // Nothing outside the buffers was written.
        let mut tail = [0u8; 64];
        mem.read_slice(&mut tail, GuestAddress(0x4_0000 + MAX_REQUEST_BYTES as u64))
            .unwrap();
        assert_eq!(tail, [0u8; 64]);
    }

    #[test]
    fn reset_stops_and_reactivation_works() {
        let mem = memory();
        let mut driver = DriverQueue::new(&mem, 0, 16);
        let (mut rng, _interrupt, kick) = activate(&mem, &driver);
        assert!(rng.is_active());
        rng.reset();
        assert!(!rng.is_active());
        driver.offer(&[D::w(0x2_0000, 8)]);
        kick.write(1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(driver.used().is_empty(), "a reset device served a request");

        let mut driver = DriverQueue::new(&mem, 0, 16);
        let interrupt = Arc::new(RecordingInterrupt::default());
        let queue_events = driver.queue_events(0);
        let kick = driver.kick.try_clone().unwrap();
        rng.activate(mem.clone(), interrupt, vec![queue_events], 0)
            .unwrap();
        let head = driver.offer(&[D::w(0x2_0000, 8)]);
        kick.write(1).unwrap();
        assert_eq!(driver.wait_used_n(1), vec![(head as u32, 8)]);
    }

    #[test]
    fn a_broken_available_index_does_not_spin_the_worker() {
        let mem = memory();
        let mut driver = DriverQueue::new(&mem, 0, 16);
        let (mut rng, _interrupt, kick) = activate(&mem, &driver);
        driver.set_avail_idx(1000);
        kick.write(1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(driver.used().is_empty());
        // A spinning worker would never see the stop request.
        let rng = finishes("the reset", move || {
            rng.reset();
            rng
        });
        assert!(!rng.is_active());
    }

    #[test]
    fn event_idx_suppresses_interrupts_the_driver_does_not_want() {
        let mem = memory();
        let mut driver = DriverQueue::new(&mem, 0, 16);
        let mut rng = Rng::new(RngConfig::default());
        let interrupt = Arc::new(RecordingInterrupt::default());
        let mut queue_events = driver.queue_events(0);
        let kick = driver.kick.try_clone().unwrap();
        queue_events.queue.set_event_idx(true);
        // Interrupt only after the third buffer (used index passes 2).
        driver.set_used_event(2);
        rng.activate(
            mem.clone(),
            interrupt.clone(),
            vec![queue_events],
            super::super::COMMON_FEATURES,
        )
        .unwrap();
        for _ in 0..2 {
            driver.offer(&[D::w(0x2_0000, 8)]);
            kick.write(1).unwrap();
            driver.wait_used_n(1);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(interrupt.queue_count(0), 0);
        driver.offer(&[D::w(0x2_0000, 8)]);
        kick.write(1).unwrap();
        driver.wait_used_n(1);
        wait_until("the interrupt", || interrupt.queue_count(0) == 1);
    }

    #[test]
    fn a_paused_device_serves_nothing_and_resumes_where_it_stopped() {
        let mem = memory();
        let mut driver = DriverQueue::new(&mem, 0, 16);
        let (mut rng, _interrupt, kick) = activate(&mem, &driver);
        let a = driver.offer(&[D::w(0x2_0000, 8)]);
        kick.write(1).unwrap();
        assert_eq!(driver.wait_used_n(1), vec![(a as u32, 8)]);

        let at = QueuePosition {
            index: 0,
            next_avail: 1,
            next_used: 1,
        };
        assert_eq!(rng.pause().unwrap(), vec![at]);
        // A request made while paused waits; pausing again changes nothing.
        let b = driver.offer(&[D::w(0x2_0000, 16)]);
        kick.write(1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(driver.used().is_empty(), "a paused device served a request");
        assert_eq!(rng.pause().unwrap(), vec![at]);
        rng.resume().unwrap();
        assert_eq!(driver.wait_used_n(1), vec![(b as u32, 16)]);
    }

    #[test]
    fn a_restored_device_serves_from_the_saved_position() {
        use crate::virtio::state::testing::{at_saved_position, through_json};
        let mem = memory();
        let mut driver = DriverQueue::new(&mem, 0, 16);
        let (mut source, _interrupt, kick) = activate(&mem, &driver);
        let heads: Vec<u16> = (0..3).map(|_| driver.offer(&[D::w(0x2_0000, 8)])).collect();
        kick.write(1).unwrap();
        assert_eq!(driver.wait_used_n(3).len(), 3);
        let positions = source.pause().unwrap();
        let state = through_json(&source.save_state());
        drop(source);

        // The guest queues a request whose kick went to the old VMM.
        let next = driver.offer(&[D::w(0x3_0000, 32)]);
        let mut restored = Rng::new(RngConfig::default());
        let interrupt = Arc::new(RecordingInterrupt::default());
        let events = driver.queue_events(0);
        let kick = driver.kick.try_clone().unwrap();
        restored
            .restore_state(
                &state,
                Some(Activation {
                    memory: mem.clone(),
                    interrupt: interrupt.clone(),
                    queues: vec![at_saved_position(events, &positions)],
                    acked_features: super::super::COMMON_FEATURES,
                }),
            )
            .unwrap();
        // Parked until resumed, whatever the kicks.
        kick.write(1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(driver.used().is_empty(), "served before the resume");
        restored.resume().unwrap();
        // Only the new request: the three before it are not served again.
        assert_eq!(driver.wait_used_n(1), vec![(next as u32, 32)]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(driver.used().is_empty(), "{heads:?} served twice");
        let mut out = [0u8; 32];
        mem.read_slice(&mut out, GuestAddress(0x3_0000)).unwrap();
        assert_ne!(out, [0u8; 32]);
    }

    #[test]
    fn state_of_another_device_is_refused() {
        let mut rng = Rng::new(RngConfig::default());
        let err = rng
            .restore_state(
                &DeviceState::Vsock(crate::virtio::vsock::VsockState { cid: 3 }),
                None,
            )
            .unwrap_err();
        assert!(matches!(err, StateError::WrongKind { .. }), "{err}");
        assert!(!rng.is_active());
        // An inactive device pauses and resumes as a no-op.
        assert_eq!(rng.pause().unwrap(), Vec::new());
        rng.resume().unwrap();
        rng.restore_state(&DeviceState::Rng, None).unwrap();
        assert!(!rng.is_active());
    }

    #[test]
    fn wrong_queue_count_is_refused() {
        let mem = memory();
        let mut rng = Rng::new(RngConfig::default());
        let err = rng
            .activate(mem, Arc::new(RecordingInterrupt::default()), Vec::new(), 0)
            .unwrap_err();
        assert!(matches!(
            err,
            ActivateError::QueueCount { got: 0, needed: 1 }
        ));
    }
}
