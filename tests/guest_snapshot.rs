//! Snapshot and restore of a running default guest (docs/snapshot.md): a
//! counter started in the guest's shell keeps counting in the restored VM.
//!
//! `#[ignore]`d like the other guest tests; `scripts/test` runs them in
//! the rig.

mod common;

use std::time::{Duration, Instant};

use common::{require_hardware_kvm, temp_socket, Vmm, GUEST_TIMEOUT, PROMPT};

/// The same machine both times: a restore needs the original's flags.
const FLAGS: &[&str] = &["--cpus", "2", "--memory", "256M"];

/// The numbers of the complete `tick N` lines on the console, in order.
fn ticks(console: &str) -> Vec<u64> {
    let console = console.replace('\r', "");
    console
        .lines()
        .filter_map(|line| line.trim().strip_prefix("tick "))
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The metadata section of a snapshot file, as JSON (docs/snapshot.md).
fn metadata(path: &str) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"HKNWSNAP");
    let version_len = u16::from_le_bytes([bytes[12], bytes[13]]) as usize;
    let section = 14 + version_len + 4;
    assert_eq!(&bytes[section..section + 4], b"META");
    let len = u64::from_le_bytes(bytes[section + 4..section + 12].try_into().unwrap()) as usize;
    serde_json::from_slice(&bytes[section + 16..section + 16 + len]).unwrap()
}

/// Waits until the console shows a tick of at least `at_least`.
fn wait_for_tick(vmm: &Vmm, at_least: u64) -> Vec<u64> {
    let deadline = Instant::now() + GUEST_TIMEOUT;
    loop {
        let seen = ticks(&vmm.stdout());
        if seen.last().is_some_and(|&n| n >= at_least) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "no tick {at_least} on the console:\n{}\n--- stderr ---\n{}",
            vmm.stdout(),
            vmm.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn a_restored_guest_keeps_counting() {
    require_hardware_kvm();
    let snapshot =
        std::env::temp_dir().join(format!("hakoniwa-counter-{}.snap", std::process::id()));
    let snapshot = snapshot.to_str().unwrap().to_string();

    let socket = temp_socket("snapshot-a");
    let mut args = vec!["run", "--api-socket", &socket];
    args.extend_from_slice(FLAGS);
    let mut vmm = Vmm::spawn(&args);
    vmm.wait_for(PROMPT);
    vmm.send("i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done &\n");
    let before = *wait_for_tick(&vmm, 5).last().unwrap();

    let started = Instant::now();
    let (ok, out) = common::ctl(&socket, &["snapshot", "--path", &snapshot]);
    assert!(
        ok,
        "snapshot failed: {out}\n--- stderr ---\n{}",
        vmm.stderr()
    );
    println!(
        "snapshot of a running VM: {:?}, {} bytes",
        started.elapsed(),
        std::fs::metadata(&snapshot).unwrap().len()
    );
    assert!(out.contains("snapshot written"), "{out}");
    // Every vCPU, with the TSC and kvm-clock MSRs among its MSRs.
    let meta = metadata(&snapshot);
    assert_eq!(meta["vcpus"].as_array().unwrap().len(), 2);
    for vcpu in meta["vcpus"].as_array().unwrap() {
        let msrs: Vec<u64> = vcpu["msrs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["index"].as_u64().unwrap())
            .collect();
        for msr in [0x10, 0x4b56_4d00, 0x4b56_4d01] {
            assert!(msrs.contains(&msr), "MSR {msr:#x} not saved: {msrs:x?}");
        }
    }
    assert_eq!(meta["machine"]["memory_bytes"], 256u64 << 20);
    // The original resumes after the snapshot and keeps counting.
    wait_for_tick(&vmm, before + 3);
    drop(vmm);

    let socket = temp_socket("snapshot-b");
    let mut args = vec!["run", "--api-socket", &socket, "--restore", &snapshot];
    args.extend_from_slice(FLAGS);
    let mut restored = Vmm::spawn(&args);
    // Counting resumes where the snapshot was taken: not from 1, and not
    // before the last tick seen before the snapshot.
    let seen = wait_for_tick(&restored, before + 1);
    let first = seen[0];
    assert!(
        first >= before,
        "the restored guest counted from {first}, but {before} was printed before the snapshot: {seen:?}"
    );
    assert!(
        seen.windows(2).all(|w| w[1] == w[0] + 1),
        "ticks must continue one by one: {seen:?}"
    );
    println!(
        "last tick before the snapshot: {before}; the restored guest went on with {seen:?}; its stderr: {:?}",
        restored.stderr()
    );
    wait_for_tick(&restored, first + 5);
    // The shell still answers (COM1 input and output both work).
    let answer = restored.shell("echo alive-$((6*7))");
    assert!(answer.contains("alive-42"), "{answer}");
    let (ok, info) = common::ctl(&socket, &["info"]);
    assert!(ok && info.contains("\"running\""), "{info}");

    // A paused VM (here, a restored one) is snapshotted and stays paused.
    let (ok, out) = common::ctl(&socket, &["pause"]);
    assert!(ok, "{out}");
    let paused_at = *ticks(&restored.stdout()).last().unwrap();
    let again = format!("{snapshot}.2");
    let (ok, out) = common::ctl(&socket, &["snapshot", "--path", &again]);
    assert!(ok, "second snapshot failed: {out}");
    let (ok, info) = common::ctl(&socket, &["info"]);
    assert!(ok && info.contains("\"paused\""), "{info}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        *ticks(&restored.stdout()).last().unwrap(),
        paused_at,
        "the guest ran while paused"
    );
    let (ok, out) = common::ctl(&socket, &["shutdown"]);
    assert!(ok, "{out}");
    let status = restored.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", restored.stderr());

    // The snapshot of the restored VM restores too.
    let mut args = vec!["run", "--restore", &again];
    args.extend_from_slice(FLAGS);
    let third = Vmm::spawn(&args);
    let seen = wait_for_tick(&third, paused_at + 3);
    assert!(seen[0] >= paused_at, "{paused_at} then {seen:?}");
    println!("paused at tick {paused_at}; the second restore went on with {seen:?}");
    drop(third);
    let _ = std::fs::remove_file(&snapshot);
    let _ = std::fs::remove_file(&again);
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn a_vm_with_virtio_devices_is_not_snapshotted() {
    require_hardware_kvm();
    let socket = temp_socket("snapshot-virtio");
    let mut vmm = Vmm::spawn(&["run", "--rng", "--api-socket", &socket]);
    vmm.wait_for(PROMPT);
    let path = std::env::temp_dir().join(format!("hakoniwa-virtio-{}.snap", std::process::id()));
    let (ok, out) = common::ctl(&socket, &["snapshot", "--path", path.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("snapshot of virtio devices is not supported yet"),
        "{out}"
    );
    assert!(!path.exists());
    // The VM was not paused by the refusal.
    vmm.send("echo still-$((1+1))\n");
    vmm.wait_for("still-2");
}
