//! Fuzzes the VNC server's WebSocket front: the HTTP upgrade request
//! (Origin check, subprotocol) and then RFC 6455 framing (masking,
//! fragments, control frames, lengths), as a browser peer sends them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // Loopback socket setup failing is the host's problem, not a finding.
    let _ = display::vnc::fuzzing::websocket_stream(input);
});
