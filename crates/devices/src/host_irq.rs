//! The host interrupts of a passed-through PCI device: which lines of
//! `/proc/interrupts` are the device's, where the kernel delivers each
//! (`/proc/irq/N/smp_affinity_list`, `effective_affinity_list`), and
//! steering them to the VM's CPUs (`--device ...,irq_affinity=on`).
//!
//! vfio-pci names the interrupts it requests after the device:
//! `vfio-msix[0](0000:00:04.0)`, `vfio-msi[0](...)`, `vfio-intx(...)`, and
//! newer kernels also name the MSI domain after it (`PCI-MSIX-0000:00:04.0`),
//! so a line is the device's when it mentions its PCI address. vfio-pci
//! requests them when the guest enables MSI, MSI-X or INTx, so a device has
//! none before that, and new ones each time the guest enables more vectors:
//! the VFIO device steers them each time.
//!
//! Every reader takes the root of `/proc` so tests run over fake trees.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::affinity::CpuSet;

/// One numbered line of `/proc/interrupts`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostIrq {
    pub irq: u32,
    /// The handlers' names (`vfio-msix[0](0000:00:04.0)`), or what follows
    /// the counts when the line has fewer columns than usual.
    pub name: String,
    /// Everything after the per-CPU counts: chip, hardware IRQ and trigger,
    /// names (`PCI-MSI 49152-edge vfio-msix[0](0000:00:04.0)`).
    pub description: String,
}

/// Where the kernel delivers one IRQ, as `/proc/irq/N/` says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IrqAffinity {
    /// `smp_affinity_list`: the CPUs it may be delivered to.
    pub affinity: Option<String>,
    /// `effective_affinity_list`: the CPUs it is delivered to now (absent
    /// on kernels or chips that do not say).
    pub effective: Option<String>,
}

/// What steering did to one IRQ.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqChange {
    pub irq: u32,
    pub name: String,
    /// `smp_affinity_list` before (absent: unreadable).
    pub old: Option<String>,
    /// `smp_affinity_list` after; equal to `old` when it already was the
    /// VM's CPUs (nothing was written); absent when the write failed.
    pub new: Option<String>,
    /// Why it could not be set, one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl fmt::Display for IrqChange {
    /// `IRQ 45 vfio-msix[0](0000:00:04.0): 0-3 -> 2`, `...: already 2`,
    /// `...: cannot set 2: <why>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let old = self.old.as_deref().unwrap_or("?");
        write!(f, "IRQ {} {}: ", self.irq, self.name)?;
        match (&self.new, &self.error) {
            (_, Some(error)) => write!(f, "{error}"),
            (Some(new), None) if self.old.as_deref() == Some(new.as_str()) => {
                write!(f, "already {new}")
            }
            (Some(new), None) => write!(f, "{old} -> {new}"),
            (None, None) => write!(f, "{old}, unchanged"),
        }
    }
}

/// `0000:00:04.0` or `00:04.0` (domain 0) → `0000:00:04.0`, lower case.
pub fn normalize_pci_address(text: &str) -> Result<String, String> {
    let text = text.trim().to_ascii_lowercase();
    let full = if text.matches(':').count() == 1 {
        format!("0000:{text}")
    } else {
        text
    };
    let bad =
        || format!("'{full}' is not a PCI address (DOMAIN:BUS:DEVICE.FUNCTION, e.g. 0000:00:04.0)");
    let hex = |s: &str, len: std::ops::RangeInclusive<usize>| {
        len.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let (domain, rest) = full.split_once(':').ok_or_else(bad)?;
    let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
    let (device, function) = rest.split_once('.').ok_or_else(bad)?;
    let valid = hex(domain, 4..=5)
        && hex(bus, 2..=2)
        && hex(device, 2..=2)
        && matches!(function.as_bytes(), [b'0'..=b'7']);
    if !valid {
        return Err(bad());
    }
    Ok(full)
}

/// Whether `line` names `address` (normalized) as a whole: not as the end
/// of a longer domain (`10000:00:04.0`) nor the start of another function.
fn mentions(line: &str, address: &str) -> bool {
    let bytes = line.as_bytes();
    line.match_indices(address).any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + address.len()).copied();
        !before.is_some_and(|b| b.is_ascii_hexdigit()) && !after.is_some_and(|b| b.is_ascii_digit())
    })
}

/// The numbered lines of `/proc/interrupts` (`NMI:`, `LOC:` and other
/// lines are not IRQs one can steer). Lines it cannot make sense of are
/// skipped: the format is for people and has changed over the years.
pub fn parse_interrupts(text: &str) -> Vec<HostIrq> {
    let mut lines = text.lines();
    // The header names one column per CPU: `CPU0 CPU1 ...`.
    let columns = lines
        .next()
        .map(|h| {
            h.split_whitespace()
                .filter(|c| c.starts_with("CPU"))
                .count()
        })
        .unwrap_or(0);
    let mut irqs = Vec::new();
    for line in lines {
        let Some((label, rest)) = line.split_once(':') else {
            continue;
        };
        let Ok(irq) = label.trim().parse::<u32>() else {
            continue;
        };
        let mut words = rest.split_whitespace().peekable();
        let mut counts = 0;
        while counts < columns && words.peek().is_some_and(|w| w.parse::<u64>().is_ok()) {
            words.next();
            counts += 1;
        }
        let words: Vec<&str> = words.collect();
        // chip, hardware IRQ-trigger, then the handlers' names.
        let name = match words.len() {
            0 => String::new(),
            1..=2 => words.join(" "),
            _ => words[2..].join(" "),
        };
        irqs.push(HostIrq {
            irq,
            name,
            description: words.join(" "),
        });
    }
    irqs
}

/// The host IRQs of the PCI device at `pci_address`: the lines of
/// `<proc_root>/interrupts` that mention it.
pub fn device_irqs(proc_root: &Path, pci_address: &str) -> Result<Vec<HostIrq>, String> {
    let address = normalize_pci_address(pci_address)?;
    let path = proc_root.join("interrupts");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {}", path.display(), io_reason(&e)))?;
    Ok(parse_interrupts(&text)
        .into_iter()
        .filter(|i| mentions(&i.description, &address))
        .collect())
}

/// Where IRQ `irq` is delivered (`<proc_root>/irq/N/`).
pub fn irq_affinity(proc_root: &Path, irq: u32) -> IrqAffinity {
    let dir = proc_root.join("irq").join(irq.to_string());
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file))
            .ok()
            .map(|t| t.trim().to_string())
    };
    IrqAffinity {
        affinity: read("smp_affinity_list"),
        effective: read("effective_affinity_list"),
    }
}

/// Steers every host IRQ of the device at `pci_address` to `cpus` (the
/// VM's vCPU CPUs) by writing `<proc_root>/irq/N/smp_affinity_list`, and
/// says for each what it was and what it is now. An IRQ whose affinity
/// cannot be set (a managed IRQ, a chip that cannot move it: EIO) keeps
/// its own and carries the reason; the others are still steered. Fails
/// only when the device's IRQs cannot be found at all.
pub fn steer_device_irqs(
    proc_root: &Path,
    pci_address: &str,
    cpus: &CpuSet,
) -> Result<Vec<IrqChange>, String> {
    if cpus.cpus().is_empty() {
        return Err("no CPUs to steer the device's interrupts to".into());
    }
    let target = cpus.to_string();
    let irqs = device_irqs(proc_root, pci_address)?;
    Ok(irqs
        .into_iter()
        .map(|irq| {
            let path = proc_root
                .join("irq")
                .join(irq.irq.to_string())
                .join("smp_affinity_list");
            let old = irq_affinity(proc_root, irq.irq).affinity;
            let already = old.as_deref().and_then(|o| CpuSet::parse(o).ok()).as_ref() == Some(cpus);
            let mut change = IrqChange {
                irq: irq.irq,
                name: irq.name,
                old: old.clone(),
                new: old,
                error: None,
            };
            if already {
                return change;
            }
            // Never created (the file exists in procfs): the steering
            // thread's filter allows no O_CREAT.
            let written = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&path)
                .and_then(|mut f| {
                    std::io::Write::write_all(&mut f, format!("{target}\n").as_bytes())
                });
            match written {
                Ok(()) => change.new = irq_affinity(proc_root, irq.irq).affinity,
                Err(e) => {
                    change.new = None;
                    change.error = Some(format!(
                        "cannot set {target}: {}{}",
                        io_reason(&e),
                        why_not(&e)
                    ));
                }
            }
            change
        })
        .collect())
}

/// The steering of one device's host IRQs to the VM's CPUs
/// (`irq_affinity=on`), shared by the device, which steers each time the
/// guest enables or changes MSI/MSI-X (`VfioPciDevice::on_interrupts_changed`),
/// and the isolation check, which reports what it changed.
#[derive(Clone, Debug)]
pub struct IrqSteering {
    proc_root: PathBuf,
    address: String,
    cpus: CpuSet,
    /// Each IRQ moved or that could not be, oldest first, once each.
    log: Arc<Mutex<Vec<IrqChange>>>,
}

impl IrqSteering {
    /// Steering for the device at `pci_address` to `cpus`; `proc_root` is
    /// `/proc` on a real host.
    pub fn new(proc_root: &Path, pci_address: &str, cpus: CpuSet) -> Result<IrqSteering, String> {
        if cpus.cpus().is_empty() {
            return Err("irq_affinity=on needs the VM's vCPUs pinned (--cpus affinity=)".into());
        }
        Ok(IrqSteering {
            proc_root: proc_root.to_path_buf(),
            address: normalize_pci_address(pci_address)?,
            cpus,
            log: Arc::default(),
        })
    }

    /// Steers the device's IRQs now and records what changed: each IRQ
    /// moved, and each that could not be (logged once).
    pub fn steer(&self) -> Vec<IrqChange> {
        let changes = match steer_device_irqs(&self.proc_root, &self.address, &self.cpus) {
            Ok(changes) => changes,
            Err(e) => {
                tracing::warn!("{}: cannot steer its host IRQs: {e}", self.address);
                return Vec::new();
            }
        };
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        for change in changes
            .iter()
            .filter(|c| c.new != c.old || c.error.is_some())
        {
            if log.contains(change) {
                continue;
            }
            match &change.error {
                Some(_) => tracing::warn!("{}: {change}", self.address),
                None => tracing::info!("{}: {change}", self.address),
            }
            log.push(change.clone());
        }
        changes
    }

    /// What steering changed so far, oldest first.
    pub fn changes(&self) -> Vec<IrqChange> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What an errno from writing `smp_affinity_list` means.
fn why_not(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EIO) => {
            " (the kernel manages this IRQ's affinity, or its interrupt chip cannot move it)"
        }
        Some(libc::EACCES) | Some(libc::EPERM) => " (needs root)",
        Some(libc::EINVAL) => " (none of those CPUs can take it)",
        Some(libc::ENOENT) => " (the IRQ went away)",
        _ => "",
    }
}

/// An I/O error without Rust's " (os error N)".
fn io_reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fake /proc in a fresh temporary directory.
    struct FakeProc(pub PathBuf);

    impl FakeProc {
        pub fn new(test: &str) -> FakeProc {
            let dir = std::env::temp_dir()
                .join(format!("hakoniwa-host-irq-{test}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            FakeProc(dir)
        }

        pub fn irq(&self, irq: u32, affinity: &str, effective: Option<&str>) {
            let dir = self.0.join("irq").join(irq.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("smp_affinity_list"), format!("{affinity}\n")).unwrap();
            if let Some(e) = effective {
                std::fs::write(dir.join("effective_affinity_list"), format!("{e}\n")).unwrap();
            }
        }
    }

    impl Drop for FakeProc {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const INTERRUPTS: &str = "           CPU0       CPU1       CPU2       CPU3
  0:         36          0          0          0   IO-APIC   2-edge      timer
 24:          0          5          0          0  PCI-MSI 49152-edge      vfio-msix[0](0000:00:04.0)
 25:          0          0          7          0  PCI-MSI 49153-edge      vfio-msix[1](0000:00:04.0)
 26:          1          0          0          0  PCI-MSI 65536-edge      vfio-msix[0](10000:00:04.0)
 27:          1          0          0          0  PCI-MSI 65536-edge      vfio-msix[0](0000:00:04.1)
 28:          0          0          0          3 PCI-MSIX-0000:00:05.0   0-edge      nvme0q0
 29:          9          0          0          0   IO-APIC  11-fasteoi   vfio-intx(0000:00:04.0)
NMI:          0          0          0          0   Non-maskable interrupts
ERR:          0
";

    #[test]
    fn the_devices_lines_are_the_ones_naming_its_address() {
        let proc = FakeProc::new("lines");
        std::fs::write(proc.0.join("interrupts"), INTERRUPTS).unwrap();
        let irqs = device_irqs(&proc.0, "00:04.0").unwrap();
        let found: Vec<(u32, &str)> = irqs.iter().map(|i| (i.irq, i.name.as_str())).collect();
        assert_eq!(
            found,
            [
                (24, "vfio-msix[0](0000:00:04.0)"),
                (25, "vfio-msix[1](0000:00:04.0)"),
                (29, "vfio-intx(0000:00:04.0)"),
            ]
        );
        // The MSI domain's name counts too (any driver, newer kernels).
        let nvme = device_irqs(&proc.0, "0000:00:05.0").unwrap();
        assert_eq!(nvme.len(), 1);
        assert_eq!(nvme[0].name, "nvme0q0");
        assert!(device_irqs(&proc.0, "0000:00:09.0").unwrap().is_empty());
        assert!(device_irqs(&proc.0, "zz:04.0")
            .unwrap_err()
            .contains("is not a PCI address"));
        let missing = FakeProc::new("missing");
        assert!(device_irqs(&missing.0, "00:04.0")
            .unwrap_err()
            .starts_with("cannot read "));
    }

    #[test]
    fn malformed_interrupts_lines_do_not_panic() {
        for text in [
            "",
            "\n\n",
            "no header at all",
            "CPU0\n 7:",
            "CPU0\n 7:\n 8: 1\n 9: x y\n10: 1 chip\n:\n::::\n-1: 3 a b c\n4294967296: 1 a b c",
            "CPU0 CPU1\n 5: 1 2 3 4 5 chip 1-edge name with spaces\n\u{fffd}\u{0}: \u{1}",
        ] {
            let irqs = parse_interrupts(text);
            assert!(irqs.iter().all(|i| i.irq <= 10), "{text:?}: {irqs:?}");
        }
        let irqs = parse_interrupts("CPU0 CPU1\n 5: 1 2 3 4 5 chip 1-edge name with spaces\n");
        // Three numbers more than there are CPUs: they are not counts.
        assert_eq!(irqs[0].description, "3 4 5 chip 1-edge name with spaces");
        let irqs = parse_interrupts("CPU0\n 7: 1 chip\n");
        assert_eq!((irqs[0].irq, irqs[0].name.as_str()), (7, "chip"));
    }

    #[test]
    fn pci_addresses_are_normalized_and_checked() {
        assert_eq!(normalize_pci_address("00:04.0").unwrap(), "0000:00:04.0");
        assert_eq!(
            normalize_pci_address(" 0000:0A:1f.7 ").unwrap(),
            "0000:0a:1f.7"
        );
        assert_eq!(
            normalize_pci_address("10000:00:04.0").unwrap(),
            "10000:00:04.0"
        );
        for bad in [
            "",
            "04.0",
            "0000:00:04.8",
            "0000:00:04",
            "g000:00:04.0",
            "0:0:0.0",
        ] {
            assert!(normalize_pci_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn steering_writes_each_irq_and_says_old_and_new() {
        let proc = FakeProc::new("steer");
        std::fs::write(proc.0.join("interrupts"), INTERRUPTS).unwrap();
        proc.irq(24, "0-3", Some("1"));
        proc.irq(25, "2", Some("2"));
        // IRQ 29's directory is missing: the write fails, the rest go on.
        let cpus = CpuSet::parse("2").unwrap();
        let changes = steer_device_irqs(&proc.0, "0000:00:04.0", &cpus).unwrap();
        assert_eq!(changes.len(), 3);
        assert_eq!(changes[0].old.as_deref(), Some("0-3"));
        assert_eq!(changes[0].new.as_deref(), Some("2"));
        assert_eq!(
            changes[0].to_string(),
            "IRQ 24 vfio-msix[0](0000:00:04.0): 0-3 -> 2"
        );
        let written = std::fs::read_to_string(proc.0.join("irq/24/smp_affinity_list")).unwrap();
        assert_eq!(written, "2\n");
        assert_eq!(
            changes[1].to_string(),
            "IRQ 25 vfio-msix[1](0000:00:04.0): already 2"
        );
        assert_eq!(changes[2].new, None);
        let error = changes[2].error.as_deref().unwrap();
        assert!(error.starts_with("cannot set 2: "), "{error}");
        assert!(!changes[2].to_string().contains('\n'));
        // Irrelevant IRQs are untouched.
        proc.irq(27, "0-3", None);
        steer_device_irqs(&proc.0, "0000:00:04.0", &cpus).unwrap();
        assert_eq!(
            irq_affinity(&proc.0, 27),
            IrqAffinity {
                affinity: Some("0-3".into()),
                effective: None
            }
        );
        assert!(steer_device_irqs(&proc.0, "0000:00:04.0", &CpuSet::from(vec![])).is_err());
    }

    #[test]
    fn steering_records_each_change_once() {
        let proc = FakeProc::new("record");
        std::fs::write(proc.0.join("interrupts"), INTERRUPTS).unwrap();
        proc.irq(24, "0-3", None);
        proc.irq(25, "2", None);
        let cpus = CpuSet::parse("2").unwrap();
        assert!(IrqSteering::new(&proc.0, "00:04.0", CpuSet::from(vec![])).is_err());
        assert!(IrqSteering::new(&proc.0, "nonsense", cpus.clone()).is_err());
        let steering = IrqSteering::new(&proc.0, "00:04.0", cpus).unwrap();
        let shared = steering.clone();
        assert_eq!(steering.steer().len(), 3);
        // Again (the guest enabled more vectors): nothing new to record.
        steering.steer();
        let log: Vec<String> = shared.changes().iter().map(|c| c.to_string()).collect();
        assert_eq!(log.len(), 2, "{log:?}");
        assert_eq!(log[0], "IRQ 24 vfio-msix[0](0000:00:04.0): 0-3 -> 2");
        assert!(log[1].starts_with("IRQ 29 vfio-intx(0000:00:04.0): cannot set 2: "));
    }

    #[test]
    fn a_managed_irq_says_why_it_cannot_move() {
        let e = std::io::Error::from_raw_os_error(libc::EIO);
        assert_eq!(
            format!("{}{}", io_reason(&e), why_not(&e)),
            "Input/output error (the kernel manages this IRQ's affinity, \
             or its interrupt chip cannot move it)"
        );
    }
}
