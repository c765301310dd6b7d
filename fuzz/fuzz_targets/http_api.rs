//! Fuzzes the control API's HTTP server: request framing (heads, limits,
//! Content-Length, Expect, pipelining), routing and every endpoint's body
//! parser, on one connection; the answers must be well-framed HTTP.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let _ = api::server::fuzzing::serve(input);
});
