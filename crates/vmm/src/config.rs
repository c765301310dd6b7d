//! The configuration of one VM, as the command line (or a later API call)
//! describes it, and the checks that need no KVM.

use std::path::PathBuf;

/// Largest vCPU count: APIC IDs are 8 bits and the IOAPIC takes the ID
/// after the last vCPU.
pub const MAX_VCPUS: u8 = 254;

/// Everything needed to build and boot a VM.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// bzImage (64-bit boot protocol) or ELF vmlinux (PVH entry if present).
    pub kernel: PathBuf,
    /// Initramfs (any format the kernel unpacks).
    pub initramfs: Option<PathBuf>,
    /// Kernel command line, without the `hk.cmd=` hakoniwa may append.
    pub cmdline: String,
    /// Number of vCPUs (`cpus.boot`).
    pub vcpus: u8,
    /// `--cpus`: the vCPU count and the host CPUs of pinned vCPUs
    /// (crate::cpus).
    pub cpus: crate::cpus::CpusConfig,
    /// Guest RAM in bytes (`memory.size`).
    pub memory_bytes: u64,
    /// How guest RAM is backed on the host (`--memory size=..,hugepages=..`;
    /// crate::memory::backing).
    pub memory: crate::memory::backing::MemoryConfig,
    /// A shell command the default guest runs instead of a shell; the VM
    /// then ends with the command's exit status.
    pub exec: Option<String>,
    /// Where to serve the control API, if anywhere.
    pub api_socket: Option<PathBuf>,
    /// Expose KVM asynchronous page faults to the guest.
    pub async_pf: bool,
    /// Virtio devices.
    pub virtio: VirtioConfig,
    /// `--device path=/sys/bus/pci/devices/..[,id=..][,irq_affinity=on]`:
    /// host PCI functions passed through with VFIO (crate::passthrough).
    pub passthrough: Vec<String>,
    /// Shadow-paging budget (`--spt-pages`; docs/shadow-paging.md).
    pub spt_budget: crate::mmu::SptBudget,
    /// Periodic metrics file (`--metrics`, `--metrics-interval`).
    pub metrics: Option<crate::metrics::MetricsConfig>,
    /// `--display vnc=..,...` (docs/display.md), checked by the display's
    /// own parser.
    pub display: Option<String>,
    /// `--restore FILE`: continue the VM saved in FILE instead of booting
    /// (docs/snapshot.md).
    pub restore: Option<PathBuf>,
    /// `--incoming tcp:ADDR:PORT,tls=DIR|auth=none`: take the VM a
    /// migration sends instead of booting (docs/migration.md).
    pub incoming: Option<crate::migration::MigrationAddress>,
    /// `--seccomp`: what each thread's seccomp filter does with a call
    /// outside its allow-list (docs/security.md).
    pub seccomp: choices::SeccompMode,
    /// `--dump-dir`: where a failure report goes when a vCPU triple-faults
    /// or KVM fails it, and `ctl dump`'s default (crate::dump).
    pub dump_dir: Option<std::path::PathBuf>,
}

/// Virtio devices as the command line gives them: each a `key=value,...`
/// string that the device's own parser checks.
#[derive(Clone, Debug, Default)]
pub struct VirtioConfig {
    /// `--disk path=FILE[,readonly=on][,cache=writeback|none|unsafe][,id=NAME]`, repeatable.
    pub disks: Vec<String>,
    /// `--net tap=NAME[,mac=..][,mtu=..][,id=..]`, repeatable.
    pub nets: Vec<String>,
    /// `--vsock cid=N,uds=PATH[,id=..]`.
    pub vsock: Option<String>,
    /// `--rng [id=..]`.
    pub rng: Option<String>,
    /// `--balloon [size=MIB][,deflate_on_oom=on][,stats=on|off]`.
    pub balloon: Option<String>,
    /// `--input keyboard|tablet[,width=..,height=..]`, repeatable.
    pub inputs: Vec<String>,
}

/// The kernel command line hakoniwa uses when none is given: serial
/// console, few boot messages (each console byte is a VM exit), no port
/// 0x80 delays, and reboot on panic so a broken guest ends the VM.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 quiet io_delay=none panic=-1";

/// Errors in the user's configuration, each naming what is wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--memory: '{0}' is not a size (examples: 512M, 2G, 1024 for MiB)")]
    MemoryNotASize(String),
    #[error("--memory {0} is not a whole number of MiB")]
    MemoryNotMiBAligned(String),
    #[error("--memory {0} is too large")]
    MemoryTooLarge(String),
    #[error("--cpus must be between 1 and {max}, not {0}", max = MAX_VCPUS)]
    VcpuCount(u32),
}

/// Parses a memory size: a number with an optional K/M/G/T suffix (binary
/// units, optionally followed by "iB" or "B"); a bare number means MiB, as
/// for QEMU's `-m`.
pub fn parse_memory_size(text: &str) -> Result<u64, ConfigError> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(digits_end);
    let number: u64 = digits
        .parse()
        .map_err(|_| ConfigError::MemoryNotASize(text.to_string()))?;
    let shift = match suffix
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" if suffix.is_empty() => 20,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(ConfigError::MemoryNotASize(text.to_string())),
    };
    let bytes = number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| ConfigError::MemoryTooLarge(text.to_string()))?;
    if bytes == 0 {
        return Err(ConfigError::MemoryNotASize(text.to_string()));
    }
    if !bytes.is_multiple_of(1 << 20) {
        return Err(ConfigError::MemoryNotMiBAligned(text.to_string()));
    }
    Ok(bytes)
}

/// Checks a vCPU count from the command line.
pub fn parse_vcpu_count(count: u32) -> Result<u8, ConfigError> {
    match u8::try_from(count) {
        Ok(n) if (1..=MAX_VCPUS).contains(&n) => Ok(n),
        _ => Err(ConfigError::VcpuCount(count)),
    }
}

/// Human-readable size in the units users type.
pub fn format_size(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{}G", bytes >> 30)
    } else {
        format!("{}M", bytes.div_ceil(1 << 20))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_the_usual_units() {
        assert_eq!(parse_memory_size("512M"), Ok(512 << 20));
        assert_eq!(parse_memory_size("2G"), Ok(2 << 30));
        assert_eq!(parse_memory_size("2g"), Ok(2 << 30));
        assert_eq!(parse_memory_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_memory_size("1024"), Ok(1 << 30));
        assert_eq!(parse_memory_size("65536K"), Ok(64 << 20));
        assert_eq!(parse_memory_size("1T"), Ok(1 << 40));
    }

    #[test]
    fn bad_sizes_are_named() {
        assert_eq!(
            parse_memory_size("lots"),
            Err(ConfigError::MemoryNotASize("lots".into()))
        );
        assert_eq!(
            parse_memory_size("12Q"),
            Err(ConfigError::MemoryNotASize("12Q".into()))
        );
        assert_eq!(
            parse_memory_size("0"),
            Err(ConfigError::MemoryNotASize("0".into()))
        );
        assert_eq!(
            parse_memory_size("-5M"),
            Err(ConfigError::MemoryNotASize("-5M".into()))
        );
        assert_eq!(
            parse_memory_size("100K"),
            Err(ConfigError::MemoryNotMiBAligned("100K".into()))
        );
        assert_eq!(
            parse_memory_size("99999999999T"),
            Err(ConfigError::MemoryTooLarge("99999999999T".into()))
        );
    }

    #[test]
    fn vcpu_counts() {
        assert_eq!(parse_vcpu_count(1), Ok(1));
        assert_eq!(parse_vcpu_count(254), Ok(254));
        assert_eq!(parse_vcpu_count(0), Err(ConfigError::VcpuCount(0)));
        assert_eq!(parse_vcpu_count(255), Err(ConfigError::VcpuCount(255)));
        assert_eq!(
            parse_vcpu_count(100_000),
            Err(ConfigError::VcpuCount(100_000))
        );
        assert!(ConfigError::VcpuCount(0).to_string().contains("--cpus"));
    }

    #[test]
    fn sizes_print_back() {
        assert_eq!(format_size(2 << 30), "2G");
        assert_eq!(format_size(512 << 20), "512M");
        assert_eq!(format_size((1 << 20) + 1), "2M");
    }
}
