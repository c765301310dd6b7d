#!/usr/bin/env python3
"""Boot benchmark: hakoniwa against QEMU/KVM (-M microvm and -M pc).

For each VMM, boot the same kernel and initramfs (1 vCPU, 512 MiB, the same
kernel command line) N times, round-robin so that drift hits every VMM alike,
and measure:

  boot time   from just before the VMM process is spawned (time.monotonic)
              to the line "hakoniwa-guest: init" on its serial console, which
              the default guest's /init prints first when the command line
              holds "hk.bootmark";
  VMM RSS     resident memory of the VMM process excluding guest RAM, from
              /proc/PID/smaps once the guest sits idle at its shell prompt:
              the Rss of every mapping except the guest-RAM mapping(s), i.e.
              anonymous mappings whose size is the guest memory's within
              max(16 MiB, 2%) (or, failing that, runs of adjacent anonymous
              mappings of that size). Total RSS and the excluded amount are
              recorded too;
  KVM exits   (extra, where debugfs is mounted, as in the rig) the VM's exit
              counters from /sys/kernel/debug/kvm/PID-FD at that moment;
  guest time  (extra) the guest kernel's own printk timestamp of
              "Run /init as init process", read with dmesg over the console.

hakoniwa runs twice over: with its default guest RAM (private memory,
transparent huge pages asked for) and as "hakoniwa-hugepages" with
`--memory size=..,hugepages=on` (2 MiB hugetlbfs pages). For the latter the
host's pool is grown for the run by writing /proc/sys/vm/nr_hugepages (as
root) and put back afterwards; when that cannot be done, its row says why
instead of failing.

Then the VMM gets SIGTERM (SIGKILL after 5 s). A run that does not reach the
marker within --timeout seconds, or whose VMM dies first, is a failed run: it
is reported and recorded, never silently dropped, and the script exits 1.

Writes bench/results/boot.json (raw runs, summary, environment) and
bench/results/boot.md (readable tables). Python 3 standard library only.
Normally run through scripts/bench-boot, which picks the test rig or the
host (hardware KVM) and builds what is missing.
"""

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import CMDLINE as GUEST_CMDLINE  # noqa: E402
from lib.environment import vmm_environment  # noqa: E402
from lib.hugepages import HugePages, pages_for  # noqa: E402
from lib.options import add_path_options, exit_status  # noqa: E402
from lib.qemu import qemu_argv  # noqa: E402
from lib.tables import (cell, fmt_range, fmt_ratio, md_context, md_table,  # noqa: E402
                        stats, text_table)
from lib.vmm import Proc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CMDLINE = GUEST_CMDLINE + " hk.bootmark"
MARKER_RE = re.compile(rb"(?:^|[\r\n])hakoniwa-guest: init\r?\n")
PROMPT_RE = re.compile(rb"hakoniwa:[^\r\n]*# ")
# Typed at the guest shell; the echoed command line holds "HKT=\1=", which
# the result pattern (digits between the '=') does not match.
GUEST_TIME_CMD = b"dmesg | sed -n 's/^\\[ *\\([0-9.]*\\)\\] Run \\/init .*/HKT=\\1=/p'\n"
GUEST_TIME_RE = re.compile(rb"HKT=([0-9]+\.[0-9]+)=")
RIG_NOTE = ("inside L1 under TCG with nested KVM; absolute times mean little, "
            "compare ratios")
DEFAULT_VMMS = ["hakoniwa", "hakoniwa-hugepages", "qemu-microvm", "qemu-pc"]
MICROVM_MACHINE = "microvm,isa-serial=on,rtc=on"
MIB = 1024 * 1024
OUTPUT_LIMIT = 1 << 20  # console and stderr bytes kept per run (the rest is dropped)


# ---------------------------------------------------------------- VMMs ----

class Vmm:
    def __init__(self, name, kind, machine=None, accel=None, memory_options=None):
        self.name = name
        self.kind = kind          # "hakoniwa" or "qemu"
        self.machine = machine    # QEMU's -M argument
        self.accel = accel        # QEMU's -accel argument (default: -enable-kvm)
        # hakoniwa's --memory options after the size (e.g. "hugepages=on").
        self.memory_options = memory_options
        self.skipped = None       # why it was not run, when it was not

    def hugepages(self):
        return "hugepages=on" in (self.memory_options or "")

    def argv(self, args, kernel, initrd):
        if self.kind == "hakoniwa":
            memory = "%dM" % args.memory_mib
            if self.memory_options:
                memory = "size=%s,%s" % (memory, self.memory_options)
            return [args.hakoniwa, "run", "--kernel", kernel, "--initramfs", initrd,
                    "--cmdline", CMDLINE, "--cpus", str(args.cpus), "--memory", memory]
        return qemu_argv(args.qemu, kernel, initrd, CMDLINE, args.memory_mib, cpus=args.cpus,
                         machine=self.machine, accel=self.accel, extra=["-no-reboot"])


def parse_vmms(items, microvm_machine):
    vmms = []
    for item in items:
        if item == "hakoniwa":
            vmms.append(Vmm("hakoniwa", "hakoniwa"))
        elif item == "hakoniwa-hugepages":
            vmms.append(Vmm("hakoniwa-hugepages", "hakoniwa", memory_options="hugepages=on"))
        elif item == "qemu-microvm":
            vmms.append(Vmm("qemu-microvm", "qemu", microvm_machine))
        elif item == "qemu-pc":
            vmms.append(Vmm("qemu-pc", "qemu", "pc"))
        elif item.startswith("qemu:"):
            machine = item[len("qemu:"):]
            vmms.append(Vmm("qemu(%s)" % machine, "qemu", machine))
        else:
            sys.exit("boot.py: unknown VMM %r (hakoniwa, hakoniwa-hugepages, qemu-microvm, "
                     "qemu-pc, qemu:MACHINE)" % item)
    if len({v.name for v in vmms}) != len(vmms):
        sys.exit("boot.py: a VMM is listed twice")
    return vmms


# ---------------------------------------------------------------- smaps ---

SMAPS_HEADER = re.compile(
    r"^([0-9a-f]+)-([0-9a-f]+) (\S+) (\S+) (\S+) (\d+)\s*(.*)$")


def read_smaps(pid):
    maps = []
    cur = None
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            m = SMAPS_HEADER.match(line)
            if m:
                cur = {"start": int(m.group(1), 16), "end": int(m.group(2), 16),
                       "perms": m.group(3), "inode": int(m.group(6)),
                       "path": m.group(7).strip(), "kib": {}}
                maps.append(cur)
                continue
            key, _, rest = line.partition(":")
            parts = rest.split()
            if cur is not None and len(parts) == 2 and parts[1] == "kB":
                cur["kib"][key] = int(parts[0])
    return maps


def is_plain_anon(m):
    return m["inode"] == 0 and (m["path"] == "" or m["path"].startswith("[anon:"))


def is_anon_ram(m):
    """Anonymous memory that may be guest RAM: plain, or hugetlbfs pages
    mapped with MAP_ANONYMOUS|MAP_HUGETLB ("/anon_hugepage (deleted)")."""
    return is_plain_anon(m) or m["path"].startswith("/anon_hugepage")


def rss_kib(m):
    """A mapping's resident KiB, hugetlbfs pages included (smaps counts them
    apart from Rss)."""
    k = m["kib"]
    return k.get("Rss", 0) + k.get("Private_Hugetlb", 0) + k.get("Shared_Hugetlb", 0)


def measure_rss(pid, memory_bytes, exe):
    """RSS of PID split into guest RAM and the rest (KiB)."""
    maps = read_smaps(pid)
    # Guest RAM: plain anonymous mappings about the guest memory's size (QEMU
    # and hakoniwa map it in one piece). Should a VMM split it into several
    # VMAs (madvise/mprotect), runs of adjacent anonymous mappings of that
    # size are taken instead. Upper bound, so that e.g. TCG's 1 GiB code
    # buffer is never mistaken for guest RAM.
    slack = max(16 * MIB, memory_bytes // 50)

    def fits(size):
        return memory_bytes - slack <= size <= memory_bytes + slack

    candidates = [[m] for m in maps if is_anon_ram(m) and fits(m["end"] - m["start"])]
    if not candidates:
        runs = []
        for m in maps:
            if (is_anon_ram(m) and runs and is_anon_ram(runs[-1][-1])
                    and runs[-1][-1]["end"] == m["start"]):
                runs[-1].append(m)
            else:
                runs.append([m])
        candidates = [r for r in runs
                      if is_anon_ram(r[0]) and fits(r[-1]["end"] - r[0]["start"])]
    guest = set()
    guest_maps = []
    for run in candidates:
        guest.update(id(m) for m in run)
        guest_maps.append({
            "range": "%x-%x" % (run[0]["start"], run[-1]["end"]),
            "size_mib": (run[-1]["end"] - run[0]["start"]) / MIB,
            "vmas": len(run),
            "rss_kib": sum(rss_kib(m) for m in run),
        })
    total = guest_rss = pss_rest = 0
    cats = {}
    for m in maps:
        rss = rss_kib(m)
        total += rss
        if id(m) in guest:
            guest_rss += rss
            continue
        pss_rest += m["kib"].get("Pss", 0)
        p = m["path"]
        if p == exe or p == exe + " (deleted)":
            cat = "binary"
        elif p == "[heap]":
            cat = "heap"
        elif p == "[stack]":
            cat = "main stack"
        elif p in ("[vdso]", "[vvar]", "[vsyscall]"):
            cat = "vdso"
        elif is_plain_anon(m):
            cat = "other anon (thread stacks, malloc arenas, ...)"
        elif ".so" in os.path.basename(p):
            cat = "shared libraries"
        else:
            cat = "other file-backed (%s)" % os.path.basename(p) if p else "other"
        cats[cat] = cats.get(cat, 0) + rss
    status = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                status[key] = int(rest.split()[0])
    return {
        "rss_excl_guest_kib": total - guest_rss,
        "rss_total_kib": total,
        "guest_ram_rss_kib": guest_rss,
        "guest_ram_mappings": guest_maps,
        "pss_excl_guest_kib": pss_rest,
        "breakdown_kib": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
        "status_kib": status,
    }


KVM_STAT_KEYS = ("exits", "io_exits", "mmio_exits", "halt_exits", "irq_exits",
                 "insn_emulation", "pf_taken", "hypercalls")


def kvm_stats(pid):
    """The VM's KVM exit counters from debugfs (/sys/kernel/debug/kvm/PID-FD,
    mounted in the rig), summed over the process's VMs; None if unavailable."""
    base = "/sys/kernel/debug/kvm"
    try:
        dirs = [d for d in os.listdir(base) if d.startswith("%d-" % pid)]
    except OSError:
        return None
    stats = {}
    for d in dirs:
        for key in KVM_STAT_KEYS:
            try:
                with open(os.path.join(base, d, key)) as f:
                    stats[key] = stats.get(key, 0) + int(f.read())
            except (OSError, ValueError):
                pass
    return stats or None


# ------------------------------------------------------------ one run -----

def one_run(args, vmm, kernel, initrd, index, warmup=False):
    argv = vmm.argv(args, kernel, initrd)
    memory_bytes = args.memory_mib * MIB
    rec = {"vmm": vmm.name, "index": index, "warmup": warmup, "ok": False}
    t0 = time.monotonic()
    vm = Proc(argv, vmm.name, limit=OUTPUT_LIMIT,
              watch=[("marker", MARKER_RE), ("prompt", PROMPT_RE)])
    proc, out, err, alive = vm.proc, vm.con, vm.err, vm.alive
    try:
        found = out.wait_found("marker", t0 + args.timeout, alive)
        if found is None:
            if alive():
                rec["error"] = "no marker within %g s" % args.timeout
            else:
                rec["error"] = "VMM exited with status %s before the marker" % proc.returncode
            return rec
        rec["boot_s"] = found[0] - t0
        # The guest is at its shell once the prompt shows; then let it settle.
        prompt = out.wait_found("prompt", time.monotonic() + 60, alive)
        if prompt is not None:
            rec["prompt_s"] = prompt[0] - t0
        else:
            rec["prompt_s"] = None
            rec["note"] = "no shell prompt within 60 s after the marker"
        time.sleep(args.settle)
        if not alive():
            rec["error"] = "VMM exited with status %s after the marker" % proc.returncode
            return rec
        exe = os.path.realpath("/proc/%d/exe" % proc.pid)
        rec.update(measure_rss(proc.pid, memory_bytes, exe))
        rec["kvm_stats"] = kvm_stats(proc.pid)
        if not rec["guest_ram_mappings"]:
            rec["error"] = "no guest-RAM mapping found in smaps"
            return rec
        # Extra: the guest kernel's own clock at "Run /init".
        if prompt is not None and not args.no_guest_time:
            start = out.size()
            try:
                proc.stdin.write(GUEST_TIME_CMD)
                proc.stdin.flush()
                m = out.wait_until(GUEST_TIME_RE, start, time.monotonic() + 20,
                                   lambda: out.eof)
                rec["guest_init_s"] = float(m.group(1)) if m else None
                rec["guest_console_reply"] = out.text()[start:start + 400] if m else None
            except OSError:
                rec["guest_init_s"] = None
        rec["ok"] = True
        return rec
    finally:
        status, stop_s, killed = vm.stop(5)
        rec["exit_status"] = status
        rec["stop_s"] = stop_s
        rec["killed"] = killed
        try:
            proc.stdin.close()
        except OSError:
            pass
        out.thread.join(2)
        err.thread.join(2)
        if not rec["ok"]:
            rec["console_tail"] = out.text(3000)
            rec["stderr_tail"] = err.text(3000)
            rec["argv"] = argv


# --------------------------------------------------------- environment ----

def environment(args):
    return vmm_environment(RIG_NOTE, "times", args.hakoniwa, args.qemu, args.kernel,
                           args.initramfs, CMDLINE, vcpus=args.cpus, memory_mib=args.memory_mib,
                           initramfs_sha256=False)


# ------------------------------------------------------------- summary ----

def summarize(vmms, runs):
    summary = {}
    for v in vmms:
        mine = [r for r in runs if r["vmm"] == v.name and not r["warmup"]]
        ok = [r for r in mine if r["ok"]]
        s = {"runs": len(mine), "ok": len(ok), "failed": len(mine) - len(ok)}
        if v.skipped:
            s["skipped"] = v.skipped
        for key in ("boot_s", "prompt_s", "guest_init_s", "rss_excl_guest_kib",
                    "rss_total_kib", "guest_ram_rss_kib", "pss_excl_guest_kib"):
            vals = [r[key] for r in ok if r.get(key) is not None]
            if vals:
                s[key] = stats(vals)
        counters = {}
        for r in ok:
            for k, n in (r.get("kvm_stats") or {}).items():
                counters.setdefault(k, []).append(n)
        s["kvm_stats_median"] = {k: statistics.median(v) for k, v in counters.items()}
        cats = {}
        for r in ok:
            for c in r.get("breakdown_kib", {}):
                cats.setdefault(c, []).append(r["breakdown_kib"][c])
        s["breakdown_median_kib"] = dict(sorted(
            ((c, statistics.median(v)) for c, v in cats.items()), key=lambda kv: -kv[1]))
        summary[v.name] = s
    ratios = {}
    hk = summary.get("hakoniwa")
    if hk:
        for v in vmms:
            if v.kind != "qemu":
                continue
            q = summary[v.name]
            ratios[v.name] = {}
            for key in ("boot_s", "rss_excl_guest_kib", "rss_total_kib", "guest_init_s"):
                if key in hk and key in q and q[key]["median"]:
                    ratios[v.name][key] = hk[key]["median"] / q[key]["median"]
    return summary, ratios


def fmt_s(d):
    return fmt_range(d, "%.3f")


def fmt_mib(d):
    """KiB as MiB."""
    return fmt_range(d, "%.1f", 1024)


def tables(vmms, summary, ratios):
    """Returns the main table and the ratio table as lists of rows."""
    main = [["VMM", "ok/runs", "boot to /init marker, s", "VMM RSS excl. guest RAM, MiB",
             "total RSS, MiB", "guest kernel t(/init), s"]]
    for v in vmms:
        s = summary[v.name]
        runs = "not run: %s" % s["skipped"] if s.get("skipped") else "%d/%d" % (s["ok"],
                                                                                 s["runs"])
        main.append([v.name, runs, fmt_s(s.get("boot_s")),
                     fmt_mib(s.get("rss_excl_guest_kib")), fmt_mib(s.get("rss_total_kib")),
                     fmt_s(s.get("guest_init_s"))])
    rat = [["hakoniwa / QEMU", "boot time", "RSS excl. guest RAM", "total RSS",
            "guest kernel t(/init)"]]
    for name, r in ratios.items():
        rat.append([name, fmt_ratio(r.get("boot_s")), fmt_ratio(r.get("rss_excl_guest_kib")),
                    fmt_ratio(r.get("rss_total_kib")), fmt_ratio(r.get("guest_init_s"))])
    return main, rat


def write_markdown(path, result, vmms):
    env = result["environment"]
    summary, ratios = result["summary"], result["ratios"]
    main, rat = tables(vmms, summary, ratios)
    L = []
    L.append("# Boot benchmark: hakoniwa vs QEMU/KVM")
    L.append("")
    L.append("Run on %s (%s); reproduce with `%s`." % (env["date_utc"], env["where"],
                                                       result["command"]))
    L.append("")
    L += md_context(env, "In the rig, L1's user space, and so each VMM process itself, runs "
                    "under TCG, and every guest exit that reaches a VMM's user space is very "
                    "expensive. Both inflate VMM start-up work and user-space device traffic "
                    "far beyond their native cost, so these ratios overstate differences "
                    "that come from the VMMs' own user-space work.")
    L.append("Same guest for every VMM: kernel %s (`%s`), initramfs `%s`, "
             "%d vCPU(s), %d MiB, command line `%s`. %d measured runs per VMM, "
             "round-robin, after %d warm-up round(s) that are not counted."
             % (env["guest_kernel_package"] or env["guest_kernel_version"],
                os.path.relpath(env["guest_kernel"], ROOT),
                os.path.relpath(env["guest_initramfs"], ROOT), env["vcpus"], env["memory_mib"],
                env["guest_cmdline"], result["runs_per_vmm"], result["warmup_rounds"]))
    L.append("")
    L.append("Median (min-max):")
    L.append("")
    L.append(md_table(main))
    L.append("")
    L.append("Ratios of medians, hakoniwa / QEMU (below 1: hakoniwa is faster or smaller):")
    L.append("")
    L.append(md_table(rat))
    L.append("")
    L.append("## What is measured")
    L.append("")
    L.append("- **boot to /init marker**: from just before the VMM process is spawned to "
             "the moment the line `hakoniwa-guest: init` (printed first by the guest's "
             "/init) is read from the VMM's serial console on its stdout pipe.")
    L.append("- **VMM RSS excl. guest RAM**: once the guest is idle at its shell prompt "
             "(+%.1f s), the sum of `Rss` over all mappings in `/proc/PID/smaps` except "
             "the guest RAM: the anonymous mapping(s) whose size is the guest memory's "
             "within max(16 MiB, 2%%) (each VMM here maps it in one piece; the matched "
             "mappings are listed per run in boot.json, with total RSS and the excluded "
             "guest-RAM RSS)." % result["settle_s"])
    L.append("- **hakoniwa-hugepages**: hakoniwa with `--memory size=%dM,hugepages=on`: "
             "guest RAM on 2 MiB hugetlbfs pages, reserved when hakoniwa maps it (the "
             "host's pool grown for the run through /proc/sys/vm/nr_hugepages and put back "
             "after; see `hugepages` under Environment). RSS counts hugetlbfs pages "
             "(smaps' `Private_Hugetlb`) as resident. The plain `hakoniwa` row uses the "
             "default backing: private memory with transparent huge pages asked for "
             "(`madvise`), which apply where the host's THP setting allows (not in the "
             "rig, whose THP is `never`)." % env["memory_mib"])
    L.append("- **guest kernel t(/init)**: the guest kernel's printk timestamp of "
             "`Run /init as init process`, read with dmesg over the console: guest-side "
             "time, which leaves out the VMM's own start-up and firmware.")
    L.append("")
    L.append("Median RSS excluding guest RAM, by mapping (KiB):")
    L.append("")
    cats = []
    for v in vmms:
        for c in summary[v.name]["breakdown_median_kib"]:
            if c not in cats:
                cats.append(c)
    rows = [["mapping"] + [v.name for v in vmms]]
    for c in cats:
        rows.append([c] + ["%d" % summary[v.name]["breakdown_median_kib"].get(c, 0)
                           for v in vmms])
    L.append(md_table(rows))
    L.append("")
    if any(summary[v.name]["kvm_stats_median"] for v in vmms):
        L.append("Median KVM exit counters of the whole boot, up to the RSS sample "
                 "(debugfs `kvm/PID-FD`):")
        L.append("")
        rows = [["counter"] + [v.name for v in vmms]]
        for k in KVM_STAT_KEYS:
            rows.append([k] + ["%d" % summary[v.name]["kvm_stats_median"][k]
                               if k in summary[v.name]["kvm_stats_median"] else "-"
                               for v in vmms])
        L.append(md_table(rows))
        L.append("")
    L.append("## Command lines")
    L.append("")
    for v in vmms:
        L.append("- %s: `%s`" % (v.name, " ".join(result["argv"][v.name])))
    L.append("")
    L.append("## Environment")
    L.append("")
    for k, val in env.items():
        L.append("- %s: %s" % (k, val))
    L.append("")
    L.append("## All runs")
    L.append("")
    rows = [["round", "VMM", "ok", "boot s", "prompt s", "guest t(/init) s",
             "RSS excl. guest KiB", "total RSS KiB", "guest RAM RSS KiB", "error"]]
    for r in result["runs"]:
        if r["warmup"]:
            rnd = "warm-up"
        else:
            rnd = str(r["index"] + 1)
        g = functools.partial(cell, r)
        rows.append([rnd, r["vmm"], "yes" if r["ok"] else "**no**", g("boot_s", "%.3f"),
                     g("prompt_s", "%.3f"), g("guest_init_s", "%.3f"),
                     g("rss_excl_guest_kib", "%d"), g("rss_total_kib", "%d"),
                     g("guest_ram_rss_kib", "%d"), r.get("error", "")])
    L.append(md_table(rows))
    L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L))


def run_and_report(args, v, kernel, initrd, rnd, warm, runs):
    """One run of V in round RND, appended to RUNS and printed."""
    r = one_run(args, v, kernel, initrd, rnd - args.warmup, warmup=warm)
    runs.append(r)
    label = "warm-up" if warm else "run %d/%d" % (rnd - args.warmup + 1, args.runs)
    if r["ok"]:
        print("%-8s %-18s boot %7.3f s  prompt %s  guest t(/init) %s  "
              "RSS excl. guest %7.1f MiB (total %.1f, guest RAM %.1f)" % (
                  label, v.name, r["boot_s"],
                  "%7.3f s" % r["prompt_s"] if r.get("prompt_s") else "-",
                  "%.3f s" % r["guest_init_s"] if r.get("guest_init_s") else "-",
                  r["rss_excl_guest_kib"] / 1024, r["rss_total_kib"] / 1024,
                  r["guest_ram_rss_kib"] / 1024), flush=True)
    else:
        print("%-8s %-18s FAILED: %s" % (label, v.name, r["error"]), flush=True)
        print("  console tail: %r" % r["console_tail"][-400:], flush=True)
        print("  stderr tail: %r" % r["stderr_tail"][-400:], flush=True)


# ---------------------------------------------------------------- main ----

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="measured runs per VMM (default 5)")
    p.add_argument("--warmup", type=int, default=1,
                   help="uncounted warm-up rounds first (default 1)")
    p.add_argument("--vmms", nargs="+", default=DEFAULT_VMMS, metavar="VMM",
                   help="VMMs to compare: hakoniwa, qemu-microvm, qemu-pc, qemu:MACHINE "
                        "(QEMU's -M value) (default: %s)" % " ".join(DEFAULT_VMMS))
    p.add_argument("--microvm-machine", default=MICROVM_MACHINE,
                   help="QEMU -M value for qemu-microvm (default %s)" % MICROVM_MACHINE)
    add_path_options(p, "kernel", "initramfs", "hakoniwa", "qemu")
    p.add_argument("--memory-mib", type=int, default=512)
    p.add_argument("--cpus", type=int, default=1,
                   help="vCPUs of every guest (default 1; 4 with 2560 MiB is the "
                   "shape of tests/guest.rs's four_cpus_and_2560m)")
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds a run may take to reach the marker (default 120)")
    p.add_argument("--settle", type=float, default=1.0,
                   help="seconds to wait at the shell prompt before sampling RSS")
    p.add_argument("--no-guest-time", action="store_true",
                   help="do not ask the guest for its kernel's time to /init")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"),
                   help="directory for boot.json and boot.md")
    args = p.parse_args()

    vmms = parse_vmms(args.vmms, args.microvm_machine)
    args.kernel = os.path.abspath(args.kernel)
    args.initramfs = os.path.abspath(args.initramfs)
    args.hakoniwa = os.path.abspath(args.hakoniwa) if os.sep in args.hakoniwa else args.hakoniwa
    for path in (args.kernel, args.initramfs):
        if not os.path.isfile(path):
            sys.exit("boot.py: %s is missing (scripts/build-guest builds it)" % path)
    if any(v.kind == "hakoniwa" for v in vmms) and not os.access(args.hakoniwa, os.X_OK):
        sys.exit("boot.py: %s is missing (cargo build --release)" % args.hakoniwa)
    if any(v.kind == "qemu" for v in vmms) and not shutil.which(args.qemu):
        sys.exit("boot.py: %s not found (apt-get install qemu-system-x86)" % args.qemu)
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        sys.exit("boot.py: /dev/kvm is not usable here")

    env = environment(args)
    print("boot benchmark: %s" % env["note"], flush=True)
    print("guest: %s, %s, %d vCPU(s), %d MiB, cmdline %r" % (
        env["guest_kernel_version"], os.path.basename(args.initramfs),
        args.cpus, args.memory_mib, CMDLINE), flush=True)

    # Stage the guest files on a local file system (in the rig, /tmp is a
    # tmpfs while the project tree is 9p), the same copies for every VMM.
    stage = tempfile.mkdtemp(prefix="hk-bench-boot.")
    kernel = shutil.copy(args.kernel, os.path.join(stage, os.path.basename(args.kernel)))
    initrd = shutil.copy(args.initramfs, os.path.join(stage, os.path.basename(args.initramfs)))

    runs = []
    # Huge pages for the hugepages=on rows: one guest at a time, so one
    # guest's worth, reserved for the whole run and given back after it.
    hugepages = [v for v in vmms if v.hugepages()]
    try:
        with HugePages(pages_for(args.memory_mib) if hugepages else 0) as pool:
            if hugepages:
                env["hugepages"] = pool.record()
                if not pool.ok:
                    print("huge pages: %s; %s not run" % (
                        pool.note, ", ".join(v.name for v in hugepages)), flush=True)
                    for v in hugepages:
                        v.skipped = pool.note
            for rnd in range(args.warmup + args.runs):
                warm = rnd < args.warmup
                for v in vmms:
                    if v.skipped:
                        continue
                    run_and_report(args, v, kernel, initrd, rnd, warm, runs)
    finally:
        shutil.rmtree(stage, ignore_errors=True)

    summary, ratios = summarize(vmms, runs)
    argv_shown = {}
    for v in vmms:
        a = v.argv(args, args.kernel, args.initramfs)
        argv_shown[v.name] = [os.path.relpath(x, ROOT) if x.startswith(ROOT + os.sep) else x
                              for x in a]
        argv_shown[v.name] = [("'%s'" % x) if " " in x else x for x in argv_shown[v.name]]
    result = {
        "benchmark": "boot",
        "command": "scripts/bench-boot" + "".join(" " + a for a in sys.argv[1:]),
        "environment": env,
        "runs_per_vmm": args.runs,
        "warmup_rounds": args.warmup,
        "settle_s": args.settle,
        "timeout_s": args.timeout,
        "vmms": [v.name for v in vmms],
        "argv": argv_shown,
        "summary": summary,
        "ratios": ratios,
        "ratio_definition": "median(hakoniwa) / median(QEMU machine); below 1 means "
                            "hakoniwa is faster or smaller",
        "runs": runs,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "boot.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    write_markdown(os.path.join(args.out, "boot.md"), result, vmms)

    main_t, rat_t = tables(vmms, summary, ratios)
    print()
    print("Context: %s." % env["note"])
    print("Median (min-max) of %d runs per VMM:" % args.runs)
    print(text_table(main_t))
    print()
    print("Ratios of medians, hakoniwa / QEMU (below 1: hakoniwa is faster or smaller):")
    print(text_table(rat_t))
    print()
    print("wrote %s and %s" % (os.path.relpath(os.path.join(args.out, "boot.json"), ROOT),
                               os.path.relpath(os.path.join(args.out, "boot.md"), ROOT)))
    failed = sum(s["failed"] for s in summary.values())
    failed += sum(1 for r in runs if r["warmup"] and not r["ok"])
    return exit_status("boot.py", failed, "run(s)", "boot.json")


if __name__ == "__main__":
    sys.exit(main())
