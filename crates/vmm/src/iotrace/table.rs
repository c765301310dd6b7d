//! `hakoniwa ctl iotrace report`'s text: a line per layer (bytes and
//! requests read and written, average request size), then the cache
//! ratios.

use std::fmt::Write;

use iotrace::layers::{Layer, LayerStats};

use super::IoTraceReport;
use crate::counters::table::human_bytes;

/// The report as text.
pub fn render(report: &IoTraceReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "disk {}: {} for {:.2}s, {} records{}",
        report.disk,
        if report.tracing { "traced" } else { "stopped" },
        report.seconds,
        report.records,
        if report.dropped > 0 {
            format!(
                " ({} dropped: buffer of {} full)",
                report.dropped, report.capacity
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "{:<16} {:>10} {:>9} {:>10} {:>9} {:>10}",
        "layer", "read", "reads", "written", "writes", "avg req"
    );
    let layers = &report.layers;
    let absent = |layer: Layer| layers.absent_layers.contains(&layer);
    let physical_name = match &report.physical_device {
        Some(device) => format!("physical ({})", device.name),
        None => "physical".to_string(),
    };
    for (name, layer, stats) in [
        ("application", Layer::Application, &layers.application),
        ("virtual disk", Layer::VirtualDisk, &layers.virtual_disk),
        (
            physical_name.as_str(),
            Layer::PhysicalDevice,
            &layers.physical_device,
        ),
    ] {
        if absent(layer) {
            let why = match layer {
                Layer::Application => report.application.as_str(),
                _ => report
                    .physical_unavailable
                    .as_deref()
                    .unwrap_or("not traced"),
            };
            let _ = writeln!(out, "{name:<16} {why}");
        } else {
            layer_line(&mut out, name, stats);
        }
    }
    let percent = |ratio: Option<f64>| match ratio {
        Some(r) => format!("{:.1}%", r * 100.0),
        None => "-".to_string(),
    };
    let host = &layers.host_cache;
    let _ = writeln!(
        out,
        "host cache: {} of {} read probed in it ({}); {} by the layers' difference",
        percent(host.probed_hit_ratio),
        human_bytes(host.probed_read_bytes),
        report.host_cache_probe,
        percent(host.hit_ratio),
    );
    let _ = writeln!(
        out,
        "guest cache: {}",
        percent(layers.guest_cache.hit_ratio)
    );
    if let Some(path) = &report.trace_file {
        let _ = writeln!(out, "records written to {path}");
    }
    out
}

fn layer_line(out: &mut String, name: &str, stats: &LayerStats) {
    let _ = writeln!(
        out,
        "{:<16} {:>10} {:>9} {:>10} {:>9} {:>10}",
        name,
        human_bytes(stats.read_bytes),
        stats.read_requests,
        human_bytes(stats.write_bytes),
        stats.write_requests,
        stats
            .average_request_bytes
            .map_or("-".to_string(), |b| human_bytes(b as u64)),
    );
}

#[cfg(test)]
mod tests {
    use super::super::{PhysicalDevice, APPLICATION_ABSENT};
    use super::*;
    use iotrace::layers::{self, CacheFacts, Direction, IoRecord, LayerTotals, Window};
    use iotrace::physical::DiskStat;

    #[test]
    fn a_line_per_layer_then_the_ratios() {
        let window = Window {
            start_ns: 0,
            end_ns: 100,
        };
        let records: Vec<IoRecord> = (0..16)
            .map(|i| IoRecord {
                layer: Layer::VirtualDisk,
                time_ns: i,
                direction: Direction::Read,
                offset: i << 20,
                bytes: 1 << 20,
                host_cached_bytes: Some(if i < 4 { 1 << 20 } else { 0 }),
            })
            .collect();
        let stat = DiskStat {
            reads: 8,
            read_sectors: 12 * 2048,
            ..DiskStat::default()
        };
        let totals = LayerTotals {
            application: None,
            physical_device: Some(stat.layer_stats()),
        };
        let report = IoTraceReport {
            disk: "data".into(),
            tracing: false,
            seconds: 1.5,
            records: 16,
            dropped: 0,
            capacity: 65536,
            host_cache_probe: "mincore".into(),
            physical_device: Some(PhysicalDevice {
                name: "loop0".into(),
                dev: "7:0".into(),
                stat,
            }),
            physical_unavailable: None,
            application: APPLICATION_ABSENT.into(),
            trace_file: Some("/tmp/t.jsonl".into()),
            layers: layers::report_from_layers(
                window,
                totals,
                &records,
                &CacheFacts::default(),
                4096,
            ),
        };
        let text = render(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "disk data: stopped for 1.50s, 16 records");
        assert!(lines[2].starts_with("application") && lines[2].contains("absent"));
        assert!(
            lines[3].contains("16.0MiB") && lines[3].contains(" 16 "),
            "{}",
            lines[3]
        );
        assert!(lines[4].starts_with("physical (loop0)") && lines[4].contains("12.0MiB"));
        assert!(
            lines[5].starts_with("host cache: 25.0% of 16.0MiB read probed"),
            "{}",
            lines[5]
        );
        assert!(
            lines[5].ends_with("25.0% by the layers' difference"),
            "{}",
            lines[5]
        );
        assert_eq!(lines[6], "guest cache: -");
        assert_eq!(lines[7], "records written to /tmp/t.jsonl");
    }
}
