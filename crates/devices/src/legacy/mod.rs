//! PC platform devices at their traditional I/O ports.

pub mod acpi_pm;
pub mod debug_exit;
pub mod i8042;
pub mod serial;

pub use acpi_pm::AcpiPm;
pub use debug_exit::DebugExit;
pub use i8042::I8042;
pub use serial::Serial;

use vm_superio::Trigger;
use vmm_sys_util::eventfd::EventFd;

/// COM1: base port and ISA interrupt.
pub const COM1_PORT: u16 = 0x3f8;
pub const COM1_IRQ: u32 = 4;
/// The i8042 keyboard controller's data..command ports (reset line only).
pub const I8042_PORT: u16 = 0x60;
pub const I8042_PORT_COUNT: u16 = 5;

/// An eventfd that raises an interrupt when written; registered with KVM
/// as an irqfd so device interrupts never need a vCPU to exit.
pub struct EventFdTrigger(pub EventFd);

impl Trigger for EventFdTrigger {
    type E = std::io::Error;

    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}
