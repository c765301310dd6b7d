//! `hakoniwa run --restore FILE` refuses a bad snapshot file or one that
//! does not match its flags with one line and a non-zero status, before
//! any KVM work (so these need no KVM). docs/snapshot.md describes the
//! format built here by hand.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::run_to_end;

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hakoniwa-cli-snap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Any file will do for --kernel: a restore does not load it.
fn kernel() -> PathBuf {
    let path = temp_dir().join("kernel");
    std::fs::write(&path, b"not loaded on restore").unwrap();
    path
}

/// CRC-32 (IEEE), as the format uses.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The metadata of a one-vCPU VM with `memory_mib` of RAM; KVM's
/// structures are empty byte arrays (read back as zeros).
fn metadata(memory_mib: u64) -> String {
    let bytes = memory_mib << 20;
    format!(
        r#"{{"machine":{{"memory_bytes":{bytes},"vcpus":1,"ram_regions":[[0,{bytes}]],
        "devices":[],"boot_protocol":"linux-64bit","kernel":"k","cmdline":"c"}},
        "vm":{{"pic_master":[],"pic_slave":[],"ioapic":[],"pit":[],"clock":[]}},
        "vcpus":[{{"index":0,"cpuid":[],"mp_state":[],"regs":[],"sregs":[],"xsave":[],
        "xcrs":null,"debug_regs":[],"lapic":[],"msrs":[],"vcpu_events":[],"tsc_khz":null}}],
        "devices":{{"com1":{{"baud_divisor_low":12,"baud_divisor_high":0,"interrupt_enable":0,
        "interrupt_identification":1,"line_control":3,"line_status":96,"modem_control":8,
        "modem_status":176,"scratch":0,"in_buffer":[]}},"virtio":{{}}}}}}"#
    )
}

fn section(out: &mut Vec<u8>, tag: &[u8; 4], payload: &[u8]) {
    out.extend_from_slice(tag);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let crc = if payload.is_empty() {
        0
    } else {
        crc32(payload)
    };
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
}

/// A complete snapshot file: header, metadata, zeroed RAM, end marker.
fn snapshot_bytes(format_version: u32, memory_mib: u64) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"HKNWSNAP");
    out.extend_from_slice(&format_version.to_le_bytes());
    let version = env!("CARGO_PKG_VERSION");
    out.extend_from_slice(&(version.len() as u16).to_le_bytes());
    out.extend_from_slice(version.as_bytes());
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    section(&mut out, b"META", metadata(memory_mib).as_bytes());
    section(&mut out, b"RAM ", &vec![0u8; (memory_mib << 20) as usize]);
    section(&mut out, b"END ", &[]);
    out
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let path = temp_dir().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `run --restore FILE --memory 2M EXTRA...` must fail with one line
/// containing `needle`.
fn expect_refusal(snapshot: &Path, memory: &str, extra: &[&str], needle: &str) {
    let kernel = kernel();
    let mut args = vec![
        "run",
        "--kernel",
        kernel.to_str().unwrap(),
        "--memory",
        memory,
        "--restore",
        snapshot.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = run_to_end(&args, Duration::from_secs(30));
    assert_ne!(code, 0, "should fail: {args:?}\nstderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected, got:\n{stderr}");
    assert!(lines[0].starts_with("hakoniwa: "), "{stderr}");
    assert!(
        lines[0].contains(needle),
        "expected {needle:?} in: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn a_missing_snapshot_is_named() {
    let path = temp_dir().join("nonexistent.snap");
    expect_refusal(&path, "2M", &[], "cannot open snapshot");
}

#[test]
fn a_file_that_is_not_a_snapshot() {
    let path = write("text.snap", b"hello, I am text, not a VM\n");
    expect_refusal(&path, "2M", &[], "is not a hakoniwa snapshot");
}

#[test]
fn corrupt_metadata_is_refused() {
    let mut bytes = snapshot_bytes(2, 2);
    let at = bytes.windows(6).position(|w| w == b"vcpus\"").unwrap();
    bytes[at] = b'w';
    let path = write("corrupt.snap", &bytes);
    expect_refusal(&path, "2M", &[], "corrupt: metadata checksum mismatch");
}

#[test]
fn a_truncated_snapshot_is_refused() {
    let bytes = snapshot_bytes(2, 2);
    let path = write("truncated.snap", &bytes[..bytes.len() - 4096]);
    expect_refusal(&path, "2M", &[], "is truncated");
    let path = write("truncated-header.snap", &bytes[..10]);
    expect_refusal(&path, "2M", &[], "is truncated (header)");
}

#[test]
fn another_format_version_is_refused() {
    let path = write("v99.snap", &snapshot_bytes(99, 2));
    expect_refusal(&path, "2M", &[], "format version 99");
}

#[test]
fn a_memory_size_mismatch_is_refused() {
    let path = write("2m.snap", &snapshot_bytes(2, 2));
    expect_refusal(
        &path,
        "4M",
        &[],
        "does not match this VM: it has 2M of memory, --memory is 4M",
    );
    expect_refusal(&path, "2M", &["--cpus", "2"], "it has 1 vCPUs, --cpus is 2");
}

#[test]
fn a_display_the_snapshot_does_not_have_is_refused() {
    let path = write("display.snap", &snapshot_bytes(2, 2));
    expect_refusal(
        &path,
        "2M",
        &["--display", "vnc=127.0.0.1:0,width=640,height=480"],
        "does not match this VM: it has no display, --display gives a 640x480 linear display",
    );
}

#[test]
fn a_snapshot_of_the_previous_format_is_refused() {
    let path = write("v1.snap", &snapshot_bytes(1, 2));
    expect_refusal(
        &path,
        "2M",
        &[],
        "has format version 1; this hakoniwa reads version 2",
    );
}
