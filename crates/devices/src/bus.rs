//! Address buses that route a vCPU's port I/O or MMIO exit to the device
//! that owns the address.
//!
//! The map sits behind a lock because PCI devices move when the guest
//! reprograms their BARs; lookups take the read side only.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

/// A device on a bus. Offsets are relative to the device's base address.
pub trait BusDevice: Send {
    /// The guest reads `data.len()` bytes at `offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// The guest writes `data` at `offset`.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// A device shared between the bus and whoever else drives it (e.g. the
/// console thread feeding the serial port).
pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// Errors while placing a device on a bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("bus range {base:#x}+{len:#x} is empty or wraps around")]
    InvalidRange { base: u64, len: u64 },
    #[error("bus range {base:#x}+{len:#x} overlaps a device already at {other:#x}")]
    Overlap { base: u64, len: u64, other: u64 },
    #[error("no device at {0:#x}")]
    NotFound(u64),
}

struct Range {
    len: u64,
    device: SharedDevice,
}

/// A sorted set of non-overlapping address ranges, each owned by one device.
#[derive(Default)]
pub struct Bus {
    ranges: RwLock<BTreeMap<u64, Range>>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Places `device` at `[base, base + len)`.
    pub fn insert(&self, device: SharedDevice, base: u64, len: u64) -> Result<(), BusError> {
        if len == 0 || base.checked_add(len).is_none() {
            return Err(BusError::InvalidRange { base, len });
        }
        let mut ranges = self.ranges.write().unwrap_or_else(|e| e.into_inner());
        // The nearest range at or below the new end is the only one that can overlap.
        if let Some((&other, range)) = ranges.range(..base + len).next_back() {
            if other + range.len > base {
                return Err(BusError::Overlap { base, len, other });
            }
        }
        ranges.insert(base, Range { len, device });
        Ok(())
    }

    /// Moves the device at `old_base` to `new_base`, keeping its length.
    pub fn relocate(&self, old_base: u64, new_base: u64) -> Result<(), BusError> {
        let range = {
            let mut ranges = self.ranges.write().unwrap_or_else(|e| e.into_inner());
            ranges
                .remove(&old_base)
                .ok_or(BusError::NotFound(old_base))?
        };
        let (device, len) = (range.device.clone(), range.len);
        self.insert(device, new_base, len).inspect_err(|_| {
            // Put it back where it was rather than lose it.
            let mut ranges = self.ranges.write().unwrap_or_else(|e| e.into_inner());
            ranges.insert(old_base, range);
        })
    }

    /// The device owning `addr` and the offset of `addr` inside it.
    fn resolve(&self, addr: u64) -> Option<(SharedDevice, u64)> {
        let ranges = self.ranges.read().unwrap_or_else(|e| e.into_inner());
        let (&base, range) = ranges.range(..=addr).next_back()?;
        (addr - base < range.len).then(|| (range.device.clone(), addr - base))
    }

    /// Reads from the device at `addr`; false if no device is there.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.resolve(addr) {
            Some((device, offset)) => {
                device
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Writes to the device at `addr`; false if no device is there.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.resolve(addr) {
            Some((device, offset)) => {
                device
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .write(offset, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        writes: Vec<(u64, Vec<u8>)>,
    }

    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.writes.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn accesses_reach_the_owner_with_relative_offsets() {
        let bus = Bus::new();
        let dev = Arc::new(Mutex::new(Recorder::default()));
        bus.insert(dev.clone(), 0x3f8, 8).unwrap();
        assert!(bus.write(0x3fb, &[0x80]));
        let mut data = [0u8; 1];
        assert!(bus.read(0x3fd, &mut data));
        assert_eq!(data, [5]);
        assert_eq!(dev.lock().unwrap().writes, vec![(3, vec![0x80])]);
    }

    #[test]
    fn addresses_outside_every_range_are_unclaimed() {
        let bus = Bus::new();
        bus.insert(Arc::new(Mutex::new(Recorder::default())), 0x3f8, 8)
            .unwrap();
        let mut data = [0u8; 1];
        assert!(!bus.read(0x3f7, &mut data));
        assert!(!bus.read(0x400, &mut data));
        assert!(!bus.write(0x0, &[1]));
    }

    #[test]
    fn overlapping_and_empty_ranges_are_refused() {
        let bus = Bus::new();
        bus.insert(Arc::new(Mutex::new(Recorder::default())), 0x100, 0x10)
            .unwrap();
        let dev = || Arc::new(Mutex::new(Recorder::default()));
        assert!(matches!(
            bus.insert(dev(), 0x10f, 1),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(dev(), 0xf8, 0x10),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(dev(), 0x0, 0x1000),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(dev(), 0x200, 0),
            Err(BusError::InvalidRange { .. })
        ));
        assert!(matches!(
            bus.insert(dev(), u64::MAX, 2),
            Err(BusError::InvalidRange { .. })
        ));
        // Adjacent ranges are fine.
        bus.insert(dev(), 0x110, 0x10).unwrap();
        bus.insert(dev(), 0xf0, 0x10).unwrap();
    }

    #[test]
    fn relocation_moves_the_device_or_leaves_it_in_place() {
        let bus = Bus::new();
        let dev = Arc::new(Mutex::new(Recorder::default()));
        bus.insert(dev.clone(), 0x1000, 0x100).unwrap();
        bus.insert(Arc::new(Mutex::new(Recorder::default())), 0x3000, 0x100)
            .unwrap();
        bus.relocate(0x1000, 0x2000).unwrap();
        assert!(!bus.write(0x1000, &[1]));
        assert!(bus.write(0x2004, &[1]));
        assert_eq!(dev.lock().unwrap().writes, vec![(4, vec![1])]);
        // Onto another device: refused, and the device stays.
        assert!(matches!(
            bus.relocate(0x2000, 0x3000),
            Err(BusError::Overlap { .. })
        ));
        assert!(bus.write(0x2000, &[2]));
        assert_eq!(
            bus.relocate(0x9000, 0xa000),
            Err(BusError::NotFound(0x9000))
        );
    }
}
