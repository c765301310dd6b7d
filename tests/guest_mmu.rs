//! The shadow-paging budget (`--spt-pages`, `vm.mmu`; docs/shadow-paging.md).
//! The bad-value tests need no KVM; the others boot real guests and run in
//! the rig (scripts/test), with nested paging on (default) or off
//! (HK_RIG_NPT=0): `paging` in `vm.mmu` says which.

mod common;

use std::time::{Duration, Instant};

use common::{ctl, require_hardware_kvm, run_to_end, temp_socket, Vmm, PROMPT};

/// The guest agent: reports PageTables to the host's vsock port 1024.
const AGENT: &str =
    "while :; do grep PageTables /proc/meminfo | hk-vsock connect 2 1024; sleep 1; done >/dev/null 2>&1 &";

fn expect_one_line_error(args: &[&str], needle: &str) {
    let (code, _, stderr) = run_to_end(args, Duration::from_secs(30));
    assert_eq!(code, 125, "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("hakoniwa: --spt-pages"), "{stderr}");
    assert!(lines[0].contains(needle), "{needle:?} not in {stderr}");
}

#[test]
fn bad_budgets_are_one_line_errors() {
    let run = |value: &str| {
        vec![
            "run",
            "--spt-pages",
            value.to_string().leak(),
            "--exec",
            "true",
        ]
    };
    expect_one_line_error(&run("0"), "at least 64");
    expect_one_line_error(&run("lots"), "'lots' is not a number");
    expect_one_line_error(&run("1.5"), "is not a number");
    expect_one_line_error(&run("131073"), "more than the guest's 512M of memory");
    expect_one_line_error(&run("auto"), "needs the guest agent");
}

fn mmu(socket: &str) -> serde_json::Value {
    let (ok, out) = ctl(socket, &["mmu"]);
    assert!(ok, "{out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn the_budget_set_is_the_budget_kvm_reports() {
    require_hardware_kvm();
    let socket = temp_socket("mmu");
    let mut vmm = Vmm::spawn(&["run", "--spt-pages", "1000", "--api-socket", &socket]);
    vmm.wait_for(PROMPT);
    let info = mmu(&socket);
    eprintln!("paging: {} ({})", info["paging"], info["paging_source"]);
    assert!(
        ["shadow", "npt", "ept"].contains(&info["paging"].as_str().unwrap()),
        "{info}"
    );
    assert_eq!(info["mode"], "fixed", "{info}");
    assert_eq!(info["budget_pages"], 1000, "{info}");
    assert_eq!(info["kvm_nr_mmu_pages"], 1000, "{info}");
    assert_eq!(info["guest_memory_pages"], 131072, "{info}");
    // KVM's statistics are there and the guest has run.
    assert!(
        info["vcpu_stats"]["exits"].as_u64().unwrap_or(0) > 0,
        "{info}"
    );
    assert!(
        info["stats"]
            .as_object()
            .unwrap()
            .contains_key("mmu_cache_miss"),
        "{info}"
    );

    // Changed at run time, through ctl and the raw API.
    let (ok, out) = ctl(&socket, &["mmu", "--spt-pages", "2500"]);
    assert!(ok, "{out}");
    assert_eq!(mmu(&socket)["kvm_nr_mmu_pages"], 2500);
    let (status, body) = api::client::request(
        std::path::Path::new(&socket),
        "PUT",
        "/api/v1/vm.mmu",
        Some(r#"{"spt_pages": 64}"#),
    )
    .unwrap();
    assert_eq!(status, 204, "{body}");
    assert_eq!(mmu(&socket)["kvm_nr_mmu_pages"], 64);
    // The guest still works with the smallest budget.
    assert_eq!(vmm.shell("echo $((6*7))").trim(), "42");

    // Bad values are refused with one line; the budget stays.
    for (value, needle) in [("0", "at least 64"), ("999999999", "more than the guest")] {
        let (ok, out) = ctl(&socket, &["mmu", "--spt-pages", value]);
        assert!(
            !ok && out.contains(needle) && out.lines().count() == 1,
            "{out}"
        );
    }
    let (ok, out) = ctl(&socket, &["mmu", "--spt-pages", "auto"]);
    assert!(!ok && out.contains("vsock"), "{out}");
    assert_eq!(mmu(&socket)["kvm_nr_mmu_pages"], 64);
    vmm.send("poweroff\n");
    assert_eq!(vmm.wait_exit(Duration::from_secs(60)).code(), Some(0));
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn auto_follows_the_guest_page_tables() {
    require_hardware_kvm();
    let socket = temp_socket("mmu-auto");
    let uds = temp_socket("mmu-vsock");
    let mut vmm = Vmm::spawn(&[
        "run",
        "--memory",
        "1G",
        "--vsock",
        &format!("cid=3,uds={uds}"),
        "--spt-pages",
        "auto",
        "--api-socket",
        &socket,
    ]);
    vmm.wait_for(PROMPT);
    let info = mmu(&socket);
    eprintln!("paging: {} ({})", info["paging"], info["paging_source"]);
    assert_eq!(info["mode"], "auto", "{info}");
    assert!(std::path::Path::new(&format!("{uds}_1024")).exists());
    // Background jobs are typed, not run through shell(): "&;" is a syntax error.
    vmm.send(&format!("{AGENT}\n"));

    // Wait for the first report and the budget that follows it.
    let wait = |what: &str, check: &dyn Fn(&serde_json::Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let info = mmu(&socket);
            if check(&info) {
                return info;
            }
            assert!(Instant::now() < deadline, "{what}: {info}");
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    wait("no PageTables report from the guest agent", &|i| {
        i["guest_page_tables_kib"].as_u64().is_some()
    });
    std::thread::sleep(Duration::from_secs(3));
    let before = mmu(&socket);
    let (pt0, budget0) = (
        before["guest_page_tables_kib"].as_u64().unwrap(),
        before["budget_pages"].as_u64().unwrap(),
    );
    assert_eq!(
        before["kvm_nr_mmu_pages"].as_u64(),
        Some(budget0),
        "{before}"
    );

    // 24 processes with 24 MiB each: ~16 page-table pages per process.
    vmm.send("hk-sptbench -p 24 -m 24 -t 600 >/dev/null 2>&1 &\n");
    let after = wait("the budget did not grow", &|i| {
        i["guest_page_tables_kib"].as_u64().unwrap_or(0) >= pt0 + 1024
            && i["budget_pages"].as_u64().unwrap_or(0) >= budget0 + 400
    });
    eprintln!(
        "PageTables {pt0} -> {} kB, budget {budget0} -> {} pages, KVM {}",
        after["guest_page_tables_kib"], after["budget_pages"], after["kvm_nr_mmu_pages"]
    );
    assert_eq!(after["kvm_nr_mmu_pages"], after["budget_pages"], "{after}");
    vmm.shell("killall hk-sptbench; true");
    vmm.send("poweroff\n");
    assert_eq!(vmm.wait_exit(Duration::from_secs(60)).code(), Some(0));
    assert!(!std::path::Path::new(&format!("{uds}_1024")).exists());
}

/// The lines of a metrics file so far, parsed.
fn metrics_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

#[test]
#[ignore = "boots a real guest: run through the rig (scripts/test)"]
fn the_metrics_file_gets_a_line_every_interval() {
    require_hardware_kvm();
    let path = std::env::temp_dir().join(format!("hakoniwa-metrics-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut vmm = Vmm::spawn(&[
        "run",
        "--spt-pages",
        "2000",
        "--metrics",
        path.to_str().unwrap(),
    ]);
    vmm.wait_for(PROMPT);
    // The guest works (console output is I/O exits) while lines accumulate
    // at the default interval of 1 s.
    let deadline = Instant::now() + Duration::from_secs(60);
    while metrics_lines(&path).len() < 4 {
        assert!(
            Instant::now() < deadline,
            "fewer than 4 metrics lines in 60 s: {:?}",
            std::fs::read_to_string(&path)
        );
        assert_eq!(vmm.shell("echo $((6*7))").trim(), "42");
        std::thread::sleep(Duration::from_millis(300));
    }
    vmm.send("poweroff\n");
    assert_eq!(vmm.wait_exit(Duration::from_secs(60)).code(), Some(0));

    let lines = metrics_lines(&path);
    assert!(lines.len() >= 5, "{lines:?}");
    let mut last_ts = 0;
    let mut last_exits = 0;
    for line in &lines {
        let ts = line["ts_ms"].as_u64().unwrap_or_else(|| panic!("{line}"));
        assert!(ts >= last_ts, "{line}");
        last_ts = ts;
        let mmu = &line["mmu"];
        assert!(
            ["shadow", "npt", "ept"].contains(&mmu["paging"].as_str().unwrap_or("")),
            "{line}"
        );
        assert_eq!(mmu["mode"], "fixed", "{line}");
        assert_eq!(mmu["kvm_nr_mmu_pages"], 2000, "{line}");
        assert!(mmu["stats"]
            .as_object()
            .is_some_and(|s| s.contains_key("mmu_cache_miss")));
        let kvm = &line["kvm"];
        assert_eq!(kvm["vcpus"], 1, "{line}");
        for counter in ["io_exits", "halt_exits", "pf_fixed"] {
            assert!(kvm[counter].is_u64(), "no {counter}: {line}");
        }
        let exits = kvm["exits"].as_u64().unwrap_or_else(|| panic!("{line}"));
        assert!(exits >= last_exits, "exits went down: {line}");
        last_exits = exits;
    }
    let first = lines[0]["kvm"]["exits"].as_u64().unwrap();
    assert!(
        last_exits > first,
        "exits did not grow: {first} -> {last_exits}"
    );
    // About one line a second (the last one is written as the VM ends).
    let span =
        lines[lines.len() - 2]["ts_ms"].as_u64().unwrap() - lines[0]["ts_ms"].as_u64().unwrap();
    let per_line = span / (lines.len() as u64 - 2).max(1);
    assert!((500..=3000).contains(&per_line), "{per_line} ms a line");
    let _ = std::fs::remove_file(&path);
}
