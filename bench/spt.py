#!/usr/bin/env python3
"""Shadow-paging benchmark (seed 001): throughput of a multi-process,
memory-heavy guest workload against the shadow-page budget.

The workload is guest/tools/hk-sptbench: PROCS processes (default 16), each
with MIB MiB (default 16) resident, pass a token around a ring of pipes and
write one byte in every page of their set per turn, so every pass is a
process switch into a large address space. It runs natively (in L1, the same
static binary) and in a hakoniwa guest under these budgets:

  one SPT     64 pages (KVM's minimum): less than one process's shadow tables
              plus the kernel's, so every switch rebuilds them (the paper's
              "SPT 1 面", 0.23 of native);
  fixed N     --budgets (default 256, 1024);
  default     KVM's own budget (2 % of guest pages);
  auto        --spt-pages auto with the guest agent (docs/shadow-paging.md).

Budgets are set through the API (`PUT /api/v1/vm.mmu`) after boot, so every
guest boots alike. For each run: throughput relative to native, the budget
as a share of guest RAM (paper: ~3 %), and KVM's statistics over the run
(mmu_shadow_zapped, mmu_recycled, mmu_cache_miss, pf_fixed, ...).
Meaningful only with shadow paging: run with `HK_RIG_NPT=0 scripts/rig --
python3 bench/spt.py` (scripts/bench-spt does). With nested paging the
budget has nothing to bound; the script says so in its output.

Writes bench/results/spt.json and bench/results/spt.md (with an ASCII bar
chart), and spt.png when matplotlib is importable. Standard library only.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = b"hakoniwa:/# "
RESULT_RE = re.compile(rb"hk-sptbench procs=(\d+) mib=(\d+) passes=(\d+) seconds=([0-9.]+) "
                       rb"passes_per_s=([0-9.]+) pages_per_s=([0-9]+)")
AGENT = ("while :; do grep PageTables /proc/meminfo | hk-vsock connect 2 1024; "
         "sleep 1; done >/dev/null 2>&1 &")
VM_STATS = ["mmu_shadow_zapped", "mmu_recycled", "mmu_cache_miss", "mmu_pte_write",
            "mmu_flooded", "mmu_unsync", "mmu_pde_zapped"]
VCPU_STATS = ["pf_fixed", "pf_guest", "pf_taken", "exits"]
PAPER = {"one_spt": 0.23, "multiple_spt": 0.90, "shadow_memory_percent": 3.0}


class Console:
    def __init__(self, proc):
        self.proc = proc
        self.buf = bytearray()
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            data = os.read(self.proc.stdout.fileno(), 65536)
            with self.cond:
                if not data:
                    self.cond.notify_all()
                    return
                self.buf += data
                self.cond.notify_all()

    def wait(self, regex, start, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                m = regex.search(self.buf, start)
                if m:
                    return m
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    return None
                self.cond.wait(min(left, 0.5))

    def send(self, text):
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def tail(self, n=600):
        with self.cond:
            return bytes(self.buf[-n:]).decode("utf-8", "replace")

    def size(self):
        with self.cond:
            return len(self.buf)


def ctl(args, socket, *cmd):
    out = subprocess.run([args.hakoniwa, "ctl", "--api-socket", socket, *cmd],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError("ctl %s: status %d: %s" % (" ".join(cmd), out.returncode,
                                                     (out.stderr or out.stdout).strip()))
    return json.loads(out.stdout) if out.stdout.strip().startswith("{") else out.stdout


def bench_cmd(args):
    return "hk-sptbench -p %d -m %d -t %d" % (args.procs, args.mib, args.seconds)


def parse_result(m):
    return {"procs": int(m.group(1)), "mib": int(m.group(2)), "passes": int(m.group(3)),
            "seconds": float(m.group(4)), "passes_per_s": float(m.group(5)),
            "pages_per_s": float(m.group(6))}


def native(args, binary):
    out = subprocess.run([binary, "-p", str(args.procs), "-m", str(args.mib),
                          "-t", str(args.seconds)], capture_output=True, timeout=600)
    m = RESULT_RE.search(out.stdout)
    if not m:
        raise RuntimeError("native run failed: %r" % out.stderr)
    return parse_result(m)


def delta(after, before, keys):
    return {k: after.get(k, 0) - before.get(k, 0) for k in keys if k in after}


def guest_run(args, label, budget, tmp):
    """Boots a guest, sets BUDGET ("auto", "default" or pages), runs the
    workload, returns the record."""
    socket = os.path.join(tmp, "api-%s.sock" % label)
    uds = os.path.join(tmp, "vsock-%s.sock" % label)
    argv = [args.hakoniwa, "run", "--memory", "%dM" % args.memory_mib, "--api-socket", socket,
            "--vsock", "cid=3,uds=%s" % uds]
    if budget == "auto":
        argv += ["--spt-pages", "auto"]
    rec = {"config": label, "budget_arg": budget, "ok": False}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    con = Console(proc)
    try:
        if not con.wait(re.compile(re.escape(PROMPT)), 0, args.timeout):
            rec["error"] = "no prompt: " + con.tail()
            return rec
        rec["boot_s"] = round(time.monotonic() - t0, 2)
        if budget == "auto":
            con.send(AGENT + "\n")
        elif budget != "default":
            ctl(args, socket, "mmu", "--spt-pages", str(budget))
        time.sleep(2)
        before = ctl(args, socket, "mmu")
        start = con.size()
        con.send(bench_cmd(args) + "\n")
        m = con.wait(RESULT_RE, start, args.timeout + args.seconds)
        if not m:
            rec["error"] = "no result: " + con.tail()
            return rec
        after = ctl(args, socket, "mmu")
        rec.update(parse_result(m))
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
        proc.wait(30)
        return rec
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def bar(value, top, width=40):
    n = 0 if top <= 0 else int(round(width * value / top))
    return "#" * n


def write_md(path, result):
    L = ["# Shadow-paging benchmark (seed 001)", "",
         "`%s` on %s; %s." % (result["command"], result["date"], result["note"]), "",
         "Workload: `%s` (%d processes x %d MiB, token ring, one write per page per turn), "
         "guest %d MiB, 1 vCPU. Paging: **%s** (%s)." % (
             result["workload"], result["procs"], result["mib"], result["memory_mib"],
             result["paging"], result["paging_source"]), "",
         "| config | budget (pages) | shadow mem % of RAM | passes/s | rel. to native | "
         "mmu_shadow_zapped | mmu_recycled | mmu_cache_miss | pf_fixed | exits |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    n = result["native"]["passes_per_s"]
    L.append("| native (L1) | - | - | %.1f | 1.00 | - | - | - | - | - |" % n)
    for r in result["runs"]:
        if not r["ok"]:
            L.append("| %s | failed: %s | | | | | | | | |" % (r["config"], r.get("error", "")[:80]))
            continue
        s, v = r["stats_delta"], r["vcpu_stats_delta"]
        L.append("| %s | %s | %.2f | %.1f | %.2f | %s | %s | %s | %s | %s |" % (
            r["config"], r["kvm_nr_mmu_pages"], r["shadow_memory_percent"], r["passes_per_s"],
            r["relative"], s.get("mmu_shadow_zapped", "-"), s.get("mmu_recycled", "-"),
            s.get("mmu_cache_miss", "-"), v.get("pf_fixed", "-"), v.get("exits", "-")))
    L += ["", "Paper (Virtage, SAP S/D, 16 processes, 10 GB): one SPT **0.23**, multiple "
          "SPTs **0.90** of a physical server; shadow memory ~**3 %** of guest memory.", "",
          "Throughput relative to native (ASCII; %s):" % (
              "see also spt.png" if result.get("figure") else "matplotlib is not installed"),
          "", "```"]
    for r in [{"config": "native", "relative": 1.0, "ok": True}] + result["runs"]:
        if r["ok"]:
            L.append("%-14s %5.2f %s" % (r["config"], r["relative"], bar(r["relative"], 1.0)))
    L += ["%-14s %5.2f %s" % ("paper 1 SPT", 0.23, bar(0.23, 1.0)),
          "%-14s %5.2f %s" % ("paper multi", 0.90, bar(0.90, 1.0)), "```", "",
          "Statistics are deltas over the workload (fault-in, warm-up and the timed part). "
          "Relative throughput compares L2 (nested KVM under TCG) with L1 (TCG): the "
          "absolute gap includes nesting, so compare the guest rows with each other first.", ""]
    with open(path, "w") as f:
        f.write("\n".join(L))


def figure(path, result):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = [r for r in result["runs"] if r["ok"]]
    names = [r["config"] for r in runs] + ["paper 1 SPT", "paper multi"]
    values = [r["relative"] for r in runs] + [0.23, 0.90]
    plt.figure(figsize=(8, 4))
    plt.bar(names, values, color=["C0"] * len(runs) + ["C1", "C1"])
    plt.ylabel("throughput relative to native")
    plt.title("hk-sptbench %dx%d MiB, shadow paging" % (result["procs"], result["mib"]))
    plt.xticks(rotation=30, ha="right")
    plt.tight_layout()
    plt.savefig(path)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=16)
    p.add_argument("--mib", type=int, default=16, help="MiB per process (default 16)")
    p.add_argument("--seconds", type=int, default=5, help="timed part of each run")
    p.add_argument("--memory-mib", type=int, default=512)
    p.add_argument("--budgets", default="64,256,1024",
                   help="fixed budgets in pages, comma-separated (64 = one SPT)")
    p.add_argument("--no-default", action="store_true")
    p.add_argument("--no-auto", action="store_true")
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--hakoniwa", default=os.path.join(ROOT, "target/release/hakoniwa"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    args = p.parse_args()

    tmp = tempfile.mkdtemp(prefix="hk-bench-spt.")
    binary = os.path.join(tmp, "hk-sptbench")
    subprocess.run(["gcc", "-static", "-Os", "-s", "-o", binary,
                    os.path.join(ROOT, "guest/tools/hk-sptbench.c")], check=True)
    configs = []
    for b in args.budgets.split(","):
        b = int(b)
        configs.append(("one SPT (64)" if b == 64 else "fixed %d" % b, b))
    if not args.no_default:
        configs.append(("KVM default", "default"))
    if not args.no_auto:
        configs.append(("auto", "auto"))

    print("native (L1): %s" % bench_cmd(args), flush=True)
    nat = native(args, binary)
    print("  %.1f passes/s" % nat["passes_per_s"], flush=True)
    runs = []
    try:
        for label, budget in configs:
            try:
                r = guest_run(args, label.replace(" ", "_").replace("(", "").replace(")", ""),
                              budget, tmp)
            except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
                r = {"config": label, "budget_arg": budget, "ok": False, "error": str(e)}
            r["config"] = label
            if r["ok"]:
                r["relative"] = round(r["passes_per_s"] / nat["passes_per_s"], 4)
                print("%-14s budget %6s pages (%5.2f %% of RAM, %s)  %8.1f passes/s  %.3f x native"
                      "  zapped %s recycled %s cache_miss %s pf_fixed %s" % (
                          label, r["kvm_nr_mmu_pages"], r["shadow_memory_percent"], r["paging"],
                          r["passes_per_s"], r["relative"],
                          r["stats_delta"].get("mmu_shadow_zapped"),
                          r["stats_delta"].get("mmu_recycled"),
                          r["stats_delta"].get("mmu_cache_miss"),
                          r["vcpu_stats_delta"].get("pf_fixed")), flush=True)
            else:
                print("%-14s FAILED: %s" % (label, r.get("error")), flush=True)
            runs.append(r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ok = [r for r in runs if r["ok"]]
    paging = ok[0]["paging"] if ok else "unknown"
    result = {
        "benchmark": "spt",
        "command": ("HK_RIG_NPT=0 scripts/rig -- python3 bench/spt.py" if paging == "shadow"
                    else "python3 bench/spt.py") + "".join(" " + a for a in sys.argv[1:]),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "note": "inside L1 (QEMU TCG, nested KVM); absolute numbers mean little, compare ratios",
        "host": platform.node(), "kernel": platform.release(),
        "workload": bench_cmd(args), "procs": args.procs, "mib": args.mib,
        "memory_mib": args.memory_mib, "paging": paging,
        "paging_source": ok[0]["paging_source"] if ok else "",
        "native": nat, "runs": runs, "paper": PAPER,
    }
    if paging != "shadow":
        print("note: the guest ran with %s paging, not shadow paging: the budget bounds "
              "nothing here (run with HK_RIG_NPT=0)" % paging, flush=True)
    os.makedirs(args.out, exist_ok=True)
    result["figure"] = figure(os.path.join(args.out, "spt.png"), result)
    with open(os.path.join(args.out, "spt.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    write_md(os.path.join(args.out, "spt.md"), result)
    print("wrote bench/results/spt.json and spt.md%s" % (" and spt.png" if result["figure"] else ""))
    return 0 if len(ok) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
