//! Fault injection for migration (docs/migration.md, "Failures"): a
//! stream damaged on the way (with the frame's checksum made right again,
//! and not; inside TLS), a connection cut (FIN) and reset (RST), a network
//! that delays, reorders and loses packets (netem), a destination killed
//! in precopy, at the switch-over and in postcopy, a source killed in
//! precopy. Nothing is lost that was not lost by design, every failure is
//! one line, and the side that can keep the VM keeps it.
//!
//! `#[ignore]`d like the other guest tests; `scripts/test` runs them in
//! the rig. The relay (tests/common/relay.rs) sees the frames, so the
//! migrations it damages run without TLS (`auth=none`), except the one
//! that checks what TLS does to a flipped byte.

mod common;

use std::time::{Duration, Instant};

use common::migration::{
    counter, counter_started, destination, destination_with, free_port, migrate, migrate_with,
    report, shared_image, AUTH_NONE,
};
use common::relay::{Fault, Relay};
use common::{ctl, host_sh, require_hardware_kvm, temp_socket, Vmm, GUEST_TIMEOUT, PROMPT};

/// One vCPU, as tests/guest_migration.rs explains; less memory than
/// there, since every step here copies it again.
const FLAGS: &[&str] = &["--cpus", "1", "--memory", "256M"];

/// Far enough into precopy that pages of data are on their way.
const CUT_AFTER: u64 = 8 << 20;

/// The guest at `vmm` still runs: its counter moves.
fn keeps_running(vmm: &mut Vmm, after: &str) {
    let before = counter(vmm);
    std::thread::sleep(Duration::from_millis(1500));
    let now = counter(vmm);
    assert!(now > before, "{after}: the guest stopped at {before}");
}

/// A destination that ends (status 125) with one line about what went
/// wrong, containing `word`, and never ran the guest.
fn ends_with_one_line(vmm: &mut Vmm, word: &str) {
    let status = vmm.wait_exit(Duration::from_secs(60));
    let err = vmm.stderr();
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.contains("waiting for a migration"))
        .collect();
    assert_eq!(status.code(), Some(125), "{err}");
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(word), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // For the log: what each failure looks like to an operator.
    eprintln!("destination: {}", lines[0]);
}

/// A bad network on the loopback (netem): delay, reordering and loss
/// for every packet, until dropped.
struct BadLoopback;

impl BadLoopback {
    /// 10 ms each way, a tenth of the packets sent at once instead
    /// (reordered), 0.2 % lost.
    const NETEM: &'static str = "delay 10ms reorder 10% 50% loss 0.2%";

    fn on() -> BadLoopback {
        host_sh(&format!("tc qdisc add dev lo root netem {}", Self::NETEM));
        BadLoopback
    }
}

impl Drop for BadLoopback {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tc")
            .args(["qdisc", "del", "dev", "lo", "root"])
            .status();
    }
}

/// SIGKILL to `pid`, from a relay's thread.
fn kill(pid: i32) {
    // SAFETY: kill(2) takes plain integers; the pid is a child of this
    // test that has not been waited for, so it is not reused.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Sends the VM at `s1` through `fault` to a new destination without
/// authentication (`dst_flags`, its API socket named after `step`);
/// returns `ctl migrate`'s output, which must be a failure, and the
/// destination.
fn migrate_through(
    s1: &str,
    step: &str,
    dst_flags: &[&str],
    fault: impl FnOnce(&Vmm) -> Fault,
    extra: &[&str],
) -> (String, Vmm) {
    let port = free_port();
    let s2 = temp_socket(step);
    let dst = destination_with(port, AUTH_NONE, &s2, dst_flags);
    let relay = Relay::start(port, fault(&dst));
    let (ok, out) = migrate_with(s1, relay.port, AUTH_NONE, "precopy", extra);
    assert!(!ok, "the migration went through: {out}");
    (out, dst)
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn damaged_streams_and_dead_destinations_leave_the_guest_where_it_can_run() {
    require_hardware_kvm();
    let image = shared_image("faults");
    let mut flags = FLAGS.to_vec();
    flags.extend_from_slice(&["--disk", &image]);
    let s1 = temp_socket("faults-src");
    let mut args = vec!["run", "--api-socket", &s1];
    args.extend_from_slice(&flags);
    let mut a = Vmm::spawn(&args);
    a.wait_for(PROMPT);
    counter_started(&mut a);

    // A page damaged and its frame's CRC made right again: the frame
    // checks out, --verify-pages does not. The destination refuses before
    // it runs the guest, which goes on here.
    let (out, mut b) = migrate_through(
        &s1,
        "faults-dst-crc-fixed",
        &flags,
        |_| Fault::FlipPageByte { fix_crc: true },
        &["--verify-pages"],
    );
    assert!(
        out.contains("refused") && out.contains("verify-pages"),
        "{out}"
    );
    ends_with_one_line(&mut b, "verify-pages");
    keeps_running(&mut a, "a page damaged, CRC fixed");
    assert_eq!(report(&s1)["phase"], "failed");

    // The same damage without the CRC made right: the frame's own check.
    let (out, mut b) = migrate_through(
        &s1,
        "faults-dst-crc",
        &flags,
        |_| Fault::FlipPageByte { fix_crc: false },
        &[],
    );
    ends_with_one_line(&mut b, "checksum");
    keeps_running(&mut a, &format!("a frame damaged: {out}"));

    // Inside TLS a flipped byte is a record that does not authenticate.
    let port = free_port();
    let s2 = temp_socket("faults-dst-tls");
    let mut b = destination(port, &s2, &flags);
    let relay = Relay::start(port, Fault::FlipStreamByte(CUT_AFTER));
    let (ok, out) = migrate(&s1, relay.port, "precopy", &[]);
    assert!(!ok, "{out}");
    ends_with_one_line(&mut b, "TLS");
    keeps_running(&mut a, &format!("a TLS record damaged: {out}"));

    // The connection cut in precopy: the destination ends, the guest
    // goes on here.
    let (out, mut b) = migrate_through(
        &s1,
        "faults-dst-cut",
        &flags,
        |_| Fault::CutAfter {
            bytes: CUT_AFTER,
            then: Box::new(|| {}),
        },
        &[],
    );
    ends_with_one_line(&mut b, "migration");
    keeps_running(&mut a, &format!("cut in precopy: {out}"));

    // The connection reset in precopy, an RST each way rather than a FIN:
    // the same, and the destination says so.
    let (out, mut b) = migrate_through(
        &s1,
        "faults-dst-reset",
        &flags,
        |_| Fault::ResetAfter(CUT_AFTER),
        &[],
    );
    ends_with_one_line(&mut b, "reset");
    keeps_running(&mut a, &format!("reset in precopy: {out}"));
    eprintln!("source, after the reset: {out}");

    // The destination killed in precopy.
    let (out, mut b) = migrate_through(
        &s1,
        "faults-dst-kill-precopy",
        &flags,
        |b| {
            let pid = b.pid();
            Fault::CutAfter {
                bytes: CUT_AFTER,
                then: Box::new(move || kill(pid)),
            }
        },
        &[],
    );
    b.wait_exit(Duration::from_secs(30));
    keeps_running(&mut a, &format!("destination killed in precopy: {out}"));
    let err = a.stderr();
    assert!(err.contains("the VM keeps running here"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // The destination killed at the switch-over, as the state goes by:
    // the source cannot know whether it ran the guest, so the guest stays
    // stopped here, and the operator who knows may resume it.
    let (out, mut b) = migrate_through(
        &s1,
        "faults-dst-kill-switchover",
        &flags,
        |b| {
            let pid = b.pid();
            Fault::CutAtFrame {
                name: "state",
                then: Box::new(move || kill(pid)),
            }
        },
        &[],
    );
    b.wait_exit(Duration::from_secs(30));
    assert!(
        a.stderr()
            .contains("the destination did not say it ran the guest"),
        "{out}\n{}",
        a.stderr()
    );
    let (_, info) = ctl(&s1, &["info"]);
    assert!(info.contains("\"paused\""), "{info}");
    // Not migrated again while it is half handed over.
    let (ok, again) = migrate_with(&s1, free_port(), AUTH_NONE, "precopy", &[]);
    assert!(!ok && again.contains("resume"), "{again}");
    let (ok, resumed) = ctl(&s1, &["resume"]);
    assert!(ok, "{resumed}\n{}", a.stderr());
    keeps_running(&mut a, "resumed after the switch-over failed");
    // Its disk is its own again, and its devices run.
    let written = a.shell(
        "dd if=/dev/urandom of=/dev/vda bs=4096 count=16 oflag=direct 2>/dev/null && echo disk-ok",
    );
    assert!(written.contains("disk-ok"), "{written}");

    // Through a network that delays, reorders and loses packets (TCP's
    // to hide), over TLS: the migration completes, every page checked.
    let port = free_port();
    let s2 = temp_socket("faults-dst-netem");
    let mut b = destination(port, &s2, &flags);
    let (ok, out) = {
        let _netem = BadLoopback::on();
        migrate(&s1, port, "precopy", &["--verify-pages"])
    };
    assert!(ok, "{out}\n{}\n{}", a.stderr(), b.stderr());
    assert_eq!(a.wait_exit(Duration::from_secs(60)).code(), Some(0));
    let r = report(&s2);
    assert_eq!(r["verify_pages"], true, "{r}");
    assert_eq!(r["pages"]["wrong"], 0, "{r}");
    keeps_running(
        &mut b,
        &format!("migrated through netem ({})", BadLoopback::NETEM),
    );
    let (s1, mut a) = (s2, b);

    // The destination killed in postcopy, once it runs the guest: the
    // guest's newest state died with it (lost by design). The source
    // waits for a resume of the migration and refuses to run its older
    // copy.
    let port = free_port();
    let s2 = temp_socket("faults-dst-kill-postcopy");
    let mut b = destination_with(port, AUTH_NONE, &s2, &flags);
    let (ok, out) = migrate_with(
        &s1,
        port,
        AUTH_NONE,
        "postcopy",
        &["--max-bandwidth", "4", "--no-wait"],
    );
    assert!(ok, "{out}");
    let deadline = Instant::now() + GUEST_TIMEOUT;
    while !std::path::Path::new(&s2).exists() || report(&s2)["phase"] != "postcopy" {
        assert!(Instant::now() < deadline, "no postcopy: {}", a.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    b.signal(libc::SIGKILL);
    b.wait_exit(Duration::from_secs(30));
    let deadline = Instant::now() + GUEST_TIMEOUT;
    while report(&s1)["phase"] != "paused" {
        assert!(Instant::now() < deadline, "{}", report(&s1));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, refused) = ctl(&s1, &["resume"]);
    assert!(!ok && refused.contains("409"), "{refused}");
    assert!(refused.contains("migrate --resume"), "{refused}");
    let err = a.stderr();
    assert!(!err.contains("panicked"), "{err}");
    let (ok, out) = ctl(&s1, &["shutdown"]);
    assert!(ok, "{out}\n{err}");
    assert_eq!(a.wait_exit(Duration::from_secs(60)).code(), Some(0));
    let _ = std::fs::remove_file(&image);
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn a_source_killed_in_precopy_ends_the_destination_with_one_line() {
    require_hardware_kvm();
    let s1 = temp_socket("faults-src-kill");
    let mut args = vec!["run", "--api-socket", &s1];
    args.extend_from_slice(FLAGS);
    let mut a = Vmm::spawn(&args);
    a.wait_for(PROMPT);
    let port = free_port();
    let s2 = temp_socket("faults-dst-of-killed");
    let mut b = destination_with(port, AUTH_NONE, &s2, FLAGS);
    let pid = a.pid();
    let relay = Relay::start(
        port,
        Fault::CutAfter {
            bytes: CUT_AFTER,
            then: Box::new(move || kill(pid)),
        },
    );
    let (ok, out) = migrate_with(&s1, relay.port, AUTH_NONE, "precopy", &[]);
    assert!(!ok, "{out}");
    a.wait_exit(Duration::from_secs(30));
    ends_with_one_line(&mut b, "migration");
    assert!(
        !std::path::Path::new(&s2).exists(),
        "the destination's API came up: it ran the guest"
    );
}

/// The relay's page damage, without a guest: a stream whose last run
/// before the checksums ends in zero pages (as a stop-and-copy's often
/// does) still gets one page damaged, one that no zero frame after it
/// clears, and only that byte. With the CRC left alone, the frame fails
/// its own check. The relay once passed such a stream unharmed, and the
/// migration it was meant to break went through (CI, 2026-11-27).
#[test]
fn the_relay_damages_a_page_that_stays_damaged() {
    use std::io::Write as _;
    use std::net::{TcpListener, TcpStream};
    use vmm::migration::protocol::{read_message, write_message, Message, PageKind, PAGE_SIZE};

    let sent = || {
        vec![
            Message::Pages {
                kind: PageKind::Precopy,
                first: 0,
                data: vec![0x11; 2 * PAGE_SIZE],
            },
            Message::Pages {
                kind: PageKind::Precopy,
                first: 10,
                data: vec![0x22; 3 * PAGE_SIZE],
            },
            Message::Zero {
                kind: PageKind::Precopy,
                first: 12,
                count: 1,
            },
            Message::Zero {
                kind: PageKind::Precopy,
                first: 40,
                count: 8,
            },
            Message::Checksums(vec![1, 2, 3]),
        ]
    };
    for fix_crc in [true, false] {
        let dst = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay = Relay::start(
            dst.local_addr().unwrap().port(),
            Fault::FlipPageByte { fix_crc },
        );
        let mut src = TcpStream::connect(("127.0.0.1", relay.port)).unwrap();
        let (mut conn, _) = dst.accept().unwrap();
        let mut stream = Vec::new();
        for m in sent() {
            write_message(&mut stream, &m).unwrap();
        }
        src.write_all(&stream).unwrap();
        src.shutdown(std::net::Shutdown::Write).unwrap();

        let mut got = Vec::new();
        let refused = loop {
            match read_message(&mut conn) {
                Ok((m, _)) => got.push(m),
                Err(e) => break e.to_string(),
            }
        };
        if !fix_crc {
            // The first pages frame passes; the second fails its CRC.
            assert_eq!(got.len(), 1, "{refused}");
            assert!(refused.contains("checksum"), "{refused}");
            continue;
        }
        let want = sent();
        assert_eq!(got.len(), want.len(), "{refused}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if i != 1 {
                assert_eq!(g, w, "frame {i}");
            }
        }
        let Message::Pages {
            first: 10, data, ..
        } = &got[1]
        else {
            panic!("frame 1: {:?}", got[1].name());
        };
        // Page 12 is zeroed after; page 11 is the last one that stays.
        let changed: Vec<usize> = (0..data.len()).filter(|&i| data[i] != 0x22).collect();
        assert_eq!(changed, vec![PAGE_SIZE + 100]);
    }
}
