//! `hakoniwa ctl iotrace report`'s text: a line per layer (bytes and
//! requests read and written, average request size), then the cache
//! ratios.

use std::fmt::Write;

use iotrace::layers::{HostViewKind, Layer, LayerStats};

use super::IoTraceReport;

/// Processes listed one a line; the JSON has them all.
const MAX_PROCESS_LINES: usize = 8;
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
    for p in report.processes.iter().take(MAX_PROCESS_LINES) {
        match &p.error {
            Some(e) => {
                let comm = if p.comm.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", p.comm)
                };
                let _ = writeln!(out, "  process {}{comm}: {e}", p.pid);
            }
            None => {
                let _ = writeln!(
                    out,
                    "  process {} ({}): read {} in {} calls, wrote {} in {}; {} O_DIRECT of {} open files",
                    p.pid,
                    p.comm,
                    human_bytes(p.read_bytes),
                    p.reads,
                    human_bytes(p.write_bytes),
                    p.writes,
                    p.direct_fds,
                    p.direct_fds + p.buffered_fds
                );
            }
        }
    }
    if report.processes.len() > MAX_PROCESS_LINES {
        let _ = writeln!(
            out,
            "  ({} more processes: --json lists them)",
            report.processes.len() - MAX_PROCESS_LINES
        );
    }
    match (&report.guest, &report.guest_unavailable) {
        (Some(g), _) => {
            let _ = writeln!(
                out,
                "guest: {} memory, {} available, {} cached, swap {} free of {}; direct I/O: {}",
                human_bytes(g.mem_total),
                human_bytes(g.mem_available),
                human_bytes(g.cached),
                human_bytes(g.swap_free),
                human_bytes(g.swap_total),
                match g.direct_io {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "-",
                }
            );
        }
        (None, why) => {
            let _ = writeln!(out, "guest: - ({})", why.as_deref().unwrap_or("no agent"));
        }
    }
    let estimated = match &layers.double_cached {
        Some(d) => format!(
            "estimated {} (the guest's last {} blocks through the disk, host {})",
            human_bytes(d.bytes),
            d.guest_blocks,
            match d.host_view {
                HostViewKind::Measured => "measured",
                HostViewKind::AssumedLru => "assumed LRU",
            }
        ),
        None => "estimated -".to_string(),
    };
    let measured = match (
        &report.double_cached_measured,
        &report.double_cached_unmeasured,
    ) {
        (Some(m), _) => format!(
            "measured {} (guest {} of {}, host {} of the image)",
            human_bytes(m.both_bytes),
            human_bytes(m.guest_bytes),
            m.guest_device,
            human_bytes(m.host_bytes)
        ),
        (None, why) => format!("measured - ({})", why.as_deref().unwrap_or("no agent")),
    };
    let _ = writeln!(out, "cached twice: {estimated}; {measured}");
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
    use super::super::agent::{DoubleCachedMeasured, ProcessDelta};
    use super::super::{GuestFacts, PhysicalDevice, APPLICATION_ABSENT};
    use super::*;
    use iotrace::layers::{self, CacheFacts, Direction, IoRecord, LayerTotals, Window};
    use iotrace::physical::DiskStat;

    /// `count` virtual-disk reads of 1 MiB, one after another, the first
    /// `cached` of them in the host cache.
    fn mib_reads(count: u64, cached: u64) -> Vec<IoRecord> {
        (0..count)
            .map(|i| IoRecord {
                layer: Layer::VirtualDisk,
                time_ns: i,
                direction: Direction::Read,
                offset: i << 20,
                bytes: 1 << 20,
                host_cached_bytes: Some(if i < cached { 1 << 20 } else { 0 }),
            })
            .collect()
    }

    #[test]
    fn a_line_per_layer_then_the_ratios() {
        let window = Window {
            start_ns: 0,
            end_ns: 100,
        };
        let records = mib_reads(16, 4);
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
            processes: Vec::new(),
            guest: None,
            guest_unavailable: Some("no guest agent".into()),
            double_cached_measured: None,
            double_cached_unmeasured: Some("no guest agent".into()),
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
        assert_eq!(lines[7], "guest: - (no guest agent)");
        assert_eq!(
            lines[8],
            "cached twice: estimated -; measured - (no guest agent)"
        );
        assert_eq!(lines[9], "records written to /tmp/t.jsonl");
    }

    #[test]
    fn the_agent_s_lines_name_the_processes_the_guest_and_both_double_cachings() {
        let window = Window {
            start_ns: 0,
            end_ns: 100,
        };
        let records = mib_reads(4, 0);
        let facts = CacheFacts {
            guest_cache_bytes: Some(64 << 20),
            host_cache: Some(layers::HostCacheView::ResidentBlocks((0..512).collect())),
        };
        let report = IoTraceReport {
            disk: "data".into(),
            tracing: true,
            seconds: 1.0,
            records: 4,
            dropped: 0,
            capacity: 65536,
            host_cache_probe: "mincore".into(),
            physical_device: None,
            physical_unavailable: Some("tmpfs".into()),
            application: "guest processes 7 (sh)".into(),
            processes: vec![
                ProcessDelta {
                    pid: 7,
                    comm: "sh".into(),
                    read_bytes: 4 << 20,
                    reads: 4,
                    direct_fds: 1,
                    ..ProcessDelta::default()
                },
                ProcessDelta {
                    pid: 9,
                    error: Some("no such process".into()),
                    ..ProcessDelta::default()
                },
            ],
            guest: Some(GuestFacts {
                mem_total: 512 << 20,
                mem_available: 400 << 20,
                cached: 64 << 20,
                swap_total: 0,
                swap_free: 0,
                direct_io: Some(true),
            }),
            guest_unavailable: None,
            double_cached_measured: Some(DoubleCachedMeasured {
                guest_device: "/dev/vdb".into(),
                guest_bytes: 3 << 20,
                host_bytes: 2 << 20,
                both_bytes: 2 << 20,
            }),
            double_cached_unmeasured: None,
            trace_file: None,
            layers: layers::report_from_layers(
                window,
                LayerTotals {
                    application: Some(LayerStats::from_counters(4 << 20, 0, 4, 0)),
                    physical_device: None,
                },
                &records,
                &facts,
                4096,
            ),
        };
        let text = render(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[2].starts_with("application") && lines[2].contains("4.0MiB"),
            "{text}"
        );
        assert_eq!(lines[6], "guest cache: 0.0%", "{text}");
        assert_eq!(
            lines[7],
            "  process 7 (sh): read 4.0MiB in 4 calls, wrote 0B in 0; 1 O_DIRECT of 1 open files"
        );
        assert_eq!(lines[8], "  process 9: no such process");
        assert_eq!(
            lines[9],
            "guest: 512.0MiB memory, 400.0MiB available, 64.0MiB cached, swap 0B free of 0B; direct I/O: yes"
        );
        // Estimated: 4 MiB crossed the disk, the host holds its first 2.
        assert_eq!(
            lines[10],
            "cached twice: estimated 2.0MiB (the guest's last 1024 blocks through the disk, host measured); \
             measured 2.0MiB (guest 3.0MiB of /dev/vdb, host 2.0MiB of the image)"
        );
    }
}
