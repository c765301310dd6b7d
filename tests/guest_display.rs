//! Integration tests of the virtual display (seed 000): a real VNC client
//! (vncdotool, tests/display/vnc_client.py) against real guests drawing on
//! the stock kernel's vesafb. Like tests/guest.rs they run in the rig
//! (scripts/test). Pictures are checked against ground truth: the same
//! guest tool (hk-fbdraw) drawing into a file on the host.

mod common;

use std::time::{Duration, Instant};

use common::display::{
    assert_screen_is, display_info, expected_after, expected_picture, settle, tmp, vnc_client,
    SCENE,
};
use common::{ctl, require_hardware_kvm, temp_socket, Vmm, PROMPT};

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
    // Fill on top of the scene, as the guest did.
    let want = expected_after(&[SCENE, fill]);
    assert_screen_is(&address, Some("hk-pass"), "raw", &want, "tiled fill");
    vmm.send("poweroff\n");
    assert!(vmm.wait_exit(Duration::from_secs(60)).success());
}
