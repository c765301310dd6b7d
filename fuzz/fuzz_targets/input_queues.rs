//! Fuzzes virtio-input: the guest's event queue (buffers too small,
//! read-only, outside memory) as host key and pointer events arrive, its
//! status queue (LED events of any type and code), and the driver's
//! `select`/`subsel` configuration queries at any offset and length, with
//! corrupt rings, over a small guest memory with a hole. Layout and
//! checks: `devices::virtio::input::fuzzing::queues`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // Failing to create eventfds is the host's problem.
    let _ = devices::virtio::input::fuzzing::queues(input);
});
