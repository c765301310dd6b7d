//! Tests that boot the Debian guest (scripts/build-guest-debian: bookworm
//! with systemd on a virtio-blk root, the stock kernel, 512 MiB) on real
//! KVM: `--exec` output and exit status with the papers' workloads present,
//! a read-only root, and the serial console's automatic login. The image is
//! only read: the disk is `readonly=on`, and the writable runs put a tmpfs
//! overlay on it (`hk.overlay`), so test binaries can share it.
//!
//! `#[ignore]`d like tests/guest.rs: `scripts/test` builds the image on the
//! host and runs these in the rig.

mod common;

use common::debian::{debian_args, require_debian_guest, ROOT_PROMPT};
use common::{run_to_end, Vmm, GUEST_TIMEOUT};

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn exec_runs_the_workloads_and_returns_the_status() {
    require_debian_guest();
    let command = "systemctl is-system-running --wait; \
                   fio --version; stress --version; iperf3 --version | head -n1 | cut -d' ' -f1; \
                   command -v postmark; apache2 -v | head -n1 | cut -d' ' -f3 | cut -d/ -f1; \
                   modprobe dummy && lsmod | grep -c '^dummy '; findmnt -n -o FSTYPE /; exit 3";
    let args = debian_args(
        "console=ttyS0 root=/dev/vda hk.overlay quiet",
        &["--exec", command],
    );
    let (status, stdout, stderr) = run_to_end(&args, GUEST_TIMEOUT);
    assert_eq!(status, 3, "stdout: {stdout}\nstderr: {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    // Nothing but the command's output: no boot messages, no \r, no login.
    assert_eq!(lines.len(), 8, "{stdout:?}");
    assert_eq!(lines[0], "running", "boot not finished cleanly: {stdout}");
    assert!(lines[1].starts_with("fio-3."), "{stdout}");
    assert!(lines[2].starts_with("stress 1."), "{stdout}");
    assert_eq!(lines[3], "iperf", "{stdout}");
    assert_eq!(lines[4], "/usr/bin/postmark", "{stdout}");
    assert_eq!(lines[5], "Apache", "{stdout}");
    // The stock kernel's modules are in the image, with depmod's indexes.
    assert_eq!(lines[6], "1", "modprobe dummy: {stdout}");
    assert_eq!(lines[7], "overlay", "{stdout}");
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn exec_false_exits_1_on_a_read_only_root() {
    require_debian_guest();
    let args = debian_args(
        "console=ttyS0 root=/dev/vda ro quiet",
        &[
            "--exec",
            "findmnt -n -o FSTYPE,OPTIONS / | cut -d, -f1; systemctl --failed --no-legend; false",
        ],
    );
    let (status, stdout, stderr) = run_to_end(&args, GUEST_TIMEOUT);
    assert_eq!(status, 1, "stdout: {stdout}\nstderr: {stderr}");
    // The root as mounted, and no failed unit.
    assert_eq!(
        stdout.split_whitespace().collect::<Vec<_>>(),
        ["ext4", "ro"],
        "{stdout:?}"
    );
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn serial_console_logs_root_in_and_poweroff_ends_the_vm() {
    require_debian_guest();
    let mut vmm = Vmm::spawn(&debian_args(
        "console=ttyS0 root=/dev/vda hk.overlay quiet",
        &[],
    ));
    vmm.wait_for("hakoniwa login: root (automatic login)");
    vmm.wait_for(ROOT_PROMPT);
    let state = vmm.shell("systemctl is-system-running --wait");
    assert_eq!(state.trim(), "running", "{}", vmm.stdout());
    vmm.send("poweroff\n");
    let status = vmm.wait_exit(GUEST_TIMEOUT);
    assert_eq!(status.code(), Some(0), "{}", vmm.stderr());
    assert!(vmm.stderr().contains("powered off"), "{}", vmm.stderr());
}
