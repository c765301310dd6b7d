//! Fuzzes device-state restore with states built field by field rather
//! than parsed from JSON: a real device's saved state with any of its
//! fields replaced (`devices::virtio::state::fuzzing::state_from_fields`),
//! so inputs get past serde to the device's own checks. Restored as the
//! `device_state` target does, with the same checks.
#![no_main]

use devices::virtio::state::fuzzing::{restore, state_from_fields, PREFIX_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let (prefix, fields) = input.split_at(input.len().min(PREFIX_LEN));
    let kind = usize::from(prefix.first().copied().unwrap_or(0));
    // Failing to create eventfds or threads is the host's problem.
    let Ok(state) = state_from_fields(kind, fields) else {
        return;
    };
    let _ = restore(prefix, &state);
});
