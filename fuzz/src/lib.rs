//! What the fuzz targets and the seed writer (`src/bin/make_seeds.rs`)
//! share: the machines the targets run against, so seeds fit them.

use vmm::snapshot::state::{MachineState, VmSnapshot};

/// The destination machine of `migration_stream`: 128 KiB of RAM in two
/// regions (0 and 1 MiB), one vCPU, no devices.
pub fn migration_machine() -> MachineState {
    MachineState {
        memory_bytes: 0x2_0000,
        vcpus: 1,
        ram_regions: vec![(0, 0x1_0000), (0x10_0000, 0x1_0000)],
        devices: Vec::new(),
        boot_protocol: "pvh".into(),
        kernel: "vmlinux".into(),
        cmdline: "console=ttyS0".into(),
        display: None,
    }
}

/// A one-vCPU VM's state for `machine` (vmm's own sample, which its
/// snapshot tests use too).
pub fn vm_state(machine: &MachineState) -> VmSnapshot {
    VmSnapshot::sample(machine)
}

/// Input byte 0 of `snapshot_file`, bit 0: recompute the header, metadata
/// and RAM checksums of the file that follows before opening it, so
/// mutations reach the parsers behind them.
pub const REPAIR_CHECKSUMS: u8 = 1;

/// Recomputes the checksums of a snapshot file's header and first two
/// sections (see `vmm::snapshot::file`), where the lengths fit.
pub fn repair_checksums(file: &mut [u8]) {
    let Some(v) = file.get(12..14) else { return };
    let header_len = 14 + usize::from(u16::from_le_bytes([v[0], v[1]]));
    if file.len() < header_len + 4 {
        return;
    }
    let crc = crc32fast::hash(&file[..header_len]);
    file[header_len..header_len + 4].copy_from_slice(&crc.to_le_bytes());
    let mut section = header_len + 4;
    for _ in 0..2 {
        let Some(h) = file.get(section..section + 16) else {
            return;
        };
        let len = u64::from_le_bytes(h[4..12].try_into().unwrap());
        let start = section + 16;
        let Some(end) = usize::try_from(len).ok().and_then(|l| start.checked_add(l)) else {
            return;
        };
        let Some(payload) = file.get(start..end) else {
            return;
        };
        let crc = crc32fast::hash(payload);
        file[section + 12..section + 16].copy_from_slice(&crc.to_le_bytes());
        section = end;
    }
}

/// A directory of this fuzzing process for a device's Unix sockets (the
/// vsock targets'), made on first use.
pub fn socket_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hakoniwa-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}
