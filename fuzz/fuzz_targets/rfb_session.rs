//! Fuzzes a VNC client's RFB session on the server: every handshake phase
//! (ProtocolVersion, security type, VNC Authentication, ClientInit) and
//! every client message, with and without a password, with the input
//! split into reads at arbitrary places. The layout of the input and
//! what must hold are in `display::vnc::fuzzing::rfb_session`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let _ = display::vnc::fuzzing::rfb_session(input);
});
