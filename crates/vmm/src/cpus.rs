//! `--cpus`: how many vCPUs the VM has and, optionally, which host CPUs
//! each vCPU thread may run on, in Cloud Hypervisor's syntax:
//!
//! ```text
//! --cpus 2
//! --cpus boot=2,affinity=[0@[2],1@[3]]
//! --cpus boot=4,affinity=[0@[2-3],1@[2-3],2@[4,6]]
//! ```
//!
//! A pinned vCPU thread sets its own affinity first thing, before it
//! enters the guest; `vm.info` reports each vCPU thread's id and the CPUs
//! the kernel lets it run on (`Cpus_allowed_list` of
//! `/proc/PID/task/TID/status`), so what is reported is what holds.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

pub use devices::affinity::CpuSet;
use devices::options::{split_top_level, Options, OptionsError};

use crate::config::{parse_vcpu_count, ConfigError};

/// A `--cpus` mistake, one line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CpusError {
    #[error(transparent)]
    Count(#[from] ConfigError),
    #[error("--cpus: {0}")]
    Options(#[from] OptionsError),
    #[error("--cpus: boot: '{0}' is not a number of vCPUs")]
    Boot(String),
    #[error("--cpus affinity: '{0}' is not VCPU@[HOST_CPUS] (e.g. affinity=[0@[2],1@[3-4]])")]
    Entry(String),
    #[error("--cpus affinity: {0}")]
    HostCpus(String),
    #[error("--cpus affinity: vCPU {vcpu} does not exist (boot={boot}: vCPUs 0 to {last})", last = boot - 1)]
    NoSuchVcpu { vcpu: u32, boot: u8 },
    #[error("--cpus affinity: vCPU {0} is given twice")]
    Twice(u8),
}

/// What `--cpus` asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpusConfig {
    /// vCPUs at boot.
    pub boot: u8,
    /// The host CPUs of each pinned vCPU; the others run where the host
    /// scheduler puts them.
    pub affinity: BTreeMap<u8, CpuSet>,
}

impl CpusConfig {
    /// One vCPU, not pinned.
    pub fn with_count(boot: u8) -> CpusConfig {
        CpusConfig {
            boot,
            affinity: BTreeMap::new(),
        }
    }

    /// `N`, or `boot=N[,affinity=[V@[CPUS],...]]`.
    pub fn parse(text: &str) -> Result<CpusConfig, CpusError> {
        if let Ok(count) = text.trim().parse::<u32>() {
            return Ok(CpusConfig::with_count(parse_vcpu_count(count)?));
        }
        let mut o = Options::parse(text, None)?;
        let boot_text = o.require("boot")?;
        let count = boot_text
            .parse::<u32>()
            .map_err(|_| CpusError::Boot(boot_text.clone()))?;
        let boot = parse_vcpu_count(count)?;
        let affinity = match o.take("affinity") {
            Some(list) => parse_affinity(&list, boot)?,
            None => BTreeMap::new(),
        };
        o.finish()?;
        Ok(CpusConfig { boot, affinity })
    }

    /// Checks each pinned host CPU is one this process may run on (before
    /// any KVM work, so a wrong CPU fails with one line first).
    pub fn check_host(&self) -> Result<(), CpusError> {
        for set in self.affinity.values() {
            set.check_allowed().map_err(CpusError::HostCpus)?;
        }
        Ok(())
    }
}

impl fmt::Display for CpusConfig {
    /// The canonical form, which parses back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.affinity.is_empty() {
            return write!(f, "{}", self.boot);
        }
        let entries: Vec<String> = self
            .affinity
            .iter()
            .map(|(vcpu, set)| format!("{vcpu}@[{set}]"))
            .collect();
        write!(f, "boot={},affinity=[{}]", self.boot, entries.join(","))
    }
}

/// `[0@[2],1@[3-4]]`.
fn parse_affinity(text: &str, boot: u8) -> Result<BTreeMap<u8, CpuSet>, CpusError> {
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| CpusError::Entry(text.to_string()))?;
    let mut affinity = BTreeMap::new();
    for entry in split_top_level(inner).filter(|e| !e.is_empty()) {
        let (vcpu, cpus) = entry
            .split_once('@')
            .and_then(|(v, c)| Some((v.trim().parse::<u32>().ok()?, c)))
            .ok_or_else(|| CpusError::Entry(entry.to_string()))?;
        let cpus = cpus
            .strip_prefix('[')
            .and_then(|c| c.strip_suffix(']'))
            .ok_or_else(|| CpusError::Entry(entry.to_string()))?;
        if vcpu >= u32::from(boot) {
            return Err(CpusError::NoSuchVcpu { vcpu, boot });
        }
        let set = CpuSet::parse(cpus).map_err(CpusError::HostCpus)?;
        let vcpu = vcpu as u8;
        if affinity.insert(vcpu, set).is_some() {
            return Err(CpusError::Twice(vcpu));
        }
    }
    Ok(affinity)
}

/// The thread id of each running vCPU, as each vCPU thread records it.
#[derive(Clone, Debug, Default)]
pub struct VcpuThreadIds(Arc<Mutex<BTreeMap<u8, i32>>>);

impl VcpuThreadIds {
    /// Called by vCPU `index`'s own thread.
    pub fn record_this_thread(&self, index: u8) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(index, tid);
    }

    /// (vCPU, thread id), by vCPU.
    pub fn report(&self) -> Vec<(u8, i32)> {
        let ids = self.0.lock().unwrap_or_else(|e| e.into_inner());
        ids.iter().map(|(&index, &tid)| (index, tid)).collect()
    }
}

/// Every thread of this process: (thread id, name, `Cpus_allowed_list`),
/// by thread id. Device threads are named after their device
/// (`disk0-queue`, `disk0-io0`, `net0-worker`), vCPUs `vcpuN`.
pub fn threads_of_this_process() -> Vec<(i32, String, Option<String>)> {
    threads_of(Path::new("/proc/self"))
}

/// Every thread of the process whose `/proc` directory is `process`
/// (`/proc/self`, `/proc/PID`, or a test's fake tree), as
/// [`threads_of_this_process`] lists them; empty if it has gone.
pub fn threads_of(process: &Path) -> Vec<(i32, String, Option<String>)> {
    let Ok(dir) = std::fs::read_dir(process.join("task")) else {
        return Vec::new();
    };
    let mut threads: Vec<_> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .map(|tid| {
            let task = process.join("task").join(tid.to_string());
            let name = std::fs::read_to_string(task.join("comm"))
                .map(|n| n.trim().to_string())
                .unwrap_or_default();
            (tid, name, cpus_allowed_in(&task))
        })
        .collect();
    threads.sort();
    threads
}

/// `Cpus_allowed_list` of one of this process's threads.
pub fn cpus_allowed_list(tid: i32) -> Option<String> {
    cpus_allowed_in(&Path::new("/proc/self/task").join(tid.to_string()))
}

/// `Cpus_allowed_list` from the `status` of a `/proc` task directory.
fn cpus_allowed_in(task: &Path) -> Option<String> {
    let status = std::fs::read_to_string(task.join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_count_still_works_and_says_the_same() {
        assert_eq!(CpusConfig::parse("2"), Ok(CpusConfig::with_count(2)));
        assert_eq!(CpusConfig::parse("2").unwrap().to_string(), "2");
        assert_eq!(
            CpusConfig::parse("0").unwrap_err().to_string(),
            ConfigError::VcpuCount(0).to_string()
        );
    }

    #[test]
    fn affinity_in_cloud_hypervisors_syntax() {
        let c = CpusConfig::parse("boot=3,affinity=[0@[2],2@[4-6,9]]").unwrap();
        assert_eq!(c.boot, 3);
        assert_eq!(c.affinity[&0].cpus(), &[2]);
        assert_eq!(c.affinity[&2].cpus(), &[4, 5, 6, 9]);
        assert!(!c.affinity.contains_key(&1));
        assert_eq!(c.to_string(), "boot=3,affinity=[0@[2],2@[4-6,9]]");
        assert_eq!(CpusConfig::parse(&c.to_string()), Ok(c));
        assert_eq!(
            CpusConfig::parse("boot=2").unwrap(),
            CpusConfig::with_count(2)
        );
    }

    #[test]
    fn each_mistake_is_one_line() {
        let err = |t: &str| CpusConfig::parse(t).unwrap_err().to_string();
        assert_eq!(
            err("boot=2,affinity=[2@[1]]"),
            "--cpus affinity: vCPU 2 does not exist (boot=2: vCPUs 0 to 1)"
        );
        assert_eq!(
            err("boot=2,affinity=[0@[1],0@[2]]"),
            "--cpus affinity: vCPU 0 is given twice"
        );
        assert!(err("boot=2,affinity=[0:1]").contains("is not VCPU@[HOST_CPUS]"));
        assert!(err("boot=2,affinity=0@[1]").contains("is not VCPU@[HOST_CPUS]"));
        assert!(err("boot=2,affinity=[0@[x]]").contains("'x' is not a host CPU"));
        assert!(err("boot=2,affinity=[0@[3-1]]").contains("'3-1' is not a host CPU"));
        assert_eq!(
            err("boot=two"),
            "--cpus: boot: 'two' is not a number of vCPUs"
        );
        assert!(err("affinity=[0@[1]]").contains("missing option 'boot'"));
        assert!(err("boot=1,pin=yes").contains("unknown option 'pin'"));
        for t in ["boot=2,affinity=[2@[1]]", "boot=two", "boot=1,pin=yes"] {
            assert!(!err(t).contains('\n'));
        }
    }

    #[test]
    fn the_host_check_and_pinning_use_the_real_affinity() {
        let allowed = CpuSet::of_this_process().unwrap();
        let first = allowed.cpus()[0];
        let ok = CpusConfig::parse(&format!("boot=1,affinity=[0@[{first}]]")).unwrap();
        assert_eq!(ok.check_host(), Ok(()));
        let absent = libc::CPU_SETSIZE as usize - 1;
        let bad = CpusConfig::parse(&format!("boot=1,affinity=[0@[{absent}]]")).unwrap();
        assert!(bad
            .check_host()
            .unwrap_err()
            .to_string()
            .starts_with(&format!("--cpus affinity: host CPU {absent} is not one")));
        // A thread of our own, pinned, reads back as pinned.
        let set = CpuSet::from(vec![first]);
        let ids = VcpuThreadIds::default();
        let reader = ids.clone();
        std::thread::spawn(move || {
            set.pin_this_thread().unwrap();
            ids.record_this_thread(0);
            let (_, tid) = ids.report()[0];
            assert_eq!(
                cpus_allowed_list(tid).as_deref(),
                Some(first.to_string().as_str())
            );
        })
        .join()
        .unwrap();
        assert_eq!(reader.report().len(), 1);
    }
}
