//! Fuzzes opening a snapshot file (`run --restore`): header, versions,
//! section framing and lengths, the metadata JSON (machine, KVM and
//! device state), then loading its RAM into a guest memory laid out as
//! the file says. Byte 0 of the input: `hakoniwa_fuzz::REPAIR_CHECKSUMS`;
//! the rest is the file.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use vm_memory::GuestAddress;

use vmm::memory::GuestMemoryMmap;
use vmm::snapshot::file::SnapshotReader;

fuzz_target!(|input: &[u8]| {
    let Some((&control, file)) = input.split_first() else {
        return;
    };
    let mut file = file.to_vec();
    if control & hakoniwa_fuzz::REPAIR_CHECKSUMS != 0 {
        hakoniwa_fuzz::repair_checksums(&mut file);
    }
    let path = snapshot_path();
    std::fs::write(path, &file).unwrap();
    let Ok(mut reader) = SnapshotReader::open(path) else {
        return;
    };
    // What opening promises: RAM laid out as the machine's memory size
    // says, and the whole of it in the file.
    let machine = &reader.snapshot.machine;
    assert_eq!(
        machine.ram_regions,
        arch::layout::ram_regions(machine.memory_bytes)
    );
    let ram: u64 = machine.ram_regions.iter().map(|r| r.1).sum();
    assert!(ram <= file.len() as u64);
    if ram == 0 {
        return;
    }
    let ranges: Vec<_> = machine
        .ram_regions
        .iter()
        .map(|&(start, len)| (GuestAddress(start), len as usize))
        .collect();
    let memory = GuestMemoryMmap::from_ranges(&ranges).unwrap();
    let _ = reader.load_ram(&memory);
});

/// The snapshot file of this fuzzing process.
fn snapshot_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("hakoniwa-fuzz-{}.snap", std::process::id()))
    })
}
