//! The VM's device counters: `GET /api/v1/vm.counters`, `hakoniwa ctl
//! counters`, and the `"counters"` section of the `--metrics` lines
//! (docs/devices.md, "Counters").
//!
//! Each counted device is kept by its id with a handle on its live
//! figures (a disk's [`DiskStats`], a network device's [`NetMetrics`]); a
//! report reads them all at once. [`wire`] is the JSON shape (Cloud
//! Hypervisor's `vm.counters` where it has one, ours beside), both ways;
//! [`table`] is `ctl counters`' text. Another kind of device joins by a
//! variant of [`CountedDevice`] and of [`DeviceCounters`].

pub mod table;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;

use choices::{Boundaries, LatencyHistogram};
use devices::virtio::block::{DiskCounters, DiskStats};
use devices::virtio::net::{NetMetrics, NetMetricsSnapshot};
use serde_json::Value;

use crate::metrics::MetricsSource;

/// A device whose counters the VM reports.
#[derive(Clone, Debug)]
pub enum CountedDevice {
    Disk(Arc<DiskStats>),
    Net(Arc<NetMetrics>),
}

/// One device's counters, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceCounters {
    Disk(Box<DiskCounters>),
    Net(NetMetricsSnapshot),
}

/// Every counted device's counters, by id.
pub type CountersReport = BTreeMap<String, DeviceCounters>;

/// Why a histogram could not be set. One line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CountersError {
    #[error("no device '{id}' (disks: {disks})")]
    NoSuchDevice { id: String, disks: String },
    #[error("{0} is not a disk: only disks have latency histograms")]
    NotADisk(String),
}

/// The counted devices of a VM.
#[derive(Debug, Default)]
pub struct VmCounters {
    devices: Vec<(String, CountedDevice)>,
}

impl VmCounters {
    /// Counts `devices` (id, handle), reported in id order.
    pub fn new(devices: Vec<(String, CountedDevice)>) -> VmCounters {
        VmCounters { devices }
    }

    /// Every device's counters now.
    pub fn report(&self) -> CountersReport {
        self.devices
            .iter()
            .map(|(id, device)| {
                let counters = match device {
                    CountedDevice::Disk(stats) => DeviceCounters::Disk(Box::new(stats.snapshot())),
                    CountedDevice::Net(metrics) => DeviceCounters::Net(metrics.snapshot()),
                };
                (id.clone(), counters)
            })
            .collect()
    }

    /// New boundaries for disk `id`'s histogram `which`, or all of its
    /// histograms; `None` boundaries mean the defaults. The bins start
    /// again from zero (QEMU's `block-latency-histogram-set`).
    pub fn set_histogram(
        &self,
        id: &str,
        which: Option<LatencyHistogram>,
        boundaries: Option<&Boundaries>,
    ) -> Result<(), CountersError> {
        let stats = match self.devices.iter().find(|(d, _)| d == id) {
            Some((_, CountedDevice::Disk(stats))) => stats,
            Some((_, _)) => return Err(CountersError::NotADisk(id.to_string())),
            None => {
                let disks: Vec<&str> = self
                    .devices
                    .iter()
                    .filter(|(_, d)| matches!(d, CountedDevice::Disk(_)))
                    .map(|(id, _)| id.as_str())
                    .collect();
                return Err(CountersError::NoSuchDevice {
                    id: id.to_string(),
                    disks: if disks.is_empty() {
                        "none".into()
                    } else {
                        disks.join(", ")
                    },
                });
            }
        };
        let defaults = Boundaries::default_set();
        stats.set_boundaries(which, boundaries.unwrap_or(&defaults));
        Ok(())
    }
}

/// `"counters"`: what `vm.counters` answers, every interval.
impl MetricsSource for VmCounters {
    fn name(&self) -> &'static str {
        "counters"
    }

    fn sample(&self) -> Value {
        wire::to_json(&self.report())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::virtio::block::{Outcome, RequestKind, RequestRecord, StageTimes};

    fn vm() -> (VmCounters, Arc<DiskStats>) {
        let disk = Arc::new(DiskStats::new(1));
        let net = Arc::new(NetMetrics::default());
        net.rx_frames
            .fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        let counters = VmCounters::new(vec![
            ("disk0".into(), CountedDevice::Disk(disk.clone())),
            ("net0".into(), CountedDevice::Net(net)),
        ]);
        (counters, disk)
    }

    #[test]
    fn reports_every_device_by_id() {
        let (counters, disk) = vm();
        let mut times = StageTimes::kicked_at(100);
        (times.dequeue, times.submit, times.complete, times.interrupt) = (200, 300, 4300, 4400);
        disk.dequeued();
        disk.completed(
            0,
            &RequestRecord {
                kind: RequestKind::Read,
                outcome: Outcome::Ok,
                bytes: 4096,
                times,
            },
        );
        let report = counters.report();
        assert_eq!(report.keys().collect::<Vec<_>>(), ["disk0", "net0"]);
        let DeviceCounters::Disk(d) = &report["disk0"] else {
            panic!("{report:?}")
        };
        assert_eq!(d.kind(RequestKind::Read).bytes, 4096);
        let DeviceCounters::Net(n) = &report["net0"] else {
            panic!("{report:?}")
        };
        assert_eq!(n.rx_frames, 3);
        let line = counters.sample();
        assert_eq!(line["disk0"]["read_ops"], 1);
        assert_eq!(line["net0"]["rx_frames"], 3);
    }

    #[test]
    fn histograms_are_set_on_disks_only_with_a_clear_line() {
        let (counters, disk) = vm();
        let b: Boundaries = "1ms".parse().unwrap();
        counters
            .set_histogram("disk0", Some(LatencyHistogram::Flush), Some(&b))
            .unwrap();
        let c = disk.snapshot();
        let flush = c.kind(RequestKind::Flush).histogram.clone().unwrap();
        assert_eq!(flush.boundaries, [1_000_000]);
        counters.set_histogram("disk0", None, None).unwrap();
        let c = disk.snapshot();
        let flush = c.kind(RequestKind::Flush).histogram.clone().unwrap();
        assert_eq!(flush.boundaries, choices::DEFAULT_BOUNDARIES_NS);
        assert_eq!(
            counters
                .set_histogram("disk9", None, None)
                .unwrap_err()
                .to_string(),
            "no device 'disk9' (disks: disk0)"
        );
        assert_eq!(
            counters
                .set_histogram("net0", None, None)
                .unwrap_err()
                .to_string(),
            "net0 is not a disk: only disks have latency histograms"
        );
        assert_eq!(
            VmCounters::default()
                .set_histogram("disk0", None, None)
                .unwrap_err()
                .to_string(),
            "no device 'disk0' (disks: none)"
        );
    }
}
