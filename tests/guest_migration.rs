//! Live migration between two hakoniwa processes on one host
//! (docs/migration.md): the guest's memory is the same after each mode
//! (a checksum computed inside the guest before and after), the guest
//! keeps running through it (a counter), its disk, one image both sides
//! share, has what the guest wrote before each migration, a migrated-in
//! VM can migrate again, and the failure cases end with one clear line
//! and lose nothing that was not already gone.
//!
//! `#[ignore]`d like the other guest tests; `scripts/test` runs them in
//! the rig.

mod common;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::migration::{
    counter, counter_started, credentials, destination, destination_with, free_port, host_has_thp,
    migrate, migrate_with, ram_mapping, report, shared_image, tls, AUTH_NONE, COUNTER,
};
use common::net::{md5_hex, HostLinks};
use common::relay::{Fault, Relay};
use common::{ctl, require_hardware_kvm, temp_socket, Vmm, GUEST_TIMEOUT, PROMPT};

/// The machine on both sides. One vCPU: under the rig's emulated nested
/// SVM, two-vCPU guests migrated back and forth three times took ~5 min
/// and three times panicked L1's kernel ("stack guard page was hit" in a
/// vCPU thread); with one vCPU the same chain runs in ~60 s and held in
/// every run. Two vCPUs moving under postcopy are covered by the network
/// test below, and two-vCPU state by tests/guest_snapshot.rs.
const FLAGS: &[&str] = &["--cpus", "1", "--memory", "512M"];

/// The two-vCPU machine of the network test.
const FLAGS_2CPU: &[&str] = &["--cpus", "2", "--memory", "512M"];

/// Starts the guest's workload: 96 MiB of random data in a tmpfs with its
/// checksum, and a counter in the background. Returns the checksum.
fn start_workload(vmm: &mut Vmm) -> String {
    let out = vmm.shell(
        "dd if=/dev/urandom of=/dev/shm/blob bs=1M count=96 2>/dev/null; md5sum /dev/shm/blob | cut -d' ' -f1",
    );
    vmm.shell(COUNTER);
    let sum = out.trim().to_string();
    assert_eq!(sum.len(), 32, "{out}");
    sum
}

/// Writes 256 KiB of random data to the guest's disk at `kib` KiB with
/// O_DIRECT and no flush (what reaches the device without the guest
/// asking for durability); returns its checksum.
fn write_disk(vmm: &mut Vmm, kib: u64) -> String {
    let out = vmm.shell(&format!(
        "dd if=/dev/urandom of=/tmp/chunk bs=4096 count=64 2>/dev/null; \
         dd if=/tmp/chunk of=/dev/vda bs=4096 seek={} oflag=direct 2>/dev/null; \
         md5sum /tmp/chunk | cut -d' ' -f1",
        kib / 4
    ));
    let sum = out.trim().to_string();
    assert_eq!(sum.len(), 32, "{out}");
    sum
}

/// The checksum of the guest's disk's 256 KiB at `kib` KiB, read from the
/// device (the guest's page cache dropped first: it came with its RAM).
fn read_disk(vmm: &mut Vmm, kib: u64) -> String {
    vmm.shell(&format!(
        "echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/vda bs=4096 skip={} count=64 2>/dev/null | md5sum | cut -d' ' -f1",
        kib / 4
    ))
    .trim()
    .to_string()
}

/// Each guest task's pid, state, parent's pid, command and where in the
/// kernel it waits, with the kernel stack of those running or in an
/// uninterruptible wait, or why its entry could not be read; before and
/// after, the guest's timer and IPI interrupt counts, uptime, load, every
/// task's children and the counter (do timers fire? are the loops'
/// children there? did the listing itself unstick them?).
const GUEST_TASKS: &str = "state() { grep -E 'LOC|CAL|RES' /proc/interrupts; grep -H . /proc/[0-9]*/task/*/children 2>/dev/null; cat /proc/uptime /proc/loadavg /tmp/count; }; state; for p in /proc/[0-9]*; do s=$(cut -d' ' -f3,4 $p/stat 2>&1); echo \"${p#/proc/} $s $(cat $p/comm 2>&1) $(cat $p/wchan 2>/dev/null)\"; case $s in R*|D*) cat $p/stack 2>/dev/null;; esac; done; state";

/// After a migration: the source ended with status 0, the destination's
/// guest (API on `socket`) has the same blob and its counter keeps
/// counting.
fn check_arrived(
    source: &mut Vmm,
    destination: &mut Vmm,
    socket: &str,
    sum: &str,
    count_before: u64,
) {
    let status = source.wait_exit(Duration::from_secs(120));
    assert_eq!(status.code(), Some(0), "source: {}", source.stderr());
    assert!(
        source.stderr().contains("migrated to 127.0.0.1:"),
        "{}",
        source.stderr()
    );
    let first = counter(destination);
    assert!(first >= count_before, "{first} < {count_before}");
    std::thread::sleep(Duration::from_millis(1500));
    let second = counter(destination);
    if second <= first {
        // Where the guest's tasks wait (the counter's loop among them),
        // for the log: the guest still answers its shell. And the
        // destination's report: with --verify-pages, whether every page
        // it holds is the source's.
        let tasks = destination.shell(GUEST_TASKS);
        panic!(
            "the counter stopped at {first}\nthe guest's tasks:\n{tasks}\ndestination:\n{}\nits report: {}\nsource:\n{}",
            destination.stderr(),
            report(socket),
            source.stderr()
        );
    }
    let out = destination.shell("md5sum /dev/shm/blob | cut -d' ' -f1");
    assert_eq!(out.trim(), sum, "guest memory changed across the migration");
}

/// `--verify-pages`: the destination checked every page against the
/// source's checksum (at least `pages`: a hybrid checks some twice) and
/// found none wrong.
fn check_verified(r: &serde_json::Value, pages: u64) {
    assert_eq!(r["verify_pages"], true, "{r}");
    assert!(r["pages"]["verified"].as_u64().unwrap() >= pages, "{r}");
    assert_eq!(r["pages"]["wrong"], 0, "{r}");
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn precopy_then_postcopy_then_hybrid_keep_the_guest_and_its_memory() {
    require_hardware_kvm();
    let (s1, s2, s3, s4) = (
        temp_socket("mig-a"),
        temp_socket("mig-b"),
        temp_socket("mig-c"),
        temp_socket("mig-d"),
    );
    // One disk image for every VM of the chain: each destination starts
    // while its source has the image open and locked, and locks it only
    // at the switch-over, once the source has flushed and let go.
    let image = shared_image("mig-disk");
    let disk = format!("path={image}");
    let mut flags = FLAGS.to_vec();
    flags.extend_from_slice(&["--disk", &disk]);
    let flags = flags.as_slice();
    let mut args = vec!["run", "--api-socket", &s1];
    args.extend_from_slice(flags);
    let mut a = Vmm::spawn(&args);
    a.wait_for(PROMPT);
    let sum = start_workload(&mut a);
    let disk_a = write_disk(&mut a, 0);
    let before = counter(&mut a);

    // Precopy: the whole of RAM while the guest runs, then the rest.
    let port = free_port();
    let mut b = destination(port, &s2, flags);
    let (ok, out) = migrate(&s1, port, "precopy", &["--verify-pages"]);
    assert!(ok, "precopy: {out}\n{}", a.stderr());
    assert!(out.contains("migration completed"), "{out}");
    check_arrived(&mut a, &mut b, &s2, &sum, before);
    assert_eq!(read_disk(&mut b, 0), disk_a, "the disk after precopy");
    // A precopy destination's RAM has huge pages: every page is written
    // whole, none is left to userfaultfd. (Not in the rig: L1's THP is
    // off there, docs/rig.md.)
    if host_has_thp() {
        let (flags, huge_kib) = ram_mapping(b.pid(), 512 << 20);
        eprintln!("precopy destination: AnonHugePages {huge_kib} kB of 512 MiB");
        assert!(
            flags.contains(&"hg".to_string()) && huge_kib > 0,
            "{flags:?} {huge_kib} kB"
        );
    }
    let disk_b = write_disk(&mut b, 256);
    let r = report(&s2);
    check_verified(&r, 131072);
    assert_eq!(r["phase"], "completed", "{r}");
    assert_eq!(r["role"], "destination", "{r}");
    assert!(r["pages"]["precopy"].as_u64().unwrap() >= 131072, "{r}");
    let downtime = r["downtime_ms"].as_f64().unwrap();
    // Printed for the log: the figure to compare when the page path changes.
    eprintln!("precopy with --verify-pages: downtime {downtime:.0} ms");
    assert!(downtime > 0.0 && downtime < 10_000.0, "{r}");

    // Postcopy out of a VM that came in by migration, without the
    // background push: pages come only when the guest touches them.
    let before = counter(&mut b);
    let port = free_port();
    let mut c = destination(port, &s3, flags);
    let (ok, out) = migrate(
        &s2,
        port,
        "postcopy",
        &["--prefetch", "4", "--verify-pages"],
    );
    assert!(ok, "postcopy: {out}\n{}", b.stderr());
    check_arrived(&mut b, &mut c, &s3, &sum, before);
    assert_eq!(read_disk(&mut c, 0), disk_a, "the disk after postcopy");
    // Every page is here: RAM may have huge pages again (khugepaged
    // collapses the 4 KiB pages postcopy placed, in its own time).
    if host_has_thp() {
        let (flags, huge_kib) = ram_mapping(c.pid(), 512 << 20);
        eprintln!("postcopy destination: AnonHugePages {huge_kib} kB of 512 MiB");
        assert!(flags.contains(&"hg".to_string()), "{flags:?}");
    }
    assert_eq!(read_disk(&mut c, 256), disk_b, "the disk after postcopy");
    let disk_c = write_disk(&mut c, 512);
    let r = report(&s3);
    check_verified(&r, 131072);
    // A report of the migrated-in guest says where its pages came from.
    let dump = std::env::temp_dir().join(format!("hakoniwa-mig-dump-{}.json", std::process::id()));
    let (ok, out) = ctl(&s3, &["dump", "--path", dump.to_str().unwrap()]);
    assert!(ok, "{out}");
    let dump_report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dump).unwrap()).unwrap();
    std::fs::remove_file(&dump).unwrap();
    let pages = dump_report["pages"].as_array().unwrap();
    assert!(!pages.is_empty(), "{dump_report}");
    for page in pages {
        let arrived = page["migration"]["arrived"].as_str().unwrap_or("");
        assert!(
            ["demand", "prefetch", "background"].contains(&arrived),
            "every page came by postcopy: {page}"
        );
        assert!(
            page["verdict"].as_str().unwrap().starts_with("arrived by"),
            "{page}"
        );
    }
    assert_eq!(
        dump_report["migration"]["role"], "destination",
        "{dump_report}"
    );
    assert_eq!(r["phase"], "completed", "{r}");
    assert_eq!(r["mode"], "postcopy", "{r}");
    let faults = &r["faults"];
    assert!(faults["major"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(
        r["fault_latency"]["counts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .sum::<u64>(),
        faults["major"].as_u64().unwrap(),
        "every major fault has a latency: {r}"
    );
    assert!(r["pages"]["demand"].as_u64().unwrap() > 0, "{r}");
    assert!(r["pages"]["background"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["pages"]["precopy"].as_u64().unwrap(), 0, "{r}");

    // Hybrid with a guest that dirties memory faster than the rig's
    // loopback carries it and a downtime limit precopy cannot meet: it
    // switches to postcopy and says why.
    // Copying the 96 MiB of random data again and again dirties pages that
    // are not zero (zero pages cost the stream nothing) as fast as the
    // guest can copy.
    c.shell("(while :; do cp /dev/shm/blob /dev/shm/churn; done) & true");
    let before = counter(&mut c);
    let port = free_port();
    // The bandwidth cap keeps the link slower than the guest's copying,
    // however fast the rig's loopback is today. This step runs without
    // TLS: it needs a link that reaches the cap, so that the first round
    // ends in seconds. In the rig, L1 is emulated (TCG, one vCPU) and so
    // is AES: a TLS link carried 2-27 MiB/s there (alone, by the load on
    // the host) against 130-200 MiB/s plain, and beside this guest's
    // copying 1 MiB/s, so the first round had not ended when `ctl
    // migrate` gave up at 300 s (rig, 2026-11-26). The precopy and
    // postcopy above, and the resume test, run over TLS.
    //
    // One precopy round beyond the first (--max-rounds 1): the guest's
    // copying does not always outrun the cap in the rig (CI, 2026-11-27:
    // 158 pages/s while the first round ran at 10 MiB/s), and then each
    // round is shorter than the last until one is too short for the guest
    // to dirty a page (round 4: 46 pages in 0.00 s, none dirtied) and
    // precopy converges. The second round (the first's dirt, a fraction
    // of a second) still finds far more than the 1 ms limit allows.
    let mut d = destination_with(port, AUTH_NONE, &s4, flags);
    let (ok, out) = migrate_with(
        &s3,
        port,
        AUTH_NONE,
        "hybrid",
        &[
            "--max-downtime",
            "1",
            "--max-rounds",
            "1",
            "--max-bandwidth",
            "16",
            "--verify-pages",
        ],
    );
    assert!(ok, "hybrid: {out}\n{}", c.stderr());
    assert!(out.contains("switched to postcopy"), "{out}");
    check_arrived(&mut c, &mut d, &s4, &sum, before);
    let r = report(&s4);
    check_verified(&r, 131072);
    assert_eq!(r["phase"], "completed", "{r}");
    assert!(r["pages"]["precopy"].as_u64().unwrap() >= 131072, "{r}");
    assert_eq!(read_disk(&mut d, 512), disk_c, "the disk after hybrid");
    d.send("poweroff\n");
    assert_eq!(d.wait_exit(Duration::from_secs(60)).code(), Some(0));
    // And the image itself has all three.
    let bytes = std::fs::read(&image).unwrap();
    for (kib, sum) in [(0, &disk_a), (256, &disk_b), (512, &disk_c)] {
        let at = kib << 10;
        assert_eq!(
            &md5_hex(&bytes[at..at + (256 << 10)]),
            sum,
            "image at {kib} KiB"
        );
    }
    std::fs::remove_file(&image).unwrap();
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn a_mismatched_or_corrupt_migration_is_refused_and_the_source_keeps_running() {
    require_hardware_kvm();
    let (s1, s2, s3) = (
        temp_socket("bad-src"),
        temp_socket("bad-dst"),
        temp_socket("bad-dst2"),
    );
    let mut args = vec!["run", "--api-socket", &s1];
    args.extend_from_slice(FLAGS);
    let mut a = Vmm::spawn(&args);
    a.wait_for(PROMPT);
    let before = counter_started(&mut a);

    // A destination with other memory refuses before anything runs. It
    // has no authentication (auth=none): the source learns what differs,
    // not the destination's values.
    let port = free_port();
    let mut b = destination_with(port, AUTH_NONE, &s2, &["--cpus", "2", "--memory", "256M"]);
    let (ok, out) = migrate_with(&s1, port, AUTH_NONE, "precopy", &[]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("refused") && out.contains("memory size differs"),
        "{out}"
    );
    assert!(
        !out.contains("256"),
        "the refusal describes the destination: {out}"
    );
    let status = b.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(125), "{}", b.stderr());
    let lines: Vec<_> = b
        .stderr()
        .lines()
        .filter(|l| !l.contains("waiting"))
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("memory"), "{lines:?}");
    // The source still runs, and says why it failed.
    assert!(counter(&mut a) > before);
    let r = report(&s1);
    assert_eq!(r["phase"], "failed", "{r}");
    assert!(r["error"].as_str().unwrap().contains("refused"), "{r}");

    // A destination that takes every page and the state, then refuses
    // before running the guest (as --verify-pages does on a wrong page):
    // the guest goes on at the source.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = std::thread::spawn(move || refuse_after_the_state(listener));
    let before = counter(&mut a);
    let (ok, out) = migrate_with(&s1, port, AUTH_NONE, "precopy", &["--verify-pages"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("refused") && out.contains("after the state"),
        "{out}"
    );
    let checksums = fake.join().unwrap();
    assert_eq!(checksums, 131072, "one checksum per page of 512 MiB");
    assert!(
        a.stderr().contains("the VM keeps running here"),
        "{}",
        a.stderr()
    );
    let now = counter(&mut a);
    assert!(now >= before, "{now} < {before}");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        counter(&mut a) > now,
        "the guest did not go on at the source"
    );
    assert_eq!(report(&s1)["phase"], "failed");

    // A destination address nobody listens on: the source keeps running.
    let (ok, out) = migrate(&s1, free_port(), "postcopy", &[]);
    assert!(!ok, "{out}");
    assert!(out.contains("cannot connect"), "{out}");
    let now = counter(&mut a);
    std::thread::sleep(Duration::from_millis(500));
    assert!(counter(&mut a) > now);

    // A TLS destination drops, with one line each, and goes on waiting
    // for: a bare connect and close (`nc -z`), garbage, a plain-TCP
    // source (auth=none), and a source whose certificate is from another
    // CA (which is told so by the TLS alert). The real source then
    // migrates to it.
    let port = free_port();
    let mut c = destination(port, &s3, FLAGS);
    drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    drop(stream);
    let (ok, out) = migrate_with(&s1, port, AUTH_NONE, "precopy", &[]);
    assert!(!ok, "{out}");
    // The stranger trusts our CA; its own certificate is from another.
    let stranger = credentials("stranger");
    let ours = tls();
    let ours = std::path::Path::new(ours.trim_start_matches(",tls="));
    std::fs::copy(ours.join("ca-cert.pem"), stranger.join("ca-cert.pem")).unwrap();
    let stranger = format!(",tls={}", stranger.display());
    let (ok, out) = migrate_with(&s1, port, &stranger, "precopy", &[]);
    assert!(!ok, "{out}");
    assert!(out.contains("alert"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.stderr().matches("dropped a connection").count() < 4 {
        assert!(Instant::now() < deadline, "{}", c.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    let err = c.stderr();
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("invalid peer certificate"), "{err}");
    assert!(counter(&mut a) > now, "the source stopped");
    let before = counter(&mut a);
    let (ok, out) = migrate(&s1, port, "precopy", &[]);
    assert!(ok, "{out}\n{}", c.stderr());
    assert_eq!(a.wait_exit(Duration::from_secs(60)).code(), Some(0));
    assert!(counter(&mut c) > before, "the guest does not run on");
    c.send("poweroff\n");
    assert_eq!(c.wait_exit(Duration::from_secs(60)).code(), Some(0));
}

/// A destination speaking the protocol that welcomes the VM, reads every
/// page, the checksums and the state, and refuses it at the end. Returns
/// how many page checksums came.
fn refuse_after_the_state(listener: TcpListener) -> usize {
    use vmm::migration::protocol::{read_message, write_message, Message};
    let (stream, _) = listener.accept().unwrap();
    let mut reader = stream.try_clone().unwrap();
    let mut writer = stream;
    let mut checksums = 0;
    loop {
        match read_message(&mut reader).unwrap().0 {
            Message::Hello(_) => {
                write_message(&mut writer, &Message::Welcome(b"{}".to_vec())).unwrap();
            }
            Message::Checksums(c) => checksums = c.len(),
            Message::Done => break,
            _ => {}
        }
    }
    let why = Message::Refused("test: refused after the state".into());
    write_message(&mut writer, &why).unwrap();
    checksums
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn a_source_that_dies_in_postcopy_leaves_the_destination_paused_with_a_message() {
    require_hardware_kvm();
    let (s1, s2) = (temp_socket("die-src"), temp_socket("die-dst"));
    let mut args = vec!["run", "--api-socket", &s1];
    args.extend_from_slice(FLAGS);
    let mut a = Vmm::spawn(&args);
    a.wait_for(PROMPT);
    start_workload(&mut a);
    let port = free_port();
    let mut b = destination(port, &s2, FLAGS);
    // No background push: most of RAM stays on the source.
    let (ok, out) = migrate(&s1, port, "postcopy", &["--no-background", "--no-wait"]);
    assert!(ok, "{out}");
    // The destination's API comes up once its VM runs.
    let deadline = Instant::now() + GUEST_TIMEOUT;
    while !std::path::Path::new(&s2).exists() || report(&s2)["phase"] != "postcopy" {
        assert!(Instant::now() < deadline, "no postcopy: {}", report(&s2));
        std::thread::sleep(Duration::from_millis(50));
    }
    a.signal(libc::SIGKILL);
    a.wait_exit(Duration::from_secs(30));
    // The guest needs pages only the dead source had.
    b.send("md5sum /dev/shm/blob\n");
    let deadline = Instant::now() + GUEST_TIMEOUT;
    while !b.stderr().contains("postcopy connection lost") {
        assert!(Instant::now() < deadline, "no message: {}", b.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(b.stderr().contains("the guest is paused"), "{}", b.stderr());
    let (ok, info) = ctl(&s2, &["info"]);
    assert!(ok, "{info}");
    assert!(info.contains("\"paused\""), "{info}");
    let r = report(&s2);
    assert_eq!(r["phase"], "paused", "{r}");
    // It stays up and answers; ending it is the user's call.
    let (ok, out) = ctl(&s2, &["shutdown"]);
    assert!(ok, "{out}");
    b.wait_exit(Duration::from_secs(60));
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn a_postcopy_whose_connection_drops_is_resumed_over_a_new_one() {
    require_hardware_kvm();
    let (s1, s2) = (temp_socket("resume-src"), temp_socket("resume-dst"));
    let mut args = vec!["run", "--api-socket", &s1];
    args.extend_from_slice(FLAGS);
    let mut a = Vmm::spawn(&args);
    a.wait_for(PROMPT);
    let sum = start_workload(&mut a);
    let port = free_port();
    let mut b = destination(port, &s2, FLAGS);
    let relay = Relay::start(port, Fault::None);
    // A slow background push, so the cut lands mid-postcopy.
    let (ok, out) = migrate(
        &s1,
        relay.port,
        "postcopy",
        &["--max-bandwidth", "4", "--no-wait"],
    );
    assert!(ok, "{out}");
    let deadline = Instant::now() + GUEST_TIMEOUT;
    while !std::path::Path::new(&s2).exists() || report(&s2)["phase"] != "postcopy" {
        assert!(Instant::now() < deadline, "no postcopy");
        std::thread::sleep(Duration::from_millis(50));
    }
    relay.cut();
    // Both sides pause and say so.
    let deadline = Instant::now() + GUEST_TIMEOUT;
    while report(&s1)["phase"] != "paused" || report(&s2)["phase"] != "paused" {
        assert!(
            Instant::now() < deadline,
            "not paused: source {} destination {}",
            report(&s1),
            report(&s2)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(a.stderr().contains("paused"), "{}", a.stderr());
    assert!(
        b.stderr().contains("postcopy connection lost"),
        "{}",
        b.stderr()
    );
    // Resume straight to the destination; it finishes.
    let to = format!("tcp:127.0.0.1:{port}{}", tls());
    let (ok, out) = ctl(&s1, &["migrate", "--resume", "--to", &to]);
    assert!(ok, "resume: {out}\n{}", a.stderr());
    assert_eq!(a.wait_exit(Duration::from_secs(180)).code(), Some(0));
    let r = report(&s2);
    assert_eq!(r["phase"], "completed", "{r}");
    assert_eq!(r["resumes"], 1, "{r}");
    let out = b.shell("md5sum /dev/shm/blob | cut -d' ' -f1");
    assert_eq!(
        out.trim(),
        sum,
        "guest memory changed across the resumed migration"
    );
    b.send("poweroff\n");
    assert_eq!(b.wait_exit(Duration::from_secs(60)).code(), Some(0));
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn a_tcp_connection_over_virtio_net_survives_a_postcopy_migration() {
    require_hardware_kvm();
    let _bridge = HostLinks::bridge("hkmbr0", "10.78.0.1", &["hkm-a", "hkm-b"]);
    let (s1, s2) = (temp_socket("net-src"), temp_socket("net-dst"));
    let mac = "52:54:00:aa:bb:78";
    let net = |tap: &str| format!("tap={tap},mac={mac}");
    let (net_a, net_b) = (net("hkm-a"), net("hkm-b"));
    let mut args = vec!["run", "--api-socket", &s1, "--net", &net_a];
    args.extend_from_slice(FLAGS_2CPU);
    let mut a = Vmm::spawn(&args);
    a.wait_for(PROMPT);
    let sum = start_workload(&mut a);
    // The host serves a paced stream of known bytes for ~20 s; the guest
    // receives it over one TCP connection while it moves.
    let listener = TcpListener::bind("10.78.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    const CHUNKS: usize = 400;
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut sent = Vec::new();
        for i in 0..CHUNKS {
            let chunk: Vec<u8> = (0..4096u32)
                .map(|j| ((i as u32).wrapping_mul(31) ^ j.wrapping_mul(7)) as u8)
                .collect();
            conn.write_all(&chunk).unwrap();
            sent.extend_from_slice(&chunk);
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(conn);
        sent
    });
    a.shell(&format!(
        "ip link set eth0 up; ip addr add 10.78.0.2/24 dev eth0; \
         (nc 10.78.0.1 {port} </dev/null > /dev/shm/stream; echo done > /dev/shm/stream.done) & true"
    ));
    std::thread::sleep(Duration::from_secs(3));
    let dst_port = free_port();
    let mut dst_args = vec!["--net", net_b.as_str()];
    dst_args.extend_from_slice(FLAGS_2CPU);
    let mut b = destination(dst_port, &s2, &dst_args);
    let (ok, out) = migrate(&s1, dst_port, "postcopy", &[]);
    assert!(ok, "postcopy with virtio-net: {out}\n{}", a.stderr());
    assert_eq!(a.wait_exit(Duration::from_secs(120)).code(), Some(0));
    let sent = server.join().unwrap();
    let deadline = Instant::now() + GUEST_TIMEOUT;
    while !b
        .shell("cat /dev/shm/stream.done 2>/dev/null")
        .contains("done")
    {
        assert!(
            Instant::now() < deadline,
            "the stream never ended in the guest"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let got = b.shell("wc -c < /dev/shm/stream; md5sum /dev/shm/stream | cut -d' ' -f1");
    let expected_md5 = md5_hex(&sent);
    assert_eq!(
        got.split_whitespace().collect::<Vec<_>>(),
        vec![sent.len().to_string().as_str(), expected_md5.as_str()],
        "the TCP stream was not carried whole across the migration"
    );
    // Memory is intact too, and the network still answers.
    let out = b.shell("md5sum /dev/shm/blob | cut -d' ' -f1");
    assert_eq!(out.trim(), sum);
    let out = b.shell("ping -c 1 -W 5 10.78.0.1 >/dev/null && echo ping-ok");
    assert!(out.contains("ping-ok"), "{out}");
    b.send("poweroff\n");
    assert_eq!(b.wait_exit(Duration::from_secs(60)).code(), Some(0));
}
