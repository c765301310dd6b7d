//! Fuzzes the destination of a live migration: the message stream a
//! source (or anyone who reaches `--incoming`) sends, placed into a small
//! guest memory of two regions with a hole between them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vm_memory::GuestAddress;

use vmm::memory::GuestMemoryMmap;
use vmm::migration::destination::fuzzing::precopy_stream;

/// Guest RAM: 64 KiB at 0 and 64 KiB at 1 MiB (hakoniwa_fuzz::seeds
/// writes streams for this machine).
const REGIONS: [(u64, u64); 2] = [(0, 0x1_0000), (0x10_0000, 0x1_0000)];

fuzz_target!(|input: &[u8]| {
    let ranges: Vec<_> = REGIONS
        .iter()
        .map(|&(start, len)| (GuestAddress(start), len as usize))
        .collect();
    let memory = GuestMemoryMmap::from_ranges(&ranges).unwrap();
    let machine = hakoniwa_fuzz::migration_machine();
    assert_eq!(machine.ram_regions, REGIONS);
    let _ = precopy_stream(&memory, &machine, input);
});
