//! The virtual display as guest tests see it: a real VNC client
//! (vncdotool, tests/display/vnc_client.py) capturing the screen, and the
//! ground truth it is compared with — the same guest tool (hk-fbdraw)
//! drawing into a file on the host.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{ctl, project_root};

pub const WIDTH: u32 = 1024;
pub const HEIGHT: u32 = 768;
/// The deterministic picture every check draws.
pub const SCENE: &str = "hk-fbdraw -p scene -s 7";

pub fn python() -> PathBuf {
    let python = project_root().join("build/pyenv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: the display tests need the project's Python environment (scripts/lib/pyenv.sh, run by scripts/test)",
        python.display()
    );
    python
}

/// How long one vnc_client.py run may take: vncdotool's own timeout covers
/// only the connection, and its Twisted reactor has been seen to hang.
const VNC_CLIENT_TIMEOUT_S: &str = "90";

/// Runs tests/display/vnc_client.py; (success, stderr).
pub fn vnc_client(args: &[&str]) -> (bool, String) {
    let out = Command::new("timeout")
        .args(["-k", "5", VNC_CLIENT_TIMEOUT_S])
        .arg(python())
        .arg(project_root().join("tests/display/vnc_client.py"))
        .args(args)
        .output()
        .expect("cannot run vnc_client.py");
    let mut err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if out.status.code() == Some(124) || out.status.code().is_none() {
        err =
            format!("vnc_client.py {args:?} did not finish within {VNC_CLIENT_TIMEOUT_S} s; {err}");
    }
    (out.status.success(), err)
}

pub fn tmp(name: &str) -> String {
    std::env::temp_dir()
        .join(format!("hakoniwa-display-{}-{name}", std::process::id()))
        .to_str()
        .unwrap()
        .to_string()
}

/// The expected screen: hk-fbdraw, built for the host, draws `args` into a
/// linear XRGB file of the display's size.
pub fn expected_picture(args: &str) -> String {
    expected_after(&[args])
}

/// The expected screen after the guest cleared it and drew each of
/// `steps` (hk-fbdraw command lines) in turn.
pub fn expected_after(steps: &[&str]) -> String {
    let tool = tmp("hk-fbdraw");
    if !Path::new(&tool).exists() {
        let status = Command::new("gcc")
            .args(["-O2", "-o", &tool])
            .arg(project_root().join("guest/tools/hk-fbdraw.c"))
            .status()
            .expect("cannot run gcc");
        assert!(status.success(), "gcc hk-fbdraw.c failed");
    }
    let name = steps.join("+").replace([' ', '-', '+'], "_");
    let raw = tmp(&format!("expected-{name}.raw"));
    let _ = std::fs::remove_file(&raw);
    for step in std::iter::once(&"-p clear").chain(steps) {
        let mut command = Command::new(&tool);
        command.args(step.split_whitespace().skip_while(|w| *w == "hk-fbdraw"));
        command.args(["-F", &raw, "-W", "1024", "-G", "768", "-l", "linear"]);
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "{step}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    raw
}

pub fn display_info(socket: &str) -> serde_json::Value {
    let (ok, out) = ctl(socket, &["display"]);
    assert!(ok, "ctl display: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Waits until the display has run `n` more detection periods, so what the
/// guest drew is on the screen clients see.
pub fn settle(socket: &str) {
    let start = display_info(socket)["periods"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while display_info(socket)["periods"].as_u64().unwrap() < start + 3 {
        assert!(Instant::now() < deadline, "the display stopped refreshing");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Captures the screen (retrying while the guest's latest drawing may
/// still be on its way) until it equals `raw`.
pub fn assert_screen_is(
    address: &str,
    password: Option<&str>,
    encoding: &str,
    raw: &str,
    what: &str,
) {
    let png = tmp(&format!("capture-{}.png", what.replace(' ', "_")));
    let mut last = String::new();
    for _ in 0..5 {
        let mut args = vec!["capture", address, &png, "--encoding", encoding];
        if let Some(p) = password {
            args.extend(["--password", p]);
        }
        let (ok, err) = vnc_client(&args);
        assert!(ok, "{what}: capture failed: {err}");
        let w = WIDTH.to_string();
        let h = HEIGHT.to_string();
        let (same, diff) = vnc_client(&["matches-raw", &png, raw, &w, &h]);
        if same {
            return;
        }
        last = diff;
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("{what}: the VNC picture is not the guest's drawing: {last}");
}
