//! Which RAM pages changed since the last look, on the source: the memory
//! manager's dirty log of RAM's slots — what vCPUs wrote (KVM's log) ORed
//! with what the VMM's own threads wrote (virtio devices filling guest
//! buffers), which KVM never sees.
//!
//! The manager shares each slot's log among its readers, so a display
//! reading the log of its own slot, or KVM's manual protection switched
//! on for the whole VM, changes nothing here.

use std::sync::Arc;

use super::pages::PageBitmap;
use super::MigrationError;
use crate::memory::{DirtyLogReader, MemoryManager};

/// Dirty logging of every RAM slot, for one migration; it stops when
/// dropped (unless someone else reads those slots too).
pub struct RamDirtyLog {
    reader: DirtyLogReader,
    /// Pages in each RAM slot, in RAM order.
    slot_pages: Vec<usize>,
}

impl RamDirtyLog {
    /// Starts logging. Writes before this are not reported: the first
    /// round sends every page anyway.
    pub fn start(memory: &Arc<MemoryManager>) -> Result<RamDirtyLog, MigrationError> {
        let failed = |e| MigrationError::Invalid(format!("RAM dirty log: {e}"));
        let slots = memory.ram_slots();
        let slot_pages = slots
            .iter()
            .map(|&s| memory.slot_pages(s))
            .collect::<Result<_, _>>()
            .map_err(failed)?;
        let reader = memory.dirty_log(&slots).map_err(failed)?;
        Ok(RamDirtyLog { reader, slot_pages })
    }

    /// Adds the pages written since the last harvest (or the start) to
    /// `into`, in RAM order; returns how many pages were dirty.
    pub fn harvest(&self, into: &PageBitmap) -> Result<usize, MigrationError> {
        let before = into.count();
        let mut index = 0;
        for (&slot, &pages) in self.reader.slots().iter().zip(&self.slot_pages) {
            let words = self
                .reader
                .harvest(slot)
                .map_err(|e| MigrationError::Invalid(format!("RAM dirty log: {e}")))?;
            into.or_words(index, &words);
            index += pages;
        }
        Ok(into.count() - before)
    }
}
