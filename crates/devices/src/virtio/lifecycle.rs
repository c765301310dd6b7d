//! The one lifecycle of a virtio device whose queues a worker thread
//! serves.
//!
//! Every device here is started, reset, paused, resumed and restored the
//! same way; only what serves its queues and what it keeps of its own
//! differ. A device says what is its own by implementing [`QueueDevice`]
//! and keeps a [`DeviceLifecycle`], which holds the worker (see
//! [`worker`](super::worker)) and with it the loop that owns the queues,
//! the guest memory and the interrupt. The functions of this module then
//! answer the [`VirtioDevice`] lifecycle calls once for every device:
//!
//! - [`activate`]: the device is reset; the driver's queues are checked
//!   (each valid in guest memory, each index one of the device's and given
//!   once, every queue the accepted features need present) and follow the
//!   accepted EVENT_IDX; the device builds its loop over them
//!   ([`QueueDevice::serve`]) and the worker starts.
//! - [`reset`]: the worker is stopped and joined, the queues go with its
//!   loop; then the device forgets what the driver told it
//!   ([`QueueDevice::on_reset`]).
//! - [`DeviceLifecycle::pause`]: the worker is parked after the event it
//!   is handling; its loop completes what it took off the queues
//!   ([`QueueLoop::quiesce`]) and reports where each queue stands. The
//!   loop, and everything it holds, waits for the resume.
//! - [`DeviceLifecycle::resume`]: the parked loop runs again on a new
//!   thread, from where it stopped.
//! - [`restore`]: the device refuses a state it cannot take before
//!   anything changes ([`QueueDevice::check_state`]), is reset, gets its
//!   queues as on activation but stays parked until the resume, and puts
//!   back the rest of its state ([`QueueDevice::apply_state`]).
//!
//! A failed activation or restore leaves the device reset.

use std::sync::Arc;

use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;

use super::device::{ActivateError, Activation, QueueEvents, VirtioDevice, VirtioInterrupt};
use super::state::{DeviceState, QueuePosition, StateError};
use super::worker::{Worker, WorkerLoop};
use crate::affinity::{CpuSet, IoThreadSched, ThreadPlacement};
use crate::GuestMemoryMmap;

/// The body of a device's worker thread, as the lifecycle sees it: the
/// loop owns the queues it serves, so it alone knows where they stand.
pub(crate) trait QueueLoop: WorkerLoop {
    /// Where each queue the loop serves stands; asked while it is parked.
    fn positions(&self) -> Vec<QueuePosition>;

    /// Completes, once the loop is parked and before its positions are
    /// read, what it took off its queues and handed to other threads, so
    /// that every request is in the used ring (with the interrupt the
    /// driver asked for) or still in the available ring. A loop that
    /// serves each request whole on its own thread has nothing to do.
    fn quiesce(&mut self) -> Result<(), StateError> {
        Ok(())
    }
}

/// What is a device's own in its lifecycle; see the module's
/// documentation for what is done around it.
pub(crate) trait QueueDevice: VirtioDevice + Sized {
    /// What serves the queues on the device's worker thread.
    type Loop: QueueLoop;

    /// The worker thread is named `<id>-<WORKER_SUFFIX>`.
    const WORKER_SUFFIX: &'static str = "worker";

    /// The device's lifecycle.
    fn lifecycle(&mut self) -> &mut DeviceLifecycle<Self::Loop>;

    /// The host CPUs the device's threads run on (`iothread_affinity=`);
    /// anywhere by default.
    fn thread_affinity(&self) -> Option<CpuSet> {
        None
    }

    /// The device's threads' scheduling policy (`iothread_sched=`); the
    /// kernel's default unless the device says otherwise.
    fn thread_sched(&self) -> IoThreadSched {
        IoThreadSched::Other
    }

    /// How many queues (the first ones, by index) a driver that accepted
    /// `acked_features` must make ready; every queue unless the device
    /// says otherwise. Queues past these are not served.
    fn queues_needed(&self, _acked_features: u64) -> usize {
        self.queue_max_sizes().len()
    }

    /// Whether queues the driver made ready past the first
    /// [`queues_needed`](QueueDevice::queues_needed) are served too (a
    /// multi-queue disk whose driver uses fewer queues than offered, e.g.
    /// one per guest CPU). By default they are not.
    fn serves_optional_queues(&self) -> bool {
        false
    }

    /// The loop that serves `queues`, built but not yet running.
    /// `restoring` is the state being restored when the device takes over
    /// the queues of a driver in the middle of its work (a snapshot),
    /// rather than those of a driver that just started it.
    fn serve(
        &mut self,
        queues: ActiveQueues,
        restoring: Option<&DeviceState>,
    ) -> Result<Self::Loop, ActivateError>;

    /// The loops that serve `queues`, each on its own worker thread: one
    /// ([`serve`](QueueDevice::serve)) unless the device gives each queue
    /// a thread of its own.
    fn serve_each(
        &mut self,
        queues: ActiveQueues,
        restoring: Option<&DeviceState>,
    ) -> Result<Vec<Self::Loop>, ActivateError> {
        Ok(vec![self.serve(queues, restoring)?])
    }

    /// Refuses a saved state of another kind, of a device configured
    /// otherwise, or that cannot be right (with `activation`, the queues
    /// it would be restored with). Called before anything changes.
    fn check_state(
        &self,
        state: &DeviceState,
        activation: Option<&Activation>,
    ) -> Result<(), StateError>;

    /// Puts back what `state` holds besides the queues, once the queues
    /// are back (or, for a device that was not active, there are none).
    fn apply_state(&mut self, _state: &DeviceState) {}

    /// What a reset undoes besides the worker and its queues.
    fn on_reset(&mut self) {}
}

/// The queues of an activation, checked and in index order: `queues[i]`
/// is queue `i`, for as many queues as [`QueueDevice::queues_needed`].
pub(crate) struct ActiveQueues {
    pub memory: GuestMemoryMmap,
    pub interrupt: Arc<dyn VirtioInterrupt>,
    pub queues: Vec<QueueEvents>,
    /// The features the driver accepted.
    pub acked_features: u64,
}

/// The `N` queues of a device that serves `N` queues, from
/// [`ActiveQueues::queues`].
pub(crate) fn queue_array<const N: usize>(
    queues: Vec<QueueEvents>,
) -> Result<[QueueEvents; N], ActivateError> {
    let got = queues.len();
    queues
        .try_into()
        .map_err(|_| ActivateError::QueueCount { got, needed: N })
}

/// A device's workers (one, or one per queue): none while no driver runs
/// the device, running while it serves, parked while paused or restored
/// and not yet resumed.
pub(crate) struct DeviceLifecycle<L: QueueLoop> {
    workers: Vec<Worker<L>>,
}

impl<L: QueueLoop> Default for DeviceLifecycle<L> {
    fn default() -> Self {
        DeviceLifecycle {
            workers: Vec::new(),
        }
    }
}

impl<L: QueueLoop> DeviceLifecycle<L> {
    /// Whether a driver's queues are being served (or parked to be).
    pub fn is_active(&self) -> bool {
        !self.workers.is_empty()
    }

    /// [`VirtioDevice::pause`]: parks every worker, then completes what
    /// each loop took off its queues and returns where they all stand;
    /// nothing (an inactive device) or the same again (a paused one)
    /// otherwise.
    pub fn pause(&mut self) -> Result<Vec<QueuePosition>, StateError> {
        // All parked first: no queue takes new requests while another
        // drains.
        for worker in &mut self.workers {
            worker
                .park()
                .map_err(|e| StateError::Pause(e.to_string()))?;
        }
        let mut positions = Vec::new();
        for worker in &mut self.workers {
            let body = worker
                .park()
                .map_err(|e| StateError::Pause(e.to_string()))?;
            body.quiesce()?;
            positions.extend(body.positions());
        }
        Ok(positions)
    }

    /// [`VirtioDevice::resume`]: runs the parked loops again; a running or
    /// inactive device is left as it is.
    pub fn resume(&mut self) -> Result<(), StateError> {
        for worker in &mut self.workers {
            worker
                .resume()
                .map_err(|e| StateError::Resume(e.to_string()))?;
        }
        Ok(())
    }

    /// The (first) loop, while parked (e.g. for a snapshot of what it
    /// holds).
    pub fn parked(&self) -> Option<&L> {
        self.workers.first().and_then(|w| w.parked_ref())
    }

    /// Stops and joins the workers; their loops, and the queues, are
    /// dropped.
    fn stop(&mut self) {
        self.workers.clear();
    }
}

/// [`VirtioDevice::activate`]: serves the queues of a driver that just
/// started the device.
pub(crate) fn activate<D: QueueDevice>(
    device: &mut D,
    activation: Activation,
) -> Result<(), ActivateError> {
    reset(device);
    let started = install(device, activation, None).and_then(|()| {
        device
            .lifecycle()
            .resume()
            .map_err(|e| ActivateError::Worker(e.to_string()))
    });
    if started.is_err() {
        reset(device);
    }
    started
}

/// [`VirtioDevice::reset`]: stops serving; the device may be activated
/// again.
pub(crate) fn reset<D: QueueDevice>(device: &mut D) {
    device.lifecycle().stop();
    device.on_reset();
}

/// [`VirtioDevice::restore_state`]: puts `state` back into a device no
/// driver has touched, with the queues of `activation` (parked until the
/// resume) if it was active.
pub(crate) fn restore<D: QueueDevice>(
    device: &mut D,
    state: &DeviceState,
    activation: Option<Activation>,
) -> Result<(), StateError> {
    device.check_state(state, activation.as_ref())?;
    reset(device);
    if let Some(activation) = activation {
        if let Err(e) = install(device, activation, Some(state)) {
            reset(device);
            return Err(StateError::Mismatch(e.to_string()));
        }
    }
    device.apply_state(state);
    Ok(())
}

/// Checks `activation`'s queues and gives the device a parked worker
/// serving them.
fn install<D: QueueDevice>(
    device: &mut D,
    activation: Activation,
    restoring: Option<&DeviceState>,
) -> Result<(), ActivateError> {
    let needed = device.queues_needed(activation.acked_features);
    let optional = device.serves_optional_queues();
    let queues = check_queues(activation, device.queue_max_sizes().len(), needed, optional)?;
    let bodies = device.serve_each(queues, restoring)?;
    let several = bodies.len() > 1;
    let mut workers = Vec::with_capacity(bodies.len());
    for (i, body) in bodies.into_iter().enumerate() {
        let mut name = format!("{}-{}", device.id(), D::WORKER_SUFFIX);
        if several {
            name.push_str(&i.to_string());
        }
        let placement = ThreadPlacement {
            affinity: device.thread_affinity(),
            sched: device.thread_sched(),
        };
        workers.push(Worker::parked(name, body)?.with_placement(placement));
    }
    device.lifecycle().workers = workers;
    Ok(())
}

/// The queues of `activation` in index order, each valid in guest memory,
/// each index below `count` and given once, the first `needed` all
/// present (any others dropped, or kept if `optional` ones are served),
/// with EVENT_IDX as the driver accepted it.
fn check_queues(
    activation: Activation,
    count: usize,
    needed: usize,
    optional: bool,
) -> Result<ActiveQueues, ActivateError> {
    let Activation {
        memory,
        interrupt,
        queues,
        acked_features,
    } = activation;
    let got = queues.len();
    let event_idx = acked_features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
    let mut slots: Vec<Option<QueueEvents>> = std::iter::repeat_with(|| None).take(count).collect();
    for mut events in queues {
        let index = events.index;
        if !events.queue.is_valid(&memory) {
            return Err(ActivateError::InvalidQueue(index));
        }
        let Some(slot @ None) = slots.get_mut(usize::from(index)) else {
            return Err(ActivateError::InvalidQueue(index));
        };
        events.queue.set_event_idx(event_idx);
        *slot = Some(events);
    }
    let extra = if optional {
        slots.split_off(needed.min(slots.len()))
    } else {
        Vec::new()
    };
    slots.truncate(needed);
    let mut queues = slots
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or(ActivateError::QueueCount { got, needed })?;
    queues.extend(extra.into_iter().flatten());
    Ok(ActiveQueues {
        memory,
        interrupt,
        queues,
        acked_features,
    })
}

/// The [`VirtioDevice`] lifecycle methods — `activate`, `reset`, `pause`,
/// `resume`, `restore_state` — for a device that implements
/// [`QueueDevice`]: written once here, expanded inside each device's
/// `impl VirtioDevice`, so a device writes only what is its own.
macro_rules! lifecycle_methods {
    () => {
        fn activate(
            &mut self,
            memory: $crate::GuestMemoryMmap,
            interrupt: ::std::sync::Arc<dyn $crate::virtio::VirtioInterrupt>,
            queues: ::std::vec::Vec<$crate::virtio::QueueEvents>,
            acked_features: u64,
        ) -> ::std::result::Result<(), $crate::virtio::ActivateError> {
            $crate::virtio::lifecycle::activate(
                self,
                $crate::virtio::Activation {
                    memory,
                    interrupt,
                    queues,
                    acked_features,
                },
            )
        }

        fn reset(&mut self) {
            $crate::virtio::lifecycle::reset(self);
        }

        fn pause(
            &mut self,
        ) -> ::std::result::Result<
            ::std::vec::Vec<$crate::virtio::QueuePosition>,
            $crate::virtio::StateError,
        > {
            $crate::virtio::lifecycle::QueueDevice::lifecycle(self).pause()
        }

        fn resume(&mut self) -> ::std::result::Result<(), $crate::virtio::StateError> {
            $crate::virtio::lifecycle::QueueDevice::lifecycle(self).resume()
        }

        fn restore_state(
            &mut self,
            state: &$crate::virtio::DeviceState,
            activation: ::std::option::Option<$crate::virtio::Activation>,
        ) -> ::std::result::Result<(), $crate::virtio::StateError> {
            $crate::virtio::lifecycle::restore(self, state, activation)
        }
    };
}
pub(crate) use lifecycle_methods;

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::Queue;
    use vm_memory::GuestAddress;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    struct NoInterrupt;

    impl VirtioInterrupt for NoInterrupt {
        fn notify_queue(&self, _: u16) {}
        fn notify_config(&self) {}
    }

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap()
    }

    /// Queue `index`, 16 entries at `base`, or outside memory.
    fn events(index: u16, base: u64) -> QueueEvents {
        let mut queue = Queue::new(16).unwrap();
        queue.set_size(16);
        queue.set_desc_table_address(Some(base as u32), Some(0));
        queue.set_avail_ring_address(Some(base as u32 + 0x100), Some(0));
        queue.set_used_ring_address(Some(base as u32 + 0x200), Some(0));
        queue.set_ready(true);
        QueueEvents {
            index,
            queue,
            kick: EventFd::new(EFD_NONBLOCK).unwrap(),
        }
    }

    fn activation(queues: Vec<QueueEvents>, acked_features: u64) -> Activation {
        Activation {
            memory: memory(),
            interrupt: Arc::new(NoInterrupt),
            queues,
            acked_features,
        }
    }

    #[test]
    fn queues_come_in_index_order_with_the_accepted_event_idx() {
        let given = vec![events(2, 0x3000), events(0, 0x1000), events(1, 0x2000)];
        let active =
            check_queues(activation(given, 1 << VIRTIO_RING_F_EVENT_IDX), 3, 3, false).unwrap();
        let indices: Vec<u16> = active.queues.iter().map(|q| q.index).collect();
        assert_eq!(indices, [0, 1, 2]);
        assert!(active.queues.iter().all(|q| q.queue.event_idx_enabled()));
        let active = check_queues(activation(vec![events(0, 0x1000)], 0), 1, 1, false).unwrap();
        assert!(!active.queues[0].queue.event_idx_enabled());
        let [only] = queue_array(active.queues).unwrap();
        assert_eq!(only.index, 0);

        // Queues past those the features need are not served.
        let given = vec![events(0, 0x1000), events(1, 0x2000), events(2, 0x3000)];
        let active = check_queues(activation(given, 0), 3, 2, false).unwrap();
        assert_eq!(active.queues.len(), 2);
        let Err(err) = queue_array::<3>(active.queues) else {
            panic!("two queues taken for three");
        };
        assert!(matches!(
            err,
            ActivateError::QueueCount { got: 2, needed: 3 }
        ));

        // A device that serves optional queues keeps those the driver
        // made ready past the needed ones, gaps and all, in index order.
        let given = vec![events(2, 0x3000), events(0, 0x1000)];
        let active = check_queues(activation(given, 0), 4, 1, true).unwrap();
        let indices: Vec<u16> = active.queues.iter().map(|q| q.index).collect();
        assert_eq!(indices, [0, 2]);
        let given = vec![events(1, 0x2000)];
        assert!(matches!(
            check_queues(activation(given, 0), 4, 1, true).err(),
            Some(ActivateError::QueueCount { got: 1, needed: 1 })
        ));
    }

    #[test]
    fn queues_missing_repeated_foreign_or_outside_memory_are_refused() {
        let check = |given: Vec<QueueEvents>| check_queues(activation(given, 0), 2, 2, false).err();
        assert!(matches!(
            check(vec![events(1, 0x2000)]),
            Some(ActivateError::QueueCount { got: 1, needed: 2 })
        ));
        assert!(matches!(
            check(vec![events(0, 0x1000), events(0, 0x2000)]),
            Some(ActivateError::InvalidQueue(0))
        ));
        assert!(matches!(
            check(vec![events(0, 0x1000), events(2, 0x2000)]),
            Some(ActivateError::InvalidQueue(2))
        ));
        assert!(matches!(
            check(vec![events(0, 0x1000), events(1, 0x10_0000)]),
            Some(ActivateError::InvalidQueue(1))
        ));
    }
}
