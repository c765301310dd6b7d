//! Bad input to `hakoniwa run` gets one line naming the problem and a
//! non-zero exit, never a panic. These need no KVM: every check happens
//! before a VM is created.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::run_to_end;

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hakoniwa-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A file with a bzImage setup header (64-bit protocol 2.15) that asks for
/// 64 MiB at 16 MiB: enough for hakoniwa's checks, never booted.
fn fake_bzimage() -> PathBuf {
    let mut image = vec![0u8; 0x2000];
    image[0x1f1] = 4; // setup_sects
    image[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    image[0x202..0x206].copy_from_slice(b"HdrS");
    image[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes()); // version
    image[0x211] = 0x01; // loadflags: LOADED_HIGH
    image[0x236..0x238].copy_from_slice(&0x0001u16.to_le_bytes()); // xloadflags: XLF_KERNEL_64
    image[0x258..0x260].copy_from_slice(&0x0100_0000u64.to_le_bytes()); // pref_address
    image[0x260..0x264].copy_from_slice(&0x0400_0000u32.to_le_bytes()); // init_size
    let path = temp_dir().join("fake-bzImage");
    std::fs::write(&path, image).unwrap();
    path
}

/// Runs hakoniwa and checks the shape of a user error: non-zero status,
/// exactly one line on stderr, naming `needle`, no panic or backtrace.
fn expect_error(args: &[&str], needle: &str) -> (i32, String) {
    let (code, stdout, stderr) = run_to_end(args, Duration::from_secs(30));
    assert_ne!(code, 0, "should fail: {args:?}\nstderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one line expected for {args:?}, got:\n{stderr}"
    );
    assert!(lines[0].starts_with("hakoniwa: "), "{stderr}");
    assert!(
        lines[0].contains(needle),
        "expected {needle:?} in: {stderr}"
    );
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!stderr.contains(bad), "{stderr}");
    }
    assert!(
        stdout.is_empty(),
        "nothing on stdout for a user error: {stdout}"
    );
    (code, stderr)
}

#[test]
fn missing_kernel_file() {
    expect_error(
        &["run", "--kernel", "/nonexistent/vmlinuz"],
        "/nonexistent/vmlinuz",
    );
}

#[test]
fn a_file_that_is_not_a_kernel() {
    let path = temp_dir().join("not-a-kernel.txt");
    std::fs::write(&path, "hello, I am text\n").unwrap();
    let (_, stderr) = expect_error(
        &["run", "--kernel", path.to_str().unwrap()],
        "not a Linux kernel",
    );
    assert!(stderr.contains("not-a-kernel.txt"));
}

#[test]
fn memory_below_the_kernels_needs() {
    let kernel = fake_bzimage();
    let (_, stderr) = expect_error(
        &[
            "run",
            "--kernel",
            kernel.to_str().unwrap(),
            "--memory",
            "64M",
        ],
        "too small",
    );
    // 16 MiB load address + 64 MiB init_size + 32 MiB margin.
    assert!(stderr.contains("112M"), "{stderr}");
}

#[test]
fn memory_above_the_hosts() {
    let kernel = fake_bzimage();
    expect_error(
        &[
            "run",
            "--kernel",
            kernel.to_str().unwrap(),
            "--memory",
            "100T",
        ],
        "more than the host's memory",
    );
}

#[test]
fn memory_that_is_not_a_size() {
    expect_error(&["run", "--memory", "lots"], "--memory");
}

#[test]
fn zero_cpus() {
    expect_error(&["run", "--cpus", "0"], "--cpus");
}

#[test]
fn cpu_pinning_mistakes_are_one_line_errors() {
    let kernel = fake_bzimage();
    let kernel = kernel.to_str().unwrap();
    for (cpus, needle) in [
        (
            "boot=2,affinity=[2@[0]]",
            "--cpus affinity: vCPU 2 does not exist (boot=2: vCPUs 0 to 1)",
        ),
        (
            "boot=1,affinity=[0@[1023]]",
            "--cpus affinity: host CPU 1023 is not one hakoniwa may run on here",
        ),
        ("boot=1,affinity=[0:1]", "is not VCPU@[HOST_CPUS]"),
        ("boot=1,pin=on", "--cpus: unknown option 'pin'"),
    ] {
        let (code, _) = expect_error(&["run", "--kernel", kernel, "--cpus", cpus], needle);
        assert_eq!(code, 125, "{cpus}");
    }
    // A device's threads: the same check, before the image is opened.
    let (code, _) = expect_error(
        &[
            "run",
            "--kernel",
            kernel,
            "--disk",
            "path=/nonexistent.img,iothread_affinity=[1023]",
        ],
        "option iothread_affinity: host CPU 1023 is not one hakoniwa may run on here",
    );
    assert_eq!(code, 125);
}

#[test]
fn passthrough_mistakes_are_one_line_errors() {
    let kernel = fake_bzimage();
    let kernel = kernel.to_str().unwrap();
    for (device, needle) in [
        (
            "path=/sys/bus/pci/devices/0000:99:1f.7",
            "--device: /sys/bus/pci/devices/0000:99:1f.7: no such PCI device",
        ),
        (
            "path=/sys/bus/pci/devices/0000:99:1f.7,speed=9",
            "--device: unknown option 'speed' (known: path, id, irq_affinity)",
        ),
        ("id=nvme0", "--device: missing option 'path'"),
        (
            "path=/x,irq_affinity=maybe",
            "--device: option irq_affinity=maybe: 'maybe' is not on or off",
        ),
    ] {
        let (code, _) = expect_error(&["run", "--kernel", kernel, "--device", device], needle);
        assert_eq!(code, 125, "{device}");
    }
}

#[test]
fn unknown_flags() {
    let (code, _) = expect_error(&["run", "--frobnicate"], "--frobnicate");
    assert_eq!(code, 2, "usage errors exit 2");
}

#[test]
fn a_bad_seccomp_mode_is_one_line() {
    let (code, stderr) = expect_error(&["run", "--seccomp", "maybe"], "--seccomp");
    assert_eq!(code, 2, "usage errors exit 2");
    assert!(stderr.contains("'maybe' is not on, log or off"), "{stderr}");
}

#[test]
fn unreadable_initramfs() {
    let kernel = fake_bzimage();
    let dir = temp_dir();
    // A directory cannot be read as a file, even by root.
    expect_error(
        &[
            "run",
            "--kernel",
            kernel.to_str().unwrap(),
            "--initramfs",
            dir.to_str().unwrap(),
        ],
        "cannot read initramfs",
    );
    expect_error(
        &[
            "run",
            "--kernel",
            kernel.to_str().unwrap(),
            "--initramfs",
            "/nonexistent/initrd",
        ],
        "/nonexistent/initrd",
    );
}

#[test]
fn ctl_without_a_running_vmm() {
    expect_error(
        &["ctl", "--api-socket", "/nonexistent/hakoniwa.sock", "info"],
        "cannot connect to API socket",
    );
}

#[test]
fn bad_metrics_paths_and_intervals() {
    let kernel = fake_bzimage();
    let kernel = kernel.to_str().unwrap();
    // A missing directory: one line, before any VM exists, and no file.
    let (code, stderr) = expect_error(
        &[
            "run",
            "--kernel",
            kernel,
            "--metrics",
            "/nonexistent-hakoniwa-dir/metrics.json",
        ],
        "--metrics /nonexistent-hakoniwa-dir/metrics.json: no such directory: /nonexistent-hakoniwa-dir",
    );
    assert_eq!(code, 125, "{stderr}");
    assert!(!std::path::Path::new("/nonexistent-hakoniwa-dir").exists());
    // A directory is not a metrics file.
    let dir = temp_dir();
    expect_error(
        &[
            "run",
            "--kernel",
            kernel,
            "--metrics",
            dir.to_str().unwrap(),
        ],
        "is a directory, not a file or FIFO",
    );
    let file = temp_dir().join("metrics.json");
    let file = file.to_str().unwrap();
    for interval in ["0", "-1", "soon", "99999"] {
        expect_error(
            &[
                "run",
                "--kernel",
                kernel,
                "--metrics",
                file,
                "--metrics-interval",
                interval,
            ],
            "--metrics-interval",
        );
    }
    // An interval without a file is a usage error that names --metrics.
    let (code, _) = expect_error(
        &["run", "--kernel", kernel, "--metrics-interval", "1"],
        "not provided: --metrics <PATH>",
    );
    assert_eq!(code, 2);
}

#[test]
fn incoming_addresses_and_busy_ports_are_one_line_errors() {
    let kernel = fake_bzimage();
    let kernel = kernel.to_str().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let address = format!("tcp:127.0.0.1:{port},auth=none");
    let (code, _) = expect_error(
        &[
            "run",
            "--kernel",
            kernel,
            "--memory",
            "256M",
            "--incoming",
            &address,
        ],
        "cannot listen",
    );
    assert_eq!(code, 125);
    expect_error(
        &["run", "--kernel", kernel, "--incoming", "127.0.0.1:4444"],
        "tcp:HOST:PORT",
    );
    expect_error(
        &[
            "run",
            "--kernel",
            kernel,
            "--incoming",
            "tcp:127.0.0.1:99999",
        ],
        "not a port",
    );
    expect_error(
        &[
            "run",
            "--kernel",
            kernel,
            "--incoming",
            "tcp:127.0.0.1:4444,auth=none",
            "--restore",
            "x",
        ],
        "cannot be used with",
    );
    expect_error(
        &[
            "ctl",
            "--api-socket",
            "/nonexistent.sock",
            "migrate",
            "--to",
            "tcp:h:1,auth=none",
            "--mode",
            "teleport",
        ],
        "not precopy, postcopy or hybrid",
    );
}

#[test]
fn a_migration_address_must_say_how_it_is_authenticated() {
    let kernel = fake_bzimage();
    let kernel = kernel.to_str().unwrap();
    // Neither tls= nor auth=none: both sides refuse, saying how to fix it.
    let (code, err) = expect_error(
        &[
            "run",
            "--kernel",
            kernel,
            "--incoming",
            "tcp:127.0.0.1:4444",
        ],
        ",tls=DIR",
    );
    assert_eq!(code, 2);
    assert!(err.contains(",auth=none"), "{err}");
    expect_error(
        &[
            "ctl",
            "--api-socket",
            "/nonexistent.sock",
            "migrate",
            "--to",
            "tcp:h:1",
            "--mode",
            "precopy",
        ],
        ",auth=none",
    );
    // Credentials that are not there: one line naming the file, before
    // any VM is built.
    let empty = std::env::temp_dir().join(format!("hk-cli-no-creds-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let address = format!("tcp:127.0.0.1:0,tls={}", empty.display());
    let (code, err) = expect_error(
        &[
            "run",
            "--kernel",
            kernel,
            "--memory",
            "256M",
            "--incoming",
            &address,
        ],
        "ca-cert.pem",
    );
    assert_eq!(code, 125);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn memory_backing_mistakes_are_one_line_errors() {
    let kernel = fake_bzimage();
    let kernel = kernel.to_str().unwrap();
    for (memory, needle) in [
        (
            "size=256M,colour=red",
            "--memory: unknown option 'colour' (known: size, hugepages, thp, prefault, shared)",
        ),
        (
            "size=256M,thp=maybe",
            "--memory: option thp=maybe: 'maybe' is not on or off",
        ),
        ("hugepages=on", "--memory hugepages=on: no size given"),
        (
            "size=255M,hugepages=on",
            "the size must be a multiple of the 2 MiB huge page",
        ),
        ("size=lots,shared=on", "--memory: 'lots' is not a size"),
    ] {
        let (code, _) = expect_error(&["run", "--kernel", kernel, "--memory", memory], needle);
        assert_eq!(code, 125, "{memory}");
    }
    // A migration destination fills RAM 4 KiB at a time through
    // userfaultfd: no hugetlbfs, nothing populated in advance.
    for (memory, needle) in [
        (
            "size=256M,hugepages=on",
            "--memory hugepages=on cannot be used with --incoming",
        ),
        (
            "size=256M,prefault=on",
            "--memory prefault=on cannot be used with --incoming",
        ),
        (
            "size=256M,shared=on",
            "--memory shared=on cannot be used with --incoming",
        ),
    ] {
        expect_error(
            &[
                "run",
                "--kernel",
                kernel,
                "--memory",
                memory,
                "--incoming",
                "tcp:127.0.0.1:0,auth=none",
            ],
            needle,
        );
    }
}

/// More huge pages than the host has free: one line naming
/// /proc/sys/vm/nr_hugepages and how many, before any VM is built.
#[test]
fn hugepages_beyond_the_hosts_pool() {
    let sysfs = std::path::Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB");
    let read = |name: &str| -> u64 {
        std::fs::read_to_string(sysfs.join(name))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    };
    let available = read("free_hugepages").saturating_sub(read("resv_hugepages"))
        + read("nr_overcommit_hugepages").saturating_sub(read("surplus_hugepages"));
    // One huge page more than there are, and at least what the fake
    // kernel needs, so that nothing else is wrong.
    let pages = (available + 1).max(64);
    let memory = format!("size={}M,hugepages=on", pages * 2);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let host_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap();
    if pages * 2048 > host_kib {
        return; // the pool is most of the host: cannot ask for more
    }
    let kernel = fake_bzimage();
    let needle = if sysfs.exists() {
        format!("needs {pages} free 2 MiB huge pages and the host has {available}: set /proc/sys/vm/nr_hugepages to at least")
    } else {
        "the host kernel has no 2 MiB huge pages".to_string()
    };
    let (code, _) = expect_error(
        &[
            "run",
            "--kernel",
            kernel.to_str().unwrap(),
            "--memory",
            &memory,
        ],
        &needle,
    );
    assert_eq!(code, 125);
}

/// A malformed HK_LOG (the diagnostics' level setting) is named once and
/// ignored: the run goes on to its own result (here the missing kernel).
#[test]
fn a_malformed_log_level_is_named_and_ignored() {
    let output = std::process::Command::new(common::hakoniwa())
        .args(["run", "--kernel", "/nonexistent/vmlinuz"])
        .env("HK_LOG", "devices=loud")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].starts_with("hakoniwa: warning: HK_LOG=\"devices=loud\" ignored"),
        "{stderr}"
    );
    assert!(lines[1].contains("/nonexistent/vmlinuz"), "{stderr}");
    assert_eq!(output.status.code(), Some(125), "{stderr}");
}

#[test]
fn ctl_counters_mistakes_are_one_line_each() {
    let ctl = |extra: &[&str], needle: &str| {
        let mut args = vec!["ctl", "--api-socket", "/nonexistent/hk.sock", "counters"];
        args.extend_from_slice(extra);
        expect_error(&args, needle)
    };
    // Bad boundary lists are refused before any connection is tried.
    for (list, needle) in [
        (
            "1ms,500us",
            "boundaries: 500us follows 1ms: each value must be above the one before",
        ),
        (
            "10us,fast",
            "boundaries: 'fast' is not a duration (a number with ns, us, ms or s)",
        ),
        ("0", "boundaries: 0 is not a boundary"),
        ("", "boundaries: '' is not a duration"),
    ] {
        let (code, _) = ctl(&["--disk", "disk0", "--boundaries", list], needle);
        assert_eq!(code, 2, "a usage error: {list:?}");
    }
    ctl(
        &[
            "--disk",
            "disk0",
            "--histogram",
            "reads",
            "--boundaries",
            "1ms",
        ],
        "'reads' is not read, write, flush, discard, write_zeroes, kick_to_dequeue",
    );
    // What the flags need and exclude.
    ctl(&["--disk", "disk0"], "--boundaries");
    ctl(&["--boundaries", "1ms"], "name the disk with --disk");
    ctl(&["--histogram", "read"], "--boundaries");
    ctl(
        &["--json", "--disk", "disk0", "--boundaries", "1ms"],
        "cannot be used with",
    );
    // Well-formed: the socket is the only problem.
    ctl(&[], "cannot connect to API socket");
    ctl(
        &["--disk", "disk0", "--boundaries", "default"],
        "cannot connect to API socket",
    );
}

/// An image a running QEMU holds: `run` refuses it in one line naming
/// QEMU (QEMU's own image locks, docs/devices.md). QEMU runs a TCG
/// machine stopped at its start (`-S`): no KVM needed.
#[test]
fn a_disk_image_in_use_by_qemu_is_one_line_error() {
    use std::os::unix::fs::MetadataExt;
    let kernel = fake_bzimage();
    let image = temp_dir().join("qemu-held.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let mut qemu = std::process::Command::new("qemu-system-x86_64")
        .args(["-machine", "pc", "-accel", "tcg", "-S", "-nodefaults"])
        .args(["-display", "none", "-monitor", "none", "-serial", "none"])
        .args([
            "-drive",
            &format!("file={},if=virtio,format=raw", image.display()),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("qemu-system-x86_64 (the rig installs it)");
    // Until QEMU holds its "write not shared" byte (201).
    let inode = format!(":{} 201 201", std::fs::metadata(&image).unwrap().ino());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string("/proc/locks")
        .unwrap()
        .contains(&inode)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "QEMU never locked the image"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let disk = format!("path={}", image.display());
    let result = std::panic::catch_unwind(|| {
        expect_error(
            &["run", "--kernel", kernel.to_str().unwrap(), "--disk", &disk],
            "is in use by QEMU (read-write; its lock refuses us the \"write\" lock)",
        )
    });
    let _ = qemu.kill();
    let _ = qemu.wait();
    let _ = std::fs::remove_file(&image);
    let (code, _) = result.unwrap();
    assert_eq!(code, 125);
}

#[test]
fn ctl_iotrace_mistakes_are_one_line_each() {
    let ctl = |extra: &[&str], needle: &str| {
        let mut args = vec!["ctl", "--api-socket", "/nonexistent/hk.sock", "iotrace"];
        args.extend_from_slice(extra);
        expect_error(&args, needle)
    };
    // Refused before any connection is tried.
    ctl(&["begin"], "invalid value 'begin'");
    ctl(
        &["stop", "--trace-file", "/tmp/t.jsonl"],
        "--trace-file is given with start",
    );
    ctl(&[], "<ACTION>");
    // Well-formed: the socket is the only problem.
    ctl(&["report", "--disk", "data"], "/nonexistent/hk.sock");
}
