//! [`DirectGate`]: a `cache=none` image's O_DIRECT accesses in flight on
//! every queue against the one access that goes through the page cache.
//!
//! A request whose disk offset or length O_DIRECT cannot take (a 512-byte
//! sector on a 4K-sector host disk) is written through a buffered
//! descriptor: the kernel reads the whole 4 KiB block into its page cache,
//! changes the sectors and writes the block back. An O_DIRECT write to
//! *another* sector of that block meanwhile (a request the guest may well
//! have in flight at once) would be overwritten by the stale copy. Its own
//! queue drains before such a request runs (`Started::Alone`); the gate
//! keeps the other queues' O_DIRECT reads and writes out too, as the one
//! read-write lock of the single-queue device did.
//!
//! An engine's op holds the gate from its submission until its completion
//! is reaped, on the queue thread, so it cannot be a lock guard: it is a
//! count. Waiting for the count to drop is safe because no queue thread
//! waits for the gate while it has the buffered access: new O_DIRECT
//! submissions wait only while that access runs, and the access waits for
//! none of its own queue's ops (drained first).

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// O_DIRECT ops in flight (shared) against one buffered access
/// (exclusive).
#[derive(Debug, Default)]
pub struct DirectGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    direct: usize,
    buffered: bool,
}

impl DirectGate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An O_DIRECT op starts: waits while a buffered access runs.
    pub fn enter_direct(&self) {
        let mut s = self.lock();
        while s.buffered {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.direct += 1;
    }

    /// An O_DIRECT op that [`enter_direct`](Self::enter_direct)ed is done.
    pub fn leave_direct(&self) {
        let mut s = self.lock();
        s.direct = s.direct.saturating_sub(1);
        if s.direct == 0 {
            self.changed.notify_all();
        }
    }

    /// Waits until no O_DIRECT op is in flight and no other buffered
    /// access runs, and keeps new ones out until the guard is dropped.
    /// The caller must have none of its own in flight.
    pub fn buffered(&self) -> BufferedAccess<'_> {
        let mut s = self.lock();
        while s.buffered || s.direct > 0 {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.buffered = true;
        BufferedAccess { gate: self }
    }
}

impl DirectGate {
    /// No O_DIRECT op and no buffered access holds the gate: what every
    /// drained device must come back to (the fuzz harness checks it).
    pub fn is_idle(&self) -> bool {
        let s = self.lock();
        s.direct == 0 && !s.buffered
    }
}

/// A buffered access under way (see [`DirectGate::buffered`]).
pub struct BufferedAccess<'a> {
    gate: &'a DirectGate,
}

impl Drop for BufferedAccess<'_> {
    fn drop(&mut self) {
        self.gate.lock().buffered = false;
        self.gate.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_buffered_access_waits_for_direct_ops_and_keeps_new_ones_out() {
        let gate = Arc::new(DirectGate::default());
        gate.enter_direct();
        let running = Arc::new(AtomicBool::new(false));
        let (g, r) = (gate.clone(), running.clone());
        let buffered = std::thread::spawn(move || {
            let _access = g.buffered();
            r.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            r.store(false, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(30));
        assert!(!running.load(Ordering::SeqCst), "ran over a direct op");
        gate.leave_direct();
        while !running.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // A new direct op waits for the buffered access to end.
        gate.enter_direct();
        assert!(!running.load(Ordering::SeqCst));
        gate.leave_direct();
        buffered.join().unwrap();
    }
}
