//! Snapshot and restore of a running default guest (docs/snapshot.md): a
//! counter started in the guest's shell keeps counting in the restored VM,
//! and a guest using every virtio device (rng, disk, net, balloon, vsock,
//! input) keeps using them after a restore.
//!
//! `#[ignore]`d like the other guest tests; `scripts/test` runs them in
//! the rig.

mod common;

use std::time::{Duration, Instant};

use common::net::{md5_hex, HostLinks};
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
    let meta = common::snapshot_metadata(&snapshot);
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

fn balloon_mib(socket: &str) -> (u64, u64) {
    let (ok, out) = common::ctl(socket, &["balloon"]);
    assert!(ok, "{out}");
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    (
        info["target_mib"].as_u64().unwrap(),
        info["actual_mib"].as_u64().unwrap(),
    )
}

/// Waits until the guest's balloon holds `mib`.
fn wait_balloon(socket: &str, mib: u64) {
    let deadline = Instant::now() + GUEST_TIMEOUT;
    while balloon_mib(socket).1 != mib {
        assert!(
            Instant::now() < deadline,
            "the balloon did not reach {mib} MiB"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Fails at once, with what hakoniwa said, if it has exited (rather than
/// waiting for a shell that will never answer).
fn assert_running(vmm: &Vmm) {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", vmm.pid())).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    assert!(
        !matches!(state, None | Some("Z") | Some("X")),
        "hakoniwa has exited:\n--- stdout ---\n{}\n--- stderr ---\n{}",
        vmm.stdout(),
        vmm.stderr()
    );
}

/// The guest's I/O loop's round count (see below).
fn io_rounds(vmm: &mut Vmm) -> u64 {
    assert_running(vmm);
    // 0 until the loop has finished its first round.
    let out = vmm.shell("cat /tmp/io-rounds 2>/dev/null || echo 0");
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("no round count: {out:?}"))
}

/// Waits until the guest's I/O loop has done more than `rounds` rounds.
fn wait_io_past(vmm: &mut Vmm, rounds: u64) -> u64 {
    let deadline = Instant::now() + GUEST_TIMEOUT;
    loop {
        let now = io_rounds(vmm);
        if now > rounds {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the guest's disk and hwrng loop stopped at round {now}:\n{}",
            vmm.stderr()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn a_restored_guest_keeps_its_virtio_devices() {
    require_hardware_kvm();
    let pid = std::process::id();
    let tmp = std::env::temp_dir();
    let image = tmp.join(format!("hakoniwa-snap-disk-{pid}.img"));
    std::fs::File::create(&image)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let image = image.to_str().unwrap().to_string();
    let snapshot = tmp.join(format!("hakoniwa-snap-virtio-{pid}.snap"));
    let snapshot = snapshot.to_str().unwrap().to_string();
    let uds = temp_socket("snap-vsock");
    let tap = HostLinks::tap("hksnap0", "10.78.0.1");
    let disk = format!("path={image}");
    let net = format!("tap={},mac=52:54:00:aa:bb:02", tap.name());
    let vsock = format!("cid=3,uds={uds}");
    let flags = [
        "--cpus",
        "2",
        "--memory",
        "256M",
        "--rng",
        "--disk",
        &disk,
        "--net",
        &net,
        "--balloon",
        "--vsock",
        &vsock,
        "--input",
        "keyboard",
    ];

    let socket = temp_socket("snap-virtio-a");
    let mut args = vec!["run", "--api-socket", &socket];
    args.extend_from_slice(&flags);
    let mut vmm = Vmm::spawn(&args);
    vmm.wait_for(PROMPT);
    // 1 MiB of known data at the start of the disk, past the page cache.
    let written = vmm.shell(
        "dd if=/dev/urandom of=/tmp/before bs=4096 count=256 2>/dev/null; \
         dd if=/tmp/before of=/dev/vda bs=4096 oflag=direct conv=fsync 2>/dev/null; \
         md5sum /tmp/before | cut -d' ' -f1",
    );
    let before_sum = written.trim().to_string();
    let on_host = std::fs::read(&image).unwrap();
    assert_eq!(md5_hex(&on_host[..1 << 20]), before_sum);
    let net_up = vmm.shell(
        "ip link set eth0 up; ip addr add 10.78.0.2/24 dev eth0; \
         ping -c 1 -W 10 10.78.0.1 >/dev/null && echo ping-ok",
    );
    assert_eq!(net_up.trim(), "ping-ok");
    // The balloon takes 32 MiB before the snapshot.
    let (ok, out) = common::ctl(&socket, &["balloon", "--target", "32M"]);
    assert!(ok, "{out}");
    wait_balloon(&socket, 32);
    // Keep the disk and the rng busy: direct reads of 1 MiB and 64 random
    // bytes per round, the round count in a file, so requests are in
    // flight when the snapshot is taken. The count is renamed into place:
    // `echo > file` truncates first, and a read in between saw an empty
    // file (CI, 2026-11-26: "no round count").
    vmm.send(
        "(i=0; while :; do dd if=/dev/vda of=/dev/null bs=65536 count=16 iflag=direct 2>/dev/null; \
         dd if=/dev/hwrng of=/dev/null bs=64 count=1 2>/dev/null; i=$((i+1)); \
         echo $i > /tmp/io-rounds.new; mv /tmp/io-rounds.new /tmp/io-rounds; done) &\n",
    );
    let before_rounds = wait_io_past(&mut vmm, 3);

    let (ok, out) = common::ctl(&socket, &["snapshot", "--path", &snapshot]);
    assert!(
        ok,
        "snapshot failed: {out}\n--- stderr ---\n{}",
        vmm.stderr()
    );
    let meta = common::snapshot_metadata(&snapshot);
    let virtio = meta["devices"]["virtio"].as_object().unwrap();
    let mut ids: Vec<&str> = virtio.keys().map(String::as_str).collect();
    ids.sort();
    assert_eq!(
        ids,
        ["balloon0", "disk0", "keyboard0", "net0", "rng0", "vsock0"]
    );
    for (id, function) in virtio {
        assert_eq!(function["activated"], true, "{id} was not in use");
    }
    // Requests went through the disk: with two vCPUs it has a queue per
    // vCPU, and which one the loop's requests take is the guest's choice
    // (CI, 2026-11-27: all on queue 1, queue 0's next_avail 0).
    let taken: u64 = virtio["disk0"]["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["next_avail"].as_u64().unwrap())
        .sum();
    assert_ne!(taken, 0, "{}", virtio["disk0"]["queues"]);
    assert_eq!(virtio["balloon0"]["device"]["actual"], 32 * 256);
    // The original goes on after the snapshot: its devices were resumed.
    wait_io_past(&mut vmm, before_rounds + 2);
    drop(vmm);

    // Another MAC is refused, with one line, before the guest runs.
    let other_net = format!("tap={},mac=52:54:00:aa:bb:03", tap.name());
    let mut args = vec!["run", "--restore", &snapshot];
    args.extend(
        flags
            .iter()
            .map(|f| if *f == net { other_net.as_str() } else { f }),
    );
    let (code, _, stderr) = common::run_to_end(&args, GUEST_TIMEOUT);
    assert_ne!(code, 0, "{stderr}");
    assert_eq!(
        stderr.trim(),
        "hakoniwa: virtio device net0: the guest's MAC is 52:54:00:aa:bb:02, --net gives 52:54:00:aa:bb:03"
    );

    let socket = temp_socket("snap-virtio-b");
    let mut args = vec!["run", "--api-socket", &socket, "--restore", &snapshot];
    args.extend_from_slice(&flags);
    let mut restored = Vmm::spawn(&args);
    // The loop goes on: disk and hwrng requests complete after the restore.
    let rounds = wait_io_past(&mut restored, before_rounds);
    println!("I/O rounds: {before_rounds} before the snapshot, {rounds} after the restore");
    let random =
        restored.shell("dd if=/dev/hwrng bs=64 count=1 2>/dev/null | od -An -tx1 | tr -d ' \\n'");
    assert_eq!(random.trim().len(), 128, "{random}");
    // What was written before the snapshot reads back from the disk.
    let read_back = restored.shell(
        "dd if=/dev/vda bs=4096 count=256 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1",
    );
    assert_eq!(read_back.trim(), before_sum);
    // A new write lands in the image.
    let after_sum = restored.shell(
        "dd if=/dev/urandom of=/tmp/after bs=4096 count=64 2>/dev/null; \
         dd if=/tmp/after of=/dev/vda bs=4096 seek=1024 oflag=direct conv=fsync 2>/dev/null; \
         md5sum /tmp/after | cut -d' ' -f1",
    );
    let on_host = std::fs::read(&image).unwrap();
    assert_eq!(
        md5_hex(&on_host[4 << 20..(4 << 20) + (256 << 10)]),
        after_sum.trim()
    );
    // The network answers.
    let ping = restored.shell("ping -c 2 -W 10 10.78.0.1 >/dev/null && echo ping-ok");
    assert_eq!(ping.trim(), "ping-ok");
    // vsock: old connections were reset (TRANSPORT_RESET), new ones work.
    let listener = std::os::unix::net::UnixListener::bind(format!("{uds}_5000")).unwrap();
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut conn, _) = listener.accept().unwrap();
        let mut got = String::new();
        conn.read_to_string(&mut got).unwrap();
        conn.write_all(format!("pong:{got}").as_bytes()).unwrap();
    });
    let answer = restored.shell("echo ping-$((2+3)) | hk-vsock connect 2 5000");
    server.join().unwrap();
    assert_eq!(answer.trim(), "pong:ping-5");
    // The keyboard is still the guest's.
    let input = restored.shell("grep -c 'hakoniwa virtio keyboard' /proc/bus/input/devices");
    assert_eq!(input.trim(), "1", "{input}");
    // The balloon kept its size and target, and still follows the host.
    assert_eq!(balloon_mib(&socket), (32, 32));
    let (ok, out) = common::ctl(&socket, &["balloon", "--target", "0"]);
    assert!(ok, "{out}");
    wait_balloon(&socket, 0);

    let (ok, out) = common::ctl(&socket, &["shutdown"]);
    assert!(ok, "{out}");
    let status = restored.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", restored.stderr());
    let _ = std::fs::remove_file(&snapshot);
    let _ = std::fs::remove_file(&image);
    let _ = std::fs::remove_file(format!("{uds}_5000"));
}
