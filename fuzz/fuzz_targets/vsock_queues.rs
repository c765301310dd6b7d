//! Fuzzes virtio-vsock as a whole device: its worker's rx, tx and event
//! queues with corrupt rings over a small guest memory with a hole, the
//! guest's packets in them, and a host program and service on real Unix
//! sockets, in any order of kicks and host events; a restored device's
//! transport reset too. Layout and checks:
//! `devices::virtio::vsock::fuzzing::queues`.
#![no_main]

use hakoniwa_fuzz::socket_dir;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // Failing to create host sockets or eventfds is the host's problem.
    let _ = devices::virtio::vsock::fuzzing::queues(socket_dir(), input);
});
