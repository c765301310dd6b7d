//! `hakoniwa ctl counters`' text: a table per disk (kinds, the queue
//! depth and syncs, then stages, then the non-empty histogram bins) and a line per network device.

use std::fmt::Write;

use choices::format_ns;
use devices::virtio::block::{DiskCounters, HistogramSnapshot, RequestKind, Stage};
use devices::virtio::net::NetMetricsSnapshot;

use super::{CountersReport, DeviceCounters};

/// The whole report as text.
pub fn render(report: &CountersReport) -> String {
    if report.is_empty() {
        return "no disks or network devices\n".into();
    }
    let mut out = String::new();
    for (id, counters) in report {
        match counters {
            DeviceCounters::Disk(disk) => disk_table(&mut out, id, disk),
            DeviceCounters::Net(net) => net_line(&mut out, id, net),
        }
    }
    out
}

/// A duration for people: 850ns, 12.3us, 4.56ms, 1.20s.
pub fn human_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}us", f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", f / 1e6)
    } else {
        format!("{:.2}s", f / 1e9)
    }
}

/// Bytes for people: 512B, 4.0KiB, 1.5MiB, 2.00GiB.
pub fn human_bytes(bytes: u64) -> String {
    let f = bytes as f64;
    if bytes < 1 << 10 {
        format!("{bytes}B")
    } else if bytes < 1 << 20 {
        format!("{:.1}KiB", f / 1024.0)
    } else if bytes < 1 << 30 {
        format!("{:.1}MiB", f / (1u64 << 20) as f64)
    } else {
        format!("{:.2}GiB", f / (1u64 << 30) as f64)
    }
}

/// Where a quantile lies: "≤20us", ">1s" past the last boundary, "-"
/// without samples.
fn quantile(h: Option<&HistogramSnapshot>, q: f64) -> String {
    match h {
        Some(h) if h.count() > 0 => match h.quantile_bound(q) {
            Some(bound) => format!("<{}", format_ns(bound)),
            None => format!(
                ">={}",
                h.boundaries.last().map_or("0".into(), |b| format_ns(*b))
            ),
        },
        _ => "-".into(),
    }
}

fn disk_table(out: &mut String, id: &str, d: &DiskCounters) {
    let _ = writeln!(
        out,
        "{id:<14}{:>9}{:>11}{:>8}{:>8}{:>10}{:>10}{:>10}{:>9}{:>9}",
        "ops", "bytes", "failed", "invalid", "avg", "min", "max", "p50", "p99"
    );
    for kind in RequestKind::ALL {
        let k = d.kind(kind);
        if kind == RequestKind::Other && k.ops == 0 {
            continue;
        }
        let h = k.histogram.as_ref();
        let _ = writeln!(
            out,
            "  {:<12}{:>9}{:>11}{:>8}{:>8}{:>10}{:>10}{:>10}{:>9}{:>9}",
            kind.name(),
            k.ops,
            human_bytes(k.bytes),
            k.failed,
            k.invalid,
            human_ns(k.avg_ns()),
            human_ns(k.min_ns),
            human_ns(k.max_ns),
            quantile(h, 0.5),
            quantile(h, 0.99),
        );
    }
    let _ = writeln!(
        out,
        "  in flight {}, deepest queue {}",
        d.in_flight, d.max_queue_depth
    );
    let _ = writeln!(
        out,
        "  syncs {} ({} failed, {} refused)",
        d.syncs.ops, d.syncs.failed, d.syncs.refused
    );
    let _ = writeln!(
        out,
        "  {:<23}{:>9}{:>10}{:>10}{:>9}{:>9}",
        "stage", "count", "avg", "max", "p50", "p99"
    );
    for stage in Stage::ALL {
        let s = d.stage(stage);
        let _ = writeln!(
            out,
            "  {:<23}{:>9}{:>10}{:>10}{:>9}{:>9}",
            stage.histogram().name(),
            s.count,
            human_ns(s.total_ns.checked_div(s.count).unwrap_or(0)),
            human_ns(s.max_ns),
            quantile(Some(&s.histogram), 0.5),
            quantile(Some(&s.histogram), 0.99),
        );
    }
    let histograms = RequestKind::ALL
        .iter()
        .filter_map(|k| Some((k.name(), d.kind(*k).histogram.as_ref()?)))
        .chain(
            Stage::ALL
                .iter()
                .map(|s| (s.histogram().name(), &d.stage(*s).histogram)),
        );
    for (name, h) in histograms {
        if h.count() > 0 {
            let _ = writeln!(out, "  {name}: {}", bins_text(h));
        }
    }
}

/// The non-empty bins: `[10us,20us) 3, [1s,∞) 1`.
fn bins_text(h: &HistogramSnapshot) -> String {
    let bound = |i: usize| {
        h.boundaries
            .get(i)
            .map_or("inf".to_string(), |b| format_ns(*b))
    };
    let mut parts = Vec::new();
    for (i, &n) in h.bins.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let low = if i == 0 {
            "0".to_string()
        } else {
            bound(i - 1)
        };
        parts.push(format!("[{low},{}) {n}", bound(i)));
    }
    parts.join(", ")
}

fn net_line(out: &mut String, id: &str, n: &NetMetricsSnapshot) {
    let _ = writeln!(
        out,
        "{id:<14}rx {} frames {} ({} dropped), tx {} frames {} ({} dropped)",
        n.rx_frames,
        human_bytes(n.rx_bytes),
        n.rx_dropped,
        n.tx_frames,
        human_bytes(n.tx_bytes),
        n.tx_dropped
    );
}

#[cfg(test)]
mod tests {
    use super::super::wire::tests::sample_disk;
    use super::*;

    #[test]
    fn units_read_naturally() {
        assert_eq!(human_ns(850), "850ns");
        assert_eq!(human_ns(12_345), "12.3us");
        assert_eq!(human_ns(4_560_000), "4.56ms");
        assert_eq!(human_ns(1_200_000_000), "1.20s");
        assert_eq!(human_bytes(512), "512B");
        assert_eq!(human_bytes(4096), "4.0KiB");
        assert_eq!(human_bytes(3 << 29), "1.50GiB");
    }

    #[test]
    fn a_disk_and_a_nic_make_a_table() {
        let mut report = CountersReport::new();
        report.insert(
            "disk0".into(),
            DeviceCounters::Disk(Box::new(sample_disk())),
        );
        report.insert(
            "net0".into(),
            DeviceCounters::Net(NetMetricsSnapshot::default()),
        );
        let text = render(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("disk0") && lines[0].contains("p99"),
            "{text}"
        );
        let read = lines
            .iter()
            .find(|l| l.trim_start().starts_with("read "))
            .unwrap();
        // 1 op, 0 bytes, 15us, in the [10us,20us) bin.
        let words: Vec<&str> = read.split_whitespace().collect();
        assert_eq!(
            words,
            ["read", "1", "0B", "0", "0", "15.0us", "15.0us", "15.0us", "<20us", "<20us"]
        );
        assert!(text.contains("  other "), "other has requests here: {text}");
        assert!(text.contains("in flight 1, deepest queue 7"));
        assert!(text.contains("  syncs 5 (1 failed, 2 refused)"), "{text}");
        assert!(
            text.contains("  submit_to_complete: [0,1us) 1, [10us,inf) 1"),
            "{text}"
        );
        assert!(text.contains("  write: [10us,20us) 2"), "{text}");
        assert!(lines.last().unwrap().starts_with("net0"), "{text}");
        assert!(text.contains("rx 0 frames 0B (0 dropped)"));
        assert_eq!(
            render(&CountersReport::new()),
            "no disks or network devices\n"
        );
    }

    #[test]
    fn quantiles_past_the_last_boundary_say_so() {
        let mut h = HistogramSnapshot::empty(&[1000]);
        h.add(5000);
        assert_eq!(quantile(Some(&h), 0.5), ">=1us");
        assert_eq!(quantile(None, 0.5), "-");
        assert_eq!(quantile(Some(&HistogramSnapshot::empty(&[1])), 0.5), "-");
    }
}
