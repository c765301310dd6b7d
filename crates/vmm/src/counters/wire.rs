//! The JSON of `vm.counters` (and of the `--metrics` `"counters"`
//! section), both ways: one object per device, by id.
//!
//! Cloud Hypervisor's `vm.counters` is `{id: {name: integer}}` with, for a
//! disk, `read_bytes`, `write_bytes`, `read_ops`, `write_ops` and
//! `read_latency_{min,max,avg}` / `write_latency_{min,max,avg}` (µs), and
//! for a network device `rx_bytes`, `rx_frames`, `tx_bytes`, `tx_frames`.
//! Those are here under the same names; beside them, flat integers for
//! every kind (`flush_ops`, `discard_total_time_ns`, `read_failed`, ...;
//! QEMU's `query-blockstats` figures), the image's syncs (`sync_ops`,
//! `sync_failed`, `sync_refused`: QEMU has no such figures), and two
//! objects: a disk's
//! `latency_histograms` (by kind: `boundaries` in ns and `bins`, QEMU's
//! shape) and `stages` (per stage: count, sums, histogram).

use std::collections::BTreeMap;

use devices::virtio::block::{
    DiskCounters, HistogramSnapshot, KindCounters, RequestKind, Stage, StageCounters, SyncCounters,
};
use devices::virtio::net::NetMetricsSnapshot;
use serde_json::{json, Map, Value};

use super::{CountersReport, DeviceCounters};

/// The names of a network device's counters, in the order shown.
const NET_FIELDS: [&str; 6] = [
    "rx_bytes",
    "rx_frames",
    "rx_dropped",
    "tx_bytes",
    "tx_frames",
    "tx_dropped",
];

/// The whole report.
pub fn to_json(report: &CountersReport) -> Value {
    Value::Object(
        report
            .iter()
            .map(|(id, counters)| {
                let value = match counters {
                    DeviceCounters::Disk(disk) => disk_to_json(disk),
                    DeviceCounters::Net(net) => net_to_json(net),
                };
                (id.clone(), value)
            })
            .collect(),
    )
}

/// A report read back (`ctl counters`); a device is a disk if it has
/// `read_ops`, a network device if it has `rx_frames`.
pub fn from_json(value: &Value) -> Result<CountersReport, String> {
    let devices = value
        .as_object()
        .ok_or("the counters are not a JSON object")?;
    let mut report = BTreeMap::new();
    for (id, device) in devices {
        let counters = if device.get("read_ops").is_some() {
            DeviceCounters::Disk(Box::new(
                disk_from_json(device).map_err(|e| format!("{id}: {e}"))?,
            ))
        } else if device.get("rx_frames").is_some() {
            DeviceCounters::Net(net_from_json(device).map_err(|e| format!("{id}: {e}"))?)
        } else {
            return Err(format!(
                "{id}: neither a disk's nor a network device's counters"
            ));
        };
        report.insert(id.clone(), counters);
    }
    Ok(report)
}

fn us(ns: u64) -> u64 {
    ns / 1000
}

fn disk_to_json(d: &DiskCounters) -> Value {
    let mut o = Map::new();
    let mut put = |name: String, v: u64| {
        o.insert(name, Value::from(v));
    };
    for kind in RequestKind::ALL {
        let k = d.kind(kind);
        let n = kind.name();
        put(format!("{n}_ops"), k.ops);
        put(format!("{n}_bytes"), k.bytes);
        put(format!("{n}_failed"), k.failed);
        put(format!("{n}_invalid"), k.invalid);
        put(format!("{n}_total_time_ns"), k.total_time_ns);
        put(format!("{n}_latency_min"), us(k.min_ns));
        put(format!("{n}_latency_max"), us(k.max_ns));
        put(format!("{n}_latency_avg"), us(k.avg_ns()));
    }
    put("in_flight".into(), d.in_flight);
    put("max_queue_depth".into(), d.max_queue_depth);
    put("sync_ops".into(), d.syncs.ops);
    put("sync_failed".into(), d.syncs.failed);
    put("sync_refused".into(), d.syncs.refused);
    let histograms: Map<String, Value> = RequestKind::ALL
        .iter()
        .filter_map(|kind| {
            let h = d.kind(*kind).histogram.as_ref()?;
            Some((kind.name().to_string(), histogram_to_json(h)))
        })
        .collect();
    o.insert("latency_histograms".into(), Value::Object(histograms));
    let stages: Map<String, Value> = Stage::ALL
        .iter()
        .map(|stage| {
            let s = d.stage(*stage);
            let mut v = histogram_to_json(&s.histogram);
            v["count"] = s.count.into();
            v["total_ns"] = s.total_ns.into();
            v["max_ns"] = s.max_ns.into();
            (stage.histogram().name().to_string(), v)
        })
        .collect();
    o.insert("stages".into(), Value::Object(stages));
    Value::Object(o)
}

fn histogram_to_json(h: &HistogramSnapshot) -> Value {
    json!({ "boundaries": h.boundaries, "bins": h.bins })
}

fn net_to_json(n: &NetMetricsSnapshot) -> Value {
    let values = [
        n.rx_bytes,
        n.rx_frames,
        n.rx_dropped,
        n.tx_bytes,
        n.tx_frames,
        n.tx_dropped,
    ];
    Value::Object(
        NET_FIELDS
            .iter()
            .zip(values)
            .map(|(name, v)| (name.to_string(), Value::from(v)))
            .collect(),
    )
}

fn number(o: &Value, name: &str) -> Result<u64, String> {
    o.get(name)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("no number {name}"))
}

fn histogram_from_json(o: &Value, what: &str) -> Result<HistogramSnapshot, String> {
    let list = |name: &str| -> Result<Vec<u64>, String> {
        o.get(name)
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
            .ok_or_else(|| format!("{what}: no list of numbers {name}"))
    };
    let h = HistogramSnapshot {
        boundaries: list("boundaries")?,
        bins: list("bins")?,
    };
    if h.bins.len() != h.boundaries.len() + 1 {
        return Err(format!(
            "{what}: {} bins for {} boundaries",
            h.bins.len(),
            h.boundaries.len()
        ));
    }
    Ok(h)
}

fn disk_from_json(o: &Value) -> Result<DiskCounters, String> {
    let mut d = DiskCounters {
        in_flight: number(o, "in_flight")?,
        max_queue_depth: number(o, "max_queue_depth")?,
        syncs: SyncCounters {
            ops: number(o, "sync_ops")?,
            failed: number(o, "sync_failed")?,
            refused: number(o, "sync_refused")?,
        },
        ..DiskCounters::default()
    };
    for kind in RequestKind::ALL {
        let n = kind.name();
        let field = |f: &str| number(o, &format!("{n}_{f}"));
        let histogram = match kind.histogram() {
            Some(h) => Some(histogram_from_json(
                o.pointer(&format!("/latency_histograms/{}", h.name()))
                    .ok_or_else(|| format!("no latency histogram {n}"))?,
                n,
            )?),
            None => None,
        };
        d.kinds[kind.index()] = KindCounters {
            ops: field("ops")?,
            bytes: field("bytes")?,
            failed: field("failed")?,
            invalid: field("invalid")?,
            total_time_ns: field("total_time_ns")?,
            min_ns: field("latency_min")? * 1000,
            max_ns: field("latency_max")? * 1000,
            histogram,
        };
    }
    for stage in Stage::ALL {
        let name = stage.histogram().name();
        let s = o
            .pointer(&format!("/stages/{name}"))
            .ok_or_else(|| format!("no stage {name}"))?;
        d.stages[stage as usize] = StageCounters {
            count: number(s, "count")?,
            total_ns: number(s, "total_ns")?,
            max_ns: number(s, "max_ns")?,
            histogram: histogram_from_json(s, name)?,
        };
    }
    Ok(d)
}

fn net_from_json(o: &Value) -> Result<NetMetricsSnapshot, String> {
    let [rx_bytes, rx_frames, rx_dropped, tx_bytes, tx_frames, tx_dropped] =
        NET_FIELDS.map(|name| number(o, name));
    Ok(NetMetricsSnapshot {
        rx_bytes: rx_bytes?,
        rx_frames: rx_frames?,
        rx_dropped: rx_dropped?,
        tx_bytes: tx_bytes?,
        tx_frames: tx_frames?,
        tx_dropped: tx_dropped?,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A disk with a little of everything, times in whole µs (the CH
    /// fields are µs).
    pub(crate) fn sample_disk() -> DiskCounters {
        let mut d = DiskCounters {
            in_flight: 1,
            max_queue_depth: 7,
            syncs: SyncCounters {
                ops: 5,
                failed: 1,
                refused: 2,
            },
            ..DiskCounters::default()
        };
        for kind in RequestKind::ALL {
            let i = kind.index() as u64;
            let mut histogram = kind
                .histogram()
                .map(|_| HistogramSnapshot::empty(&choices::DEFAULT_BOUNDARIES_NS));
            if let Some(h) = &mut histogram {
                for _ in 0..i + 1 {
                    h.add(15_000);
                }
            }
            d.kinds[kind.index()] = KindCounters {
                ops: i + 1,
                bytes: 4096 * i,
                failed: i % 2,
                invalid: i % 3,
                total_time_ns: 15_000 * (i + 1),
                min_ns: 15_000,
                max_ns: 15_000,
                histogram,
            };
        }
        for stage in Stage::ALL {
            let mut h = HistogramSnapshot::empty(&[1000, 10_000]);
            h.add(500);
            h.add(50_000);
            d.stages[stage as usize] = StageCounters {
                count: 2,
                total_ns: 50_500,
                max_ns: 50_000,
                histogram: h,
            };
        }
        d
    }

    fn report() -> CountersReport {
        let mut report = CountersReport::new();
        report.insert(
            "disk0".into(),
            DeviceCounters::Disk(Box::new(sample_disk())),
        );
        report.insert(
            "net0".into(),
            DeviceCounters::Net(NetMetricsSnapshot {
                rx_bytes: 1,
                rx_frames: 2,
                rx_dropped: 3,
                tx_bytes: 4,
                tx_frames: 5,
                tx_dropped: 6,
            }),
        );
        report
    }

    #[test]
    fn cloud_hypervisors_fields_are_there_with_ours_beside() {
        let v = to_json(&report());
        let disk = &v["disk0"];
        for name in [
            "read_bytes",
            "write_bytes",
            "read_ops",
            "write_ops",
            "read_latency_min",
            "read_latency_max",
            "read_latency_avg",
            "write_latency_min",
            "write_latency_max",
            "write_latency_avg",
        ] {
            assert!(disk[name].is_u64(), "{name}: {disk}");
        }
        assert_eq!(disk["read_latency_avg"], 15, "µs, as Cloud Hypervisor");
        assert_eq!(disk["write_total_time_ns"], 30_000);
        assert_eq!(disk["flush_ops"], 3);
        assert_eq!(disk["write_zeroes_bytes"], 4 * 4096);
        assert_eq!(disk["max_queue_depth"], 7);
        assert_eq!(
            (
                &disk["sync_ops"],
                &disk["sync_failed"],
                &disk["sync_refused"]
            ),
            (&json!(5), &json!(1), &json!(2))
        );
        assert_eq!(disk["latency_histograms"]["read"]["bins"][4], 1);
        assert!(disk["latency_histograms"].get("other").is_none());
        assert_eq!(
            disk["stages"]["submit_to_complete"]["bins"],
            json!([1, 0, 1])
        );
        assert_eq!(disk["stages"]["kick_to_dequeue"]["total_ns"], 50_500);
        let net = &v["net0"];
        for (i, name) in NET_FIELDS.iter().enumerate() {
            assert_eq!(net[name], i as u64 + 1);
        }
    }

    #[test]
    fn a_report_reads_back_as_written() {
        let report = report();
        assert_eq!(from_json(&to_json(&report)).unwrap(), report);
        assert_eq!(from_json(&json!({})).unwrap(), CountersReport::new());
    }

    #[test]
    fn a_broken_report_is_one_line() {
        let mut v = to_json(&report());
        v["disk0"]["stages"]["kick_to_dequeue"]["bins"] = json!([1]);
        assert_eq!(
            from_json(&v).unwrap_err(),
            "disk0: kick_to_dequeue: 1 bins for 2 boundaries"
        );
        v["disk0"].as_object_mut().unwrap().remove("flush_invalid");
        assert_eq!(from_json(&v).unwrap_err(), "disk0: no number flush_invalid");
        assert!(from_json(&json!({"x": {"y": 1}}))
            .unwrap_err()
            .contains("neither"));
        assert!(from_json(&json!([1])).is_err());
    }
}
