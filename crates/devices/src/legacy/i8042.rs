//! The i8042 keyboard controller, reduced to its CPU-reset line: the
//! fallback reboot method of Linux (`reboot=k`). vm-superio emulates it.

use vm_superio::Trigger;

use crate::bus::BusDevice;
use crate::{ExitNotifier, PlatformExit};

/// Turns the controller's reset line into a reboot request.
pub struct ResetLine(ExitNotifier);

impl Trigger for ResetLine {
    type E = std::convert::Infallible;

    fn trigger(&self) -> Result<(), Self::E> {
        (self.0)(PlatformExit::Reboot);
        Ok(())
    }
}

/// The i8042 at ports 0x60..0x64.
pub struct I8042 {
    inner: vm_superio::I8042Device<ResetLine>,
}

impl I8042 {
    pub fn new(notify: ExitNotifier) -> Self {
        I8042 {
            inner: vm_superio::I8042Device::new(ResetLine(notify)),
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let value = u8::try_from(offset)
            .map(|o| self.inner.read(o))
            .unwrap_or(0);
        data.fill(value);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&value), Ok(reg)) = (data.first(), u8::try_from(offset)) {
            // ResetLine cannot fail.
            let _ = self.inner.write(reg, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording_notifier;

    #[test]
    fn reset_command_requests_a_reboot() {
        let (notify, seen) = recording_notifier();
        let mut dev = I8042::new(notify);
        dev.write(0, &[0xfe]); // data port: ignored
        assert!(seen.lock().unwrap().is_empty());
        dev.write(4, &[0xfe]); // command port: pulse reset
        assert_eq!(*seen.lock().unwrap(), vec![PlatformExit::Reboot]);
    }
}
