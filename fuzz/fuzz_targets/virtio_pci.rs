//! Fuzzes the virtio-pci transport as a driver reaches it: accesses to
//! the function's BAR (common configuration with its status state machine
//! and queue setup, ISR, device configuration, notifications, MSI-X table
//! and PBA) and PCI configuration space at any offset and size, guest
//! memory writes (rings, buffers), snapshots in between and restores of
//! the function's saved state, changed field by field, into a new
//! function, against a real rng or balloon that serves its queues once
//! the driver sets DRIVER_OK.
//! Needs /dev/kvm (ioeventfds and MSI routes): `scripts/fuzz` skips it
//! where KVM is not usable. Layout and checks:
//! `devices::virtio::pci::fuzzing::accesses`.
#![no_main]

use std::sync::Mutex;

use devices::virtio::pci::fuzzing::{accesses, Host};
use libfuzzer_sys::fuzz_target;

/// The VM functions are created on, replaced when used up.
static HOST: Mutex<Option<Host>> = Mutex::new(None);

fuzz_target!(|input: &[u8]| {
    let mut host = HOST.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..2 {
        if host.is_none() {
            *host = Some(Host::new().expect("a KVM VM (is /dev/kvm usable?)"));
        }
        match accesses(host.as_mut().unwrap(), input) {
            // Failing to create eventfds or routes is the host's problem.
            Some(_) => return,
            None => *host = None,
        }
    }
    panic!("a new VM cannot take a function");
});
