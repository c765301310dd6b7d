//! The I/O tracer against a real guest (docs/iotrace.md), one boot of the
//! Debian guest (its I/O agent, hk-ioagent, answers on vsock) with a
//! 64 MiB data disk, cache=writeback, on a loop device in L1 (so the image
//! has a host block device of its own, and L1's page cache of it can be
//! dropped). The guest's interactive shell is the named process: the
//! kernel adds a reaped child's I/O to its parent's /proc/PID/io, so the
//! shell's counters are its commands'.
//! - a start naming a pid the guest lacks, or with the agent stopped, and
//!   `ctl iotrace` with an unknown disk, a second start, a stop or report
//!   of a disk not traced: one line each;
//! - an O_DIRECT read of 16 MiB of the raw disk, L1's page cache dropped
//!   first: 16 MiB at the application layer and at the virtual disk
//!   (within one request's size), the host page cache held almost none of
//!   it (the probe), and the loop device read at least that much; the same
//!   read again: the host cache holds all of it, the device reads next to
//!   nothing;
//! - a buffered read of the raw disk twice: the second is the guest
//!   cache's, ~0 bytes at the virtual-disk layer;
//! - on ext4 on the data disk, a 16 MiB file: read with O_DIRECT, 16 MiB at
//!   both layers; read buffered, then the bytes cached twice as measured
//!   (guest agent against the host's mincore) are the file's size within
//!   one request, and the estimate is within 25 % of the measure; read
//!   again, 16 MiB at the application layer, ~0 at the disk (guest hit
//!   ratio ~1); after drop_caches in the guest, the hit ratio falls to ~0;
//! - `ctl advise` on the window after the drop (16 MiB read once): a
//!   stream, direct I/O advised, the guest's memory from its agent, the
//!   guest hit ratio it weighed ~0 and its application layer the shell;
//!   `--apply` refused with one line (this VM has no balloon), and advise
//!   refused once the disk is no longer traced;
//! - a live process with an O_DIRECT file open makes the report's
//!   `guest.direct_io` true;
//! - `--trace-file` holds the window's records as JSON lines.
//!
//! Needs root in L1 (losetup, drop_caches).

mod common;

use std::process::Command;

use common::debian::{debian_args, require_debian_guest, ROOT_PROMPT};
use common::{ctl, host_sh, temp_socket, Vmm};

const MIB: u64 = 1 << 20;
/// What the guest reads each time.
const READ_BYTES: u64 = 16 * MIB;
/// The largest request the guest's virtio-blk driver sends (its
/// max_sectors_kb is 1280 by default): the virtual disk may read up to
/// one more than asked.
const MAX_REQUEST: u64 = 1280 * 1024;
/// What the shell itself reads besides its commands' I/O: the typed
/// command lines (readline reads them a byte at a time) and the
/// programs' loaders' ELF headers.
const SHELL_SLACK: u64 = 64 * 1024;
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

/// `ctl iotrace start ARGS` must succeed.
fn start(socket: &str, args: &[&str]) {
    let mut all = vec!["iotrace", "start"];
    all.extend_from_slice(args);
    let (ok, out) = ctl(socket, &all);
    assert!(ok, "ctl {all:?}: {out}");
}

/// Application and virtual-disk bytes read, and the guest hit ratio.
fn reads(report: &serde_json::Value) -> (u64, u64) {
    (
        u64_at(report, &["layers", "application", "read_bytes"]),
        u64_at(report, &["layers", "virtual_disk", "read_bytes"]),
    )
}

#[test]
#[ignore = "needs hardware KVM and root (run in the rig: scripts/test)"]
fn the_layers_agree_for_direct_and_buffered_reads() {
    require_debian_guest();
    let disk = LoopDisk::new();
    let socket = temp_socket("iotrace");
    let uds = temp_socket("iotrace-vsock");
    let vsock = format!("cid=3,uds={uds}");
    let data = format!("path={},cache=writeback,id=data", disk.dev);
    let mut vmm = Vmm::spawn(&debian_args(
        "console=ttyS0 root=/dev/vda hk.overlay quiet",
        &["--disk", &data, "--vsock", &vsock, "--api-socket", &socket],
    ));
    vmm.wait_for(ROOT_PROMPT);
    let state = vmm.shell("systemctl is-system-running --wait");
    assert_eq!(state.trim(), "running", "{}", vmm.stdout());
    let shell_pid = vmm.shell("echo pid=$$");
    let shell_pid = shell_pid
        .trim()
        .strip_prefix("pid=")
        .unwrap_or_else(|| panic!("{shell_pid:?}"))
        .to_string();
    let shell = ["--disk", "data", "--pid", shell_pid.as_str()];
    let raw_direct =
        "dd if=/dev/vdb of=/dev/null bs=1M count=16 iflag=direct 2>/dev/null; echo rc=$?";
    let raw_buffered = "dd if=/dev/vdb of=/dev/null bs=1M count=16 2>/dev/null; echo rc=$?";

    // One-line refusals.
    refused(
        &socket,
        &["start", "--disk", "nope"],
        "no disk 'nope' (disks: disk0, data)",
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
    refused(
        &socket,
        &["start", "--disk", "data", "--pid", "999999"],
        "guest process 999999: no such process",
    );
    assert!(vmm
        .shell("systemctl stop hk-ioagent; echo stopped")
        .contains("stopped"));
    refused(
        &socket,
        &["start", "--disk", "data", "--pid", &shell_pid],
        "the guest agent",
    );
    assert!(vmm
        .shell("systemctl start hk-ioagent; echo started")
        .contains("started"));

    // Cold: L1's page cache of the loop device dropped.
    host_sh("sync; echo 3 > /proc/sys/vm/drop_caches");
    let trace_file = std::env::temp_dir().join(format!("iotrace-{}.jsonl", std::process::id()));
    let trace_path = trace_file.to_str().unwrap();
    let mut args = shell.to_vec();
    args.extend(["--trace-file", trace_path]);
    start(&socket, &args);
    refused(
        &socket,
        &["start", "--disk", "data"],
        "disk 'data' is already traced",
    );
    assert!(vmm.shell(raw_direct).contains("rc=0"));
    let (ok, cold_table) = ctl(&socket, &["iotrace", "report", "--disk", "data"]);
    assert!(ok && cold_table.contains("virtual disk"), "{cold_table}");
    let cold = iotrace_json(&socket, &["stop", "--disk", "data"]);
    let (app_read, vdisk_read) = reads(&cold);
    let probed = f64_at(&cold, &["layers", "host_cache", "probed_hit_ratio"]);
    let physical_read = u64_at(&cold, &["physical_device", "stat", "read_sectors"]) * 512;
    let mut summary = format!(
        "raw direct cold: app {app_read} B, vdisk {vdisk_read} B in {} reads, probed {probed:.3}, {} {physical_read} B",
        u64_at(&cold, &["layers", "virtual_disk", "read_requests"]),
        cold["physical_device"]["name"].as_str().unwrap_or("-")
    );
    assert!(
        (READ_BYTES..=READ_BYTES + SHELL_SLACK).contains(&app_read),
        "{cold:#}"
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
    start(&socket, &["--disk", "data"]);
    assert!(vmm.shell(raw_direct).contains("rc=0"));
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
    // No process named: the layer is absent, and says why.
    assert!(
        warm["application"]
            .as_str()
            .unwrap()
            .starts_with("absent: no guest process named"),
        "{warm:#}"
    );

    // Buffered, twice: the second read is the guest cache's. The shell
    // holds the disk open meanwhile: Linux drops a block device's page
    // cache when its last opener closes it, so two dd's alone would each
    // read the disk.
    assert!(vmm
        .shell("exec 3</dev/vdb; echo 3 > /proc/sys/vm/drop_caches; echo dropped")
        .contains("dropped"));
    start(&socket, &["--disk", "data"]);
    assert!(vmm.shell(raw_buffered).contains("rc=0"));
    let first = iotrace_json(&socket, &["report", "--disk", "data"]);
    let first_read = u64_at(&first, &["layers", "virtual_disk", "read_bytes"]);
    assert!(first["tracing"] == true, "{first:#}");
    assert!(vmm.shell(raw_buffered).contains("rc=0"));
    let both = iotrace_json(&socket, &["stop", "--disk", "data"]);
    let second_read = u64_at(&both, &["layers", "virtual_disk", "read_bytes"]) - first_read;
    summary += &format!(
        "; raw buffered: vdisk {first_read} B in {} reads, again {second_read} B",
        u64_at(&first, &["layers", "virtual_disk", "read_requests"])
    );
    assert!(first_read >= READ_BYTES, "{first:#}");
    assert!(second_read < 256 * 1024, "{both:#}");
    vmm.shell("exec 3<&-");

    // A 16 MiB file on ext4 (4 KiB blocks: the guest's pages are the
    // disk's) on the data disk, out of the guest's cache.
    let made = vmm.shell(
        "mkfs.ext4 -q -F -b 4096 /dev/vdb && mount /dev/vdb /mnt && \
         dd if=/dev/urandom of=/mnt/f bs=1M count=16 conv=fsync 2>/dev/null && \
         sync && echo 3 > /proc/sys/vm/drop_caches && echo made",
    );
    assert!(made.contains("made"), "{made}");
    let file_direct = "dd if=/mnt/f of=/dev/null bs=1M iflag=direct 2>/dev/null; echo rc=$?";
    let file_buffered = "dd if=/mnt/f of=/dev/null bs=1M 2>/dev/null; echo rc=$?";

    // O_DIRECT: the application's 16 MiB reach the disk.
    start(&socket, &shell);
    assert!(vmm.shell(file_direct).contains("rc=0"));
    let direct = iotrace_json(&socket, &["stop", "--disk", "data"]);
    let (app_read, vdisk_read) = reads(&direct);
    summary += &format!("; file direct: app {app_read} B, vdisk {vdisk_read} B");
    assert!(
        (READ_BYTES..=READ_BYTES + SHELL_SLACK).contains(&app_read),
        "{direct:#}"
    );
    assert!(
        (READ_BYTES..=READ_BYTES + MAX_REQUEST).contains(&vdisk_read),
        "{direct:#}"
    );

    // Buffered, cold: the guest now caches the file, and so does L1
    // (cache=writeback): the bytes cached twice, measured and estimated.
    start(&socket, &shell);
    assert!(vmm.shell(file_buffered).contains("rc=0"));
    let cold_file = iotrace_json(&socket, &["stop", "--disk", "data"]);
    let (app_read, vdisk_read) = reads(&cold_file);
    let measured = u64_at(&cold_file, &["double_cached_measured", "both_bytes"]);
    let guest_bytes = u64_at(&cold_file, &["double_cached_measured", "guest_bytes"]);
    let host_bytes = u64_at(&cold_file, &["double_cached_measured", "host_bytes"]);
    let estimated = u64_at(&cold_file, &["layers", "double_cached", "bytes"]);
    summary += &format!(
        "; file buffered cold: app {app_read} B, vdisk {vdisk_read} B, cached twice: measured {measured} B \
         (guest {guest_bytes} B, host {host_bytes} B), estimated {estimated} B, guest Cached {} B",
        u64_at(&cold_file, &["guest", "cached"])
    );
    assert!(
        (READ_BYTES..=READ_BYTES + SHELL_SLACK).contains(&app_read),
        "{cold_file:#}"
    );
    assert!(vdisk_read >= READ_BYTES, "{cold_file:#}");
    assert!(
        measured.abs_diff(READ_BYTES) <= MAX_REQUEST,
        "measured {measured}: {cold_file:#}"
    );
    assert!(
        estimated.abs_diff(measured) * 4 <= measured,
        "estimated {estimated} against measured {measured}: {cold_file:#}"
    );
    assert_eq!(cold_file["guest"]["direct_io"], false, "{cold_file:#}");

    // Buffered again: the guest cache serves it.
    start(&socket, &shell);
    assert!(vmm.shell(file_buffered).contains("rc=0"));
    let warm_file = iotrace_json(&socket, &["stop", "--disk", "data"]);
    let (app_read, vdisk_read) = reads(&warm_file);
    let warm_ratio = f64_at(&warm_file, &["layers", "guest_cache", "hit_ratio"]);
    summary += &format!(
        "; file buffered again: app {app_read} B, vdisk {vdisk_read} B, guest hit {warm_ratio:.3}"
    );
    assert!(
        (READ_BYTES..=READ_BYTES + SHELL_SLACK).contains(&app_read),
        "{warm_file:#}"
    );
    assert!(vdisk_read < 256 * 1024, "{warm_file:#}");
    assert!(warm_ratio > 0.98, "{warm_file:#}");

    // The guest's cache dropped: the same read misses it.
    start(&socket, &shell);
    assert!(vmm
        .shell(&format!(
            "echo 3 > /proc/sys/vm/drop_caches; {file_buffered}"
        ))
        .contains("rc=0"));
    // The advisor on this window: 16 MiB read once is a stream, whatever
    // the guest's memory; --apply needs a balloon this VM has not.
    let (ok, out) = ctl(&socket, &["advise", "--disk", "data", "--apply"]);
    assert!(
        !ok && out.trim().lines().count() == 1 && out.contains("the VM has no balloon"),
        "{out}"
    );
    let (ok, out) = ctl(&socket, &["advise", "--disk", "data", "--json"]);
    assert!(ok, "{out}");
    let advice: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(advice["guest"]["source"], "guest_agent", "{advice:#}");
    // The shell's reaped dd is the application layer: its 16 MiB all
    // missed the dropped guest cache.
    let advised_hit = advice["guest_hit_ratio"]
        .as_f64()
        .unwrap_or_else(|| panic!("no guest hit ratio: {advice:#}"));
    assert!(advised_hit < 0.05, "{advice:#}");
    assert!(
        advice["application"]
            .as_str()
            .is_some_and(|a| a.starts_with("guest processes")),
        "{advice:#}"
    );
    assert_eq!(advice["advice"]["regime"], "streaming", "{advice:#}");
    assert_eq!(
        advice["advice"]["guest_io"]["recommended"], "direct",
        "{advice:#}"
    );
    assert!(advice["applied"].is_null(), "{advice:#}");
    let (ok, advice_text) = ctl(&socket, &["advise", "--disk", "data"]);
    assert!(ok && advice_text.contains("guest memory"), "{advice_text}");
    let dropped = iotrace_json(&socket, &["stop", "--disk", "data"]);
    let (ok, out) = ctl(&socket, &["advise", "--disk", "data"]);
    assert!(
        !ok && out.trim().lines().count() == 1 && out.contains("disk 'data' is not traced"),
        "{out}"
    );
    let (app_read, vdisk_read) = reads(&dropped);
    let dropped_ratio = f64_at(&dropped, &["layers", "guest_cache", "hit_ratio"]);
    summary += &format!(
        "; after drop_caches: app {app_read} B, vdisk {vdisk_read} B, guest hit {dropped_ratio:.3}"
    );
    assert!(vdisk_read >= READ_BYTES, "{dropped:#}");
    assert!(dropped_ratio < 0.05, "{dropped:#}");

    // A live reader with an O_DIRECT file open (dd blocked on a full
    // pipe nobody reads): the report says the application does direct
    // I/O.
    vmm.shell("dd if=/mnt/f bs=64k iflag=direct 2>/dev/null | sleep 60 & echo $! > /tmp/sleeper");
    start(&socket, &["--disk", "data", "--comm", "dd"]);
    let live = iotrace_json(&socket, &["report", "--disk", "data"]);
    assert_eq!(live["guest"]["direct_io"], true, "{live:#}");
    let dd = live["processes"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["comm"] == "dd"))
        .unwrap_or_else(|| panic!("no dd: {live:#}"));
    assert!(dd["direct_fds"].as_u64() >= Some(1), "{live:#}");
    // sleep's pid: dd dies of SIGPIPE.
    vmm.shell("kill $(cat /tmp/sleeper); wait");
    let (ok, table) = ctl(&socket, &["iotrace", "stop", "--disk", "data"]);
    assert!(ok, "{table}");
    // The table names the layers, the guest and both double cachings.
    assert!(
        table.contains("virtual disk")
            && table.contains("application")
            && table.contains("direct I/O: yes")
            && table.contains("cached twice: estimated"),
        "{table}"
    );
    assert!(
        table.contains(disk.dev.trim_start_matches("/dev/")),
        "{table}"
    );
    eprintln!("{cold_table}{table}{advice_text}{summary}");
}
