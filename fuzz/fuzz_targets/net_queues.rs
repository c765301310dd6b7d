//! Fuzzes virtio-net's worker: a guest's rx and tx queues (available
//! index jumps, heads and descriptors anywhere, chains with loops, holes,
//! writable tx buffers and read-only rx buffers) over a small guest
//! memory with a hole, the tx chains sent and the host's frames (any
//! length, oversized too) delivered, with and without mergeable rx
//! buffers and EVENT_IDX. A datagram socket pair stands in for the TAP.
//! Layout and checks: `devices::virtio::net::fuzzing::queues`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // Failing to create the socket pair is the host's problem.
    let _ = devices::virtio::net::fuzzing::queues(input);
});
