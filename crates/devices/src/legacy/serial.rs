//! The 16550A UART at COM1: the guest console.
//!
//! Register emulation is vm-superio's; this file connects it to the bus,
//! to an interrupt eventfd (an irqfd in KVM) and to whoever feeds input.

use std::io::Write;

use vm_superio::serial::SerialEvents;
pub use vm_superio::serial::SerialState;
use vmm_sys_util::eventfd::EventFd;

use super::EventFdTrigger;
use crate::bus::BusDevice;

/// Signals the input feeder when the guest has drained the receive FIFO,
/// so it can push the next bytes without polling.
pub struct InputSpace(pub EventFd);

impl SerialEvents for InputSpace {
    fn buffer_read(&self) {}
    fn out_byte(&self) {}
    fn tx_lost_byte(&self) {}
    fn in_buffer_empty(&self) {
        // An eventfd write only fails when its counter would overflow, in
        // which case the feeder is already due to wake up.
        let _ = self.0.write(1);
    }
}

type Uart = vm_superio::Serial<EventFdTrigger, InputSpace, Box<dyn Write + Send>>;

/// COM1 on the port-I/O bus.
pub struct Serial {
    uart: Uart,
}

impl Serial {
    /// A UART that raises `interrupt` and writes the guest's output to `out`;
    /// `input_space` is signalled when the guest empties its input FIFO.
    pub fn new(interrupt: EventFd, input_space: EventFd, out: Box<dyn Write + Send>) -> Self {
        Serial {
            uart: vm_superio::Serial::with_events(
                EventFdTrigger(interrupt),
                InputSpace(input_space),
                out,
            ),
        }
    }

    /// Queues bytes typed by the user; returns how many fit in the FIFO.
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        // The only error is a failed interrupt trigger; the bytes are queued
        // either way and the guest will see them on its next poll.
        self.uart.enqueue_raw_bytes(bytes).unwrap_or(0)
    }

    /// How many more input bytes the FIFO accepts now.
    pub fn input_capacity(&self) -> usize {
        self.uart.fifo_capacity()
    }

    /// The UART's registers and receive FIFO, for a snapshot.
    pub fn state(&self) -> SerialState {
        self.uart.state()
    }

    /// Puts the UART in `state` (from [`Serial::state`]), keeping its
    /// interrupt, input-space eventfd and output; raises the interrupt if
    /// the restored registers say one is pending.
    pub fn restore(&mut self, state: &SerialState) -> Result<(), String> {
        let interrupt = self
            .uart
            .interrupt_evt()
            .0
            .try_clone()
            .map_err(|e| e.to_string())?;
        let input_space = self
            .uart
            .events()
            .0
            .try_clone()
            .map_err(|e| e.to_string())?;
        let out = std::mem::replace(self.uart.writer_mut(), Box::new(std::io::sink()));
        self.uart = vm_superio::Serial::from_state(
            state,
            EventFdTrigger(interrupt),
            InputSpace(input_space),
            out,
        )
        .map_err(|e| format!("{e:?}"))?;
        Ok(())
    }

    /// Raises the interrupt again if the registers say one is pending
    /// (transmitter empty or data ready, and enabled). `restore` raises it
    /// too, but a restore runs before the vCPUs exist, when an edge on the
    /// IOAPIC finds no CPU and is dropped: call this once every vCPU's
    /// state is back, or a guest paused mid-output waits for the
    /// transmitter interrupt for ever and its console stops.
    pub fn raise_pending_interrupt(&self) -> Result<(), String> {
        const IER_RDA: u8 = 0x01;
        const IER_THR: u8 = 0x02;
        const IIR_THR: u8 = 0x02;
        const IIR_RDA: u8 = 0x04;
        let state = self.uart.state();
        let (ier, iir) = (state.interrupt_enable, state.interrupt_identification);
        let pending = (ier & IER_THR != 0 && iir & IIR_THR != 0)
            || (ier & IER_RDA != 0 && iir & IIR_RDA != 0);
        if pending {
            self.uart
                .interrupt_evt()
                .0
                .write(1)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl BusDevice for Serial {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if let (Some(first), Ok(reg)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.uart.read(reg);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&value), Ok(reg)) = (data.first(), u8::try_from(offset)) {
            if let Err(e) = self.uart.write(reg, value) {
                tracing::warn!("serial: {e:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn serial() -> (Serial, EventFd, EventFd, Sink) {
        let irq = EventFd::new(libc_nonblock()).unwrap();
        let space = EventFd::new(libc_nonblock()).unwrap();
        let sink = Sink::default();
        let serial = Serial::new(
            irq.try_clone().unwrap(),
            space.try_clone().unwrap(),
            Box::new(sink.clone()),
        );
        (serial, irq, space, sink)
    }

    fn libc_nonblock() -> i32 {
        vmm_sys_util::eventfd::EFD_NONBLOCK
    }

    #[test]
    fn guest_output_reaches_the_writer() {
        let (mut serial, _, _, sink) = serial();
        for b in b"hi\n" {
            serial.write(0, &[*b]);
        }
        assert_eq!(sink.0.lock().unwrap().as_slice(), b"hi\n");
    }

    #[test]
    fn input_raises_an_interrupt_and_is_read_back() {
        let (mut serial, irq, space, _) = serial();
        serial.write(1, &[0x01]); // IER: received-data interrupt on
        assert_eq!(serial.enqueue_input(b"ab"), 2);
        assert_eq!(irq.read().unwrap(), 1);
        let mut byte = [0u8];
        serial.read(0, &mut byte);
        assert_eq!(byte, [b'a']);
        serial.read(0, &mut byte);
        assert_eq!(byte, [b'b']);
        // The FIFO is empty again: the feeder is told.
        assert_eq!(space.read().unwrap(), 1);
    }

    #[test]
    fn a_full_fifo_takes_only_what_fits() {
        let (mut serial, _, _, _) = serial();
        let capacity = serial.input_capacity();
        let taken = serial.enqueue_input(&vec![b'x'; capacity + 10]);
        assert_eq!(taken, capacity);
        assert_eq!(serial.input_capacity(), 0);
    }

    #[test]
    fn state_round_trips_and_output_still_works() {
        let (mut first, _, _, sink) = serial();
        first.write(3, &[0x03]); // LCR: 8 data bits
        first.write(7, &[0x5a]); // scratch
        first.enqueue_input(b"q");
        let state = first.state();
        let (mut other, _, _, other_sink) = serial();
        other.restore(&state).unwrap();
        assert_eq!(other.state(), state);
        let mut byte = [0u8];
        other.read(0, &mut byte);
        assert_eq!(byte, [b'q']);
        other.write(0, b"z");
        assert_eq!(other_sink.0.lock().unwrap().as_slice(), b"z");
        assert!(sink.0.lock().unwrap().is_empty());
    }

    #[test]
    fn a_pending_transmitter_interrupt_is_raised_again_after_a_restore() {
        let (mut first, _, _, _) = serial();
        first.write(1, &[0x02]); // IER: transmitter-empty interrupt on
        first.write(0, b"x"); // the guest sends; THRE is pending now
        let state = first.state();
        let (mut restored, irq, _, _) = serial();
        restored.restore(&state).unwrap();
        // The restore's own edge may find no CPU yet: it is raised again.
        let _ = irq.read();
        restored.raise_pending_interrupt().unwrap();
        assert_eq!(irq.read().unwrap(), 1);
        // Nothing pending (the guest read IIR): nothing raised.
        let mut iir = [0u8];
        restored.read(2, &mut iir);
        restored.raise_pending_interrupt().unwrap();
        assert!(irq.read().is_err(), "an interrupt with nothing pending");
    }

    #[test]
    fn wide_or_odd_accesses_do_not_panic() {
        let (mut serial, _, _, _) = serial();
        serial.write(0x1_0000, &[1]);
        serial.write(0, &[]);
        let mut empty: [u8; 0] = [];
        serial.read(0, &mut empty);
    }
}
