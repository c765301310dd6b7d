//! Helpers for tests that run the real `hakoniwa` binary.

#![allow(dead_code)] // each test file uses a different subset

pub mod debian;
pub mod display;
pub mod migration;
pub mod net;
pub mod relay;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a guest may take to reach a point. The rig (nested KVM under
/// TCG) is slow and shared by parallel tests, so this is generous.
pub const GUEST_TIMEOUT: Duration = Duration::from_secs(240);

/// The interactive shell's prompt in the default guest.
pub const PROMPT: &str = "hakoniwa:/# ";

pub fn hakoniwa() -> &'static str {
    env!("CARGO_BIN_EXE_hakoniwa")
}

pub fn project_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Guest tests need hardware-style KVM. On a PVM host (or none) they would
/// emulate a stock kernel ~500x slower; say how to run them instead.
pub fn require_hardware_kvm() {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has_vmx_svm = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    assert!(
        has_vmx_svm && !pvm && Path::new("/dev/kvm").exists(),
        "this test boots a real guest and needs hardware KVM; run it through the rig (scripts/test does)"
    );
    assert!(
        project_root().join("build/guest/vmlinuz").exists(),
        "the default guest is not built: run scripts/build-guest"
    );
}

static SHELL_COMMANDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A running `hakoniwa` with its console captured.
pub struct Vmm {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Set when hakoniwa closed its stdout (it exited).
    stdout_ended: Arc<AtomicBool>,
    /// `--api-socket`, when given: a timeout asks it for a failure report.
    api_socket: Option<String>,
}

/// Reads `from` to its end into a buffer; the flag is set once everything
/// has been read (the writer closed it: for a child's stdout, it exited).
fn collect(mut from: impl Read + Send + 'static) -> (Arc<Mutex<Vec<u8>>>, Arc<AtomicBool>) {
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let ended = Arc::new(AtomicBool::new(false));
    let (sink, done) = (buffer.clone(), ended.clone());
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = from.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
        done.store(true, Ordering::SeqCst);
    });
    (buffer, ended)
}

impl Vmm {
    /// Starts `hakoniwa <args>` with piped stdin, stdout and stderr.
    pub fn spawn(args: &[&str]) -> Vmm {
        let mut child = Command::new(hakoniwa())
            .args(args)
            .current_dir(project_root())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start hakoniwa");
        let (stdout, stdout_ended) = collect(child.stdout.take().unwrap());
        let (stderr, _) = collect(child.stderr.take().unwrap());
        let api_socket = args
            .iter()
            .position(|a| *a == "--api-socket")
            .and_then(|i| args.get(i + 1))
            .map(|s| s.to_string());
        Vmm {
            stdin: child.stdin.take(),
            child,
            stdout,
            stderr,
            stdout_ended,
            api_socket,
        }
    }

    /// For a timeout's panic message: a failure report of the VM as it is
    /// (`ctl dump`: where each vCPU is, the pages involved), written under
    /// build/test-dumps/ so it outlives the rig's L1, when the VMM serves
    /// the API.
    fn dump_for_timeout(&self) -> String {
        let Some(socket) = &self.api_socket else {
            return "(no --api-socket: no failure report)".into();
        };
        let dir = project_root().join("build/test-dumps");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!(
            "timeout-{}-{}.json",
            std::process::id(),
            self.pid()
        ));
        let out = Command::new("timeout")
            .args([
                "60",
                hakoniwa(),
                "ctl",
                "--api-socket",
                socket,
                "dump",
                "--path",
            ])
            .arg(&path)
            .output();
        match out {
            Ok(out) => format!(
                "ctl dump: {}{}",
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => format!("ctl dump: {e}"),
        }
    }

    /// For a timeout's panic message: each of hakoniwa's threads, its
    /// name, state, `wchan` and kernel stack (root, as in the rig), read
    /// from outside as the VMM's own failure reports read them: a VMM with
    /// no API, or one too stuck to answer it, still says which thread
    /// waits where, and whether the vCPUs are in the guest or halted.
    fn threads_for_timeout(&self) -> String {
        let threads = vmm::dump::threads_of(&self.pid().to_string());
        if threads.is_empty() {
            return format!("(cannot list /proc/{}/task)", self.pid());
        }
        threads.join("\n")
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Waits until the console shows `needle`. Fails at once if hakoniwa
    /// has exited without it (no point waiting out the timeout).
    pub fn wait_for(&self, needle: &str) {
        let deadline = Instant::now() + GUEST_TIMEOUT;
        while Instant::now() < deadline {
            // Read the flag first: once it is set, all output is in.
            let ended = self.stdout_ended.load(Ordering::SeqCst);
            if self.stdout().contains(needle) {
                return;
            }
            if ended {
                // Let the stderr reader catch up with the last message.
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "hakoniwa exited without {needle:?} on the console\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    self.stdout(),
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "no {needle:?} on the console within {GUEST_TIMEOUT:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- threads ---\n{}\n--- report ---\n{}",
            self.stdout(),
            self.stderr(),
            self.threads_for_timeout(),
            self.dump_for_timeout()
        );
    }

    /// Types `text` on the console.
    pub fn send(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("stdin closed");
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for hakoniwa to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        self.exit_within(timeout).unwrap_or_else(|| {
            panic!(
                "hakoniwa did not exit within {timeout:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- threads ---\n{}\n--- report ---\n{}",
                self.stdout(),
                self.stderr(),
                self.threads_for_timeout(),
                self.dump_for_timeout()
            )
        })
    }

    /// Its exit status, if hakoniwa exits within `timeout`.
    pub fn exit_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the readers drain what is left in the pipes.
                std::thread::sleep(Duration::from_millis(100));
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `command` in the guest's interactive shell and returns what it
    /// printed. The start and end markers are computed by the shell, so the
    /// echo of the typed line (however the terminal wraps it) never matches.
    pub fn shell(&mut self, command: &str) -> String {
        let n = SHELL_COMMANDS.fetch_add(2, std::sync::atomic::Ordering::SeqCst) + 1000;
        let (begin, end) = (
            format!("__begin_{}__\n", n + 1),
            format!("__end_{}__", n + 2),
        );
        // Where this command's output starts, in the output as compared
        // below (without \r): the raw length would skip one byte more per
        // \r so far, and in a long session cut off a short command's
        // begin marker.
        let skip = self.stdout().replace('\r', "").len();
        self.send(&format!(
            "echo __begin_$(({n}+1))__; {command}; echo __end_$(({n}+2))__\n"
        ));
        let deadline = Instant::now() + GUEST_TIMEOUT;
        loop {
            let out = self.stdout().replace('\r', "");
            let tail = out.get(skip..).unwrap_or("");
            if let Some(from) = tail.find(&begin).map(|i| i + begin.len()) {
                if let Some(len) = tail[from..].find(&end) {
                    return tail[from..from + len].to_string();
                }
            }
            assert!(
                Instant::now() < deadline,
                "{command:?} did not finish:\n{out}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0);
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test's VMMs say what they said last: the panic's own
        // message rarely carries it, and the failure is kept as evidence.
        if std::thread::panicking() {
            let stderr = self.stderr();
            let lines: Vec<&str> = stderr.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!(
                "--- hakoniwa (pid {}) stderr, last {} lines ---\n{}",
                self.child.id(),
                tail.len(),
                tail.join("\n")
            );
        }
    }
}

/// `hakoniwa ctl --api-socket SOCKET ARGS...`: (success, stdout + stderr).
/// A failure with no output says how ctl ended (its status, or the signal
/// that killed it): a killed ctl prints nothing.
pub fn ctl(socket: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(hakoniwa())
        .args(["ctl", "--api-socket", socket])
        .args(args)
        .output()
        .expect("cannot run hakoniwa ctl");
    let mut text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && text.trim().is_empty() {
        text = format!("(ctl printed nothing: {})", out.status);
    }
    (out.status.success(), text)
}

/// Runs `script` with sh on the VMM's host (L1 in the rig); panics with
/// its output if it fails. Returns stdout.
pub fn host_sh(script: &str) -> String {
    let out = Command::new("sh").args(["-c", script]).output().unwrap();
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A socket path in the test's temporary directory (a tmpfs in the rig).
pub fn temp_socket(name: &str) -> String {
    let path = std::env::temp_dir().join(format!("hakoniwa-{name}-{}.sock", std::process::id()));
    path.to_str().unwrap().to_string()
}

/// Runs `hakoniwa <args>` to completion: (exit code, stdout, stderr).
pub fn run_to_end(args: &[&str], timeout: Duration) -> (i32, String, String) {
    let mut vmm = Vmm::spawn(args);
    drop(vmm.stdin.take());
    let status = vmm.wait_exit(timeout);
    (status.code().unwrap_or(-1), vmm.stdout(), vmm.stderr())
}

/// The sysfs directory of the first PCI function of this host bound to
/// `driver` (e.g. the rig's virtio disk, bound to virtio-pci).
pub fn pci_device_bound_to(driver: &str) -> PathBuf {
    std::fs::read_dir("/sys/bus/pci/devices")
        .unwrap()
        .flatten()
        .find(|e| std::fs::read_link(e.path().join("driver")).is_ok_and(|d| d.ends_with(driver)))
        .unwrap_or_else(|| panic!("no PCI device bound to {driver} here"))
        .path()
}

/// The metadata section of a snapshot file, as JSON (docs/snapshot.md).
pub fn snapshot_metadata(path: &str) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"HKNWSNAP");
    let version_len = u16::from_le_bytes([bytes[12], bytes[13]]) as usize;
    let section = 14 + version_len + 4;
    assert_eq!(&bytes[section..section + 4], b"META");
    let len = u64::from_le_bytes(bytes[section + 4..section + 12].try_into().unwrap()) as usize;
    serde_json::from_slice(&bytes[section + 16..section + 16 + len]).unwrap()
}
