//! hakoniwa's image locks against a real QEMU on the same image, both
//! orders, read-write and read-only. No KVM: QEMU runs a TCG machine that
//! never starts (`-S`), which is enough for it to open and lock its
//! drive. Needs `qemu-system-x86_64` (scripts/test installs it first).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use devices::virtio::block::{BlockConfig, BlockError, FileDisk};

const QEMU: &str = "qemu-system-x86_64";

/// An image file, removed when dropped.
struct Image(PathBuf);

impl Image {
    fn new(name: &str) -> Image {
        let path = std::env::temp_dir().join(format!(
            "hakoniwa-qemu-lock-{}-{name}.img",
            std::process::id()
        ));
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        Image(path)
    }

    fn config(&self, readonly: bool) -> BlockConfig {
        let mut c = BlockConfig::new(&self.0);
        c.readonly = readonly;
        c
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A QEMU with the image as a virtio-blk drive, killed when dropped.
struct Qemu(Child);

impl Qemu {
    fn spawn(image: &Path, readonly: bool) -> Qemu {
        let drive = format!(
            "file={},if=virtio,format=raw,readonly={}",
            image.display(),
            if readonly { "on" } else { "off" }
        );
        let child = Command::new(QEMU)
            .args(["-machine", "pc", "-accel", "tcg", "-S", "-nodefaults"])
            .args(["-display", "none", "-monitor", "none", "-serial", "none"])
            .args(["-drive", &drive])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {QEMU} (scripts/test installs it): {e}"));
        Qemu(child)
    }

    /// Waits until QEMU holds its "write not shared" byte (201) on the
    /// image, as /proc/locks shows, or panics with QEMU's stderr.
    fn wait_locked(&mut self, image: &Path) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if locked_bytes(image).contains(&201) {
                return;
            }
            if let Ok(Some(status)) = self.0.try_wait() {
                panic!("QEMU ended ({status}): {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("QEMU did not lock {} within 30 s", image.display());
    }

    /// Waits for QEMU to end; returns its status and stderr.
    fn wait_end(mut self) -> (bool, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.0.try_wait() {
                return (status.success(), self.stderr());
            }
            assert!(Instant::now() < deadline, "QEMU did not end within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stderr(&mut self) -> String {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The bytes locked on `image` (by anyone), from /proc/locks.
fn locked_bytes(image: &Path) -> Vec<u64> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(image).unwrap().ino();
    let locks = std::fs::read_to_string("/proc/locks").unwrap();
    let mut bytes = Vec::new();
    for line in locks.lines() {
        // "1: OFDLCK ADVISORY  READ -1 fe:00:9977979 100 101"
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(id) = f.iter().find(|w| w.matches(':').count() == 2) else {
            continue;
        };
        if id.rsplit(':').next() != Some(&ino.to_string()) {
            continue;
        }
        let (Some(start), Some(end)) = (
            f.get(f.len() - 2).and_then(|s| s.parse::<u64>().ok()),
            f.last().and_then(|s| s.parse::<u64>().ok()),
        ) else {
            continue;
        };
        bytes.extend(start..=end);
    }
    bytes
}

fn refusal(result: Result<FileDisk, BlockError>) -> String {
    match result {
        Err(e @ BlockError::Locked { .. }) => e.to_string(),
        Err(e) => panic!("expected a lock conflict, got: {e}"),
        Ok(_) => panic!("expected a lock conflict, the image opened"),
    }
}

#[test]
fn qemu_first_refuses_hakoniwa_and_names_qemu() {
    let image = Image::new("qemu-rw");
    let mut qemu = Qemu::spawn(&image.0, false);
    qemu.wait_locked(&image.0);
    let e = refusal(FileDisk::open(&image.config(false)));
    assert!(
        e.ends_with("is in use by QEMU (read-write; its lock refuses us the \"write\" lock)"),
        "{e}"
    );
    let e = refusal(FileDisk::open(&image.config(true)));
    assert!(e.contains("in use by QEMU (read-write;"), "{e}");
    drop(qemu);
    FileDisk::open(&image.config(false)).expect("free once QEMU is gone");
}

#[test]
fn a_read_only_qemu_shares_with_readers_only() {
    let image = Image::new("qemu-ro");
    let mut qemu = Qemu::spawn(&image.0, true);
    qemu.wait_locked(&image.0);
    let reader = FileDisk::open(&image.config(true)).expect("readers share");
    drop(reader);
    let e = refusal(FileDisk::open(&image.config(false)));
    assert!(
        e.ends_with("is in use by QEMU (read-only; its lock refuses us the \"write\" lock)"),
        "{e}"
    );
}

#[test]
fn hakoniwa_first_refuses_qemu() {
    let image = Image::new("hk-rw");
    let disk = FileDisk::open(&image.config(false)).unwrap();
    for readonly in [false, true] {
        let (ok, stderr) = Qemu::spawn(&image.0, readonly).wait_end();
        assert!(!ok, "QEMU (readonly={readonly}) started on a locked image");
        assert!(stderr.contains("\"write\" lock"), "{stderr}");
    }
    // Handed over (a migration's source): QEMU may have it.
    disk.unlock_image().unwrap();
    let mut qemu = Qemu::spawn(&image.0, false);
    qemu.wait_locked(&image.0);
    match disk.lock_image() {
        Err(e @ BlockError::Locked { .. }) => {
            assert!(e.to_string().contains("in use by QEMU"), "{e}")
        }
        other => panic!("expected a lock conflict, got {other:?}"),
    }
}

#[test]
fn a_read_only_hakoniwa_shares_with_a_read_only_qemu() {
    let image = Image::new("hk-ro");
    let _disk = FileDisk::open(&image.config(true)).unwrap();
    let mut qemu = Qemu::spawn(&image.0, true);
    qemu.wait_locked(&image.0);
    // QEMU is up and holding the image beside us.
    assert!(qemu.0.try_wait().unwrap().is_none(), "{}", qemu.stderr());
    let (ok, stderr) = Qemu::spawn(&image.0, false).wait_end();
    assert!(!ok, "a writing QEMU started beside two readers");
    assert!(stderr.contains("\"write\" lock"), "{stderr}");
}
