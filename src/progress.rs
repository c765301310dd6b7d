//! `hakoniwa ctl migrate`'s progress display: polls the source's
//! `vm.migration` report and prints phase, bytes, pages/s and what is
//! left, until the migration completes or fails.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// How often the report is read.
const POLL: Duration = Duration::from_millis(250);

/// Follows the migration the source at `socket` runs; exit status 0 when
/// it completed, 1 when it failed.
pub fn follow_migration(socket: &Path) -> Result<ExitCode, String> {
    let tty = std::io::stderr().is_terminal();
    let mut last_line = String::new();
    let mut last: Option<serde_json::Value> = None;
    loop {
        let report = match api::run_ctl(socket, &api::CtlCommand::Migration) {
            Ok(text) => serde_json::from_str::<serde_json::Value>(&text)
                .map_err(|e| format!("bad migration report: {e}"))?,
            Err(e) => {
                // The source ends itself once the destination has it all;
                // its socket goes with it.
                let switched = last
                    .as_ref()
                    .and_then(|r| r["phase"].as_str())
                    .is_some_and(|p| matches!(p, "stop_and_copy" | "postcopy" | "completed"));
                if switched {
                    finish_line(tty, &last_line);
                    println!("migration completed (the source hakoniwa has ended)");
                    return Ok(ExitCode::SUCCESS);
                }
                return Err(e.to_string());
            }
        };
        let line = progress_line(&report);
        if line != last_line {
            if tty {
                eprint!("\r\x1b[K{line}");
            } else {
                eprintln!("{line}");
            }
            let _ = std::io::stderr().flush();
            last_line = line;
        }
        match report["phase"].as_str() {
            Some("completed") => {
                finish_line(tty, &last_line);
                println!("{}", summary(&report));
                return Ok(ExitCode::SUCCESS);
            }
            Some("failed") => {
                finish_line(tty, &last_line);
                return Err(format!(
                    "migration failed: {}",
                    report["error"].as_str().unwrap_or("no reason given")
                ));
            }
            _ => {}
        }
        last = Some(report);
        std::thread::sleep(POLL);
    }
}

fn finish_line(tty: bool, line: &str) {
    if tty && !line.is_empty() {
        eprintln!();
    }
}

fn mib(bytes: f64) -> f64 {
    bytes / (1 << 20) as f64
}

/// One line: phase, round, MiB sent, rate, pages left.
fn progress_line(r: &serde_json::Value) -> String {
    let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
    let mut line = format!(
        "{} {}: {:.1} MiB sent, {:.1} MiB/s, {:.0} pages/s, {} of {} pages left",
        r["mode"].as_str().unwrap_or("?"),
        r["phase"].as_str().unwrap_or("?").replace('_', "-"),
        mib(f("bytes")),
        f("mib_per_s"),
        f("pages_per_s"),
        r["remaining_pages"].as_u64().unwrap_or(0),
        r["ram_pages"].as_u64().unwrap_or(0),
    );
    if let Some(rounds) = r["rounds"].as_u64().filter(|&n| n > 0) {
        line += &format!(", round {rounds}");
    }
    if let Some(requests) = r["requests"].as_u64().filter(|&n| n > 0) {
        line += &format!(", {requests} page requests");
    }
    line
}

/// The final report in one line.
fn summary(r: &serde_json::Value) -> String {
    let ms = |k: &str| {
        r[k].as_f64()
            .map(|v| format!("{v:.0} ms"))
            .unwrap_or_else(|| "-".into())
    };
    let pages = &r["pages"];
    let mut line = format!(
        "migration completed in {}: downtime {} (source stop to destination running), {:.1} MiB sent; pages precopy {}, demand {}, prefetch {}, background {} ({} zero)",
        ms("total_ms"),
        ms("downtime_ms"),
        mib(r["bytes"].as_f64().unwrap_or(0.0)),
        pages["precopy"],
        pages["demand"],
        pages["prefetch"],
        pages["background"],
        pages["zero"],
    );
    if let Some(reason) = r["switch_reason"].as_str() {
        line += &format!("; switched to postcopy: {reason}");
    }
    for round in r["round_log"].as_array().into_iter().flatten() {
        let f = |k: &str| round[k].as_f64().unwrap_or(0.0);
        line += &format!(
            "\n  round {}: {} pages in {:.2} s ({:.1} MiB/s), {} dirtied meanwhile ({:.0}/s), stopping then: {:.0} ms",
            round["round"],
            round["pages"],
            f("seconds"),
            f("mib_per_s"),
            round["dirty_pages"],
            f("dirty_pages_per_s"),
            f("predicted_downtime_ms"),
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_the_phase_and_what_is_left() {
        let r = serde_json::json!({
            "mode": "hybrid", "phase": "stop_and_copy", "bytes": 3145728.0,
            "mib_per_s": 12.5, "pages_per_s": 3200.0, "remaining_pages": 10,
            "ram_pages": 65536, "rounds": 3, "requests": 0
        });
        assert_eq!(
            progress_line(&r),
            "hybrid stop-and-copy: 3.0 MiB sent, 12.5 MiB/s, 3200 pages/s, 10 of 65536 pages left, round 3"
        );
    }
}
