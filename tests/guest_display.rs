//! Integration tests of the virtual display (seed 000): a real VNC client
//! (vncdotool, tests/display/vnc_client.py) against real guests drawing on
//! the stock kernel's vesafb. Like tests/guest.rs they run in the rig
//! (scripts/test). Pictures are checked against ground truth: the same
//! guest tool (hk-fbdraw) drawing into a file on the host.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{ctl, project_root, require_hardware_kvm, temp_socket, Vmm, PROMPT};

const WIDTH: u32 = 1024;
const HEIGHT: u32 = 768;
/// The deterministic picture every check draws.
const SCENE: &str = "hk-fbdraw -p scene -s 7";

fn python() -> PathBuf {
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
fn vnc_client(args: &[&str]) -> (bool, String) {
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

fn tmp(name: &str) -> String {
    std::env::temp_dir()
        .join(format!("hakoniwa-display-{}-{name}", std::process::id()))
        .to_str()
        .unwrap()
        .to_string()
}

/// The expected screen: hk-fbdraw, built for the host, draws `args` into a
/// linear XRGB file of the display's size.
fn expected_picture(args: &str) -> String {
    let tool = tmp("hk-fbdraw");
    if !Path::new(&tool).exists() {
        let status = Command::new("gcc")
            .args(["-O2", "-o", &tool])
            .arg(project_root().join("guest/tools/hk-fbdraw.c"))
            .status()
            .expect("cannot run gcc");
        assert!(status.success(), "gcc hk-fbdraw.c failed");
    }
    let raw = tmp(&format!("expected-{}.raw", args.replace([' ', '-'], "_")));
    let _ = std::fs::remove_file(&raw);
    for step in ["-p clear", args] {
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

fn display_info(socket: &str) -> serde_json::Value {
    let (ok, out) = ctl(socket, &["display"]);
    assert!(ok, "ctl display: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Waits until the display has run `n` more detection periods, so what the
/// guest drew is on the screen clients see.
fn settle(socket: &str) {
    let start = display_info(socket)["periods"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while display_info(socket)["periods"].as_u64().unwrap() < start + 3 {
        assert!(Instant::now() < deadline, "the display stopped refreshing");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Captures the screen (retrying while the guest's latest drawing may
/// still be on its way) until it equals `raw`.
fn assert_screen_is(address: &str, password: Option<&str>, encoding: &str, raw: &str, what: &str) {
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

fn boot_with_display(options: &str, socket: &str, extra: &[&str]) -> (Vmm, String) {
    let mut args = vec![
        "run",
        "--memory",
        "512M",
        "--api-socket",
        socket,
        "--display",
        options,
    ];
    args.extend_from_slice(extra);
    let mut vmm = Vmm::spawn(&args);
    vmm.wait_for(PROMPT);
    let info = display_info(socket);
    let address = info["vnc_address"].as_str().unwrap().to_string();
    // The stock kernel found the framebuffer.
    let fb = vmm
        .shell("cat /sys/class/graphics/fb0/virtual_size /sys/class/graphics/fb0/bits_per_pixel");
    assert_eq!(
        fb.split_whitespace().collect::<Vec<_>>(),
        ["1024,768", "32"],
        "{fb}"
    );
    (vmm, address)
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn vnc_client_sees_the_guest_drawing_with_every_detection_method_and_sends_input() {
    require_hardware_kvm();
    let socket = temp_socket("display-linear");
    let metrics = tmp("metrics.jsonl");
    let (mut vmm, address) = boot_with_display(
        "vnc=127.0.0.1:0,dirty=dirtylog",
        &socket,
        &["--metrics", &metrics, "--metrics-interval", "1"],
    );
    assert_eq!(
        vmm.shell("grep -o 'hk.fb=[a-z]*' /proc/cmdline").trim(),
        "hk.fb=linear"
    );

    // A filled rectangle lands exactly where the guest drew it, in Raw and
    // in ZRLE.
    let fill = "hk-fbdraw -p fill -x 100 -y 120 -w 64 -H 48 -c 0xff8000";
    let out = vmm.shell(&format!("hk-fbdraw -p clear && {fill}"));
    assert!(out.contains("pattern=fill"), "{out}");
    settle(&socket);
    let expected = expected_picture(fill);
    assert_screen_is(&address, None, "raw", &expected, "fill raw");
    assert_screen_is(&address, None, "zrle", &expected, "fill zrle");

    // Switch the detection method at run time; each draws the same scene and
    // gives the same picture, and a fresh change after the switch shows.
    let scene = expected_picture(SCENE);
    for method in ["wp", "compare", "dirtylog"] {
        let (ok, out) = ctl(&socket, &["display", "--dirty", method]);
        assert!(ok, "switch to {method}: {out}");
        let info = display_info(&socket);
        assert_eq!(info["dirty"], method, "{info}");
        let out = vmm.shell(&format!("hk-fbdraw -p clear && {SCENE}"));
        assert!(out.contains("pattern=scene"), "{out}");
        settle(&socket);
        assert_screen_is(&address, None, "zrle", &scene, &format!("scene {method}"));
        let info = display_info(&socket);
        assert!(info["pages_changed"].as_u64().unwrap() > 0, "{info}");
        if method == "wp" {
            assert!(info["tracker"]["wp_faults"].as_u64().unwrap() > 0, "{info}");
        }
    }
    let info = display_info(&socket);
    let ratio = info["useful_ratio"].as_f64().unwrap();
    assert!(ratio > 0.0 && ratio <= 1.0, "{info}");
    assert!(info["kvm"]["exits"].as_u64().unwrap_or(0) > 0, "{info}");
    // The periodic metrics line carries the same figures.
    let lines = std::fs::read_to_string(&metrics).unwrap();
    let last: serde_json::Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert!(last["display"]["periods"].as_u64().unwrap() > 0, "{last}");
    assert_eq!(last["display"]["dirty"], "dirtylog", "{last}");

    // Keyboard and pointer from the client reach the guest's evdev devices.
    vmm.shell("(hk-input -n 4 -t 120 > /tmp/input.txt 2>&1 &)");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !vmm.shell("cat /tmp/input.txt").contains("hk-input: ready") {
        assert!(Instant::now() < deadline, "hk-input did not start");
        std::thread::sleep(Duration::from_millis(300));
    }
    let (ok, err) = vnc_client(&["key", &address, "a"]);
    assert!(ok, "{err}");
    let (ok, err) = vnc_client(&["move", &address, "512", "384"]);
    assert!(ok, "{err}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let events = vmm.shell("cat /tmp/input.txt");
        let all = ["key 30 1", "key 30 0", "abs 0 512", "abs 1 384"];
        if all.iter().all(|e| events.contains(e)) {
            break;
        }
        assert!(Instant::now() < deadline, "input did not arrive: {events}");
        std::thread::sleep(Duration::from_millis(300));
    }
    vmm.send("poweroff\n");
    assert!(vmm.wait_exit(Duration::from_secs(60)).success());
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn tiled_framebuffer_gives_the_same_picture_and_vnc_auth_is_enforced() {
    require_hardware_kvm();
    let socket = temp_socket("display-tiled");
    let (mut vmm, address) = boot_with_display(
        "vnc=127.0.0.1:0,layout=tiled,dirty=wp,refresh=event,password=hk-pass",
        &socket,
        &[],
    );
    assert_eq!(
        vmm.shell("grep -o 'hk.fb=[a-z]*' /proc/cmdline").trim(),
        "hk.fb=tiled"
    );
    let out = vmm.shell(&format!("hk-fbdraw -p clear && {SCENE}"));
    assert!(out.contains("layout=tiled"), "{out}");
    settle(&socket);
    // The guest drew tiles; the client sees the same linear picture.
    assert_screen_is(
        &address,
        Some("hk-pass"),
        "zrle",
        &expected_picture(SCENE),
        "tiled scene",
    );
    let (ok, err) = vnc_client(&["capture", &address, &tmp("nopass.png")]);
    assert!(!ok, "a capture without the password worked");
    let (ok, err2) = vnc_client(&[
        "capture",
        &address,
        &tmp("badpass.png"),
        "--password",
        "wrong",
    ]);
    assert!(!ok, "a capture with a wrong password worked ({err})");
    assert!(!err2.is_empty());
    // With refresh=event the display idles at long periods, yet a drawing
    // still shows promptly.
    let info = display_info(&socket);
    assert_eq!(info["refresh"], "event", "{info}");
    let fill = "hk-fbdraw -p fill -x 300 -y 200 -w 100 -H 100 -c 0x00ff00";
    vmm.shell(fill);
    settle(&socket);
    let want = expected_picture(SCENE);
    // Fill on top of the scene, as the guest did.
    let tool = tmp("hk-fbdraw");
    let status = Command::new(&tool)
        .args(fill.split_whitespace().skip(1))
        .args(["-F", &want, "-W", "1024", "-G", "768", "-l", "linear"])
        .output()
        .unwrap();
    assert!(status.status.success());
    assert_screen_is(&address, Some("hk-pass"), "raw", &want, "tiled fill");
    vmm.send("poweroff\n");
    assert!(vmm.wait_exit(Duration::from_secs(60)).success());
}
