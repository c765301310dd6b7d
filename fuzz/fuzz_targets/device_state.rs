//! Fuzzes device-state restore: the JSON a snapshot file's metadata or a
//! migration stream carries for one virtio device, parsed and restored
//! into a real device (rng, balloon, keyboard, tablet, net, block), with or
//! without the queues of an active driver at any saved positions; a state
//! taken must resume, serve, pause and save a state a new device takes.
//! Layout and checks: `devices::virtio::state::fuzzing::restore`.
#![no_main]

use devices::virtio::state::fuzzing::{restore, PREFIX_LEN};
use devices::virtio::DeviceState;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let (prefix, json) = input.split_at(input.len().min(PREFIX_LEN));
    // What serde refuses never reaches a device.
    let Ok(state) = serde_json::from_slice::<DeviceState>(json) else {
        return;
    };
    // Failing to create eventfds or threads is the host's problem.
    let _ = restore(prefix, &state);
});
