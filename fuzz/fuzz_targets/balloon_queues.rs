//! Fuzzes virtio-balloon's worker: the guest's inflate and deflate
//! queues (arrays of page frame numbers of any length, inside, across and
//! outside guest memory, which inflating discards) and its statistics
//! queue (held buffers, returned when the host asks), with corrupt rings,
//! over a small guest memory with a hole. Layout and checks:
//! `devices::virtio::balloon::fuzzing::queues`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // Failing to create eventfds is the host's problem.
    let _ = devices::virtio::balloon::fuzzing::queues(input);
});
