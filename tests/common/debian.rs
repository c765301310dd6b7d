//! The Debian guest (scripts/build-guest-debian: bookworm with systemd on a
//! virtio-blk root, the stock kernel) for the tests that boot it.

use std::process::Command;

use super::{project_root, require_hardware_kvm};

/// The shell prompt of root's automatic login on ttyS0.
pub const ROOT_PROMPT: &str = "root@hakoniwa:~# ";

/// Hardware KVM, and the Debian guest built and current: the script does
/// nothing when it is, builds it when it is not (on the host; inside the
/// rig it can only say so).
pub fn require_debian_guest() {
    require_hardware_kvm();
    let out = Command::new(project_root().join("scripts/build-guest-debian"))
        .output()
        .expect("cannot run scripts/build-guest-debian");
    assert!(
        out.status.success(),
        "scripts/build-guest-debian failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `hakoniwa run` of the Debian guest (512 MiB) with this kernel command
/// line, the image read-only as the first disk, plus `extra`.
pub fn debian_args<'a>(cmdline: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--memory",
        "512M",
        "--kernel",
        "build/guest/vmlinuz",
        "--initramfs",
        "build/guest/debian-initramfs.cpio.gz",
        "--disk",
        "path=build/guest/debian.img,readonly=on",
        "--cmdline",
        cmdline,
    ];
    args.extend_from_slice(extra);
    args
}
