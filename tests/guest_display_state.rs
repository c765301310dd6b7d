//! A VM with a display keeps its picture through a snapshot and through
//! precopy, postcopy and hybrid migration (docs/display.md, "Snapshots and
//! migration"): a real VNC client connected to the restored or migrated-in
//! VM sees what the guest had drawn, pixel for pixel, before the guest
//! draws anything new, and later drawing keeps arriving. Every dirty
//! method is on each side once. The precopy runs while the guest draws
//! continuously under `dirty=dirtylog` (KVM's manual dirty-log protection
//! on for the whole VM) and writes 24 MiB once: it must converge, each
//! round finding only the pages written since the previous one.
//!
//! `#[ignore]`d like the other guest tests; `scripts/test` runs them in
//! the rig.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::display::{assert_screen_is, display_info, expected_after, settle, tmp, SCENE};
use common::migration::{
    destination, destination_with, free_port, migrate, migrate_with, report, AUTH_NONE,
};
use common::{require_hardware_kvm, temp_socket, Vmm, GUEST_TIMEOUT, PROMPT};

/// One vCPU, as tests/guest_migration.rs explains.
const FLAGS: &[&str] = &["--cpus", "1", "--memory", "512M"];

const FILL: &str = "hk-fbdraw -p fill -x 300 -y 200 -w 100 -H 100 -c 0x00ff00";

/// Pages the guest writes once during the precopy (24 MiB).
const WRITTEN_PAGES: u64 = 6144;

fn display(method: &str) -> String {
    format!("vnc=127.0.0.1:0,dirty={method}")
}

fn vnc_address(socket: &str) -> String {
    display_info(socket)["vnc_address"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The VNC picture of the VM at `socket` is `raw` once the display has
/// run a few periods.
fn shows(socket: &str, raw: &str, what: &str) {
    // A restored or migrated-in VM serves its API once its vCPUs run.
    let deadline = Instant::now() + GUEST_TIMEOUT;
    while !Path::new(socket).exists() {
        assert!(Instant::now() < deadline, "{what}: no API socket {socket}");
        std::thread::sleep(Duration::from_millis(100));
    }
    settle(socket);
    assert_screen_is(&vnc_address(socket), None, "zrle", raw, what);
}

/// A migration destination with a display using `method`.
///
/// The migrations that move the VM here run without TLS (`auth=none`):
/// this test is about the picture and the dirty log, and its precopy is
/// built on a 32 MiB/s limit the link must reach. In the rig, L1 is
/// emulated (TCG, one vCPU), and so is AES: TLS 1.3 carried 16-27 MiB/s
/// there against 160 MiB/s plain (one link, nothing else running), and
/// 3 MiB/s with the two guests of this test beside it, so the 120 s
/// hand-over did not happen (CI, 2026-11-26; evidence
/// ci-tls-guest-display-state.log). TLS migration is tested in
/// guest_migration; the refusal below, which names our display only to
/// an authenticated peer, still runs over TLS.
fn display_destination(port: u16, socket: &str, method: &str) -> Vmm {
    let flag = display(method);
    let mut flags = FLAGS.to_vec();
    flags.extend(["--display", &flag]);
    destination_with(port, AUTH_NONE, socket, &flags)
}

/// `ctl migrate` to a `display_destination`.
fn migrate_plain(socket: &str, port: u16, mode: &str, extra: &[&str]) -> (bool, String) {
    migrate_with(socket, port, AUTH_NONE, mode, extra)
}

/// The source ended after handing its VM over to `destination`. If it
/// did not, both sides' messages and the source's report say why.
fn handed_over(source: &mut Vmm, source_socket: &str, destination: &Vmm) {
    let Some(status) = source.exit_within(Duration::from_secs(120)) else {
        panic!(
            "the source did not hand over within 120 s\n--- report ---\n{}\n--- source stderr ---\n{}\n--- destination stderr ---\n{}\n--- destination stdout ---\n{}",
            common::ctl(source_socket, &["migration"]).1,
            source.stderr(),
            destination.stderr(),
            destination.stdout()
        );
    };
    assert_eq!(status.code(), Some(0), "source: {}", source.stderr());
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn a_vm_with_a_display_keeps_its_picture_through_snapshots_and_migrations() {
    require_hardware_kvm();
    let sockets: Vec<String> = ["a", "b", "c", "d", "e", "x"]
        .iter()
        .map(|n| temp_socket(&format!("dstate-{n}")))
        .collect();
    let scene = expected_after(&[SCENE]);
    let scene_and_fill = expected_after(&[SCENE, FILL]);

    // A: dirtylog. Draws the scene.
    let metrics = tmp("source-metrics.jsonl");
    let flag = display("dirtylog");
    let mut args = vec!["run", "--api-socket", &sockets[0], "--display", &flag];
    args.extend(["--metrics", &metrics, "--metrics-interval", "1"]);
    args.extend_from_slice(FLAGS);
    let mut a = Vmm::spawn(&args);
    a.wait_for(PROMPT);
    let out = a.shell(&format!("hk-fbdraw -p clear && {SCENE}"));
    assert!(out.contains("pattern=scene"), "{out}");
    shows(&sockets[0], &scene, "A: scene");

    // Snapshot A, restore it as B under wp: the picture is there before
    // the guest draws again, and new drawing shows.
    let snapshot = tmp("display.snap");
    let (ok, out) = common::ctl(&sockets[0], &["snapshot", "--path", &snapshot]);
    assert!(ok, "snapshot: {out}\n{}", a.stderr());
    let meta = common::snapshot_metadata(&snapshot);
    assert_eq!(
        meta["machine"]["display"], "1024x768 linear",
        "{}",
        meta["machine"]
    );
    let flag = display("wp");
    let mut args = vec!["run", "--restore", &snapshot, "--api-socket", &sockets[1]];
    args.extend(["--display", &flag]);
    args.extend_from_slice(FLAGS);
    let mut b = Vmm::spawn(&args);
    shows(&sockets[1], &scene, "B (restored, wp): scene");
    b.shell(FILL);
    shows(&sockets[1], &scene_and_fill, "B: scene and fill");
    b.send("poweroff\n");
    assert!(b.wait_exit(Duration::from_secs(60)).success());
    // A restore with another screen is refused with one line.
    let mut args = vec!["run", "--restore", &snapshot];
    args.extend(["--display", "vnc=127.0.0.1:0,width=800,height=600"]);
    args.extend_from_slice(FLAGS);
    let mut refused = Vmm::spawn(&args);
    assert!(!refused.wait_exit(Duration::from_secs(60)).success());
    assert!(
        refused
            .stderr()
            .contains("it has a 1024x768 linear display, --display gives a 800x600 linear display"),
        "{}",
        refused.stderr()
    );
    std::fs::remove_file(&snapshot).unwrap();

    // A destination with another screen refuses A at the hello.
    let port = free_port();
    let mut x = destination(
        port,
        &sockets[5],
        &[FLAGS, &["--display", "vnc=127.0.0.1:0,layout=tiled"]].concat(),
    );
    let (ok, out) = migrate(&sockets[0], port, "precopy", &[]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("the VM has a 1024x768 linear display, this one has a 1024x768 tiled display"),
        "{out}"
    );
    let status = x.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(125), "{}", x.stderr());

    // Precopy A -> C (compare) while A draws all the time, and writes
    // 24 MiB once, during the first round: a later round must find them;
    // they take 750 ms to send at 32 MiB/s, over the 300 ms downtime
    // target, so precopy converges only once a round finds far fewer
    // pages. A log that kept every page written since the start (KVM's
    // manual protection without a clear) finds the 24 MiB again in every
    // round and runs out of rounds.
    //
    // The write must be over before the first round's harvest. Timing it
    // does not hold in the rig: a `sleep 1` before the migration let the
    // 24 MiB go out with the first round's bulk copy (CI, 2026-11-26,
    // rounds [4799, 492]); a `cp` started once the round began was still
    // writing when precopy converged (rig, 2026-11-26, rounds [3746, 529]:
    // cp in the nested guest shares L1's one emulated CPU with both VMMs).
    // So the destination is stopped (SIGSTOP) as soon as the first round
    // starts, which holds that round (at 32 MiB/s its 184 MiB of random
    // data take at least 5.75 s, so it cannot be over by then) until the
    // guest says the copy is done, and then let go.
    a.shell("dd if=/dev/urandom of=/dev/shm/blob bs=1M count=160 2>/dev/null");
    a.shell("dd if=/dev/urandom of=/dev/shm/src bs=1M count=24 2>/dev/null");
    a.shell(
        "(i=0; while :; do i=$((i+1)); hk-fbdraw -p fill -x 0 -y 0 -w 256 -H 256 -c $((i * 40503 % 16777216)) >/dev/null; sleep 0.05; done) & echo $! > /tmp/draw.pid",
    );
    let port = free_port();
    let mut c = display_destination(port, &sockets[2], "compare");
    let (ok, out) = migrate_plain(
        &sockets[0],
        port,
        "precopy",
        &["--max-bandwidth", "32", "--no-wait"],
    );
    assert!(ok, "precopy: {out}\n{}", a.stderr());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = report(&sockets[0]);
        if r["phase"] == "precopy" {
            assert_eq!(
                r["rounds"], 0,
                "the first round ended before the write: {r}"
            );
            break;
        }
        // Until it starts, the report may still be the refused migration's.
        assert!(
            Instant::now() < deadline
                && !["stop_and_copy", "completed"].contains(&r["phase"].as_str().unwrap_or("")),
            "no precopy round to write during: {r}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    c.signal(libc::SIGSTOP);
    let out = a.shell("cp /dev/shm/src /dev/shm/written && echo copied");
    assert!(out.contains("copied"), "{out}");
    let r = report(&sockets[0]);
    c.signal(libc::SIGCONT);
    assert_eq!(
        r["rounds"], 0,
        "the first round ended before the write: {r}"
    );
    handed_over(&mut a, &sockets[0], &c);
    let last = std::fs::read_to_string(&metrics).unwrap();
    let last: serde_json::Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
    let m = &last["migration"];
    assert_eq!(m["phase"], "completed", "{m}");
    let rounds: Vec<u64> = m["round_log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["dirty_pages"].as_u64().unwrap())
        .collect();
    println!("precopy with a dirtylog display: dirty pages per round {rounds:?}");
    assert!(
        rounds.iter().sum::<u64>() >= WRITTEN_PAGES,
        "the rounds did not see the 24 MiB written: {rounds:?}"
    );
    assert!(
        rounds.len() < 30,
        "precopy did not converge in 30 rounds: {rounds:?}"
    );
    assert!(
        *rounds.last().unwrap() < WRITTEN_PAGES / 2,
        "the last round still found the 24 MiB: {rounds:?}"
    );
    c.shell("kill $(cat /tmp/draw.pid)");
    let out = c.shell(&format!("sleep 0.5; hk-fbdraw -p clear && {SCENE}"));
    assert!(out.contains("pattern=scene"), "{out}");
    shows(&sockets[2], &scene, "C (precopy in, compare): scene");

    // Postcopy C -> D (wp): the picture arrives with the state.
    let port = free_port();
    let mut d = display_destination(port, &sockets[3], "wp");
    let (ok, out) = migrate_plain(&sockets[2], port, "postcopy", &[]);
    assert!(ok, "postcopy: {out}\n{}", c.stderr());
    handed_over(&mut c, &sockets[2], &d);
    shows(&sockets[3], &scene, "D (postcopy in, wp): scene");
    d.shell(FILL);
    shows(&sockets[3], &scene_and_fill, "D: scene and fill");

    // Hybrid D -> E (dirtylog).
    let port = free_port();
    let mut e = display_destination(port, &sockets[4], "dirtylog");
    let (ok, out) = migrate_plain(&sockets[3], port, "hybrid", &[]);
    assert!(ok, "hybrid: {out}\n{}", d.stderr());
    handed_over(&mut d, &sockets[3], &e);
    shows(
        &sockets[4],
        &scene_and_fill,
        "E (hybrid in, dirtylog): scene and fill",
    );
    let out = e.shell(&format!("hk-fbdraw -p clear && {SCENE}"));
    assert!(out.contains("pattern=scene"), "{out}");
    shows(&sockets[4], &scene, "E: scene again");
    e.send("poweroff\n");
    assert!(e.wait_exit(Duration::from_secs(60)).success());
}
