//! Integration tests of the virtio devices on the default guest. Like
//! tests/guest.rs they boot real guests and run in the rig (scripts/test).

mod common;

use std::time::{Duration, Instant};

use common::{ctl, require_hardware_kvm, temp_socket, Vmm, PROMPT};

/// MemTotal from /proc/meminfo, in KiB.
fn mem_total_kib(vmm: &mut Vmm) -> u64 {
    let out = vmm.shell("grep MemTotal /proc/meminfo");
    out.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no MemTotal in {out:?}"))
}

fn balloon_actual_mib(socket: &str) -> u64 {
    let (ok, out) = ctl(socket, &["balloon"]);
    assert!(ok, "{out}");
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    info["actual_mib"].as_u64().unwrap()
}

/// Waits until the guest's balloon holds `mib`.
fn wait_balloon(socket: &str, mib: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while balloon_actual_mib(socket) != mib {
        assert!(Instant::now() < deadline, "balloon did not reach {mib} MiB");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn guest_sees_every_device_and_the_rng_feeds_hwrng() {
    require_hardware_kvm();
    let mut vmm = Vmm::spawn(&[
        "run",
        "--rng",
        "--balloon",
        "--input",
        "keyboard",
        "--input",
        "tablet",
    ]);
    vmm.wait_for(PROMPT);
    // virtio device ids: 4 entropy, 5 balloon, 18 input (twice).
    let ids = vmm.shell("cat /sys/bus/virtio/devices/*/device | sort | tr '\\n' ' '");
    assert_eq!(ids.trim(), "0x0004 0x0005 0x0012 0x0012", "{ids}");
    let drivers = vmm.shell("for d in /sys/bus/virtio/devices/*; do basename $(readlink $d/driver); done | sort | tr '\\n' ' '");
    assert_eq!(
        drivers.trim(),
        "virtio_balloon virtio_input virtio_input virtio_rng",
        "{drivers}"
    );
    assert_eq!(
        vmm.shell("cat /sys/class/misc/hw_random/rng_current")
            .trim(),
        "virtio_rng.0"
    );
    // Two reads of /dev/hwrng: 64 bytes each, not all the same, and different.
    let a = vmm.shell("dd if=/dev/hwrng bs=64 count=1 2>/dev/null | od -An -tx1 | tr -d ' \\n'");
    let b = vmm.shell("dd if=/dev/hwrng bs=64 count=1 2>/dev/null | od -An -tx1 | tr -d ' \\n'");
    assert_eq!(a.trim().len(), 128, "{a}");
    assert_ne!(a, b);
    assert!(
        a.trim()
            .chars()
            .collect::<std::collections::HashSet<_>>()
            .len()
            > 4,
        "{a}"
    );
    // MSI-X vectors, not legacy interrupts.
    let msi = vmm.shell("grep -c PCI-MSI /proc/interrupts");
    assert!(msi.trim().parse::<u32>().unwrap() >= 4, "{msi}");
    vmm.send("poweroff\n");
    assert_eq!(vmm.wait_exit(Duration::from_secs(60)).code(), Some(0));
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn balloon_takes_memory_from_the_guest_and_gives_it_back() {
    require_hardware_kvm();
    let socket = temp_socket("balloon");
    let mut vmm = Vmm::spawn(&[
        "run",
        "--memory",
        "512M",
        "--balloon",
        "--api-socket",
        &socket,
    ]);
    vmm.wait_for(PROMPT);
    let before = mem_total_kib(&mut vmm);

    let (ok, out) = ctl(&socket, &["balloon", "--target", "256M"]);
    assert!(ok, "{out}");
    wait_balloon(&socket, 256);
    let inflated = mem_total_kib(&mut vmm);
    assert!(
        inflated + 250 * 1024 <= before,
        "MemTotal {before} KiB -> {inflated} KiB with 256 MiB in the balloon"
    );
    // The guest reports its statistics through the stats queue.
    let (ok, out) = ctl(&socket, &["balloon"]);
    assert!(ok, "{out}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, out) = ctl(&socket, &["balloon"]);
        let info: serde_json::Value = serde_json::from_str(&out).unwrap();
        if info["stats"]["total_memory"].as_u64().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "no balloon statistics: {out}");
        std::thread::sleep(Duration::from_millis(500));
    }

    let (ok, out) = ctl(&socket, &["balloon", "--target", "0"]);
    assert!(ok, "{out}");
    wait_balloon(&socket, 0);
    let deflated = mem_total_kib(&mut vmm);
    assert!(
        deflated + 4 * 1024 >= before,
        "MemTotal {before} KiB -> {deflated} KiB after deflating"
    );

    // More than the guest has is refused.
    let (ok, out) = ctl(&socket, &["balloon", "--target", "4G"]);
    assert!(!ok && out.contains("409"), "{out}");
    vmm.send("poweroff\n");
    assert_eq!(vmm.wait_exit(Duration::from_secs(60)).code(), Some(0));
}
