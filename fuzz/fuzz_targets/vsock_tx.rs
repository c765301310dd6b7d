//! Fuzzes virtio-vsock's guest-to-host path: the packets of the tx queue
//! (header, payload, length checks) through the muxer's connection state
//! machine (requests, responses, data, credit, shutdown, reset) joined to
//! real host Unix sockets, and the packets it answers with. Layout and
//! checks: `devices::virtio::vsock::fuzzing::tx_packets`.
#![no_main]

use hakoniwa_fuzz::socket_dir;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // Failing to create host sockets is the host's problem, not a finding.
    let _ = devices::virtio::vsock::fuzzing::tx_packets(socket_dir(), input);
});
