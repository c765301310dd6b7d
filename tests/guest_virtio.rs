//! Integration tests of the virtio devices on the default guest. Like
//! tests/guest.rs they boot real guests and run in the rig (scripts/test).

mod common;

use std::time::{Duration, Instant};

use common::net::{md5_hex, HostLinks};
use common::{ctl, require_hardware_kvm, temp_socket, Vmm, PROMPT};

/// MemTotal from /proc/meminfo, in KiB.
fn mem_total_kib(vmm: &mut Vmm) -> u64 {
    let out = vmm.shell("grep MemTotal /proc/meminfo");
    out.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no MemTotal in {out:?}"))
}

fn balloon_actual_mib(socket: &str) -> u64 {
    let (ok, out) = ctl(socket, &["balloon"]);
    assert!(ok, "{out}");
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    info["actual_mib"].as_u64().unwrap()
}

/// Waits until the guest's balloon holds `mib`.
fn wait_balloon(socket: &str, mib: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while balloon_actual_mib(socket) != mib {
        assert!(Instant::now() < deadline, "balloon did not reach {mib} MiB");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn guest_sees_every_device_and_the_rng_feeds_hwrng() {
    require_hardware_kvm();
    let mut vmm = Vmm::spawn(&[
        "run",
        "--rng",
        "--balloon",
        "--input",
        "keyboard",
        "--input",
        "tablet",
    ]);
    vmm.wait_for(PROMPT);
    // virtio device ids: 4 entropy, 5 balloon, 18 input (twice).
    let ids = vmm.shell("cat /sys/bus/virtio/devices/*/device | sort | tr '\\n' ' '");
    assert_eq!(ids.trim(), "0x0004 0x0005 0x0012 0x0012", "{ids}");
    let drivers = vmm.shell("for d in /sys/bus/virtio/devices/*; do basename $(readlink $d/driver); done | sort | tr '\\n' ' '");
    assert_eq!(
        drivers.trim(),
        "virtio_balloon virtio_input virtio_input virtio_rng",
        "{drivers}"
    );
    assert_eq!(
        vmm.shell("cat /sys/class/misc/hw_random/rng_current")
            .trim(),
        "virtio_rng.0"
    );
    // Two reads of /dev/hwrng: 64 bytes each, not all the same, and different.
    let a = vmm.shell("dd if=/dev/hwrng bs=64 count=1 2>/dev/null | od -An -tx1 | tr -d ' \\n'");
    let b = vmm.shell("dd if=/dev/hwrng bs=64 count=1 2>/dev/null | od -An -tx1 | tr -d ' \\n'");
    assert_eq!(a.trim().len(), 128, "{a}");
    assert_ne!(a, b);
    assert!(
        a.trim()
            .chars()
            .collect::<std::collections::HashSet<_>>()
            .len()
            > 4,
        "{a}"
    );
    // MSI-X vectors, not legacy interrupts.
    let msi = vmm.shell("grep -c PCI-MSI /proc/interrupts");
    assert!(msi.trim().parse::<u32>().unwrap() >= 4, "{msi}");
    vmm.send("poweroff\n");
    assert_eq!(vmm.wait_exit(Duration::from_secs(60)).code(), Some(0));
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn balloon_takes_memory_from_the_guest_and_gives_it_back() {
    require_hardware_kvm();
    let socket = temp_socket("balloon");
    let mut vmm = Vmm::spawn(&[
        "run",
        "--memory",
        "512M",
        "--balloon",
        "--api-socket",
        &socket,
    ]);
    vmm.wait_for(PROMPT);
    let before = mem_total_kib(&mut vmm);

    let (ok, out) = ctl(&socket, &["balloon", "--target", "256M"]);
    assert!(ok, "{out}");
    wait_balloon(&socket, 256);
    let inflated = mem_total_kib(&mut vmm);
    assert!(
        inflated + 250 * 1024 <= before,
        "MemTotal {before} KiB -> {inflated} KiB with 256 MiB in the balloon"
    );
    // The guest reports its statistics through the stats queue.
    let (ok, out) = ctl(&socket, &["balloon"]);
    assert!(ok, "{out}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, out) = ctl(&socket, &["balloon"]);
        let info: serde_json::Value = serde_json::from_str(&out).unwrap();
        if info["stats"]["total_memory"].as_u64().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "no balloon statistics: {out}");
        std::thread::sleep(Duration::from_millis(500));
    }

    // In the guest's terms: what a guest booted with 128 MiB has. Less
    // balloon than 512 - 128 MiB, by what the kernel spent at boot on the
    // memory the balloon takes (1.71 %).
    let (ok, out) = ctl(&socket, &["balloon", "--guest-memory", "128M"]);
    assert!(ok, "{out}");
    let (_, out) = ctl(&socket, &["balloon"]);
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(info["target_mib"], 377, "{out}");
    let (ok, out) = ctl(&socket, &["balloon", "--guest-memory", "1G"]);
    assert!(
        !ok && out.contains("400") && out.contains("more than the VM's 512 MiB"),
        "{out}"
    );

    let (ok, out) = ctl(&socket, &["balloon", "--target", "0"]);
    assert!(ok, "{out}");
    wait_balloon(&socket, 0);
    let deflated = mem_total_kib(&mut vmm);
    assert!(
        deflated + 4 * 1024 >= before,
        "MemTotal {before} KiB -> {deflated} KiB after deflating"
    );

    // More than the guest has is refused.
    let (ok, out) = ctl(&socket, &["balloon", "--target", "4G"]);
    assert!(!ok && out.contains("409"), "{out}");
    vmm.send("poweroff\n");
    assert_eq!(vmm.wait_exit(Duration::from_secs(60)).code(), Some(0));
}

/// A fresh sparse raw image of `mib` MiB in the temporary directory.
fn temp_image(name: &str, mib: u64) -> String {
    let path = std::env::temp_dir().join(format!("hakoniwa-{name}-{}.img", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(mib << 20).unwrap();
    path.to_str().unwrap().to_string()
}

fn exec(args: &[&str], command: &str) -> (i32, String, String) {
    require_hardware_kvm();
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--exec", command]);
    common::run_to_end(&all, common::GUEST_TIMEOUT)
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn file_system_on_a_disk_survives_a_reboot() {
    let image = temp_image("fs", 64);
    let disk = format!("path={image}");
    let (status, out, err) = exec(
        &["--disk", &disk],
        "mke2fs /dev/vda >/dev/null && mount /dev/vda /mnt && echo persistent-$((6*7)) > /mnt/file && umount /mnt",
    );
    assert_eq!(status, 0, "{out}{err}");
    // A second VM on the same image: the file is there.
    let (status, out, err) = exec(&["--disk", &disk], "mount /dev/vda /mnt && cat /mnt/file");
    assert_eq!(status, 0, "{err}");
    assert_eq!(out, "persistent-42\n");
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn readonly_disk_refuses_writes() {
    let image = temp_image("ro", 8);
    std::fs::write(&image, vec![0x5a; 8 << 20]).unwrap();
    let disk = format!("path={image},readonly=on");
    let (status, out, err) = exec(
        &["--disk", &disk],
        "cat /sys/block/vda/ro; dd if=/dev/zero of=/dev/vda bs=4096 count=1 oflag=direct 2>/dev/null && echo wrote || echo refused; \
         dd if=/dev/vda bs=4096 count=1 2>/dev/null | od -An -tx1 | head -1",
    );
    assert_eq!(status, 0, "{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("1"), "{out}");
    assert_eq!(lines.next(), Some("refused"), "{out}");
    assert!(
        lines.next().unwrap_or("").trim().starts_with("5a 5a"),
        "{out}"
    );
    assert!(
        std::fs::read(&image).unwrap().iter().all(|b| *b == 0x5a),
        "the image changed"
    );
}

/// The open flags of every descriptor the process has on `path`.
fn open_flags(pid: i32, path: &str) -> Vec<u32> {
    let mut flags = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        if std::fs::read_link(fd.path())
            .ok()
            .and_then(|t| t.to_str().map(String::from))
            .as_deref()
            == Some(path)
        {
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_str().unwrap()
            ))
            .unwrap();
            let octal = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .unwrap()
                .trim();
            flags.push(u32::from_str_radix(octal, 8).unwrap());
        }
    }
    flags
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn cache_modes_use_o_direct_only_for_none_and_kill_9_loses_nothing_synced() {
    require_hardware_kvm();
    let (direct, buffered) = (temp_image("none", 16), temp_image("writeback", 16));
    let mut vmm = Vmm::spawn(&[
        "run",
        "--disk",
        &format!("path={direct},cache=none"),
        "--disk",
        &format!("path={buffered},cache=writeback"),
    ]);
    vmm.wait_for(PROMPT);
    let o_direct = libc::O_DIRECT as u32;
    let none_flags = open_flags(vmm.pid(), &direct);
    assert!(
        none_flags.iter().any(|f| f & o_direct != 0),
        "cache=none must open with O_DIRECT: {none_flags:?}"
    );
    let writeback_flags = open_flags(vmm.pid(), &buffered);
    assert!(
        !writeback_flags.is_empty() && writeback_flags.iter().all(|f| f & o_direct == 0),
        "{writeback_flags:?}"
    );

    // Write random data through both disks (an unaligned tail included),
    // sync, and remember what the guest wrote.
    let sums = vmm.shell(
        "dd if=/dev/urandom of=/tmp/data bs=4096 count=513 2>/dev/null; head -c 7 /dev/urandom >> /tmp/data; \
         for d in vda vdb; do dd if=/tmp/data of=/dev/$d bs=65536 conv=fsync 2>/dev/null; done; \
         md5sum /tmp/data | cut -d' ' -f1",
    );
    let guest_sum = sums.trim().to_string();
    assert_eq!(guest_sum.len(), 32, "{sums}");
    // Kill the VMM the hard way: nothing acknowledged as synced may be lost.
    vmm.signal(libc::SIGKILL);
    vmm.wait_exit(Duration::from_secs(20));
    let length = 513 * 4096 + 7;
    for image in [&direct, &buffered] {
        let data = std::fs::read(image).unwrap();
        let host_sum = md5_hex(&data[..length]);
        assert_eq!(host_sum, guest_sum, "{image} lost data");
    }
}

/// The resources `vm.info` lists for the device `id`.
fn device_resources(info: &serde_json::Value, id: &str) -> Vec<String> {
    let devices = info["devices"].as_array().unwrap();
    let device = devices.iter().find(|d| d["id"] == id).unwrap();
    device["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn disks_get_a_queue_per_vcpu_and_say_which_engine_serves_them() {
    require_hardware_kvm();
    let socket = temp_socket("mq-test");
    let (mq, single) = (temp_image("mq", 16), temp_image("single", 16));
    // disk0: the defaults (io_uring, one queue per vCPU), O_DIRECT;
    // disk1: the threads engine with one queue.
    let mut vmm = Vmm::spawn(&[
        "run",
        "--cpus",
        "2",
        "--api-socket",
        &socket,
        "--disk",
        &format!("path={mq},cache=none"),
        "--disk",
        &format!("path={single},engine=threads,num_queues=1,queue_size=128"),
    ]);
    vmm.wait_for(PROMPT);
    let queues = vmm.shell("ls /sys/block/vda/mq | wc -l; ls /sys/block/vdb/mq | wc -l");
    assert_eq!(
        queues.split_whitespace().collect::<Vec<_>>(),
        ["2", "1"],
        "{queues}"
    );

    let (ok, info) = ctl(&socket, &["info"]);
    assert!(ok, "{info}");
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    // The rig's L1 kernel (Debian's) allows io_uring.
    let disk0 = device_resources(&info, "disk0");
    assert!(
        disk0.ends_with(&[
            "engine io_uring".into(),
            "queues 2 x 256".into(),
            "cache none".into()
        ]),
        "{disk0:?}"
    );
    let disk1 = device_resources(&info, "disk1");
    assert!(
        disk1.ends_with(&[
            "engine threads".into(),
            "queues 1 x 128".into(),
            "cache writeback".into()
        ]),
        "{disk1:?}"
    );
    let threads: Vec<String> = info["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    for name in ["disk0-queue0", "disk0-queue1", "disk1-queue", "disk1-io0"] {
        assert!(
            threads.iter().any(|t| t == name),
            "{name} missing: {threads:?}"
        );
    }
    // io_uring needs no I/O threads.
    assert!(
        !threads
            .iter()
            .any(|t| t.starts_with("disk0-io") || t.starts_with("disk0-q0-io")),
        "{threads:?}"
    );

    // Both vCPUs write at once (each through its own queue), O_DIRECT and
    // buffered, then everything is read back and compared.
    let sums = vmm.shell(
        "dd if=/dev/urandom of=/tmp/data bs=65536 count=96 2>/dev/null; \
         for d in vda vdb; do \
           taskset -c 0 dd if=/tmp/data of=/dev/$d bs=4096 count=768 oflag=direct 2>/dev/null & \
           taskset -c 1 dd if=/tmp/data of=/dev/$d bs=4096 skip=768 seek=768 count=768 oflag=direct 2>/dev/null & \
         done; wait; sync; echo 3 > /proc/sys/vm/drop_caches; \
         md5sum /tmp/data | cut -d' ' -f1; \
         for d in vda vdb; do head -c 6291456 /dev/$d | md5sum | cut -d' ' -f1; done",
    );
    let sums: Vec<&str> = sums.split_whitespace().collect();
    assert_eq!(sums.len(), 3, "{sums:?}");
    assert_eq!(
        sums[1], sums[0],
        "vda (io_uring, 2 queues) read back other data"
    );
    assert_eq!(sums[2], sums[0], "vdb (threads) read back other data");
    vmm.signal(libc::SIGKILL);
    vmm.wait_exit(Duration::from_secs(20));
    let data = std::fs::read(&mq).unwrap();
    assert_eq!(
        md5_hex(&data[..6 << 20]),
        sums[0],
        "the image holds other data"
    );
    let _ = std::fs::remove_file(&mq);
    let _ = std::fs::remove_file(&single);
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn network_reaches_the_host_over_a_tap() {
    require_hardware_kvm();
    let tap = HostLinks::tap("hktest0", "10.77.0.1");
    // The host serves 48 MiB of known bytes on 10.77.0.1: enough TSO-sized
    // frames to run the guest short of rx buffers many times.
    let listener = std::net::TcpListener::bind("10.77.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let payload: Vec<u8> = (0..48u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let expected = md5_hex(&payload);
    let server = std::thread::spawn(move || {
        use std::io::Write;
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(&payload).unwrap();
    });
    let net = format!("tap={},mac=52:54:00:aa:bb:01", tap.name());
    let (status, out, err) = exec(
        &["--net", &net],
        &format!(
            "cat /sys/class/net/eth0/address; ip link set eth0 up; ip addr add 10.77.0.2/24 dev eth0; \
             ping -c 2 -W 10 10.77.0.1 >/dev/null && echo ping-ok; \
             nc 10.77.0.1 {port} </dev/null | md5sum | cut -d' ' -f1"
        ),
    );
    server.join().unwrap();
    assert_eq!(status, 0, "{err}");
    assert_eq!(out, format!("52:54:00:aa:bb:01\nping-ok\n{expected}\n"));
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn vsock_round_trips_both_ways() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    require_hardware_kvm();
    let uds = temp_socket("vsock");
    // Guest to host: the guest connects to host port 5000, which is the
    // Unix socket "<uds>_5000".
    let listener = UnixListener::bind(format!("{uds}_5000")).unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut got = String::new();
        conn.read_to_string(&mut got).unwrap();
        conn.write_all(format!("pong:{got}").as_bytes()).unwrap();
    });
    let mut vmm = Vmm::spawn(&["run", "--vsock", &format!("cid=3,uds={uds}")]);
    vmm.wait_for(PROMPT);
    let out = vmm.shell("echo ping-$((1+1)) | hk-vsock connect 2 5000");
    server.join().unwrap();
    assert_eq!(out.trim(), "pong:ping-2");

    // Host to guest: "CONNECT <port>\n" on the Unix socket, "OK <port>\n" back.
    vmm.send("echo hello-from-guest | hk-vsock listen 1234\n");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut reader, mut stream) = loop {
        let mut stream = UnixStream::connect(&uds).unwrap();
        stream.write_all(b"CONNECT 1234\n").unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        // Until the guest listens, it resets the connection: try again.
        if reader.read_line(&mut line).is_ok() && line.starts_with("OK ") {
            break (reader, stream);
        }
        assert!(
            Instant::now() < deadline,
            "the guest never accepted: {line:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    stream.write_all(b"hello-from-host\n").unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    reader.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, "hello-from-guest\n");
    vmm.wait_for("hello-from-host");
    vmm.send("poweroff\n");
    assert_eq!(vmm.wait_exit(Duration::from_secs(60)).code(), Some(0));
    assert!(
        !std::path::Path::new(&uds).exists(),
        "the vsock socket must be removed"
    );
}

/// `vm.counters` as JSON.
fn counters(socket: &str) -> serde_json::Value {
    let (ok, out) = ctl(socket, &["counters", "--json"]);
    assert!(ok, "{out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn field(v: &serde_json::Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or_else(|| panic!("no {pointer} in {v}"))
}

fn bins_sum(h: &serde_json::Value) -> u64 {
    h["bins"]
        .as_array()
        .unwrap_or_else(|| panic!("no bins in {h}"))
        .iter()
        .map(|b| b.as_u64().unwrap())
        .sum()
}

/// Waits until the disk has nothing in flight (the queue thread counts a
/// request just after the interrupt that ends the guest's wait for it).
fn settled(socket: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = counters(socket);
        if field(&c, "/disk0/in_flight") == 0 {
            return c;
        }
        assert!(Instant::now() < deadline, "requests stay in flight: {c}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn disk_counters_add_up_to_what_the_guest_did() {
    require_hardware_kvm();
    let image = temp_image("counters", 16);
    let socket = temp_socket("counters");
    let metrics =
        std::env::temp_dir().join(format!("hakoniwa-counters-{}.jsonl", std::process::id()));
    let disk = format!("path={image}");
    let mut vmm = Vmm::spawn(&[
        "run",
        "--disk",
        &disk,
        "--api-socket",
        &socket,
        "--metrics",
        metrics.to_str().unwrap(),
        "--metrics-interval",
        "0.5",
    ]);
    vmm.wait_for(PROMPT);
    let before = settled(&socket);

    // 256 reads and 128 writes of 4 KiB each (O_DIRECT: one request per
    // dd block), then a flush (fsync of the device).
    vmm.shell("dd if=/dev/vda of=/dev/null bs=4096 count=256 iflag=direct 2>/dev/null");
    vmm.shell("dd if=/dev/zero of=/dev/vda bs=4096 count=128 seek=256 oflag=direct conv=fsync 2>/dev/null");
    let after = settled(&socket);
    let delta = |name: &str| {
        let p = format!("/disk0/{name}");
        field(&after, &p) - field(&before, &p)
    };
    assert_eq!(
        (delta("read_ops"), delta("read_bytes")),
        (256, 1 << 20),
        "{after}"
    );
    assert_eq!(
        (delta("write_ops"), delta("write_bytes")),
        (128, 512 << 10),
        "{after}"
    );
    assert!(delta("flush_ops") >= 1, "{after}");
    for kind in ["read", "write", "flush"] {
        assert_eq!(field(&after, &format!("/disk0/{kind}_failed")), 0);
        assert_eq!(field(&after, &format!("/disk0/{kind}_invalid")), 0);
    }
    let disk = &after["disk0"];
    // Every request is in its kind's histogram and in every stage.
    let mut ops = 0;
    for kind in ["read", "write", "flush", "discard", "write_zeroes", "other"] {
        let n = field(disk, &format!("/{kind}_ops"));
        ops += n;
        if kind != "other" {
            assert_eq!(
                bins_sum(&disk["latency_histograms"][kind]),
                n,
                "{kind}: {disk}"
            );
        }
        if n > 0 && kind != "other" {
            let (min, avg, max) = (
                field(disk, &format!("/{kind}_latency_min")),
                field(disk, &format!("/{kind}_latency_avg")),
                field(disk, &format!("/{kind}_latency_max")),
            );
            assert!(min <= avg && avg <= max, "{kind}: {min} {avg} {max}");
        }
    }
    let stage = |name: &str, what: &str| field(disk, &format!("/stages/{name}/{what}"));
    for name in [
        "kick_to_dequeue",
        "dequeue_to_submit",
        "submit_to_complete",
        "complete_to_interrupt",
    ] {
        assert_eq!(stage(name, "count"), ops, "{name}: {disk}");
        assert_eq!(bins_sum(&disk["stages"][name]), ops, "{name}");
        assert!(stage(name, "max_ns") <= stage(name, "total_ns"), "{name}");
    }
    // The kinds' time (dequeue → completion) is exactly two stages'.
    let service: u64 = ["read", "write", "flush", "discard", "write_zeroes", "other"]
        .iter()
        .map(|k| field(disk, &format!("/{k}_total_time_ns")))
        .sum();
    assert_eq!(
        service,
        stage("dequeue_to_submit", "total_ns") + stage("submit_to_complete", "total_ns")
    );
    assert!(stage("submit_to_complete", "total_ns") > 0);
    assert!(field(disk, "/max_queue_depth") >= 1);

    // The table names the disk and its kinds.
    let (ok, table) = ctl(&socket, &["counters"]);
    // For the record (--nocapture): where the time went.
    println!("{table}");
    assert!(
        ok && table.starts_with("disk0") && table.contains("  read "),
        "{table}"
    );

    // New read boundaries: empty bins, then the next reads land in them.
    let (ok, out) = ctl(
        &socket,
        &[
            "counters",
            "--disk",
            "disk0",
            "--histogram",
            "read",
            "--boundaries",
            "10us,1ms",
        ],
    );
    assert!(ok, "{out}");
    let c = counters(&socket);
    assert_eq!(
        c["disk0"]["latency_histograms"]["read"]["boundaries"],
        serde_json::json!([10_000, 1_000_000])
    );
    assert_eq!(bins_sum(&c["disk0"]["latency_histograms"]["read"]), 0);
    assert_eq!(
        bins_sum(&c["disk0"]["latency_histograms"]["write"]),
        field(&c, "/disk0/write_ops")
    );
    vmm.shell("dd if=/dev/vda of=/dev/null bs=4096 count=16 iflag=direct 2>/dev/null");
    let c = settled(&socket);
    assert_eq!(
        bins_sum(&c["disk0"]["latency_histograms"]["read"]),
        16,
        "{c}"
    );
    let (ok, out) = ctl(
        &socket,
        &["counters", "--disk", "disk9", "--boundaries", "1ms"],
    );
    assert!(
        !ok && out.contains("no device 'disk9' (disks: disk0)"),
        "{out}"
    );

    vmm.send("poweroff\n");
    assert_eq!(vmm.wait_exit(Duration::from_secs(60)).code(), Some(0));
    // The --metrics file's last line has the same counters.
    let text = std::fs::read_to_string(&metrics).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(
        field(&last, "/counters/disk0/read_ops"),
        field(&c, "/disk0/read_ops"),
        "{last}"
    );
    let _ = std::fs::remove_file(&metrics);
    let _ = std::fs::remove_file(&image);
}
