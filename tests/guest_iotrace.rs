//! The I/O tracer against a real guest (docs/iotrace.md), one boot with a
//! 64 MiB data disk, cache=writeback, on a loop device in L1 (so the
//! image has a host block device of its own, and L1's page cache of it
//! can be dropped):
//! - an O_DIRECT read of 16 MiB in the guest, L1's page cache dropped
//!   first: the virtual-disk layer reads 16 MiB (within one request's
//!   size), the host page cache held almost none of it (the probe), and
//!   the loop device read at least that much;
//! - the same read again: the host cache holds all of it, and the device
//!   reads next to nothing;
//! - a buffered read twice in the guest: the second is served by the
//!   guest's page cache, ~0 bytes at the virtual-disk layer;
//! - `ctl iotrace` refuses an unknown disk, a second start, and a stop or
//!   report of a disk not traced, each with one line;
//! - `--trace-file` holds the window's records as JSON lines.
//!
//! Needs root in L1 (losetup, drop_caches).

mod common;

use std::process::Command;

use common::{ctl, host_sh, require_hardware_kvm, temp_socket, Vmm, PROMPT};

const MIB: u64 = 1 << 20;
/// What the guest reads each time.
const READ_BYTES: u64 = 16 * MIB;
/// The largest request the guest's virtio-blk driver sends (its
/// max_sectors_kb is 1280 by default): the virtual disk may read up to
/// one more than asked.
const MAX_REQUEST: u64 = 1280 * 1024;

/// A loop device over a 64 MiB file, detached and removed when dropped.
struct LoopDisk {
    file: String,
    dev: String,
}

impl LoopDisk {
    fn new() -> LoopDisk {
        let file = format!("/tmp/hakoniwa-iotrace-{}.img", std::process::id());
        // Written, not sparse: every read is of real data.
        host_sh(&format!(
            "dd if=/dev/urandom of={file} bs=1M count=64 2>/dev/null"
        ));
        let dev = host_sh(&format!("losetup --find --show {file}"))
            .trim()
            .to_string();
        // No host readahead: with it, L1 reads ahead of the VMM's
        // sequential reads while the guest waits for the previous one,
        // and the probe rightly finds the next range already cached (from
        // under 25 % to 70 % of a "cold" 16 MiB read, by timing). Off, a
        // cold read misses every byte and the device reads exactly what
        // the virtual disk asked.
        let name = dev.trim_start_matches("/dev/");
        host_sh(&format!("echo 0 > /sys/block/{name}/queue/read_ahead_kb"));
        LoopDisk { file, dev }
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_file(&self.file);
    }
}

/// `ctl iotrace ARGS --json`'s report.
fn iotrace_json(socket: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["iotrace"];
    all.extend_from_slice(args);
    all.push("--json");
    let (ok, out) = ctl(socket, &all);
    assert!(ok, "ctl {all:?}: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn u64_at(report: &serde_json::Value, path: &[&str]) -> u64 {
    let mut v = report;
    for key in path {
        v = &v[key];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("no {path:?} in {report:#}"))
}

fn f64_at(report: &serde_json::Value, path: &[&str]) -> f64 {
    let mut v = report;
    for key in path {
        v = &v[key];
    }
    v.as_f64()
        .unwrap_or_else(|| panic!("no {path:?} in {report:#}"))
}

/// `ctl iotrace ARGS` must fail with one line containing `expected`.
fn refused(socket: &str, args: &[&str], expected: &str) {
    let mut all = vec!["iotrace"];
    all.extend_from_slice(args);
    let (ok, out) = ctl(socket, &all);
    assert!(!ok, "ctl {all:?} succeeded: {out}");
    assert_eq!(out.trim().lines().count(), 1, "ctl {all:?}: {out}");
    assert!(out.contains(expected), "ctl {all:?}: {out}");
}

#[test]
#[ignore = "needs hardware KVM and root (run in the rig: scripts/test)"]
fn the_layers_agree_for_direct_and_buffered_reads() {
    require_hardware_kvm();
    let disk = LoopDisk::new();
    let socket = temp_socket("iotrace");
    let mut vmm = Vmm::spawn(&[
        "run",
        "--api-socket",
        &socket,
        "--disk",
        &format!("path={},cache=writeback,id=data", disk.dev),
    ]);
    vmm.wait_for(PROMPT);
    let direct_read =
        "dd if=/dev/vda of=/dev/null bs=1M count=16 iflag=direct 2>/dev/null; echo rc=$?";
    let buffered_read = "dd if=/dev/vda of=/dev/null bs=1M count=16 2>/dev/null; echo rc=$?";

    // One-line refusals.
    refused(
        &socket,
        &["start", "--disk", "nope"],
        "no disk 'nope' (disks: data)",
    );
    refused(
        &socket,
        &["stop", "--disk", "data"],
        "disk 'data' is not traced",
    );
    refused(
        &socket,
        &["report", "--disk", "data"],
        "disk 'data' is not traced",
    );

    // Cold: L1's page cache of the loop device dropped.
    host_sh("sync; echo 3 > /proc/sys/vm/drop_caches");
    let trace_file = std::env::temp_dir().join(format!("iotrace-{}.jsonl", std::process::id()));
    let trace_path = trace_file.to_str().unwrap();
    let (ok, out) = ctl(
        &socket,
        &[
            "iotrace",
            "start",
            "--disk",
            "data",
            "--trace-file",
            trace_path,
        ],
    );
    assert!(ok, "{out}");
    refused(
        &socket,
        &["start", "--disk", "data"],
        "disk 'data' is already traced",
    );
    assert!(vmm.shell(direct_read).contains("rc=0"));
    let (ok, cold_table) = ctl(&socket, &["iotrace", "report", "--disk", "data"]);
    assert!(ok && cold_table.contains("virtual disk"), "{cold_table}");
    let cold = iotrace_json(&socket, &["stop", "--disk", "data"]);
    let vdisk_read = u64_at(&cold, &["layers", "virtual_disk", "read_bytes"]);
    let probed = f64_at(&cold, &["layers", "host_cache", "probed_hit_ratio"]);
    let physical_read = u64_at(&cold, &["physical_device", "stat", "read_sectors"]) * 512;
    let mut summary = format!(
        "cold: vdisk {vdisk_read} B in {} reads, probed {probed:.3}, {} {physical_read} B",
        u64_at(&cold, &["layers", "virtual_disk", "read_requests"]),
        cold["physical_device"]["name"].as_str().unwrap_or("-")
    );
    assert!(
        (READ_BYTES..=READ_BYTES + MAX_REQUEST).contains(&vdisk_read),
        "{cold:#}"
    );
    assert!(probed < 0.01, "cold host cache: {cold:#}");
    assert!(
        (READ_BYTES..=READ_BYTES + MAX_REQUEST).contains(&physical_read),
        "{cold:#}"
    );
    assert_eq!(u64_at(&cold, &["dropped"]), 0);
    // The trace file: the window's records, the reads among them adding
    // up to the layer's bytes.
    let lines = std::fs::read_to_string(&trace_file).unwrap();
    let _ = std::fs::remove_file(&trace_file);
    let records: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len() as u64, u64_at(&cold, &["records"]));
    let read_bytes: u64 = records
        .iter()
        .filter(|r| r["kind"] == "read" && r["ok"] == true)
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(read_bytes, vdisk_read);

    // Warm: the same read again, from L1's page cache.
    let (ok, out) = ctl(&socket, &["iotrace", "start", "--disk", "data"]);
    assert!(ok, "{out}");
    assert!(vmm.shell(direct_read).contains("rc=0"));
    let warm = iotrace_json(&socket, &["stop", "--disk", "data"]);
    let vdisk_read = u64_at(&warm, &["layers", "virtual_disk", "read_bytes"]);
    let probed = f64_at(&warm, &["layers", "host_cache", "probed_hit_ratio"]);
    let physical_read = u64_at(&warm, &["physical_device", "stat", "read_sectors"]) * 512;
    summary +=
        &format!("; warm: vdisk {vdisk_read} B, probed {probed:.3}, device {physical_read} B");
    assert!(
        (READ_BYTES..=READ_BYTES + MAX_REQUEST).contains(&vdisk_read),
        "{warm:#}"
    );
    assert!(probed > 0.99, "warm host cache: {warm:#}");
    assert!(physical_read < MIB, "{warm:#}");

    // Buffered, twice: the second read is the guest cache's. The shell
    // holds the disk open meanwhile: Linux drops a block device's page
    // cache when its last opener closes it, so two dd's alone would each
    // read the disk.
    assert!(vmm
        .shell("exec 3</dev/vda; echo 3 > /proc/sys/vm/drop_caches; echo dropped")
        .contains("dropped"));
    let (ok, out) = ctl(&socket, &["iotrace", "start", "--disk", "data"]);
    assert!(ok, "{out}");
    assert!(vmm.shell(buffered_read).contains("rc=0"));
    let first = iotrace_json(&socket, &["report", "--disk", "data"]);
    let first_read = u64_at(&first, &["layers", "virtual_disk", "read_bytes"]);
    assert!(first["tracing"] == true, "{first:#}");
    assert!(vmm.shell(buffered_read).contains("rc=0"));
    let both = iotrace_json(&socket, &["stop", "--disk", "data"]);
    let second_read = u64_at(&both, &["layers", "virtual_disk", "read_bytes"]) - first_read;
    summary += &format!(
        "; buffered: vdisk {first_read} B in {} reads, again {second_read} B",
        u64_at(&first, &["layers", "virtual_disk", "read_requests"])
    );
    assert!(first_read >= READ_BYTES, "{first:#}");
    assert!(second_read < 256 * 1024, "{both:#}");
    vmm.shell("exec 3<&-");

    // The table names the layers.
    let (ok, out) = ctl(&socket, &["iotrace", "start", "--disk", "data"]);
    assert!(ok, "{out}");
    let (ok, table) = ctl(&socket, &["iotrace", "stop", "--disk", "data"]);
    assert!(ok, "{table}");
    assert!(
        table.contains("virtual disk") && table.contains("application"),
        "{table}"
    );
    assert!(
        table.contains(disk.dev.trim_start_matches("/dev/")),
        "{table}"
    );
    eprintln!("{cold_table}{summary}");
}
