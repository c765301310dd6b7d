//! One dirty log per memory slot, shared by every reader of it.
//!
//! KVM keeps one dirty bitmap per slot, and reading it (with manual
//! protection: reading then clearing) hands each written page to whoever
//! read first. Two consumers of the same slot — the display's framebuffer
//! tracking and a migration, say — would each miss the other's pages. So
//! nobody reads KVM's log but this module: a harvest by one reader fetches
//! the slot's new pages once and keeps a copy for every other reader of
//! that slot, which gets them at its own next harvest. Logging is on for a
//! slot while it has at least one reader.
//!
//! The decisions here are pure over [`LogBackend`] (KVM in the VMM, a fake
//! in the tests below).

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::MemoryError;

/// Who reads a slot's log (one per consumer, e.g. one per migration).
pub type ReaderId = u64;

/// What the shared log needs from KVM (and from the VMM's own write log).
pub trait LogBackend {
    /// Switches KVM's dirty logging of `slot` on or off.
    fn set_logging(&self, slot: u32, on: bool) -> Result<(), MemoryError>;
    /// The pages of `slot` written since the last fetch, one bit per page,
    /// and arms logging of them again (re-protects): KVM's log ORed with
    /// the VMM's own writes into that slot.
    fn fetch(&self, slot: u32) -> Result<Vec<u64>, MemoryError>;
    /// Forgets the VMM's writes into `slot` so far (logging starts afresh;
    /// KVM's own log starts empty when logging is switched on).
    fn forget_vmm_writes(&self, slot: u32);
}

/// The readers of every logged slot, and what each has not collected yet.
#[derive(Default)]
pub struct SharedDirtyLog {
    slots: Mutex<BTreeMap<u32, BTreeMap<ReaderId, Vec<u64>>>>,
}

impl SharedDirtyLog {
    /// Adds `reader` to `slot`'s readers. It is told of writes from now
    /// on; the other readers keep everything written before.
    pub fn attach(
        &self,
        backend: &dyn LogBackend,
        slot: u32,
        reader: ReaderId,
    ) -> Result<(), MemoryError> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        match slots.get_mut(&slot) {
            Some(readers) => {
                // Hand what is in the log now to those already reading,
                // so the new reader starts from an empty log.
                let fresh = backend.fetch(slot)?;
                for pending in readers.values_mut() {
                    or_into(pending, &fresh);
                }
                readers.insert(reader, Vec::new());
            }
            None => {
                backend.set_logging(slot, true)?;
                backend.forget_vmm_writes(slot);
                slots.insert(slot, BTreeMap::from([(reader, Vec::new())]));
            }
        }
        Ok(())
    }

    /// Removes `reader`; the last one out switches logging off.
    pub fn detach(&self, backend: &dyn LogBackend, slot: u32, reader: ReaderId) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let Some(readers) = slots.get_mut(&slot) else {
            return;
        };
        readers.remove(&reader);
        if readers.is_empty() {
            slots.remove(&slot);
            if let Err(e) = backend.set_logging(slot, false) {
                tracing::warn!("cannot switch dirty logging of slot {slot} off: {e}");
            }
        }
    }

    /// The pages of `slot` written since `reader`'s last harvest (or its
    /// attach), re-armed: a write after this call shows in the next one.
    pub fn harvest(
        &self,
        backend: &dyn LogBackend,
        slot: u32,
        reader: ReaderId,
    ) -> Result<Vec<u64>, MemoryError> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let readers = slots
            .get_mut(&slot)
            .filter(|r| r.contains_key(&reader))
            .ok_or(MemoryError::NotLogging(slot))?;
        let fresh = backend.fetch(slot)?;
        let mut mine = Vec::new();
        for (id, pending) in readers.iter_mut() {
            if *id == reader {
                mine = std::mem::take(pending);
            } else {
                or_into(pending, &fresh);
            }
        }
        or_into(&mut mine, &fresh);
        Ok(mine)
    }

    /// Whether `slot` is logged (has a reader).
    #[cfg(test)]
    pub fn is_logged(&self, slot: u32) -> bool {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.contains_key(&slot)
    }
}

/// `into |= from`, growing `into` as needed (an empty vector is "nothing").
fn or_into(into: &mut Vec<u64>, from: &[u64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from) {
        *a |= b;
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    use super::*;

    /// A slot's log as KVM keeps it: written pages since the last fetch.
    #[derive(Default)]
    struct FakeKvm {
        logging: RefCell<BTreeSet<u32>>,
        written: RefCell<BTreeMap<u32, u64>>,
        vmm_written: RefCell<BTreeMap<u32, u64>>,
        fetches: RefCell<usize>,
    }

    impl FakeKvm {
        fn write(&self, slot: u32, page: u32) {
            if self.logging.borrow().contains(&slot) {
                *self.written.borrow_mut().entry(slot).or_default() |= 1 << page;
            }
        }
        fn vmm_write(&self, slot: u32, page: u32) {
            *self.vmm_written.borrow_mut().entry(slot).or_default() |= 1 << page;
        }
    }

    impl LogBackend for FakeKvm {
        fn set_logging(&self, slot: u32, on: bool) -> Result<(), MemoryError> {
            if on {
                self.logging.borrow_mut().insert(slot);
                self.written.borrow_mut().remove(&slot);
            } else {
                self.logging.borrow_mut().remove(&slot);
            }
            Ok(())
        }
        fn fetch(&self, slot: u32) -> Result<Vec<u64>, MemoryError> {
            assert!(
                self.logging.borrow().contains(&slot),
                "fetch of an unlogged slot"
            );
            *self.fetches.borrow_mut() += 1;
            let kvm = self.written.borrow_mut().remove(&slot).unwrap_or(0);
            let vmm = self.vmm_written.borrow_mut().remove(&slot).unwrap_or(0);
            Ok(vec![kvm | vmm])
        }
        fn forget_vmm_writes(&self, slot: u32) {
            self.vmm_written.borrow_mut().remove(&slot);
        }
    }

    fn pages(words: &[u64]) -> u64 {
        words.first().copied().unwrap_or(0)
    }

    #[test]
    fn one_reader_sees_each_write_once() {
        let kvm = FakeKvm::default();
        let log = SharedDirtyLog::default();
        kvm.write(0, 1); // before logging: not seen
        log.attach(&kvm, 0, 1).unwrap();
        kvm.write(0, 2);
        kvm.vmm_write(0, 3);
        assert_eq!(pages(&log.harvest(&kvm, 0, 1).unwrap()), 0b1100);
        assert_eq!(pages(&log.harvest(&kvm, 0, 1).unwrap()), 0);
        kvm.write(0, 2);
        assert_eq!(pages(&log.harvest(&kvm, 0, 1).unwrap()), 0b100);
    }

    #[test]
    fn two_readers_of_one_slot_each_see_every_write() {
        // The display and a migration both read the framebuffer's slot.
        let kvm = FakeKvm::default();
        let log = SharedDirtyLog::default();
        log.attach(&kvm, 5, 1).unwrap();
        kvm.write(5, 0);
        log.attach(&kvm, 5, 2).unwrap();
        kvm.write(5, 1);
        // Reader 1 sees both writes; reader 2 only the one after it came.
        assert_eq!(pages(&log.harvest(&kvm, 5, 1).unwrap()), 0b11);
        kvm.write(5, 2);
        assert_eq!(pages(&log.harvest(&kvm, 5, 2).unwrap()), 0b110);
        assert_eq!(pages(&log.harvest(&kvm, 5, 1).unwrap()), 0b100);
        assert_eq!(pages(&log.harvest(&kvm, 5, 2).unwrap()), 0);
        assert_eq!(pages(&log.harvest(&kvm, 5, 1).unwrap()), 0);
    }

    #[test]
    fn vmm_writes_before_the_first_reader_are_forgotten() {
        let kvm = FakeKvm::default();
        let log = SharedDirtyLog::default();
        kvm.vmm_write(0, 7);
        log.attach(&kvm, 0, 1).unwrap();
        assert_eq!(pages(&log.harvest(&kvm, 0, 1).unwrap()), 0);
    }

    #[test]
    fn the_last_reader_out_switches_logging_off() {
        let kvm = FakeKvm::default();
        let log = SharedDirtyLog::default();
        log.attach(&kvm, 3, 1).unwrap();
        log.attach(&kvm, 3, 2).unwrap();
        log.detach(&kvm, 3, 1);
        assert!(kvm.logging.borrow().contains(&3));
        assert!(log.is_logged(3));
        log.detach(&kvm, 3, 2);
        assert!(!kvm.logging.borrow().contains(&3));
        assert!(!log.is_logged(3));
        // A harvest after detaching is refused, not a fetch of an
        // unlogged slot.
        assert!(matches!(
            log.harvest(&kvm, 3, 2),
            Err(MemoryError::NotLogging(3))
        ));
    }

    #[test]
    fn slots_are_independent() {
        let kvm = FakeKvm::default();
        let log = SharedDirtyLog::default();
        log.attach(&kvm, 0, 1).unwrap();
        log.attach(&kvm, 4, 2).unwrap();
        kvm.write(0, 0);
        kvm.write(4, 1);
        assert_eq!(pages(&log.harvest(&kvm, 0, 1).unwrap()), 0b1);
        assert_eq!(pages(&log.harvest(&kvm, 4, 2).unwrap()), 0b10);
        assert_eq!(*kvm.fetches.borrow(), 2);
    }
}
