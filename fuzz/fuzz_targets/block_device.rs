//! Fuzzes virtio-blk as a whole device, where `block_request` fuzzes one
//! request: one or two queues served by the device's own queue handlers
//! and threads engine over an in-memory disk, or either engine over an
//! image file with cache=none (O_DIRECT and the page cache under the
//! direct gate), fed corrupt rings (available index jumps and rewrites
//! between kicks, out-of-range heads, descriptor loops, chains into the
//! hole), kicks, completions, retries and drains in any order. Layout and
//! checks:
//! `devices::virtio::block::fuzzing::device`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // Failing to create eventfds or threads is the host's problem.
    let _ = devices::virtio::block::fuzzing::device(input);
});
