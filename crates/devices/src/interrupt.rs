//! Message-signalled interrupts through KVM: each MSI-X vector is a GSI
//! with an MSI route (address/data the guest programmed) and an irqfd, so a
//! device thread raises it by writing an eventfd.
//!
//! `KVM_SET_GSI_ROUTING` replaces the whole routing table, so every commit
//! re-states the default IOAPIC/PIC routes for GSIs 0–23 along with the MSI
//! routes; forgetting them would cut off the serial port and the timer.
//!
//! A passed-through function's INTx is a level-triggered IOAPIC line
//! ([`IntxLine`]): one of GSIs 16–23, whose IOAPIC route is among those
//! defaults, with an irqfd registered with a resample eventfd.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    kvm_irq_routing_entry, kvm_irq_routing_entry__bindgen_ty_1, kvm_irq_routing_irqchip,
    kvm_irq_routing_msi, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// GSIs wired to IOAPIC pins; MSI GSIs are allocated above them.
pub const IOAPIC_PINS: u32 = 24;

/// The IOAPIC pins PCI INTx lines use: those above the 16 ISA IRQs, as on
/// a PC (q35's PIRQs go there too). Nothing else hakoniwa routes is there:
/// COM1 is GSI 4, the PIT 0/2, and the i8042 has no interrupt. The guest
/// finds them through the DSDT's `_PRT` (arch::acpi), which makes them
/// level-triggered, active-low.
pub const PCI_INTX_GSIS: Range<u32> = 16..IOAPIC_PINS;

/// The GSI of the `index`th INTx line: the eight pins in turn, shared
/// beyond the eighth (PCI INTx is level-triggered and shareable, and
/// KVM's resampler serves every irqfd of a GSI).
pub fn intx_gsi(index: u32) -> u32 {
    PCI_INTX_GSIS.start + index % PCI_INTX_GSIS.len() as u32
}

/// An MSI message as the guest programs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiMessage {
    pub address_lo: u32,
    pub address_hi: u32,
    pub data: u32,
}

/// The VM's interrupt routing: default pin routes plus MSI routes.
pub struct MsiRouting {
    vm: Arc<VmFd>,
    state: Mutex<RoutingState>,
}

struct RoutingState {
    next_gsi: u32,
    /// INTx lines handed out so far.
    intx_lines: u32,
    routes: BTreeMap<u32, MsiMessage>,
}

/// Errors from KVM while routing interrupts.
#[derive(Debug, thiserror::Error)]
pub enum InterruptError {
    #[error("KVM_SET_GSI_ROUTING failed: {0}")]
    Routing(kvm_ioctls::Error),
    #[error("KVM_IRQFD failed: {0}")]
    Irqfd(kvm_ioctls::Error),
    #[error("cannot create an interrupt eventfd: {0}")]
    EventFd(std::io::Error),
    #[error("too many interrupt routes")]
    TooManyRoutes,
}

impl MsiRouting {
    pub fn new(vm: Arc<VmFd>) -> Arc<Self> {
        Arc::new(MsiRouting {
            vm,
            state: Mutex::new(RoutingState {
                next_gsi: IOAPIC_PINS,
                intx_lines: 0,
                routes: BTreeMap::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RoutingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new vector: a fresh GSI with an irqfd registered on it. It delivers
    /// nothing until [`MsiRouting::set_route`] gives it a message.
    pub fn new_vector(self: &Arc<Self>) -> Result<MsiVector, InterruptError> {
        let gsi = {
            let mut state = self.lock();
            let gsi = state.next_gsi;
            state.next_gsi = gsi.checked_add(1).ok_or(InterruptError::TooManyRoutes)?;
            gsi
        };
        let irqfd = EventFd::new(EFD_NONBLOCK).map_err(InterruptError::EventFd)?;
        self.vm
            .register_irqfd(&irqfd, gsi)
            .map_err(InterruptError::Irqfd)?;
        Ok(MsiVector {
            gsi,
            irqfd,
            routing: self.clone(),
        })
    }

    /// A new INTx line on one of [`PCI_INTX_GSIS`], not yet connected.
    /// Its IOAPIC route is one of the defaults every commit re-states, so
    /// nothing in the routing table changes.
    pub fn new_intx_line(&self) -> Result<IntxLine, InterruptError> {
        let gsi = {
            let mut state = self.lock();
            let gsi = intx_gsi(state.intx_lines);
            state.intx_lines += 1;
            gsi
        };
        Ok(IntxLine {
            gsi,
            trigger: EventFd::new(EFD_NONBLOCK).map_err(InterruptError::EventFd)?,
            resample: EventFd::new(EFD_NONBLOCK).map_err(InterruptError::EventFd)?,
            vm: self.vm.clone(),
            connected: false,
        })
    }

    /// Points `gsi` at `message` (or removes its route) and commits.
    pub fn set_route(&self, gsi: u32, message: Option<MsiMessage>) -> Result<(), InterruptError> {
        let mut state = self.lock();
        match message {
            Some(m) => state.routes.insert(gsi, m),
            None => state.routes.remove(&gsi),
        };
        let entries = routing_table(&state.routes);
        let table =
            KvmIrqRouting::from_entries(&entries).map_err(|_| InterruptError::TooManyRoutes)?;
        self.vm
            .set_gsi_routing(&table)
            .map_err(InterruptError::Routing)
    }
}

/// The full table: KVM's defaults for the pins, then the MSI routes.
fn routing_table(routes: &BTreeMap<u32, MsiMessage>) -> Vec<kvm_irq_routing_entry> {
    let irqchip = |gsi: u32, chip: u32, pin: u32| kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_IRQCHIP,
        u: kvm_irq_routing_entry__bindgen_ty_1 {
            irqchip: kvm_irq_routing_irqchip { irqchip: chip, pin },
        },
        ..Default::default()
    };
    let mut entries = Vec::new();
    for gsi in 0..IOAPIC_PINS {
        if gsi < 8 {
            entries.push(irqchip(gsi, KVM_IRQCHIP_PIC_MASTER, gsi));
        } else if gsi < 16 {
            entries.push(irqchip(gsi, KVM_IRQCHIP_PIC_SLAVE, gsi - 8));
        }
        entries.push(irqchip(gsi, KVM_IRQCHIP_IOAPIC, gsi));
    }
    for (&gsi, m) in routes {
        entries.push(kvm_irq_routing_entry {
            gsi,
            type_: KVM_IRQ_ROUTING_MSI,
            u: kvm_irq_routing_entry__bindgen_ty_1 {
                msi: kvm_irq_routing_msi {
                    address_lo: m.address_lo,
                    address_hi: m.address_hi,
                    data: m.data,
                    ..Default::default()
                },
            },
            ..Default::default()
        });
    }
    entries
}

/// One MSI vector: writing its irqfd injects the interrupt in KVM.
pub struct MsiVector {
    pub gsi: u32,
    irqfd: EventFd,
    routing: Arc<MsiRouting>,
}

impl MsiVector {
    /// Routes the vector to `message`, or stops delivering it.
    pub fn set_message(&self, message: Option<MsiMessage>) -> Result<(), InterruptError> {
        self.routing.set_route(self.gsi, message)
    }

    /// The eventfd KVM injects the interrupt from: a passed-through
    /// device signals it directly (crate::vfio), with no VMM thread between.
    pub fn irqfd(&self) -> &EventFd {
        &self.irqfd
    }

    /// Injects the interrupt.
    pub fn trigger(&self) {
        // Fails only if the counter would overflow: the interrupt is pending anyway.
        let _ = self.irqfd.write(1);
    }
}

/// A level-triggered IOAPIC line for a passed-through function's INTx.
/// While connected, a write to `trigger` asserts the line (KVM's irqfd);
/// when the guest EOIs it, KVM deasserts it and signals `resample`, which
/// VFIO takes as its unmask eventfd: the host unmasks the device's INTx,
/// which fires again if the device still asserts it. No VMM thread is in
/// the path (QEMU's KVM bypass for vfio-pci INTx).
pub struct IntxLine {
    pub gsi: u32,
    trigger: EventFd,
    resample: EventFd,
    vm: Arc<VmFd>,
    connected: bool,
}

impl IntxLine {
    /// What VFIO signals when the device asserts INTx.
    pub fn trigger(&self) -> &EventFd {
        &self.trigger
    }

    /// What KVM signals when the guest EOIs the line.
    pub fn resample(&self) -> &EventFd {
        &self.resample
    }

    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Registers the trigger as an irqfd with resample on the line. A
    /// trigger already pending is delivered at once (KVM polls it).
    pub fn connect(&mut self) -> Result<(), InterruptError> {
        if !self.connected {
            self.vm
                .register_irqfd_with_resample(&self.trigger, &self.resample, self.gsi)
                .map_err(InterruptError::Irqfd)?;
            self.connected = true;
        }
        Ok(())
    }

    /// Unregisters the irqfd, which deasserts the line if it was asserted
    /// (KVM's resampler lets its source go).
    pub fn disconnect(&mut self) -> Result<(), InterruptError> {
        if self.connected {
            self.vm
                .unregister_irqfd(&self.trigger, self.gsi)
                .map_err(InterruptError::Irqfd)?;
            self.connected = false;
        }
        Ok(())
    }

    /// Forgets triggers and resamples nobody will act on (after VFIO let
    /// the eventfds go), so connecting again injects no stale interrupt.
    pub fn drain(&self) {
        // Nonblocking: EAGAIN when nothing is pending, which is the goal.
        let _ = self.trigger.read();
        let _ = self.resample.read();
    }
}

impl Drop for IntxLine {
    fn drop(&mut self) {
        let _ = self.disconnect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_restates_the_pin_routes_before_msi_routes() {
        let mut routes = BTreeMap::new();
        routes.insert(
            24,
            MsiMessage {
                address_lo: 0xfee0_0000,
                address_hi: 0,
                data: 0x41,
            },
        );
        let table = routing_table(&routes);
        // 16 PIC routes + 24 IOAPIC routes + 1 MSI route.
        assert_eq!(table.len(), 16 + 24 + 1);
        let serial: Vec<_> = table.iter().filter(|e| e.gsi == 4).collect();
        assert_eq!(serial.len(), 2, "GSI 4 goes to the PIC and the IOAPIC");
        let msi = table.last().unwrap();
        assert_eq!((msi.gsi, msi.type_), (24, KVM_IRQ_ROUTING_MSI));
        // SAFETY: the entry was built with its `msi` variant.
        let m = unsafe { msi.u.msi };
        assert_eq!((m.address_lo, m.data), (0xfee0_0000, 0x41));
    }

    #[test]
    fn intx_lines_take_the_pci_pins_in_turn_and_keep_their_ioapic_route() {
        let gsis: Vec<u32> = (0..10).map(intx_gsi).collect();
        assert_eq!(gsis, vec![16, 17, 18, 19, 20, 21, 22, 23, 16, 17]);
        let table = routing_table(&BTreeMap::new());
        for gsi in PCI_INTX_GSIS {
            // Not an ISA IRQ (COM1's 4, the timer's 0 and 2 stay alone).
            assert!((16..IOAPIC_PINS).contains(&gsi));
            let routes: Vec<_> = table.iter().filter(|e| e.gsi == gsi).collect();
            assert_eq!(routes.len(), 1, "GSI {gsi}: IOAPIC only, no PIC");
            assert_eq!(routes[0].type_, KVM_IRQ_ROUTING_IRQCHIP);
            // SAFETY: the entry was built with its `irqchip` variant.
            let chip = unsafe { routes[0].u.irqchip };
            assert_eq!((chip.irqchip, chip.pin), (KVM_IRQCHIP_IOAPIC, gsi));
        }
    }
}
