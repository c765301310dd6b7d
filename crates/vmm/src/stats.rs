//! KVM's binary statistics (`KVM_GET_STATS_FD`, Linux 5.14+): every counter
//! KVM keeps for a VM or a vCPU, by name, without debugfs.
//!
//! The stats fd is a file read with `pread`; its layout is documented in the
//! KVM API (Documentation/virt/kvm/api.rst, "KVM_GET_STATS_FD"):
//!
//! ```text
//! offset 0            header: flags, name_size, num_desc, id_offset,
//!                     desc_offset, data_offset (six u32, native endian)
//! id_offset           the id string ("kvm-PID" / "kvm-PID/vcpu-N"), name_size bytes
//! desc_offset         num_desc descriptors, each 16 + name_size bytes:
//!                     flags u32 (type | unit | base), exponent i16, size u16
//!                     (number of u64 values), offset u32 (into the data
//!                     block), bucket_size u32, name (NUL-padded, name_size)
//! data_offset         the values: u64s, descriptor `offset` bytes in
//! ```
//!
//! Header, id and descriptors never change for a given fd, so
//! [`StatsFd`] parses them once and then re-reads only the data block.
//! The parsing ([`StatsLayout::parse`], [`StatsLayout::values`]) works on
//! byte slices and needs no KVM, so it is unit-tested with synthetic blobs.
//!
//! Typical names: VM fd `mmu_shadow_zapped`, `mmu_pte_write`,
//! `mmu_pde_zapped`, `mmu_flooded`, `mmu_recycled`, `mmu_cache_miss`,
//! `mmu_unsync`, `pages_4k`, `pages_2m`, `pages_1g`; vCPU fds `exits`,
//! `pf_taken`, `pf_fixed`, `pf_guest`, `io_exits`, `halt_exits`, ... (the
//! set depends on the kernel; look names up, never assume them).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

use vmm_sys_util::ioctl::ioctl;
use vmm_sys_util::ioctl_io_nr;

/// KVM's ioctl type byte.
const KVMIO: u32 = 0xAE;
ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);

const HEADER_SIZE: usize = 24;
const DESC_FIXED_SIZE: usize = 16;
/// Sanity bounds so that a corrupt blob cannot make us allocate wildly.
const MAX_NAME_SIZE: u32 = 4096;
const MAX_DESCS: u32 = 65536;
const MAX_VALUES_PER_STAT: u16 = 4096;

/// What a statistic counts (the type bits of its flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatKind {
    /// Only grows (e.g. `exits`).
    Cumulative,
    /// A current value (e.g. `pages_4k`, `mmu_unsync`).
    Instant,
    /// The highest value seen.
    Peak,
    /// A histogram with linear buckets.
    LinearHistogram,
    /// A histogram with logarithmic buckets.
    LogHistogram,
    /// A type this code does not know (newer kernel).
    Other(u32),
}

impl StatKind {
    fn from_flags(flags: u32) -> StatKind {
        match flags & 0xf {
            0 => StatKind::Cumulative,
            1 => StatKind::Instant,
            2 => StatKind::Peak,
            3 => StatKind::LinearHistogram,
            4 => StatKind::LogHistogram,
            other => StatKind::Other(other),
        }
    }
}

/// One statistic's descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatDesc {
    pub name: String,
    /// Raw flags: type (bits 0-3), unit (4-7: none, bytes, seconds,
    /// cycles, boolean), base (8-11: 10 or 2).
    pub flags: u32,
    /// The value is `raw * base^exponent` in `unit`.
    pub exponent: i16,
    /// Number of u64 values (1 for scalars, the bucket count for histograms).
    pub size: u16,
    /// Byte offset of the first value within the data block.
    pub offset: u32,
    /// Bucket width of linear histograms.
    pub bucket_size: u32,
}

impl StatDesc {
    pub fn kind(&self) -> StatKind {
        StatKind::from_flags(self.flags)
    }
}

/// A statistic's value: one number, or a histogram's buckets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatValue {
    Scalar(u64),
    Histogram(Vec<u64>),
}

impl StatValue {
    /// The number, or the sum of a histogram's buckets (its sample count).
    pub fn total(&self) -> u64 {
        match self {
            StatValue::Scalar(v) => *v,
            StatValue::Histogram(b) => b.iter().fold(0u64, |a, v| a.wrapping_add(*v)),
        }
    }
}

/// Why a stats blob could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatsError {
    #[error("KVM statistics are truncated: need {need} bytes at offset {offset}, have {have}")]
    Truncated {
        offset: usize,
        need: usize,
        have: usize,
    },
    #[error("KVM statistics are malformed: {0}")]
    Malformed(String),
    #[error("cannot read KVM statistics: {0}")]
    Io(String),
}

/// Header, id and descriptors of a stats fd: everything but the values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsLayout {
    /// "kvm-PID" for a VM, "kvm-PID/vcpu-N" for a vCPU.
    pub id: String,
    pub descs: Vec<StatDesc>,
    /// Offset of the data block in the file.
    pub data_offset: u64,
    /// Size of the data block: the end of the furthest value.
    pub data_len: usize,
}

fn read_u32(blob: &[u8], at: usize) -> Result<u32, StatsError> {
    let bytes = slice(blob, at, 4)?;
    Ok(u32::from_ne_bytes(bytes.try_into().unwrap_or([0; 4])))
}

fn slice(blob: &[u8], at: usize, len: usize) -> Result<&[u8], StatsError> {
    at.checked_add(len)
        .and_then(|end| blob.get(at..end))
        .ok_or(StatsError::Truncated {
            offset: at,
            need: len,
            have: blob.len(),
        })
}

/// A NUL-padded name.
fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

impl StatsLayout {
    /// Parses the header and everything up to the data block. `blob` holds
    /// the file from offset 0 and at least to the end of the descriptors;
    /// [`StatsLayout::header_len`] says how much that is.
    pub fn parse(blob: &[u8]) -> Result<StatsLayout, StatsError> {
        let name_size = read_u32(blob, 4)?;
        let num_desc = read_u32(blob, 8)?;
        let id_offset = read_u32(blob, 12)? as usize;
        let desc_offset = read_u32(blob, 16)? as usize;
        let data_offset = read_u32(blob, 20)?;
        if name_size == 0 || name_size > MAX_NAME_SIZE {
            return Err(StatsError::Malformed(format!("name size {name_size}")));
        }
        if num_desc > MAX_DESCS {
            return Err(StatsError::Malformed(format!("{num_desc} descriptors")));
        }
        let name_size = name_size as usize;
        let id = c_string(slice(blob, id_offset, name_size)?);
        let desc_len = DESC_FIXED_SIZE + name_size;
        let mut descs = Vec::with_capacity(num_desc as usize);
        let mut data_len = 0usize;
        for i in 0..num_desc as usize {
            let at = desc_offset + i * desc_len;
            let raw = slice(blob, at, desc_len)?;
            let flags = u32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]]);
            let exponent = i16::from_ne_bytes([raw[4], raw[5]]);
            let size = u16::from_ne_bytes([raw[6], raw[7]]);
            let offset = u32::from_ne_bytes([raw[8], raw[9], raw[10], raw[11]]);
            let bucket_size = u32::from_ne_bytes([raw[12], raw[13], raw[14], raw[15]]);
            let name = c_string(&raw[DESC_FIXED_SIZE..]);
            if size > MAX_VALUES_PER_STAT {
                return Err(StatsError::Malformed(format!("{name} has {size} values")));
            }
            data_len = data_len.max(offset as usize + 8 * size as usize);
            descs.push(StatDesc {
                name,
                flags,
                exponent,
                size,
                offset,
                bucket_size,
            });
        }
        Ok(StatsLayout {
            id,
            descs,
            data_offset: u64::from(data_offset),
            data_len,
        })
    }

    /// How many bytes from offset 0 [`StatsLayout::parse`] needs, from the
    /// 24-byte header alone.
    pub fn header_len(header: &[u8]) -> Result<usize, StatsError> {
        let name_size = read_u32(header, 4)?.min(MAX_NAME_SIZE) as usize;
        let num_desc = read_u32(header, 8)?.min(MAX_DESCS) as usize;
        let id_end = read_u32(header, 12)? as usize + name_size;
        let desc_end = read_u32(header, 16)? as usize + num_desc * (DESC_FIXED_SIZE + name_size);
        Ok(HEADER_SIZE.max(id_end).max(desc_end))
    }

    /// The values from a data block (the file from `data_offset` on), in
    /// descriptor order.
    pub fn values(&self, data: &[u8]) -> Result<Vec<(String, StatValue)>, StatsError> {
        self.descs
            .iter()
            .map(|d| {
                let raw = slice(data, d.offset as usize, 8 * d.size as usize)?;
                let mut numbers = raw
                    .chunks_exact(8)
                    .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])));
                let value = match d.kind() {
                    StatKind::LinearHistogram | StatKind::LogHistogram => {
                        StatValue::Histogram(numbers.collect())
                    }
                    _ if d.size == 1 => StatValue::Scalar(numbers.next().unwrap_or(0)),
                    _ => StatValue::Histogram(numbers.collect()),
                };
                Ok((d.name.clone(), value))
            })
            .collect()
    }
}

/// Parses a whole stats file (header to end of data) in one go.
pub fn parse_blob(blob: &[u8]) -> Result<Vec<(String, StatValue)>, StatsError> {
    let layout = StatsLayout::parse(blob)?;
    let data = blob
        .get(layout.data_offset as usize..)
        .ok_or(StatsError::Truncated {
            offset: layout.data_offset as usize,
            need: layout.data_len,
            have: blob.len(),
        })?;
    layout.values(data)
}

/// Scalar view of a list of values by name (histograms count their samples).
pub fn to_map(values: &[(String, StatValue)]) -> BTreeMap<String, u64> {
    values
        .iter()
        .map(|(name, value)| (name.clone(), value.total()))
        .collect()
}

/// An open stats fd of one VM or vCPU, its layout parsed once.
#[derive(Debug)]
pub struct StatsFd {
    file: File,
    layout: StatsLayout,
}

impl StatsFd {
    /// Opens the stats fd of a VM or vCPU fd (`KVM_GET_STATS_FD`).
    pub fn open(kvm_object: &impl AsRawFd) -> Result<StatsFd, StatsError> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and only returns a new
        // file descriptor (or -1); the VM/vCPU fd is valid for the call.
        let fd = unsafe { ioctl(kvm_object, KVM_GET_STATS_FD()) };
        if fd < 0 {
            return Err(StatsError::Io(format!(
                "KVM_GET_STATS_FD: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        StatsFd::from_file(file)
    }

    /// Reads the layout of an already open stats file.
    pub fn from_file(file: File) -> Result<StatsFd, StatsError> {
        let io = |e: std::io::Error| StatsError::Io(e.to_string());
        let mut header = vec![0u8; HEADER_SIZE];
        file.read_exact_at(&mut header, 0).map_err(io)?;
        let mut blob = vec![0u8; StatsLayout::header_len(&header)?];
        file.read_exact_at(&mut blob, 0).map_err(io)?;
        let layout = StatsLayout::parse(&blob)?;
        Ok(StatsFd { file, layout })
    }

    pub fn layout(&self) -> &StatsLayout {
        &self.layout
    }

    /// Reads every value now.
    pub fn read(&self) -> Result<Vec<(String, StatValue)>, StatsError> {
        let mut data = vec![0u8; self.layout.data_len];
        self.file
            .read_exact_at(&mut data, self.layout.data_offset)
            .map_err(|e| StatsError::Io(e.to_string()))?;
        self.layout.values(&data)
    }

    /// Reads every value now, as scalars by name.
    pub fn read_map(&self) -> Result<BTreeMap<String, u64>, StatsError> {
        Ok(to_map(&self.read()?))
    }
}

/// The statistics of a VM: its own fd and one per vCPU. vCPU fds are added
/// as vCPUs are created (before their threads own the vCPU fds).
#[derive(Debug, Default)]
pub struct VmStats {
    vm: Option<StatsFd>,
    vcpus: Mutex<Vec<StatsFd>>,
}

impl VmStats {
    /// Stats of `vm`; if the kernel has no binary stats (before 5.14) every
    /// read returns empty maps.
    pub fn new(vm: &impl AsRawFd) -> VmStats {
        VmStats {
            vm: StatsFd::open(vm).ok(),
            vcpus: Mutex::new(Vec::new()),
        }
    }

    /// Adds a vCPU's stats fd (ignored if the kernel has none).
    pub fn add_vcpu(&self, vcpu: &impl AsRawFd) {
        if let Ok(fd) = StatsFd::open(vcpu) {
            self.vcpus
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(fd);
        }
    }

    /// How many vCPUs' statistics are read.
    pub fn vcpu_count(&self) -> usize {
        self.vcpus.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether KVM gave us binary statistics at all.
    pub fn available(&self) -> bool {
        self.vm.is_some()
    }

    /// VM-level statistics by name.
    pub fn vm(&self) -> BTreeMap<String, u64> {
        self.vm
            .as_ref()
            .and_then(|fd| fd.read_map().ok())
            .unwrap_or_default()
    }

    /// Per-vCPU statistics, one map per vCPU in creation order.
    pub fn vcpus(&self) -> Vec<BTreeMap<String, u64>> {
        self.vcpus
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|fd| fd.read_map().ok())
            .collect()
    }

    /// Per-vCPU statistics summed over the vCPUs (peaks: the maximum).
    pub fn vcpus_summed(&self) -> BTreeMap<String, u64> {
        let fds = self.vcpus.lock().unwrap_or_else(|e| e.into_inner());
        let mut sum = BTreeMap::new();
        for fd in fds.iter() {
            let Ok(values) = fd.read() else { continue };
            for (desc, (name, value)) in fd.layout.descs.iter().zip(values) {
                let entry = sum.entry(name).or_insert(0u64);
                *entry = match desc.kind() {
                    StatKind::Peak => (*entry).max(value.total()),
                    _ => entry.wrapping_add(value.total()),
                };
            }
        }
        sum
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stats file as KVM lays it out: header, id, descriptors, data.
    pub(crate) fn blob(id: &str, stats: &[(&str, u32, Vec<u64>)]) -> Vec<u8> {
        let name_size = 48usize;
        let id_offset = HEADER_SIZE;
        let desc_offset = id_offset + name_size;
        let desc_len = DESC_FIXED_SIZE + name_size;
        let data_offset = desc_offset + stats.len() * desc_len;
        let mut out = Vec::new();
        for v in [
            0u32,
            name_size as u32,
            stats.len() as u32,
            id_offset as u32,
            desc_offset as u32,
            data_offset as u32,
        ] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
        let padded = |s: &str| {
            let mut b = s.as_bytes().to_vec();
            b.resize(name_size, 0);
            b
        };
        out.extend(padded(id));
        let mut offset = 0u32;
        let mut data = Vec::new();
        for (name, flags, values) in stats {
            out.extend_from_slice(&flags.to_ne_bytes());
            out.extend_from_slice(&0i16.to_ne_bytes());
            out.extend_from_slice(&(values.len() as u16).to_ne_bytes());
            out.extend_from_slice(&offset.to_ne_bytes());
            out.extend_from_slice(&0u32.to_ne_bytes());
            out.extend(padded(name));
            for v in values {
                data.extend_from_slice(&v.to_ne_bytes());
            }
            offset += 8 * values.len() as u32;
        }
        out.extend(data);
        out
    }

    #[test]
    fn parses_scalars_and_histograms() {
        let b = blob(
            "kvm-42",
            &[
                ("mmu_shadow_zapped", 0, vec![7]),
                ("pages_4k", 1, vec![1234]),
                ("max_mmu_page_hash_collisions", 2, vec![3]),
                ("halt_poll_success_hist", 4, vec![1, 2, 3]),
            ],
        );
        let layout = StatsLayout::parse(&b).unwrap();
        assert_eq!(layout.id, "kvm-42");
        assert_eq!(layout.descs.len(), 4);
        assert_eq!(layout.descs[1].kind(), StatKind::Instant);
        assert_eq!(layout.data_len, 8 * 6);
        let values = parse_blob(&b).unwrap();
        assert_eq!(
            values[0],
            ("mmu_shadow_zapped".into(), StatValue::Scalar(7))
        );
        assert_eq!(
            values[3],
            (
                "halt_poll_success_hist".into(),
                StatValue::Histogram(vec![1, 2, 3])
            )
        );
        let map = to_map(&values);
        assert_eq!(map["pages_4k"], 1234);
        assert_eq!(map["halt_poll_success_hist"], 6);
    }

    #[test]
    fn header_len_covers_the_descriptors() {
        let b = blob(
            "kvm-1/vcpu-0",
            &[("exits", 0, vec![1]), ("pf_fixed", 0, vec![2])],
        );
        let need = StatsLayout::header_len(&b[..HEADER_SIZE]).unwrap();
        assert_eq!(need, HEADER_SIZE + 48 + 2 * (16 + 48));
        assert!(StatsLayout::parse(&b[..need]).is_ok());
        assert!(matches!(
            StatsLayout::parse(&b[..need - 1]),
            Err(StatsError::Truncated { .. })
        ));
    }

    #[test]
    fn corrupt_blobs_are_errors_not_panics() {
        let good = blob("kvm-1", &[("exits", 0, vec![5])]);
        for len in 0..good.len() {
            let _ = parse_blob(&good[..len]);
        }
        let mut bad = good.clone();
        bad[4..8].copy_from_slice(&0u32.to_ne_bytes());
        assert!(matches!(
            StatsLayout::parse(&bad),
            Err(StatsError::Malformed(_))
        ));
        let mut huge = good.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(StatsLayout::parse(&huge).is_err());
        // A descriptor pointing past the data block.
        let mut far = good;
        let at = HEADER_SIZE + 48 + 8;
        far[at..at + 4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(matches!(
            parse_blob(&far),
            Err(StatsError::Truncated { .. })
        ));
    }

    #[test]
    fn reads_a_stats_file_and_sums_vcpus() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("hk-stats-test-{}", std::process::id()));
        let b = blob(
            "kvm-1/vcpu-0",
            &[("pf_fixed", 0, vec![10]), ("peak", 2, vec![4])],
        );
        std::fs::write(&path, &b).unwrap();
        let fd = StatsFd::from_file(File::open(&path).unwrap()).unwrap();
        assert_eq!(fd.read_map().unwrap()["pf_fixed"], 10);
        let b2 = blob(
            "kvm-1/vcpu-1",
            &[("pf_fixed", 0, vec![5]), ("peak", 2, vec![9])],
        );
        let path2 = dir.join(format!("hk-stats-test2-{}", std::process::id()));
        std::fs::write(&path2, &b2).unwrap();
        let fd2 = StatsFd::from_file(File::open(&path2).unwrap()).unwrap();
        let stats = VmStats {
            vm: None,
            vcpus: Mutex::new(vec![fd, fd2]),
        };
        let sum = stats.vcpus_summed();
        assert_eq!(sum["pf_fixed"], 15);
        assert_eq!(sum["peak"], 9);
        assert!(stats.vm().is_empty());
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(path2);
    }
}
