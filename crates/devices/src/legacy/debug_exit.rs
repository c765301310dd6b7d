//! The debug-exit port: a byte written here ends the VM, and the byte
//! becomes hakoniwa's exit status.
//!
//! It sits where QEMU's `isa-debug-exit,iobase=0x501,iosize=1` does, so the
//! same guest image also ends a QEMU VM (QEMU exits with `(byte << 1) | 1`).

use crate::bus::BusDevice;
use crate::{ExitNotifier, PlatformExit};

/// The port the guest writes its exit status to.
pub const DEBUG_EXIT_PORT: u16 = 0x501;

/// The debug-exit device.
pub struct DebugExit {
    notify: ExitNotifier,
}

impl DebugExit {
    pub fn new(notify: ExitNotifier) -> Self {
        DebugExit { notify }
    }
}

impl BusDevice for DebugExit {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        if let Some(&status) = data.first() {
            (self.notify)(PlatformExit::DebugExit(status));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording_notifier;

    #[test]
    fn a_written_byte_becomes_the_exit_status() {
        let (notify, seen) = recording_notifier();
        let mut dev = DebugExit::new(notify);
        dev.write(0, &[42]);
        dev.write(0, &[]);
        assert_eq!(*seen.lock().unwrap(), vec![PlatformExit::DebugExit(42)]);
    }
}
