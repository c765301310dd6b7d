//! Integration tests that boot the default guest (Debian's stock kernel and
//! the busybox initramfs) on real KVM.
//!
//! They are `#[ignore]`d in a plain `cargo test` because these machines'
//! /dev/kvm (PVM) cannot run a stock kernel at speed; `scripts/test` runs
//! them with `--ignored` inside the rig, where KVM is hardware-style.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{hakoniwa, require_hardware_kvm, run_to_end, temp_socket, Vmm, GUEST_TIMEOUT, PROMPT};

/// `hakoniwa run --exec` with extra flags: (status, stdout, stderr).
/// With an API socket, so that a run that times out leaves a failure
/// report of the VM (`ctl dump`) beside its threads.
fn exec(flags: &[&str], command: &str) -> (i32, String, String) {
    require_hardware_kvm();
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let socket = temp_socket(&format!("exec-{run}"));
    let mut args = vec!["run", "--api-socket", &socket];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--exec", command]);
    run_to_end(&args, GUEST_TIMEOUT)
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn interactive_shell_runs_commands_and_powers_off() {
    require_hardware_kvm();
    let mut vmm = Vmm::spawn(&["run"]);
    vmm.wait_for(PROMPT);
    vmm.send("echo hi-$((6*7))\n");
    vmm.wait_for("hi-42");
    vmm.send("poweroff -f\n");
    let status = vmm.wait_exit(GUEST_TIMEOUT);
    assert_eq!(status.code(), Some(0), "{}", vmm.stderr());
    assert!(vmm.stderr().contains("powered off"), "{}", vmm.stderr());
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn exec_prints_the_output_and_returns_the_status() {
    let (status, stdout, stderr) = exec(&[], "echo out; echo err >&2; exit 7");
    assert_eq!(status, 7, "stderr: {stderr}");
    // Nothing but the command's own output: no boot messages, no \r.
    assert_eq!(stdout, "out\nerr\n");
}

/// `nproc` and the memory the kernel found must match the command line,
/// and the guest must run on KVM's paravirtual clock.
fn check_cpus_and_memory(cpus: u32, memory_mib: u64) {
    check_cpus_and_memory_backed(cpus, memory_mib, &format!("{memory_mib}M"));
}

/// As [`check_cpus_and_memory`], with `--memory memory_flag` (which must
/// say `memory_mib`).
fn check_cpus_and_memory_backed(cpus: u32, memory_mib: u64, memory_flag: &str) {
    let cpus_flag = cpus.to_string();
    let (status, stdout, stderr) = exec(
        &["--cpus", &cpus_flag, "--memory", memory_flag],
        "nproc; dmesg | grep -o 'Memory: [0-9]*K/[0-9]*K'; grep MemTotal /proc/meminfo; \
         cat /sys/devices/system/clocksource/clocksource0/current_clocksource",
    );
    assert_eq!(status, 0, "stderr: {stderr}\nstdout: {stdout}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some(cpus_flag.as_str()), "nproc: {stdout}");

    // "Memory: <available>K/<total>K": total is all RAM in the e820 map,
    // which is --memory less the BIOS area below 1 MiB.
    let memory_line = lines.next().expect("no Memory: line");
    let total_kib: u64 = memory_line
        .rsplit('/')
        .next()
        .and_then(|t| t.trim_end_matches('K').parse().ok())
        .unwrap_or_else(|| panic!("cannot parse {memory_line:?}"));
    let requested_kib = memory_mib * 1024;
    assert!(
        total_kib <= requested_kib && total_kib + 1024 >= requested_kib,
        "kernel saw {total_kib} KiB of RAM for --memory {memory_mib}M"
    );
    let mem_total_kib: u64 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .expect("no MemTotal");
    assert!(
        mem_total_kib * 10 >= requested_kib * 8,
        "MemTotal {mem_total_kib} KiB is far below {requested_kib} KiB"
    );
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn one_cpu_and_256m() {
    check_cpus_and_memory(1, 256);
    // The same guest on 2 MiB hugetlbfs pages, every one populated at
    // start: a mapping that succeeds holds them (MAP_HUGETLB), so the boot
    // is the check.
    let Some(_pool) = HugePagePool::reserve(128) else {
        eprintln!(
            "one_cpu_and_256m: no 128 huge pages to reserve (not root?): hugepages=on not checked"
        );
        return;
    };
    check_cpus_and_memory_backed(1, 256, "size=256M,hugepages=on,prefault=on");
}

/// 2 MiB huge pages reserved for a test (as root: the rig runs tests so),
/// given back when dropped.
struct HugePagePool {
    before: u64,
}

impl HugePagePool {
    const NR: &'static str = "/proc/sys/vm/nr_hugepages";

    fn read() -> Option<u64> {
        std::fs::read_to_string(Self::NR).ok()?.trim().parse().ok()
    }

    /// Grows the pool by `pages`; None when the kernel cannot (not root,
    /// or memory too fragmented), with the pool as it was.
    fn reserve(pages: u64) -> Option<HugePagePool> {
        let before = Self::read()?;
        let pool = HugePagePool { before };
        std::fs::write(Self::NR, (before + pages).to_string()).ok()?;
        (Self::read()? >= before + pages).then_some(pool)
    }
}

impl Drop for HugePagePool {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::NR, self.before.to_string());
    }
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn two_cpus_and_768m() {
    check_cpus_and_memory(2, 768);
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn four_cpus_and_2560m() {
    check_cpus_and_memory(4, 2560);
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn one_cpu_and_3584m_across_the_mmio_hole() {
    // More than 3 GiB: RAM continues above 4 GiB.
    check_cpus_and_memory(1, 3584);
}

/// Each thread's seccomp mode (`Seccomp:` in its /proc status: 0 none,
/// 2 filter), by thread name.
fn thread_seccomp_modes(pid: i32) -> Vec<(String, String)> {
    let mut modes = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap()
                .trim()
                .to_string()
        };
        modes.push((field("Name:"), field("Seccomp:")));
    }
    modes
}

/// The default is `on`: every thread of a running VM (main, vCPUs,
/// console, signals) is under a filter, and the guest runs. `log` runs a
/// guest too (and filters every thread); `off` leaves every thread
/// unfiltered. The filters stopping a forbidden call is the sandbox
/// crate's unit tests' job (a guest cannot make the VMM call one).
#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn seccomp_filters_every_thread_unless_off() {
    require_hardware_kvm();
    let check = |flags: &[&str], want: &str| {
        let mut args = vec!["run", "--cpus", "2"];
        args.extend_from_slice(flags);
        let mut vmm = Vmm::spawn(&args);
        vmm.wait_for(PROMPT);
        let modes = thread_seccomp_modes(vmm.pid());
        let names: Vec<&str> = modes.iter().map(|(n, _)| n.as_str()).collect();
        for name in ["vcpu0", "vcpu1", "console-in", "signals"] {
            assert!(names.contains(&name), "{flags:?}: no {name} in {modes:?}");
        }
        for (name, mode) in &modes {
            assert_eq!(mode, want, "{flags:?}: thread {name}: {modes:?}");
        }
        vmm.send("echo alive-$((6*7))\n");
        vmm.wait_for("alive-42");
        vmm.send("poweroff -f\n");
        let status = vmm.wait_exit(GUEST_TIMEOUT);
        assert_eq!(status.code(), Some(0), "{flags:?}: {}", vmm.stderr());
        assert!(
            !vmm.stderr().contains("seccomp"),
            "{flags:?}: {}",
            vmm.stderr()
        );
    };
    check(&[], "2");
    check(&["--seccomp", "log"], "2");
    check(&["--seccomp", "off"], "0");
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn reboot_ends_the_vmm() {
    require_hardware_kvm();
    let mut vmm = Vmm::spawn(&["run"]);
    vmm.wait_for(PROMPT);
    vmm.send("reboot -f\n");
    let status = vmm.wait_exit(GUEST_TIMEOUT);
    assert_eq!(status.code(), Some(0), "{}", vmm.stderr());
    assert!(vmm.stderr().contains("rebooted"), "{}", vmm.stderr());
}

/// `ctl dump` writes a report of a running guest, and a triple fault (the
/// kernel's `reboot=t` method: an empty IDT, then int3) writes one by
/// itself into `--dump-dir` and says where in one line.
#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn dumps_report_a_running_guest_and_a_triple_fault() {
    require_hardware_kvm();
    let dir = std::env::temp_dir().join(format!("hakoniwa-dumps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let socket = common::temp_socket("dump");
    let mut vmm = Vmm::spawn(&[
        "run",
        "--cmdline",
        "console=ttyS0 quiet io_delay=none panic=-1 reboot=t",
        "--dump-dir",
        dir.to_str().unwrap(),
        "--api-socket",
        &socket,
    ]);
    vmm.wait_for(PROMPT);
    let read_json = |path: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };

    // On demand: the VM is paused for a moment and goes on.
    let (ok, out) = common::ctl(&socket, &["dump"]);
    assert!(ok, "{out}");
    let answer: serde_json::Value = serde_json::from_str(&out).unwrap();
    let report = read_json(answer["path"].as_str().unwrap());
    let vcpu = &report["vcpus"][0];
    assert_eq!(vcpu["exit"], "paused", "{vcpu}");
    assert_eq!(vcpu["paging"], "4-level", "{vcpu}");
    let rip = &vcpu["translations"][0];
    assert_eq!(rip["what"], "rip");
    assert_eq!(rip["result"], "mapped", "{rip}");
    assert!(vcpu["code"].as_str().unwrap().contains('['), "{vcpu}");
    let rip_page = rip["physical"].as_str().unwrap();
    let rip_page = u64::from_str_radix(rip_page.trim_start_matches("0x"), 16).unwrap() & !0xfff;
    let page = report["pages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["address"] == format!("{rip_page:#x}"))
        .expect("RIP's page is listed");
    assert_eq!(page["in_memory"], true, "{page}");
    assert!(report["console_tail"]
        .as_str()
        .unwrap()
        .contains("hakoniwa:/# "));
    assert_eq!(vmm.shell("echo $((6*7))").trim(), "42");

    // A triple fault: the report is written and named on stderr.
    vmm.send("reboot -f\n");
    let status = vmm.wait_exit(GUEST_TIMEOUT);
    assert_eq!(status.code(), Some(0), "{}", vmm.stderr());
    let stderr = vmm.stderr();
    assert!(stderr.contains("the guest triple-faulted"), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("; report: "))
        .unwrap_or_else(|| panic!("no report line: {stderr}"));
    assert!(line.contains("vCPU 0 (shutdown (triple fault))"), "{line}");
    let path = line.rsplit("; report: ").next().unwrap().trim();
    let report = read_json(path);
    let vcpu = &report["vcpus"][0];
    assert_eq!(vcpu["exit"], "shutdown (triple fault)", "{vcpu}");
    if vcpu["state_note"].is_null() {
        // Intel keeps the state of the fault: reboot=t loads an IDT of no
        // entries before its int3.
        assert!(line.contains(") at RIP 0x"), "{line}");
        assert!(
            vcpu["segments"]["idt"]
                .as_str()
                .unwrap()
                .ends_with("limit 0x0"),
            "{vcpu}"
        );
    } else {
        // AMD resets the vCPU at the shutdown intercept: said so, and
        // the registers are INIT's.
        assert!(line.contains("registers are lost"), "{line}");
        assert_eq!(vcpu["regs"]["rip"], "0xfff0", "{vcpu}");
    }
    // The guest's last words are in it either way.
    assert!(
        report["console_tail"]
            .as_str()
            .unwrap()
            .contains("reboot -f"),
        "{report}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn sigterm_ends_the_vmm_cleanly() {
    require_hardware_kvm();
    let mut vmm = Vmm::spawn(&["run", "--cpus", "2"]);
    vmm.wait_for(PROMPT);
    vmm.signal(libc::SIGTERM);
    let status = vmm.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{}", vmm.stderr());
    assert!(vmm.stderr().contains("SIGTERM"), "{}", vmm.stderr());
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn elf_vmlinux_boots_through_pvh() {
    let root = common::project_root();
    let vmlinux = root.join("build/guest/vmlinux");
    let initramfs = root.join("build/guest/initramfs.cpio.gz");
    let (status, stdout, stderr) = exec(
        &[
            "--kernel",
            vmlinux.to_str().unwrap(),
            "--initramfs",
            initramfs.to_str().unwrap(),
        ],
        "echo pvh-ok; dmesg | grep -c 'Booting paravirtualized kernel on KVM'",
    );
    assert_eq!(status, 0, "stderr: {stderr}");
    assert_eq!(stdout, "pvh-ok\n1\n");
}

fn ctl(socket: &str, command: &str) -> (bool, String) {
    common::ctl(socket, &[command])
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn api_describes_pauses_resumes_and_shuts_down_the_vm() {
    require_hardware_kvm();
    let socket = common::temp_socket("api-test");
    // vCPU 0 pinned to host CPU 0 (the rig's L1 has one), vCPU 1 free.
    let mut vmm = Vmm::spawn(&[
        "run",
        "--cpus",
        "boot=2,affinity=[0@[0]]",
        "--memory",
        "384M",
        "--api-socket",
        &socket,
    ]);
    vmm.wait_for(PROMPT);

    let (ok, info) = ctl(&socket, "info");
    assert!(ok, "{info}");
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["state"], "running");
    assert_eq!(info["vcpus"], 2);
    assert_eq!(info["memory_mib"], 384);
    // The default backing: private, not hugetlbfs, THP asked for (in
    // effect only where the host allows it: not in the rig, whose THP is
    // "never", and then thp_note says so).
    let backing = &info["memory_backing"];
    assert_eq!(backing["size_mib"], 384, "{backing}");
    assert_eq!(backing["hugepages"], false, "{backing}");
    assert_eq!(backing["shared"], false, "{backing}");
    assert!(
        backing["thp"] == true || backing["thp_note"].is_string(),
        "{backing}"
    );
    // Each vCPU thread, where it was pinned, and what the kernel says it
    // may run on (Cpus_allowed_list of /proc/PID/task/TID/status).
    let threads = info["vcpu_threads"].as_array().unwrap();
    assert_eq!(threads.len(), 2, "{info}");
    assert_eq!(threads[0]["index"], 0);
    assert_eq!(threads[0]["pinned"], "0", "{info}");
    assert_eq!(threads[0]["cpus_allowed"], "0", "{info}");
    assert!(threads[1]["pinned"].is_null(), "{info}");
    let tid = threads[0]["thread_id"].as_i64().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/task/{tid}/status", vmm.pid()))
        .unwrap_or_else(|e| panic!("vCPU 0's thread {tid}: {e}"));
    assert!(
        status.contains("Cpus_allowed_list:\t0\n"),
        "vCPU 0's thread {tid}: {status}"
    );
    // Every thread of the VMM, by name, with where it may run.
    let names: Vec<&str> = info["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"vcpu0") && names.contains(&"vcpu1"),
        "{names:?}"
    );
    assert_eq!(info["boot_protocol"], "linux-64bit");
    let ids: Vec<&str> = info["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["id"].as_str())
        .collect();
    assert!(
        ids.contains(&"com1") && ids.contains(&"debug-exit"),
        "{ids:?}"
    );

    check_isolation_against_a_second_vm(&socket, vmm.pid());

    let (ok, out) = ctl(&socket, "pause");
    assert!(ok, "{out}");
    let (_, info) = ctl(&socket, "info");
    assert!(info.contains("\"paused\""), "{info}");
    let (ok, out) = ctl(&socket, "pause");
    assert!(
        !ok && out.contains("409"),
        "pausing twice must be refused: {out}"
    );

    // A paused guest does not run: what we type is not echoed...
    vmm.send("echo resumed-$((20+3))\n");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !vmm.stdout().contains("resumed-23"),
        "the guest ran while paused"
    );
    // ...until it is resumed.
    let (ok, out) = ctl(&socket, "resume");
    assert!(ok, "{out}");
    vmm.wait_for("resumed-23");

    let (ok, out) = ctl(&socket, "shutdown");
    // The answer must come before the VMM exits; if it does not, what the
    // VMM said and how it ended tell a race from a crash.
    if !ok {
        let status = vmm.wait_exit(Duration::from_secs(30));
        panic!("{out}\nVMM {status:?}, stderr: {}", vmm.stderr());
    }
    let status = vmm.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", vmm.stderr());
    assert!(
        !std::path::Path::new(&socket).exists(),
        "the API socket must be removed"
    );
}

/// `ctl isolation` on the VM at `socket` (vCPU 0 pinned to CPU 0, vCPU 1
/// free) while a second VM pins its vCPU to the same CPU 0 (L1's only
/// one): the report says CPU 0 is shared with that VM, and with vCPU 1.
fn check_isolation_against_a_second_vm(socket: &str, this_pid: i32) {
    let other_socket = common::temp_socket("api-test-other");
    let mut other = Vmm::spawn(&[
        "run",
        "--cpus",
        "boot=1,affinity=[0@[0]]",
        "--memory",
        "128M",
        "--api-socket",
        &other_socket,
    ]);
    // Its vCPU thread pins itself before it first enters the guest: that
    // is enough, its guest need not boot.
    let deadline = std::time::Instant::now() + GUEST_TIMEOUT;
    loop {
        let (ok, info) = ctl(&other_socket, "info");
        let running = ok
            && serde_json::from_str::<serde_json::Value>(&info)
                .is_ok_and(|i| i["vcpu_threads"][0]["cpus_allowed"] == "0");
        if running {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the second VM's vCPU never ran: {info}\n{}",
            other.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let (ok, out) = common::ctl(socket, &["isolation", "--json"]);
    assert!(ok, "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["verdict"], "not_isolated", "{report:#}");
    assert_eq!(report["vm_cpus"], "0", "{report:#}");
    // The other VM, found by its exe; the ctl processes are not VMs.
    let others = report["other_vms"].as_array().unwrap();
    assert_eq!(others.len(), 1, "{report:#}");
    assert_eq!(others[0]["pid"], other.pid(), "{report:#}");
    assert_eq!(others[0]["matched_by"], "exe", "{report:#}");
    let cpu0 = &report["cpus"][0];
    assert_eq!(cpu0["cpu"], 0, "{report:#}");
    assert_eq!(cpu0["vcpus"], serde_json::json!([0]), "{report:#}");
    let shared = cpu0["shared_with"].as_array().unwrap();
    let has = |owner: &str, pid: i32, name: &str| {
        shared
            .iter()
            .any(|t| t["owner"] == owner && t["pid"] == pid && t["name"] == name)
    };
    assert!(has("other_vm", other.pid(), "vcpu0"), "{report:#}");
    assert!(has("this_vm_vcpu", this_pid, "vcpu1"), "{report:#}");
    let shared_problem = format!(
        "CPU 0 is shared with another hakoniwa VM: pid {}",
        other.pid()
    );
    assert!(
        report["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().starts_with(&shared_problem)),
        "{report:#}"
    );
    assert!(
        report["changed"][0]
            .as_str()
            .unwrap()
            .starts_with("vCPU 0's thread "),
        "{report:#}"
    );
    // The same, for people.
    let (ok, text) = common::ctl(socket, &["isolation"]);
    assert!(ok, "{text}");
    assert!(
        text.starts_with("verdict: not isolated (vCPUs on host CPUs 0)\nCPU 0: vCPU 0; "),
        "{text}"
    );
    assert!(
        text.contains(&format!("  shared with other VM, pid {}: ", other.pid())),
        "{text}"
    );
    println!("ctl isolation:\n{text}");

    let (ok, out) = ctl(&other_socket, "shutdown");
    assert!(ok, "{out}");
    other.wait_exit(Duration::from_secs(60));
}

/// A pseudo-terminal pair: hakoniwa gets the follower side as its terminal.
struct Pty {
    leader: std::fs::File,
    follower: std::fs::File,
}

fn open_pty() -> Pty {
    use std::os::fd::FromRawFd;
    let (mut leader, mut follower) = (0, 0);
    // SAFETY: openpty writes two new descriptors into the out-pointers;
    // the name, termios and winsize arguments may be null.
    let rc = unsafe {
        libc::openpty(
            &mut leader,
            &mut follower,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty failed");
    // SAFETY: both descriptors are fresh and owned by nobody else.
    unsafe {
        Pty {
            leader: std::fs::File::from_raw_fd(leader),
            follower: std::fs::File::from_raw_fd(follower),
        }
    }
}

fn terminal_mode(file: &std::fs::File) -> libc::termios {
    use std::os::fd::AsRawFd;
    // SAFETY: termios is plain data that tcgetattr fills in.
    let mut mode: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a valid out-pointer.
    assert_eq!(unsafe { libc::tcgetattr(file.as_raw_fd(), &mut mode) }, 0);
    mode
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn terminal_is_raw_while_running_and_ctrl_a_x_quits() {
    use std::io::{Read, Write};
    require_hardware_kvm();
    let pty = open_pty();
    let before = terminal_mode(&pty.follower);
    let mut child = Command::new(hakoniwa())
        .args(["run"])
        .current_dir(common::project_root())
        .stdin(pty.follower.try_clone().unwrap())
        .stdout(pty.follower.try_clone().unwrap())
        .stderr(pty.follower.try_clone().unwrap())
        .spawn()
        .unwrap();
    let screen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut reader = pty.leader.try_clone().unwrap();
    let sink = screen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let wait_screen = |needle: &str| {
        let deadline = std::time::Instant::now() + GUEST_TIMEOUT;
        while !screen.lock().unwrap().contains(needle) {
            assert!(
                std::time::Instant::now() < deadline,
                "no {needle:?}:\n{}",
                screen.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_screen(PROMPT);
    // Raw mode: no line editing or signals from the host's tty layer.
    let raw = terminal_mode(&pty.follower);
    assert_eq!(raw.c_lflag & (libc::ICANON | libc::ISIG | libc::ECHO), 0);

    let mut leader = pty.leader.try_clone().unwrap();
    leader.write_all(b"\x01x").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Ctrl-A x did not quit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
    wait_screen("quit from the console");
    let after = terminal_mode(&pty.follower);
    assert_eq!(
        after.c_lflag, before.c_lflag,
        "terminal mode must be restored"
    );
    assert_eq!(
        after.c_iflag, before.c_iflag,
        "terminal mode must be restored"
    );
}

#[test]
#[ignore = "needs the rig's L1 (no IOMMU there): run through the rig (scripts/test)"]
fn passthrough_without_an_iommu_is_refused_in_one_line() {
    require_hardware_kvm();
    // The rig's default L1 (machine "pc") has no IOMMU: its virtio disk has
    // no IOMMU group, which is said before anything else about it.
    let disk = common::pci_device_bound_to("virtio-pci");
    let address = disk.file_name().unwrap().to_string_lossy().into_owned();
    let device = format!("path={}", disk.display());
    let (code, stdout, stderr) = run_to_end(&["run", "--device", &device], Duration::from_secs(30));
    assert_eq!(code, 125, "{stdout}{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("{address} has no IOMMU group"))
            && stderr.contains("intel_iommu=on"),
        "{stderr}"
    );
}
