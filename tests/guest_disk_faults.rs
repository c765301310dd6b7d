//! Host disk faults under a running guest (docs/devices.md), injected in
//! L1 with device-mapper and a full tmpfs, all in one boot:
//! - a read the host fails (dm `error` target under part of the disk)
//!   reaches the guest as an I/O error, and the VMM goes on serving;
//! - a flush whose `fdatasync` failed (dm switched to `error` under dirty
//!   pages) keeps failing after the device is healthy again, where a
//!   second `fdatasync` alone would succeed, and `vm.counters` counts the
//!   failed sync and the refused ones;
//! - ENOSPC with `werror=stop` pauses the VM with one line naming the disk
//!   and the errno (and `vm.info`'s `io_error`), and after space is freed
//!   `ctl resume` completes the held write, which the guest never saw fail;
//! - durability (a second boot): what the guest wrote and flushed survives
//!   `kill -9` of the VMM *and* a simulated host crash — L1's page cache
//!   of the image lost, its dirty pages dropped by dm-flakey instead of
//!   written — with cache=writeback and cache=none; with cache=unsafe,
//!   whose flushes are ignored, the same data is lost (so the check can
//!   tell).
//!
//! Needs root and device-mapper in L1 (the rig loads dm-mod and loop).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::net::md5_hex;
use common::{ctl, require_hardware_kvm, temp_socket, Vmm, PROMPT};

/// Runs `script` with sh in L1 (the VMM's host); panics with its output
/// if it fails. Returns stdout.
fn host(script: &str) -> String {
    let out = Command::new("sh").args(["-c", script]).output().unwrap();
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// dmsetup without udev (L1 runs none): it makes /dev/mapper's nodes itself.
fn dmsetup(args: &str) {
    host(&format!("DM_DISABLE_UDEV=1 dmsetup --noudevsync {args}"));
}

/// Sectors of every test device: 16 MiB.
const SECTORS: u64 = 32768;

/// A device-mapper device over a loop device over a sparse file, removed
/// (with its loop device and file) when dropped.
struct DmDisk {
    name: String,
    loop_dev: String,
    file: String,
}

impl DmDisk {
    /// `table` may use `{loop}` for the loop device.
    fn new(name: &str, table: &str) -> DmDisk {
        let file = format!("/tmp/hakoniwa-{name}-{}.img", std::process::id());
        host(&format!("truncate -s {} {file}", SECTORS * 512));
        let loop_dev = host(&format!("losetup --find --show {file}"))
            .trim()
            .to_string();
        let name = format!("hk-{name}-{}", std::process::id());
        let disk = DmDisk {
            name,
            loop_dev,
            file,
        };
        dmsetup(&format!(
            "create {} --table '{}'",
            disk.name,
            disk.table(table)
        ));
        disk
    }

    fn table(&self, table: &str) -> String {
        table.replace("{loop}", &self.loop_dev)
    }

    fn path(&self) -> String {
        format!("/dev/mapper/{}", self.name)
    }

    /// Swaps in a new table (the device is suspended meanwhile).
    fn reload(&self, table: &str) {
        dmsetup(&format!(
            "reload {} --table '{}'",
            self.name,
            self.table(table)
        ));
        dmsetup(&format!("resume {}", self.name));
    }

    /// Swaps in a new table without syncing the device's page cache:
    /// a plain suspend "locks the file system", which for a device
    /// without one writes its dirty pages back first.
    fn swap_unsynced(&self, table: &str) {
        dmsetup(&format!("suspend --nolockfs {}", self.name));
        dmsetup(&format!(
            "reload {} --table '{}'",
            self.name,
            self.table(table)
        ));
        dmsetup(&format!("resume {}", self.name));
    }

    /// A host crash as the device sees it: whatever L1 still had in its
    /// page cache for the device never reaches it. dm-flakey, down for
    /// good with `drop_writes`, swallows the write-back that dropping the
    /// cache forces; then the device is itself again.
    fn crash(&self, linear: &str) {
        self.swap_unsynced(&format!("0 {SECTORS} flakey {{loop}} 0 0 1 1 drop_writes"));
        host(&format!(
            "blockdev --flushbufs {}; echo 3 > /proc/sys/vm/drop_caches",
            self.path()
        ));
        self.swap_unsynced(linear);
    }
}

impl Drop for DmDisk {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .args([
                "-c",
                &format!(
                    "DM_DISABLE_UDEV=1 dmsetup --noudevsync remove {}; losetup -d {}; rm -f {}",
                    self.name, self.loop_dev, self.file
                ),
            ])
            .status();
    }
}

/// A tmpfs of 4 MiB holding a sparse 16 MiB image, unmounted when dropped.
struct SmallFs {
    dir: String,
}

impl SmallFs {
    fn new() -> SmallFs {
        let dir = format!("/tmp/hakoniwa-full-{}", std::process::id());
        host(&format!(
            "mkdir -p {dir} && mount -t tmpfs -o size=4m tmpfs {dir} && truncate -s 16M {dir}/img"
        ));
        SmallFs { dir }
    }

    fn image(&self) -> String {
        format!("{}/img", self.dir)
    }

    /// Fills the file system (dd stops at ENOSPC).
    fn fill(&self) {
        host(&format!(
            "dd if=/dev/zero of={}/filler bs=64k 2>/dev/null; df -k {} | tail -1",
            self.dir, self.dir
        ));
    }

    fn free(&self) {
        host(&format!("rm {}/filler", self.dir));
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn vm_info(socket: &str) -> serde_json::Value {
    let (ok, info) = ctl(socket, &["info"]);
    assert!(ok, "{info}");
    serde_json::from_str(&info).unwrap()
}

/// `vm.counters` of disk `id`.
fn disk_counters(socket: &str, id: &str) -> serde_json::Value {
    let (ok, out) = ctl(socket, &["counters", "--json"]);
    assert!(ok, "{out}");
    let counters: serde_json::Value = serde_json::from_str(&out).unwrap();
    counters[id].clone()
}

/// Waits until hakoniwa's stderr contains `needle`.
fn wait_stderr(vmm: &Vmm, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !vmm.stderr().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} on stderr:\n{}\n--- console ---\n{}",
            vmm.stderr(),
            vmm.stdout()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "boots a real guest and needs root for device-mapper: run through the rig (scripts/test)"]
fn host_read_errors_sticky_flushes_and_werror_stop_on_enospc() {
    require_hardware_kvm();
    // vda: the first 8 MiB healthy, the last 8 MiB failing every access.
    let half = SECTORS / 2;
    let reads = DmDisk::new(
        "read",
        &format!("0 {half} linear {{loop}} 0\n{half} {half} error"),
    );
    let linear = format!("0 {SECTORS} linear {{loop}} 0");
    // vdb: healthy for now; its writes go through L1's page cache.
    let flushes = DmDisk::new("flush", &linear);
    // vdc: an image on a full file system, werror=stop.
    let small = SmallFs::new();
    small.fill();
    let socket = temp_socket("faults");
    let mut vmm = Vmm::spawn(&[
        "run",
        "--api-socket",
        &socket,
        "--disk",
        &format!("path={},cache=none", reads.path()),
        "--disk",
        &format!("path={},cache=writeback", flushes.path()),
        "--disk",
        &format!("path={},werror=stop", small.image()),
    ]);
    vmm.wait_for(PROMPT);

    // A failing read is the guest's I/O error; the VMM goes on serving.
    let out = vmm.shell(
        "dd if=/dev/vda of=/dev/null bs=4096 skip=2048 count=1 2>/dev/null; echo bad=$?; \
         dd if=/dev/vda of=/dev/null bs=4096 count=1 2>/dev/null; echo good=$?; \
         dmesg | grep -c 'I/O error, dev vda'",
    );
    assert!(out.contains("bad=1"), "{out}");
    assert!(out.contains("good=0"), "{out}");
    let logged: u32 = out.lines().last().unwrap().trim().parse().unwrap();
    assert!(logged >= 1, "the guest logged no I/O error: {out}");

    // A flush: fine while the device is; then the device fails under the
    // dirty pages, the flush fails; then it is healthy again, and flushes
    // still fail: the pages that failed writeback are lost and Linux
    // would report that only once.
    let write_sync =
        "dd if=/dev/urandom of=/dev/vdb bs=4096 count=1 conv=fsync 2>/dev/null; echo rc=$?";
    assert!(vmm.shell(write_sync).contains("rc=0"));
    flushes.reload(&format!("0 {SECTORS} error"));
    assert!(vmm.shell(write_sync).contains("rc=1"), "the failed flush");
    flushes.reload(&linear);
    host(&format!(
        "dd if=/dev/zero of={} bs=4096 count=1 conv=fsync 2>/dev/null",
        flushes.path()
    ));
    for _ in 0..2 {
        assert!(
            vmm.shell(write_sync).contains("rc=1"),
            "a flush after a failed one succeeded"
        );
    }
    // The API counts it: one sync failed, the two flushes after it were
    // refused without syncing, and all three flushes failed.
    let vdb = disk_counters(&socket, "disk1");
    let count = |name: &str| {
        vdb[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: {vdb}"))
    };
    assert_eq!(count("sync_failed"), 1, "{vdb}");
    assert!(count("sync_refused") >= 2, "{vdb}");
    assert!(
        count("sync_ops") >= 2,
        "the good sync and the failed one: {vdb}"
    );
    assert!(count("flush_failed") >= 3, "{vdb}");
    // Reads still work: only flushes are refused.
    assert!(vmm
        .shell("echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/vdb of=/dev/null bs=4096 count=1 2>/dev/null; echo rc=$?")
        .contains("rc=0"));

    // ENOSPC with werror=stop: the VM pauses, says why, and the write
    // waits unanswered until space is freed and the VM resumed.
    let sum = vmm.shell(
        "dd if=/dev/urandom of=/tmp/c bs=4096 count=16 2>/dev/null; md5sum /tmp/c | cut -d' ' -f1",
    );
    let sum = sum.trim().to_string();
    vmm.send("dd if=/tmp/c of=/dev/vdc bs=65536 oflag=direct 2>/dev/null; echo vdc-rc=$?\n");
    wait_stderr(
        &vmm,
        "hakoniwa: VM paused: disk disk2: write failed: ENOSPC (No space left on device)",
    );
    // The line comes first, then every vCPU parks.
    let deadline = Instant::now() + Duration::from_secs(10);
    let info = loop {
        let info = vm_info(&socket);
        if info["state"] == "paused" || Instant::now() > deadline {
            break info;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(info["state"], "paused", "{info}");
    assert!(
        info["io_error"].as_str().unwrap_or("").contains("ENOSPC"),
        "{info}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !vmm.stdout().contains("vdc-rc="),
        "the write completed while paused"
    );
    small.free();
    let (ok, out) = ctl(&socket, &["resume"]);
    assert!(ok, "{out}");
    vmm.wait_for("vdc-rc=0");
    let info = vm_info(&socket);
    assert_eq!(info["state"], "running", "{info}");
    assert!(info.get("io_error").is_none(), "{info}");
    let image = std::fs::read(small.image()).unwrap();
    assert_eq!(
        md5_hex(&image[..65536]),
        sum,
        "the held write is in the image"
    );
    // Exactly one pause line: the write failed once.
    assert_eq!(
        vmm.stderr().matches("VM paused").count(),
        1,
        "{}",
        vmm.stderr()
    );

    vmm.send("poweroff\n");
    assert_eq!(vmm.wait_exit(Duration::from_secs(60)).code(), Some(0));
}

/// L1's periodic write-back off for the test (restored when dropped), so
/// nothing the guest wrote reaches a device unless a flush sends it.
struct NoWriteback {
    expire: String,
    interval: String,
}

impl NoWriteback {
    const EXPIRE: &'static str = "/proc/sys/vm/dirty_expire_centisecs";
    const INTERVAL: &'static str = "/proc/sys/vm/dirty_writeback_centisecs";

    fn new() -> NoWriteback {
        let read = |p| std::fs::read_to_string(p).unwrap();
        let saved = NoWriteback {
            expire: read(Self::EXPIRE),
            interval: read(Self::INTERVAL),
        };
        std::fs::write(Self::EXPIRE, "360000").unwrap();
        std::fs::write(Self::INTERVAL, "0").unwrap();
        saved
    }
}

impl Drop for NoWriteback {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::EXPIRE, &self.expire);
        let _ = std::fs::write(Self::INTERVAL, &self.interval);
    }
}

#[test]
#[ignore = "boots a real guest and needs root for device-mapper: run through the rig (scripts/test)"]
fn flushed_data_survives_kill_9_and_a_host_crash_except_with_cache_unsafe() {
    require_hardware_kvm();
    let _no_writeback = NoWriteback::new();
    let linear = format!("0 {SECTORS} linear {{loop}} 0");
    let modes = ["writeback", "none", "unsafe"];
    let disks: Vec<DmDisk> = modes
        .iter()
        .map(|m| DmDisk::new(&format!("dur-{m}"), &linear))
        .collect();
    let mut args = vec!["run".to_string()];
    for (disk, mode) in disks.iter().zip(modes) {
        args.push("--disk".into());
        args.push(format!("path={},cache={mode}", disk.path()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // The last close of a block device writes its dirty pages back: the
    // VMM's, at its death, must not be the last, or the kill would flush
    // what a crash loses. A process holding each device open sees to it.
    let mut holders: Vec<std::process::Child> = disks
        .iter()
        .map(|d| {
            Command::new("sh")
                .args(["-c", &format!("exec 3<{}; exec sleep 600", d.path())])
                .spawn()
                .unwrap()
        })
        .collect();
    let mut vmm = Vmm::spawn(&args);
    vmm.wait_for(PROMPT);
    // 1 MiB to each disk through the guest's page cache, then fsync: the
    // guest's FLUSH is what must make it durable.
    let out = vmm.shell(
        "dd if=/dev/urandom of=/tmp/data bs=65536 count=16 2>/dev/null; \
         for d in vda vdb vdc; do dd if=/tmp/data of=/dev/$d bs=65536 conv=fsync 2>/dev/null || echo $d failed; done; \
         md5sum /tmp/data | cut -d' ' -f1",
    );
    assert!(!out.contains("failed"), "{out}");
    let sum = out.trim().to_string();
    assert_eq!(sum.len(), 32, "{out}");
    vmm.signal(libc::SIGKILL);
    vmm.wait_exit(Duration::from_secs(20));
    let mut found = Vec::new();
    for (disk, holder) in disks.iter().zip(&mut holders) {
        disk.crash(&linear);
        let _ = holder.kill();
        let _ = holder.wait();
        // What reached the device, below L1's cache of it.
        let data = std::fs::read(&disk.file).unwrap();
        found.push(md5_hex(&data[..1 << 20]));
    }
    assert_eq!(found[0], sum, "cache=writeback lost flushed data");
    assert_eq!(found[1], sum, "cache=none lost flushed data");
    // The control: flushes ignored, the data was only in L1's page cache.
    assert_ne!(
        found[2], sum,
        "cache=unsafe kept its data: the crash did not drop the page cache"
    );
}
