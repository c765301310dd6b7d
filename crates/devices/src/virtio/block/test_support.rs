//! What the block tests share beyond requests and images (those are in
//! `tests`): a driver's side of an activated disk, and waiting for the
//! statistics the queue threads count. No KVM.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Block, DiskCounters};
use crate::virtio::testing::{DriverQueue, RecordingInterrupt};
use crate::virtio::VirtioDevice;
use crate::GuestMemoryMmap;

/// Activates `block` on `mem` with one driver queue per `(guest address,
/// size)` of `queues`, the driver accepting the features `acked`, as a
/// driver's probe does; returns the queues, in order, and the interrupts
/// the device will raise.
pub(super) fn activate(
    block: &mut Block,
    mem: &GuestMemoryMmap,
    queues: &[(u64, u16)],
    acked: u64,
) -> (Vec<DriverQueue>, Arc<RecordingInterrupt>) {
    let queues: Vec<DriverQueue> = queues
        .iter()
        .map(|&(base, size)| DriverQueue::new(mem, base, size))
        .collect();
    let irq = RecordingInterrupt::new();
    let events = queues
        .iter()
        .enumerate()
        .map(|(i, q)| q.queue_events(i as u16))
        .collect();
    block
        .activate(mem.clone(), irq.clone(), events, acked)
        .unwrap();
    (queues, irq)
}

/// The device's statistics once it has counted `n` requests (its queue
/// thread counts a request just after putting it in the used ring), and
/// no more.
pub(super) fn counted(block: &Block, n: u64) -> DiskCounters {
    let stats = block.stats();
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.snapshot().ops() < n {
        assert!(Instant::now() < deadline, "{:?}", stats.snapshot());
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = stats.snapshot();
    assert_eq!(c.ops(), n, "{c:?}");
    c
}
