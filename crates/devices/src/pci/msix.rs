//! MSI-X: the capability in configuration space, and the vector table and
//! pending-bit array in a BAR. Each vector is an [`MsiVector`] (a KVM GSI
//! with an irqfd); its route follows what the guest writes to the table.

use crate::interrupt::{InterruptError, MsiMessage, MsiRouting, MsiVector};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// MSI-X capability id.
const CAP_ID_MSIX: u8 = 0x11;
const CONTROL_ENABLE: u16 = 1 << 15;
const CONTROL_FUNCTION_MASK: u16 = 1 << 14;
const ENTRY_SIZE: u64 = 16;
const VECTOR_MASKED: u32 = 1;

/// One table entry as the guest wrote it.
#[derive(Clone, Copy, Debug)]
struct Entry {
    message: MsiMessage,
    control: u32,
}

impl Default for Entry {
    fn default() -> Self {
        // Vectors come out of reset masked.
        Entry {
            message: MsiMessage::default(),
            control: VECTOR_MASKED,
        }
    }
}

/// One table entry, saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsixEntryState {
    pub address_lo: u32,
    pub address_hi: u32,
    pub data: u32,
    /// The vector control word (bit 0: masked).
    pub control: u32,
}

/// The table and pending bits of one function, saved. Enable and
/// function mask are in the capability's control word, which is saved
/// with the configuration space.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsixState {
    pub entries: Vec<MsixEntryState>,
    pub pending: Vec<bool>,
}

/// MSI-X state of one function.
pub struct Msix {
    entries: Vec<Entry>,
    pending: Vec<bool>,
    vectors: Vec<MsiVector>,
    enabled: bool,
    function_masked: bool,
}

impl Msix {
    /// `count` vectors, each with a KVM GSI and irqfd.
    pub fn new(routing: &Arc<MsiRouting>, count: u16) -> Result<Msix, InterruptError> {
        let vectors = (0..count)
            .map(|_| routing.new_vector())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Msix {
            entries: vec![Entry::default(); usize::from(count)],
            pending: vec![false; usize::from(count)],
            vectors,
            enabled: false,
            function_masked: false,
        })
    }

    /// The capability bytes for a table at `table_offset` and PBA at
    /// `pba_offset` in BAR `bar`, and the writable mask of its first dword.
    pub fn capability(&self, bar: u8, table_offset: u32, pba_offset: u32) -> (Vec<u8>, Vec<u32>) {
        let control = (self.entries.len() as u16 - 1).to_le_bytes();
        let mut bytes = vec![CAP_ID_MSIX, 0, control[0], control[1]];
        bytes.extend_from_slice(&(table_offset | u32::from(bar)).to_le_bytes());
        bytes.extend_from_slice(&(pba_offset | u32::from(bar)).to_le_bytes());
        let writable = vec![
            u32::from(CONTROL_ENABLE | CONTROL_FUNCTION_MASK) << 16,
            0,
            0,
        ];
        (bytes, writable)
    }

    /// Each vector's irqfd, in vector order (for a device that signals
    /// them itself: crate::vfio).
    pub fn irqfds(&self) -> Vec<&vmm_sys_util::eventfd::EventFd> {
        self.vectors.iter().map(MsiVector::irqfd).collect()
    }

    /// Size in bytes of the table and of the pending-bit array.
    pub fn table_size(&self) -> u64 {
        self.entries.len() as u64 * ENTRY_SIZE
    }

    pub fn pba_size(&self) -> u64 {
        (self.entries.len() as u64).div_ceil(64) * 8
    }

    /// The guest wrote the capability's first dword (control in the top half).
    pub fn write_control(&mut self, dword: u32) {
        let control = (dword >> 16) as u16;
        self.enabled = control & CONTROL_ENABLE != 0;
        self.function_masked = control & CONTROL_FUNCTION_MASK != 0;
        for vector in 0..self.entries.len() {
            self.update(vector);
        }
    }

    /// The table and pending bits (for a snapshot).
    pub fn state(&self) -> MsixState {
        MsixState {
            entries: self
                .entries
                .iter()
                .map(|e| MsixEntryState {
                    address_lo: e.message.address_lo,
                    address_hi: e.message.address_hi,
                    data: e.message.data,
                    control: e.control,
                })
                .collect(),
            pending: self.pending.clone(),
        }
    }

    /// Puts a saved table and pending bits back, with the capability's
    /// first dword `control_dword`, and routes every vector in KVM.
    /// Nothing is delivered: on a VM being restored the vCPUs are not back
    /// yet (see [`deliver_pending`](Self::deliver_pending)).
    pub fn restore(&mut self, state: &MsixState, control_dword: u32) -> Result<(), String> {
        if state.entries.len() != self.entries.len() || state.pending.len() != self.pending.len() {
            return Err(format!(
                "{} MSI-X vectors and {} pending bits, this function has {} vectors",
                state.entries.len(),
                state.pending.len(),
                self.entries.len()
            ));
        }
        for (entry, saved) in self.entries.iter_mut().zip(&state.entries) {
            *entry = Entry {
                message: MsiMessage {
                    address_lo: saved.address_lo,
                    address_hi: saved.address_hi,
                    data: saved.data,
                },
                control: saved.control & VECTOR_MASKED,
            };
        }
        self.pending.copy_from_slice(&state.pending);
        let control = (control_dword >> 16) as u16;
        self.enabled = control & CONTROL_ENABLE != 0;
        self.function_masked = control & CONTROL_FUNCTION_MASK != 0;
        for vector in 0..self.entries.len() {
            self.route(vector)
                .map_err(|e| format!("MSI-X vector {vector}: {e}"))?;
        }
        Ok(())
    }

    /// Delivers every pending vector that is not masked.
    pub fn deliver_pending(&mut self) {
        for vector in 0..self.entries.len() {
            if !self.masked(vector) && std::mem::take(&mut self.pending[vector]) {
                self.vectors[vector].trigger();
            }
        }
    }

    /// Points `vector`'s KVM route at its message, or removes it while
    /// the vector is masked.
    fn route(&self, vector: usize) -> Result<(), InterruptError> {
        let message = (!self.masked(vector)).then_some(self.entries[vector].message);
        self.vectors[vector].set_message(message)
    }

    fn masked(&self, vector: usize) -> bool {
        !self.enabled || self.function_masked || self.entries[vector].control & VECTOR_MASKED != 0
    }

    /// Re-routes `vector` and delivers a pending interrupt it unmasked.
    fn update(&mut self, vector: usize) {
        if let Err(e) = self.route(vector) {
            tracing::error!("MSI-X vector {vector}: {e}");
        }
        if !self.masked(vector) && std::mem::take(&mut self.pending[vector]) {
            self.vectors[vector].trigger();
        }
    }

    /// Raises `vector`, or marks it pending while it is masked.
    pub fn trigger(&mut self, vector: u16) {
        let v = usize::from(vector);
        if v >= self.entries.len() {
            return;
        }
        if self.masked(v) {
            self.pending[v] = true;
        } else {
            self.vectors[v].trigger();
        }
    }

    pub fn read_table(&self, offset: u64, data: &mut [u8]) {
        let value = self.table_dword(offset);
        fill(data, offset, value);
    }

    fn table_dword(&self, offset: u64) -> u32 {
        let Some(entry) = self.entries.get((offset / ENTRY_SIZE) as usize) else {
            return 0;
        };
        match (offset % ENTRY_SIZE) / 4 {
            0 => entry.message.address_lo,
            1 => entry.message.address_hi,
            2 => entry.message.data,
            _ => entry.control,
        }
    }

    pub fn write_table(&mut self, offset: u64, data: &[u8]) {
        let vector = (offset / ENTRY_SIZE) as usize;
        if vector >= self.entries.len()
            || (data.len() != 4 && data.len() != 8)
            || !offset.is_multiple_of(4)
        {
            return;
        }
        // An 8-byte write covers two dwords.
        for (i, chunk) in data.chunks(4).enumerate() {
            let value = u32::from_le_bytes(chunk.try_into().unwrap_or([0; 4]));
            let entry = &mut self.entries[vector];
            match ((offset % ENTRY_SIZE) / 4) as usize + i {
                0 => entry.message.address_lo = value,
                1 => entry.message.address_hi = value,
                2 => entry.message.data = value,
                3 => entry.control = value & VECTOR_MASKED,
                _ => {}
            }
        }
        self.update(vector);
    }

    pub fn read_pba(&self, offset: u64, data: &mut [u8]) {
        let first = (offset / 8 * 64) as usize;
        let mut bits = 0u64;
        for (i, pending) in self.pending.iter().skip(first).take(64).enumerate() {
            bits |= u64::from(*pending) << i;
        }
        let dword = if offset % 8 >= 4 {
            (bits >> 32) as u32
        } else {
            bits as u32
        };
        fill(data, offset, dword);
    }
}

/// Copies the bytes of `dword` that an access at `offset` of `data.len()` sees.
fn fill(data: &mut [u8], offset: u64, dword: u32) {
    let bytes = dword.to_le_bytes();
    let start = (offset % 4) as usize;
    for (i, b) in data.iter_mut().enumerate() {
        *b = bytes.get(start + i).copied().unwrap_or(0);
    }
}
