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

/// A one-vCPU VM's state for `machine`, KVM structures zeroed (no KVM
/// needed), with a serial port and a virtio-rng function.
pub fn vm_state(machine: &MachineState) -> VmSnapshot {
    let json = serde_json::json!({
        "machine": machine,
        "vm": {"pic_master": [], "pic_slave": [], "ioapic": [], "pit": [], "clock": []},
        "vcpus": [{
            "index": 0, "cpuid": [], "mp_state": [], "regs": [], "sregs": [], "xsave": [],
            "xcrs": null, "debug_regs": [], "lapic": [], "vcpu_events": [], "tsc_khz": 1000,
            "msrs": [{"index": 16, "data": 12345}]
        }],
        "devices": {"com1": {
            "baud_divisor_low": 12, "baud_divisor_high": 0, "interrupt_enable": 1,
            "interrupt_identification": 1, "line_control": 3, "line_status": 96,
            "modem_control": 8, "modem_status": 176, "scratch": 7, "in_buffer": [104, 105]
        }, "virtio": {"rng0": {
            "device_type": 4, "config_space": vec![0u32; 64], "bar_address": 0xc000_0000u64,
            "msix": {"entries": [{"address_lo": 0xfee0_0000u32, "address_hi": 0, "data": 34,
                "control": 0}, {"address_lo": 0, "address_hi": 0, "data": 0, "control": 1}],
                "pending": [false, true]},
            "status": 15, "device_feature_select": 1, "driver_feature_select": 1,
            "driver_features": 0x1_3000_0000u64, "queue_select": 0, "config_generation": 0,
            "config_vector": 65535, "isr": 0, "activated": true,
            "queues": [{"size": 256, "ready": true, "desc": 0x1000, "driver": 0x2000,
                "device": 0x3000, "vector": 0, "next_avail": 7, "next_used": 6}],
            "device": {"device": "rng"}
        }}}
    });
    serde_json::from_value(json).expect("the sample state matches VmSnapshot")
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
