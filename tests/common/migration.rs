//! Migrations as guest tests drive them: a destination waiting on a
//! free loopback port, `ctl migrate` bounded in time, the report. Both
//! sides authenticate with TLS certificates made for the test run
//! (`tls()`), unless a test asks for `AUTH_NONE`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{ctl, hakoniwa, Vmm, GUEST_TIMEOUT};

/// A port free right now on the loopback.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The address suffix of a migration without authentication.
pub const AUTH_NONE: &str = ",auth=none";

/// The address suffix of a migration over TLS with this run's
/// certificates (one CA; the destination's certificate names 127.0.0.1).
pub fn tls() -> String {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| credentials("tls"));
    format!(",tls={}", dir.display())
}

/// A new directory with a CA of its own and the destination's and the
/// source's certificates and keys signed by it, under the names
/// `tls=DIR` expects (docs/migration.md): the unit tests' own.
pub use vmm::migration::tls::test_credentials as credentials;

/// A destination waiting on `port` with `flags`, over TLS; returns it
/// once it listens.
pub fn destination(port: u16, socket: &str, flags: &[&str]) -> Vmm {
    destination_with(port, &tls(), socket, flags)
}

/// A destination whose address ends in `auth` (`tls()`, `AUTH_NONE`).
pub fn destination_with(port: u16, auth: &str, socket: &str, flags: &[&str]) -> Vmm {
    let address = format!("tcp:127.0.0.1:{port}{auth}");
    let mut args = vec!["run", "--incoming", &address, "--api-socket", socket];
    args.extend_from_slice(flags);
    let vmm = Vmm::spawn(&args);
    let deadline = Instant::now() + GUEST_TIMEOUT;
    while !vmm.stderr().contains("waiting for a migration") {
        assert!(
            Instant::now() < deadline,
            "the destination does not listen: {}",
            vmm.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    vmm
}

/// How long one `ctl migrate` may take in the rig.
pub const MIGRATE_TIMEOUT_S: &str = "300";

/// `ctl migrate` to `port` over TLS: (success, stdout + stderr). A
/// migration that hangs fails the test instead of hanging it.
pub fn migrate(socket: &str, port: u16, mode: &str, extra: &[&str]) -> (bool, String) {
    migrate_with(socket, port, &tls(), mode, extra)
}

/// `ctl migrate` to `port` with `auth` (`tls()`, `AUTH_NONE`).
pub fn migrate_with(
    socket: &str,
    port: u16,
    auth: &str,
    mode: &str,
    extra: &[&str],
) -> (bool, String) {
    let to = format!("tcp:127.0.0.1:{port}{auth}");
    let out = std::process::Command::new("timeout")
        .args([MIGRATE_TIMEOUT_S, hakoniwa(), "ctl", "--api-socket", socket])
        .args(["migrate", "--to", &to, "--mode", mode])
        .args(extra)
        .output()
        .expect("cannot run hakoniwa ctl");
    let mut text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(124) {
        text += &format!("\n(ctl migrate did not finish within {MIGRATE_TIMEOUT_S} s)");
    }
    (out.status.success(), text)
}

/// The migration report of the VMM at `socket`.
pub fn report(socket: &str) -> serde_json::Value {
    let (ok, out) = ctl(socket, &["migration"]);
    assert!(ok, "ctl migration: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// A counter in the background, ten a second. Each value is written aside
/// and renamed: `echo $i > /tmp/count` truncates first, and a `cat` in
/// between reads an empty file (the migration soak caught one). Returns
/// once the first value is there.
pub const COUNTER: &str = "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done) & while [ ! -e /tmp/count ]; do sleep 0.05; done";

/// A fresh sparse 16 MiB raw image in the temporary directory, the disk
/// every VM of a migration chain shares.
pub fn shared_image(name: &str) -> String {
    let path = std::env::temp_dir().join(format!("hakoniwa-{name}-{}.img", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(16 << 20).unwrap();
    path.to_str().unwrap().to_string()
}

/// The guest's counter (see [`COUNTER`]).
pub fn counter(vmm: &mut Vmm) -> u64 {
    let out = vmm.shell("cat /tmp/count");
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("no counter: {out}"))
}

/// Starts the counter; returns its first value.
pub fn counter_started(vmm: &mut Vmm) -> u64 {
    vmm.shell(COUNTER);
    std::thread::sleep(Duration::from_millis(500));
    counter(vmm)
}

/// Whether this host's kernel gives `MADV_HUGEPAGE` memory transparent
/// huge pages (`enabled` is `always` or `madvise`).
pub fn host_has_thp() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
}

/// The VmFlags of process `pid`'s mapping of `bytes` bytes (its guest
/// RAM: no other mapping of a VMM is that large) and its AnonHugePages,
/// KiB.
pub fn ram_mapping(pid: i32, bytes: u64) -> (Vec<String>, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut inside = false;
    let (mut flags, mut huge) = (None, 0);
    for line in smaps.lines() {
        let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
        if let Some((Ok(a), Ok(b))) =
            range.map(|(a, b)| (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)))
        {
            inside = b - a == bytes;
        } else if inside {
            if let Some(kib) = line.strip_prefix("AnonHugePages:") {
                huge = kib
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .unwrap_or(0);
            } else if let Some(f) = line.strip_prefix("VmFlags:") {
                flags = Some(f.split_whitespace().map(String::from).collect());
            }
        }
    }
    (
        flags.unwrap_or_else(|| panic!("process {pid} has no mapping of {bytes} bytes")),
        huge,
    )
}
