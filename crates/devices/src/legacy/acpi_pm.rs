//! Hardware-reduced ACPI power management: the sleep control, sleep status
//! and reset registers the FADT points at. Writing S5 with SLP_EN powers
//! off; writing the reset value reboots.

use crate::bus::BusDevice;
use crate::{ExitNotifier, PlatformExit};

/// First port of the block: sleep control, sleep status, reset.
pub const ACPI_PM_PORT: u16 = 0x600;
/// Number of ports in the block.
pub const ACPI_PM_PORT_COUNT: u16 = 3;
/// Offsets of the registers inside the block.
pub const SLEEP_CONTROL_OFFSET: u64 = 0;
pub const SLEEP_STATUS_OFFSET: u64 = 1;
pub const RESET_OFFSET: u64 = 2;
/// The value that resets the machine when written to the reset register.
pub const RESET_VALUE: u8 = 0x1;

const SLP_EN: u8 = 1 << 5;
const SLP_TYP_SHIFT: u8 = 2;
const SLP_TYP_MASK: u8 = 0x7;

/// The ACPI power-management register block.
pub struct AcpiPm {
    notify: ExitNotifier,
    /// The sleep type `\_S5_` tells the guest to use for soft-off.
    s5_sleep_type: u8,
}

impl AcpiPm {
    pub fn new(notify: ExitNotifier, s5_sleep_type: u8) -> Self {
        AcpiPm {
            notify,
            s5_sleep_type,
        }
    }
}

impl BusDevice for AcpiPm {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        // Sleep status reads as zero: no wake event is ever pending.
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else { return };
        match offset {
            SLEEP_CONTROL_OFFSET => {
                let sleep_type = (value >> SLP_TYP_SHIFT) & SLP_TYP_MASK;
                if value & SLP_EN != 0 && sleep_type == self.s5_sleep_type {
                    (self.notify)(PlatformExit::PowerOff);
                }
            }
            RESET_OFFSET if value == RESET_VALUE => (self.notify)(PlatformExit::Reboot),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn device() -> (AcpiPm, Arc<Mutex<Vec<PlatformExit>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        (
            AcpiPm::new(Arc::new(move |e| sink.lock().unwrap().push(e)), 5),
            seen,
        )
    }

    #[test]
    fn s5_with_sleep_enable_powers_off() {
        let (mut pm, seen) = device();
        // What Linux writes: SLP_TYP=5 at bits 2..4, SLP_EN at bit 5.
        pm.write(SLEEP_CONTROL_OFFSET, &[(5 << 2) | (1 << 5)]);
        assert_eq!(*seen.lock().unwrap(), vec![PlatformExit::PowerOff]);
    }

    #[test]
    fn other_sleep_states_and_missing_enable_do_nothing() {
        let (mut pm, seen) = device();
        pm.write(SLEEP_CONTROL_OFFSET, &[5 << 2]); // no SLP_EN
        pm.write(SLEEP_CONTROL_OFFSET, &[(3 << 2) | (1 << 5)]); // S3
        pm.write(SLEEP_STATUS_OFFSET, &[0xff]);
        pm.write(RESET_OFFSET, &[0x2]);
        assert!(seen.lock().unwrap().is_empty());
    }

    #[test]
    fn reset_value_reboots() {
        let (mut pm, seen) = device();
        pm.write(RESET_OFFSET, &[RESET_VALUE]);
        assert_eq!(*seen.lock().unwrap(), vec![PlatformExit::Reboot]);
    }
}
