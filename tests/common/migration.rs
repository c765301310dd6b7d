//! Migrations as guest tests drive them: a destination waiting on a
//! free loopback port, `ctl migrate` bounded in time, the report.

use std::net::TcpListener;
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

/// A destination waiting on `port` with `flags`; returns it once it listens.
pub fn destination(port: u16, socket: &str, flags: &[&str]) -> Vmm {
    let address = format!("tcp:127.0.0.1:{port}");
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

/// `ctl migrate` to `port`: (success, stdout + stderr). A migration that
/// hangs fails the test instead of hanging it.
pub fn migrate(socket: &str, port: u16, mode: &str, extra: &[&str]) -> (bool, String) {
    let to = format!("tcp:127.0.0.1:{port}");
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
