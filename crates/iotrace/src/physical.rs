//! The physical layer: the host block device under an image, and what it
//! did in a window, from its `/sys/block/<dev>/stat` counters.
//!
//! The counters are read at the window's start and end and subtracted. The
//! alternative, tracefs's `block:block_rq_issue`/`block_rq_complete` events
//! filtered to the device, would give each request (its sector and size)
//! but needs root or tracefs access, a tracing instance of its own and a
//! reader draining the ring buffer while the window lasts; the counters cost
//! two small file reads per window and need no privilege. What they cannot
//! do is tell one process from another: they count everything the device
//! served in the window, other VMs and host processes included.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::layers::LayerStats;

/// Bytes in the sectors `/sys/block/*/stat` counts, whatever the
/// device's block size (the kernel's `SECTOR_SIZE`).
pub const STAT_SECTOR_BYTES: u64 = 512;

/// The host block device under an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDevice {
    /// Its kernel name (`sda`, `nvme0n1`, `vda`, `loop3`, `dm-0`): the whole
    /// disk when the image is on a partition.
    pub name: String,
    /// `MAJ:MIN` of what the image is on (the partition, if it is one).
    pub dev: String,
    /// Its `stat` file.
    pub stat_path: PathBuf,
}

impl BlockDevice {
    /// The device under `image`: the one holding its file system (its
    /// `st_dev`), or the device itself when the image is a block device
    /// (its `st_rdev`).
    pub fn of_image(image: &Path) -> io::Result<BlockDevice> {
        let metadata = fs::metadata(image)?;
        let dev = if metadata.file_type().is_block_device() {
            metadata.rdev()
        } else {
            metadata.dev()
        };
        Self::of_dev(Path::new("/sys"), dev_major(dev), dev_minor(dev))
    }

    /// The device `major:minor` as the sysfs at `sys` describes it:
    /// `dev/block/MAJ:MIN` leads to its directory, and a partition's
    /// parent directory is its disk's.
    pub fn of_dev(sys: &Path, major: u64, minor: u64) -> io::Result<BlockDevice> {
        let dev = format!("{major}:{minor}");
        let link = sys.join("dev/block").join(&dev);
        let dir = fs::canonicalize(&link).map_err(|_| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no block device {dev} in {} (a file system without one: tmpfs, overlayfs, 9p, btrfs's anonymous device)",
                    link.display()
                ),
            )
        })?;
        let disk = if dir.join("partition").exists() {
            dir.parent().map(Path::to_path_buf).unwrap_or(dir)
        } else {
            dir
        };
        let name = disk
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let stat_path = disk.join("stat");
        if !stat_path.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("block device {dev} has no {}", stat_path.display()),
            ));
        }
        Ok(BlockDevice {
            name,
            dev,
            stat_path,
        })
    }

    /// Its counters now.
    pub fn stat(&self) -> io::Result<DiskStat> {
        let text = fs::read_to_string(&self.stat_path)?;
        DiskStat::parse(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: cannot parse {text:?}", self.stat_path.display()),
            )
        })
    }
}

/// `gnu_dev_major`'s encoding of `dev_t`.
fn dev_major(dev: u64) -> u64 {
    ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000)
}

/// `gnu_dev_minor`'s.
fn dev_minor(dev: u64) -> u64 {
    (dev & 0xff) | ((dev >> 12) & 0xffff_ff00)
}

/// A block device's cumulative counters (Documentation/block/stat.rst),
/// or the difference of two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskStat {
    pub reads: u64,
    pub read_sectors: u64,
    pub writes: u64,
    pub write_sectors: u64,
    /// Discards and flushes (0 on kernels too old to count them).
    pub discards: u64,
    pub flushes: u64,
    /// Milliseconds the device had requests in flight.
    pub io_ticks_ms: u64,
}

impl DiskStat {
    /// Parses a `stat` file: 11 fields, 15 with discards (4.18), 17 with
    /// flushes (5.5).
    pub fn parse(text: &str) -> Option<DiskStat> {
        let fields: Vec<u64> = text
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        if fields.len() < 11 {
            return None;
        }
        let at = |i: usize| fields.get(i).copied().unwrap_or(0);
        Some(DiskStat {
            reads: at(0),
            read_sectors: at(2),
            writes: at(4),
            write_sectors: at(6),
            io_ticks_ms: at(9),
            discards: at(11),
            flushes: at(15),
        })
    }

    /// What happened from `earlier` to `self` (a counter that went back,
    /// e.g. a device re-created, gives 0).
    pub fn since(&self, earlier: &DiskStat) -> DiskStat {
        DiskStat {
            reads: self.reads.saturating_sub(earlier.reads),
            read_sectors: self.read_sectors.saturating_sub(earlier.read_sectors),
            writes: self.writes.saturating_sub(earlier.writes),
            write_sectors: self.write_sectors.saturating_sub(earlier.write_sectors),
            discards: self.discards.saturating_sub(earlier.discards),
            flushes: self.flushes.saturating_sub(earlier.flushes),
            io_ticks_ms: self.io_ticks_ms.saturating_sub(earlier.io_ticks_ms),
        }
    }

    /// Every request counted: reads, writes, discards and flushes.
    pub fn ios(&self) -> u64 {
        self.reads + self.writes + self.discards + self.flushes
    }

    /// The physical layer's totals, for [`crate::layers::LayerTotals`].
    pub fn layer_stats(&self) -> LayerStats {
        LayerStats::from_counters(
            self.read_sectors * STAT_SECTOR_BYTES,
            self.write_sectors * STAT_SECTOR_BYTES,
            self.reads,
            self.writes,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_files_of_every_age_parse() {
        let modern = "    1523      102   106234     1200      345       12     8844      900        2     1500     2100       7        0       64        3       40       10\n";
        let s = DiskStat::parse(modern).unwrap();
        assert_eq!(
            s,
            DiskStat {
                reads: 1523,
                read_sectors: 106_234,
                writes: 345,
                write_sectors: 8844,
                discards: 7,
                flushes: 40,
                io_ticks_ms: 1500,
            }
        );
        assert_eq!(s.ios(), 1523 + 345 + 7 + 40);
        let old = "1 0 8 0 2 0 16 0 0 3 3";
        let s = DiskStat::parse(old).unwrap();
        assert_eq!(
            (s.reads, s.write_sectors, s.discards, s.flushes),
            (1, 16, 0, 0)
        );
        assert_eq!(DiskStat::parse("1 2 3"), None);
        assert_eq!(DiskStat::parse("1 2 x 4 5 6 7 8 9 10 11"), None);
    }

    #[test]
    fn deltas_become_the_physical_layer() {
        let start = DiskStat::parse("10 0 80 0 5 0 40 0 0 100 0").unwrap();
        let end = DiskStat::parse("14 0 32848 0 6 0 48 0 0 130 0").unwrap();
        let delta = end.since(&start);
        assert_eq!((delta.reads, delta.read_sectors), (4, 32768));
        assert_eq!(delta.io_ticks_ms, 30);
        let layer = delta.layer_stats();
        assert_eq!(layer.read_bytes, 16 << 20);
        assert_eq!(layer.write_bytes, 4096);
        assert_eq!(layer.average_read_bytes, Some(4.0 * 1024.0 * 1024.0));
        // A device re-created (counters back at 0) gives no negative.
        assert_eq!(start.since(&end), DiskStat::default());
    }

    #[test]
    fn dev_t_splits_as_glibc_does() {
        // glibc's makedev, for a major above 4095 and a minor above 65535.
        let makedev = |major: u64, minor: u64| {
            ((major & 0xfff) << 8)
                | ((major & !0xfff) << 32)
                | (minor & 0xff)
                | ((minor & !0xff) << 12)
        };
        let dev = makedev(4100, 65538);
        assert_eq!((dev_major(dev), dev_minor(dev)), (4100, 65538));
        assert_eq!((dev_major(0x0801), dev_minor(0x0801)), (8, 1));
    }

    /// A fake sysfs: a disk `sda` with a partition `sda1`, and `dm-0`.
    fn fake_sys() -> tempfile::TempDir {
        let sys = tempfile::tempdir().unwrap();
        let root = sys.path();
        let sda = root.join("devices/pci0000:00/block/sda");
        fs::create_dir_all(sda.join("sda1")).unwrap();
        fs::write(sda.join("stat"), "1 0 8 0 0 0 0 0 0 1 1\n").unwrap();
        fs::write(sda.join("sda1/stat"), "1 0 8 0 0 0 0 0 0 1 1\n").unwrap();
        fs::write(sda.join("sda1/partition"), "1\n").unwrap();
        let dm = root.join("devices/virtual/block/dm-0");
        fs::create_dir_all(&dm).unwrap();
        fs::write(dm.join("stat"), "2 0 16 0 0 0 0 0 0 1 1\n").unwrap();
        let links = root.join("dev/block");
        fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(&sda, links.join("8:0")).unwrap();
        std::os::unix::fs::symlink(sda.join("sda1"), links.join("8:1")).unwrap();
        std::os::unix::fs::symlink(&dm, links.join("253:0")).unwrap();
        sys
    }

    #[test]
    fn a_partition_is_measured_on_its_disk() {
        let sys = fake_sys();
        let device = BlockDevice::of_dev(sys.path(), 8, 1).unwrap();
        assert_eq!(device.name, "sda");
        assert_eq!(device.dev, "8:1");
        assert_eq!(device.stat().unwrap().read_sectors, 8);
        let device = BlockDevice::of_dev(sys.path(), 253, 0).unwrap();
        assert_eq!(device.name, "dm-0");
        assert_eq!(device.stat().unwrap().reads, 2);
    }

    #[test]
    fn a_file_system_without_a_device_says_so() {
        let sys = fake_sys();
        let err = BlockDevice::of_dev(sys.path(), 0, 45).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("no block device 0:45"), "{err}");
        assert!(!err.to_string().contains('\n'));
    }
}
