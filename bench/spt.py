#!/usr/bin/env python3
"""Shadow-paging benchmark (seed 001): throughput of a multi-process,
memory-heavy guest workload against the shadow-page budget.

The workload is guest/tools/hk-sptbench: PROCS processes (default 16), each
with MIB MiB (default 16) resident, pass a token around a ring of pipes and
write one byte in every page of their set per turn, so every pass is a
process switch into a large address space. It runs natively (in L1, the same
static binary, pinned to one CPU like the guest's single vCPU) and in a
hakoniwa guest under these budgets:

  one SPT     64 pages (KVM's minimum): less than one process's shadow tables
              plus the kernel's, so every switch rebuilds them (the paper's
              "SPT 1 面", 0.23 of native). With 16 MiB per process this row
              would take ~20 minutes (every page touch faults and recycles
              shadow pages: a few hundred touches per second, against ~100 000
              with enough budget), so it runs a smaller workload,
              --one-spt-mib MiB per process (default 1), with its own native
              baseline; --small-reference adds KVM's default budget on that
              same small workload, so the two guest rows compare directly;
  fixed N     --budgets (default 256, 1024);
  default     KVM's own budget (2 % of guest pages);
  auto        --spt-pages auto with the guest agent (docs/shadow-paging.md).

Budgets are set through the API (`PUT /api/v1/vm.mmu`) after boot, so every
guest boots alike. For each run: throughput (passes/s: token hand-overs, each
one process writing its whole set) relative to native on the same workload,
the budget as a share of guest RAM (paper: ~3 %), and KVM's statistics over
the run (mmu_shadow_zapped, mmu_recycled, mmu_cache_miss, pf_fixed, ...).
Meaningful only with shadow paging: run it as scripts/bench-spt (= the
project's Python environment, then `HK_RIG_NPT=0 scripts/rig --
build/pyenv/bin/python bench/spt.py`). With nested paging the budget has
nothing to bound; the script says so in its output.

Writes bench/results/spt.json, spt.md (with an ASCII bar chart) and, when
matplotlib is importable (build/pyenv has it: scripts/lib/pyenv.sh), spt.png.
Otherwise the standard library only.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.console import PROMPT_RE  # noqa: E402
from lib.hakoniwa import hk_ctl  # noqa: E402
from lib.plots import panels, save_figure  # noqa: E402
from lib.vmm import Proc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_RE = re.compile(rb"hk-sptbench procs=(\d+) mib=(\d+) passes=(\d+) seconds=([0-9.]+) "
                       rb"passes_per_s=([0-9.]+) pages_per_s=([0-9]+)\r?\n")
AGENT = ("while :; do grep PageTables /proc/meminfo | hk-vsock connect 2 1024; "
         "sleep 1; done >/dev/null 2>&1 &")
VM_STATS = ["mmu_shadow_zapped", "mmu_recycled", "mmu_cache_miss", "mmu_pte_write",
            "mmu_flooded", "mmu_unsync", "mmu_pde_zapped"]
VCPU_STATS = ["pf_fixed", "pf_guest", "pf_taken", "exits"]
PAPER = {"one_spt": 0.23, "multiple_spt": 0.90, "shadow_memory_percent": 3.0}


def bench_cmd(args, workload):
    procs, mib = workload
    return "hk-sptbench -p %d -m %d -t %d" % (procs, mib, args.seconds)


def workload_name(workload):
    return "%dx%d MiB" % workload


def parse_result(m):
    return {"procs": int(m.group(1)), "mib": int(m.group(2)), "passes": int(m.group(3)),
            "seconds": float(m.group(4)), "passes_per_s": float(m.group(5)),
            "pages_per_s": float(m.group(6))}


def native(args, binary, workload):
    """The best of --native-reps runs (the least disturbed by other load)."""
    procs, mib = workload
    results = []
    for _ in range(args.native_reps):
        # On one CPU, like the guest's single vCPU: on L1's two, every token
        # hand-over may be a cross-CPU wake-up, whose cost under TCG swings
        # with the host's load (seen: 500 to 4000 passes/s in one run).
        out = subprocess.run([binary, "-p", str(procs), "-m", str(mib), "-t", str(args.seconds)],
                             capture_output=True, timeout=600,
                             preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
        m = RESULT_RE.search(out.stdout)
        if not m:
            raise RuntimeError("native run failed: %r" % out.stderr)
        results.append(parse_result(m))
    best = max(results, key=lambda r: r["passes_per_s"])
    best["reps_passes_per_s"] = [r["passes_per_s"] for r in results]
    return best


def delta(after, before, keys):
    return {k: after.get(k, 0) - before.get(k, 0) for k in keys if k in after}


def guest_run(args, label, budget, tmp, workload, limit, reps):
    """Boots a guest, sets BUDGET ("auto", "default" or pages), runs the
    workload REPS times (each at most LIMIT seconds), returns the record
    with the best run's throughput and the statistics over all of them."""
    socket = os.path.join(tmp, "api-%s.sock" % label)
    uds = os.path.join(tmp, "vsock-%s.sock" % label)
    argv = [args.hakoniwa, "run", "--memory", "%dM" % args.memory_mib, "--api-socket", socket,
            "--vsock", "cid=3,uds=%s" % uds]
    if budget == "auto":
        argv += ["--spt-pages", "auto"]
    rec = {"config": label, "budget_arg": budget, "ok": False,
           "workload": bench_cmd(args, workload)}
    t0 = time.monotonic()
    vm = Proc(argv, "hakoniwa")
    con = vm.con
    try:
        if not con.wait(PROMPT_RE, 0, args.timeout):
            rec["error"] = "no prompt: " + con.tail()
            return rec
        rec["boot_s"] = round(time.monotonic() - t0, 2)
        if budget == "auto":
            con.send(AGENT + "\n")
        elif budget != "default":
            hk_ctl(args.hakoniwa, socket, "mmu", "--spt-pages", str(budget), timeout=30)
        time.sleep(2)
        before = hk_ctl(args.hakoniwa, socket, "mmu", timeout=30)
        t1 = time.monotonic()
        results = []
        for _ in range(reps):
            start = con.size()
            con.send(bench_cmd(args, workload) + "\n")
            m = con.wait(RESULT_RE, start, limit)
            if not m:
                rec["error"] = "no result within %d s (workload still running?); console: %s" % (
                    limit, con.tail(300))
                return rec
            results.append(parse_result(m))
        rec["workload_s"] = round(time.monotonic() - t1, 1)
        after = hk_ctl(args.hakoniwa, socket, "mmu", timeout=30)
        rec.update(max(results, key=lambda r: r["passes_per_s"]))
        rec["reps_passes_per_s"] = [r["passes_per_s"] for r in results]
        rec["paging"] = after["paging"]
        rec["paging_source"] = after["paging_source"]
        rec["mode"] = after["mode"]
        rec["budget_pages"] = after["budget_pages"]
        rec["kvm_nr_mmu_pages"] = after["kvm_nr_mmu_pages"]
        rec["kvm_nr_mmu_pages_before"] = before["kvm_nr_mmu_pages"]
        rec["guest_page_tables_kib"] = after["guest_page_tables_kib"]
        pages = after["kvm_nr_mmu_pages"] or 0
        rec["shadow_memory_percent"] = round(100.0 * pages * 4096 / (args.memory_mib << 20), 2)
        rec["stats_delta"] = delta(after["stats"], before["stats"], VM_STATS)
        rec["vcpu_stats_delta"] = delta(after["vcpu_stats"], before["vcpu_stats"], VCPU_STATS)
        rec["ok"] = True
        con.send("poweroff\n")
        vm.proc.wait(30)
        return rec
    finally:
        vm.kill()


def bar(value, top, width=40):
    n = 0 if top <= 0 else int(round(width * value / top))
    return "#" * n if n or value <= 0 else "."


def write_md(path, result):
    L = ["# Shadow-paging benchmark (seed 001)", "",
         "`%s` on %s; %s." % (result["command"], result["date"], result["note"]), ""]
    if result.get("rig_qemu"):
        L += ["L1's emulator: %s. QEMU 10, the rig's default, halts every L2 guest on shadow "
              "paging within its first few thousand exits, so this benchmark runs L1 under "
              "bookworm's QEMU 7.2 (docs/rig.md)." % result["rig_qemu"], ""]
    if not result.get("complete", True):
        L += ["**Incomplete run**: %s. Not measured: %s." % (
            result.get("incomplete_reason", "the run stopped before these rows"),
            ", ".join(result["missing"])), ""]
    L += ["Workload: `%s` (%d processes x %d MiB, token ring, one write per page per turn), "
          "guest %d MiB, 1 vCPU. Paging: **%s** (%s). Rows marked *small* run %s per "
          "process instead (see below) and compare with native on that same workload." % (
              result["workload"], result["procs"], result["mib"], result["memory_mib"],
              result["paging"], result["paging_source"], "%d MiB" % result["one_spt_mib"]), "",
          "Native runs are pinned to one CPU of L1, like the guest's single vCPU (on two, "
          "every token hand-over can be a cross-CPU wake-up, whose cost under TCG swings with "
          "the host's load). The machine is shared (other builds and rigs run beside the "
          "benchmark), so each guest row is compared with the best of %d native runs of its "
          "workload taken right before it, and takes the best of %d run(s) in its guest; the "
          "native rows give the spread of all native runs. Statistics are over all runs of a "
          "row." % (result["native_reps"], result["guest_reps"]), "",
          "| config | workload | budget (pages) | shadow mem % of RAM | passes/s | native passes/s "
          "| rel. to native | mmu_shadow_zapped | mmu_recycled | mmu_cache_miss | pf_fixed | exits |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, nat in result["natives"].items():
        L.append("| native (L1), median of %d | %s | - | - | %.1f (%.1f-%.1f) | - | 1.00 "
                 "| - | - | - | - | - |" % (nat["runs"], key, nat["passes_per_s"], nat["min"],
                                            nat["max"]))
    for r in result["runs"]:
        if not r["ok"]:
            L.append("| %s | %s | failed: %s | | | | | | | | | |" % (
                r["config"], r.get("workload_name", ""), r.get("error", "")[:120]
                .replace("|", "/").replace("\r", " ").replace("\n", " ")))
            continue
        s, v = r["stats_delta"], r["vcpu_stats_delta"]
        L.append("| %s | %s | %s | %.2f | %.1f | %.1f | %s | %s | %s | %s | %s | %s |" % (
            r["config"], r["workload_name"], r["kvm_nr_mmu_pages"], r["shadow_memory_percent"],
            r["passes_per_s"], r["native_passes_per_s"], rel(r["relative"]),
            s.get("mmu_shadow_zapped", "-"), s.get("mmu_recycled", "-"),
            s.get("mmu_cache_miss", "-"), v.get("pf_fixed", "-"), v.get("exits", "-")))
    L += ["", "Paper (Virtage, SAP S/D, 16 processes, 10 GB): one SPT **0.23**, multiple "
          "SPTs **0.90** of a physical server; shadow memory ~**3 %** of guest memory.", "",
          "Throughput relative to native (ASCII; %s):" % (
              "the figure is spt.png" if result.get("figure") else "matplotlib is not installed"),
          "", "```"]
    for r in [{"config": "native", "relative": 1.0, "ok": True}] + result["runs"]:
        if r["ok"]:
            L.append("%-32s %7s %s" % (r["config"], rel(r["relative"]), bar(r["relative"], 1.0)))
    L += ["%-32s %7s %s" % ("paper: one SPT", "0.23", bar(0.23, 1.0)),
          "%-32s %7s %s" % ("paper: multiple SPTs", "0.90", bar(0.90, 1.0)), "```", "",
          "Statistics are deltas over the workload (fault-in, warm-up and the timed part). "
          "Relative throughput compares L2 (nested KVM under TCG) with L1 (TCG): the "
          "absolute gap includes nesting, so compare the guest rows with each other first.", "",
          "**Why the one-SPT row runs a smaller workload.** " + one_spt_note(result), ""]
    L += reading(result)
    with open(path, "w") as f:
        f.write("\n".join(L))


def reading(result):
    """How the rows compare with the paper, from this run's numbers."""
    rows = {r["config"]: r for r in result["runs"] if r["ok"]}
    one = next((r for r in rows.values() if r["budget_arg"] == 64), None)
    small = next((r for r in rows.values() if r["budget_arg"] == "default"
                  and r["mib"] == result["one_spt_mib"]), None)
    full = [r for r in rows.values() if r["mib"] == result["mib"] and r["budget_arg"] != 64
            and not r["stats_delta"].get("mmu_recycled")]
    if not (one and small and full):
        return []
    best = max(full, key=lambda r: r["relative"])
    tight = [r for r in rows.values() if r["mib"] == result["mib"]
             and r["stats_delta"].get("mmu_recycled", 0) > 1000]
    auto = rows.get("auto")
    L = ["## Reading the results against the paper", "",
         "- **Multiple SPTs.** With a budget that holds every process's shadow tables "
         "(%s; no shadow page recycled during the workload) the guest runs at %s to %s of "
         "native, against the paper's 0.90. The gap is nesting, not the budget: L2's every "
         "exit is handled by L1's KVM, itself emulated by TCG, while native here is L1 "
         "under the same TCG; KVM's default (2 %% of RAM) and smaller budgets that still "
         "hold everything come out the same within the run's noise." % (
             ", ".join(r["config"] for r in full), rel(min(r["relative"] for r in full)),
             rel(best["relative"])),
         "- **One SPT.** 64 pages (KVM's minimum) run the small workload at %s of native, "
         "%s of the same workload with KVM's default budget (%s); the paper's one SPT is "
         "0.23 of native, 0.26 of its multiple-SPT figure. Here every page touch can evict "
         "a shadow page (%d recycled during the row), and each rebuild costs exits that "
         "nesting under TCG makes far dearer than on Virtage's hardware, so the penalty "
         "is orders of magnitude rather than 4x; the direction is the paper's." % (
             rel(one["relative"]), rel(one["passes_per_s"] / small["passes_per_s"]),
             rel(small["relative"]), one["stats_delta"].get("mmu_recycled", 0))]
    if tight:
        L.append("- **Too small a budget on the full workload**: %s (%s of native, %d shadow "
                 "pages recycled): below the working set of shadow tables, nearly as bad as one SPT."
                 % ("; ".join("%s, %.2f %% of RAM" % (r["config"], r["shadow_memory_percent"])
                              for r in tight),
                    ", ".join(rel(r["relative"]) for r in tight),
                    max(r["stats_delta"].get("mmu_recycled", 0) for r in tight)))
    if auto:
        L.append("- **Shadow memory.** `auto` sized the budget from the guest's own page "
                 "tables at %d pages, %.2f %% of guest RAM (%d recycled; %s of native), "
                 "against the paper's ~3 %% estimate for 16 processes in 10 GB and KVM's "
                 "default of 2 %%: this workload's page tables (16 x 16 MiB) are small "
                 "beside 512 MiB of RAM, and the paper's share comes from its SAP workload's "
                 "much larger address spaces." % (
                     auto["kvm_nr_mmu_pages"], auto["shadow_memory_percent"],
                     auto["stats_delta"].get("mmu_recycled", 0), rel(auto["relative"])))
    spread = [n["max"] / n["min"] for n in result["natives"].values() if n["min"]]
    L.append("- The machine (two cores) is shared with other engineers' rigs, each a TCG "
             "emulator of its own: native runs of one workload spread by up to %.1fx in "
             "this run, so differences of ~10 %% between the well-budgeted rows are noise."
             % max(spread or [1.0]))
    return L + [""]


def one_spt_note(result):
    """Why the 64-page row has its own workload."""
    procs, mib = result["procs"], result["mib"]
    return ("With 64 shadow pages and 16 MiB per process, a process's own page tables (8 "
            "page-table pages for its set, plus upper levels) and the guest kernel's do not "
            "fit at once, so shadow pages are recycled while one process writes its set, not "
            "only at switches. The first run of this row gave it the %s workload and a "
            "4-minute limit, and failed with \"no result\": the console showed only the typed "
            "command because the workload was still faulting in its memory, not because of a "
            "crash, a reboot or a fall-back to the shell. A diagnostic run in the rig "
            "(budget 64, 16 x 4 MiB) took 200 s for fault-in and one round of the ring: KVM "
            "fixed ~9000 faults and recycled ~3600 shadow pages a second, ~54 faults per page "
            "touched, i.e. ~160 page touches a second; the %s workload's ~%d Ki touches "
            "(fault-in, two warm-up rounds, one timed round) would need well over 20 minutes. "
            "The row therefore runs %d MiB per process, in the same unit (passes/s), against "
            "native on that same workload, and the *small* KVM-default row gives the same "
            "small workload enough budget." % (
                workload_name((procs, mib)), workload_name((procs, mib)),
                4 * procs * mib * 256 // 1024, result["one_spt_mib"]))


def rel(value):
    """Two significant digits at least: 0.88, 0.021, 0.0014."""
    return "%.2f" % value if value >= 0.1 else "%.2g" % value if value >= 0.001 else "%.1e" % value


def figure(path, result):
    runs = [r for r in result["runs"] if r["ok"]]
    if not runs:
        return False
    fig, axes = panels(1, 2, (12, 5.2), gridspec_kw={"width_ratios": [3, 2]})
    if fig is None:
        return False
    ax, ax2 = axes
    # Throughput: ours in order, the paper's beside the rows they match.
    names, values, colors = [], [], []
    for r in runs:
        names.append(r["config"].replace(", ", "\n"))
        values.append(r["relative"])
        colors.append("C0")
        if r["budget_arg"] == 64:
            names.append("paper:\none SPT")
            values.append(PAPER["one_spt"])
            colors.append("C1")
    names.append("paper:\nmultiple SPTs")
    values.append(PAPER["multiple_spt"])
    colors.append("C1")
    if "paper:\none SPT" not in names:
        names.insert(-1, "paper:\none SPT")
        values.insert(-1, PAPER["one_spt"])
        colors.insert(-1, "C1")
    x = range(len(names))
    ax.bar(x, values, color=colors)
    ax.set_yscale("log")
    ax.set_ylim(min(values) / 3, 2)
    for i, v in zip(x, values):
        ax.annotate(rel(v), (i, v), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, fontsize=7.5)
    ax.set_ylabel("throughput relative to native (log scale)")
    ax.set_title("hk-sptbench, %d processes, shadow paging (%s)%s\nblue: hakoniwa (L2 vs L1 "
                 "in the rig), orange: the paper" % (
                     result["procs"], result["paging_source"],
                     "" if result.get("complete", True) else " - INCOMPLETE RUN"), fontsize=9)
    # Shadow memory.
    names2 = [r["config"].replace(", ", "\n") for r in runs]
    shares = [r["shadow_memory_percent"] for r in runs]
    ax2.bar(range(len(runs)), shares, color="C2")
    ax2.axhline(PAPER["shadow_memory_percent"], color="C1", ls="--",
                label="paper: ~%g %%" % PAPER["shadow_memory_percent"])
    for i, v in enumerate(shares):
        ax2.annotate("%.2f" % v, (i, v), ha="center", va="bottom", fontsize=8,
                     xytext=(0, 2), textcoords="offset points")
    ax2.set_xticks(range(len(runs)))
    ax2.set_xticklabels(names2, fontsize=7.5, rotation=35, ha="right")
    ax2.set_ylim(0, max(shares + [PAPER["shadow_memory_percent"]]) * 1.25)
    ax2.set_ylabel("shadow-page budget, % of guest RAM")
    ax2.set_title("budget (KVM_GET_NR_MMU_PAGES) at the end of each run\n"
                  "guest %d MiB" % result["memory_mib"], fontsize=9)
    ax2.legend(fontsize=8, loc="upper left")
    save_figure(fig, path, 110)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=16)
    p.add_argument("--mib", type=int, default=16, help="MiB per process (default 16)")
    p.add_argument("--one-spt-mib", type=int, default=1,
                   help="MiB per process for the 64-page row (default 1; see above)")
    p.add_argument("--no-small-reference", action="store_true",
                   help="skip KVM's default budget on the one-SPT row's workload")
    p.add_argument("--seconds", type=int, default=5, help="timed part of each run")
    p.add_argument("--native-reps", type=int, default=3,
                   help="native runs before each guest row; the best counts (default 3)")
    p.add_argument("--guest-reps", type=int, default=1,
                   help="workload runs in each guest; the best counts (default 1; always 1 "
                        "for the 64-page row)")
    p.add_argument("--memory-mib", type=int, default=512)
    p.add_argument("--budgets", default="64,256,1024",
                   help="fixed budgets in pages, comma-separated (64 = one SPT)")
    p.add_argument("--no-default", action="store_true")
    p.add_argument("--no-auto", action="store_true")
    p.add_argument("--timeout", type=float, default=240,
                   help="boot limit, and workload limit beyond --seconds")
    p.add_argument("--one-spt-timeout", type=float, default=600,
                   help="workload limit of the 64-page row")
    p.add_argument("--hakoniwa", default=os.environ.get(
        "HK_BENCH_HAKONIWA", os.path.join(ROOT, "target/release/hakoniwa")))
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    args = p.parse_args()

    tmp = tempfile.mkdtemp(prefix="hk-bench-spt.")
    binary = os.path.join(tmp, "hk-sptbench")
    subprocess.run(["gcc", "-static", "-Os", "-s", "-o", binary,
                    os.path.join(ROOT, "guest/tools/hk-sptbench.c")], check=True)
    main_w = (args.procs, args.mib)
    small_w = (args.procs, args.one_spt_mib)
    # (label, budget, workload, workload limit, repetitions)
    configs = []
    for b in args.budgets.split(","):
        b = int(b)
        if b == 64:
            configs.append(("one SPT (64), small %s" % workload_name(small_w), b, small_w,
                            args.one_spt_timeout, 1))
            if not args.no_small_reference and not args.no_default:
                configs.append(("KVM default, small %s" % workload_name(small_w), "default",
                                small_w, args.timeout + args.seconds, args.guest_reps))
        else:
            configs.append(("fixed %d" % b, b, main_w, args.timeout + args.seconds,
                            args.guest_reps))
    if not args.no_default:
        configs.append(("KVM default", "default", main_w, args.timeout + args.seconds,
                        args.guest_reps))
    if not args.no_auto:
        configs.append(("auto", "auto", main_w, args.timeout + args.seconds, args.guest_reps))

    # Native runs right before each guest row, on that row's workload: the
    # machine is shared (other builds, other rigs), and a baseline taken
    # minutes earlier under another load would skew the ratio.
    natives = {}
    runs = []
    try:
        for label, budget, w, limit, reps in configs:
            slug = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
            nat = native(args, binary, w)
            natives.setdefault(w, []).append(nat)
            print("native (L1): %s: %s passes/s" % (
                bench_cmd(args, w), " ".join("%.1f" % v for v in nat["reps_passes_per_s"])),
                flush=True)
            t0 = time.monotonic()
            try:
                r = guest_run(args, slug, budget, tmp, w, limit, reps)
            except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
                r = {"config": label, "budget_arg": budget, "ok": False, "error": str(e)}
            r["config"] = label
            r["workload_name"] = workload_name(w)
            r["native"] = nat
            r["native_passes_per_s"] = nat["passes_per_s"]
            if r["ok"]:
                r["relative"] = round(r["passes_per_s"] / nat["passes_per_s"], 6)
                print("%-30s budget %6s pages (%5.2f %% of RAM, %s)  %9.2f passes/s  %.4f x native"
                      "  zapped %s recycled %s cache_miss %s pf_fixed %s  [%.0f s]" % (
                          label, r["kvm_nr_mmu_pages"], r["shadow_memory_percent"], r["paging"],
                          r["passes_per_s"], r["relative"],
                          r["stats_delta"].get("mmu_shadow_zapped"),
                          r["stats_delta"].get("mmu_recycled"),
                          r["stats_delta"].get("mmu_cache_miss"),
                          r["vcpu_stats_delta"].get("pf_fixed"), time.monotonic() - t0),
                      flush=True)
            else:
                print("%-30s FAILED: %s" % (label, r.get("error")), flush=True)
            runs.append(r)
            # After every row: if L1 hangs later, what ran is kept.
            save(args, build_result(args, main_w, natives, runs, configs), quiet=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    result = build_result(args, main_w, natives, runs, configs)
    if result["paging"] != "shadow":
        print("note: the guest ran with %s paging, not shadow paging: the budget bounds "
              "nothing here (run with HK_RIG_NPT=0)" % result["paging"], flush=True)
    save(args, result)
    return 0 if all(r["ok"] for r in runs) else 1


def build_result(args, main_w, natives, runs, configs):
    ok = [r for r in runs if r["ok"]]
    missing = [c[0] for c in configs[len(runs):]]
    return {
        "benchmark": "spt",
        "command": "scripts/bench-spt" + "".join(" " + a for a in sys.argv[1:]),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "note": "inside L1 (QEMU TCG, nested KVM, npt=0 for L2); absolute numbers mean "
                "little, compare ratios",
        "complete": not missing,
        "missing": missing,
        "host": platform.node(), "kernel": platform.release(),
        "workload": bench_cmd(args, main_w), "procs": args.procs, "mib": args.mib,
        "one_spt_mib": args.one_spt_mib, "memory_mib": args.memory_mib,
        "paging": ok[0]["paging"] if ok else "unknown",
        "native_reps": args.native_reps, "guest_reps": args.guest_reps,
        "paging_source": ok[0]["paging_source"] if ok else "",
        "natives": {workload_name(w): {
            "passes_per_s": statistics.median(v for n in ns for v in n["reps_passes_per_s"]),
            "min": min(v for n in ns for v in n["reps_passes_per_s"]),
            "max": max(v for n in ns for v in n["reps_passes_per_s"]),
            "runs": sum(len(n["reps_passes_per_s"]) for n in ns)} for w, ns in natives.items()},
        "runs": runs, "paper": PAPER,
        "rig_qemu": os.environ.get("HK_BENCH_RIG_QEMU"),
    }


def save(args, result, quiet=False):
    """Writes spt.json, spt.md and (with matplotlib) spt.png."""
    os.makedirs(args.out, exist_ok=True)
    result["figure"] = figure(os.path.join(args.out, "spt.png"), result)
    with open(os.path.join(args.out, "spt.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    write_md(os.path.join(args.out, "spt.md"), result)
    if not quiet:
        print("wrote bench/results/spt.json and spt.md%s" % (
            " and spt.png" if result["figure"] else ""))


if __name__ == "__main__":
    sys.exit(main())
