#!/usr/bin/env python3
"""Live-migration benchmark (seed 003): hakoniwa's postcopy with and without
para-virtualized page faults, and precopy / postcopy / hybrid beside QEMU's.

Three parts, all in one run (each a --parts name):

touch  The paper's 4.1 micro-benchmark. A 1-vCPU, 1 GiB guest runs
       `hk-memtouch -t 4 -m 200` (guest/tools/hk-memtouch.c): four threads
       each allocate and fill 200 MB, then wait. The destination hakoniwa
       waits with `run --incoming`; `ctl migrate --mode postcopy` (prefetch
       8) starts the migration, and as soon as the destination's
       `vm.migration` says postcopy (the guest runs there) the harness types
       the go line on the destination's console: every thread reads its area
       byte by byte and stops its clock at the end. Rows: async page faults
       on / off (`run --async-pf`, both sides) x background push on / off
       (`--no-background` is the paper's setting). A row without migration
       gives the pure compute time. Per row: each thread's time, the
       destination's report (faults major/minor/double, by vCPU / async
       worker / VMM, fault latency histogram, run_fraction) and, sampled by
       the harness every 100 ms, the destination's vCPU thread: time in
       guest mode (/proc/PID/task/TID/stat guest_time; the paper's "VMX
       non-root time") and on CPU (schedstat).

web    The paper's 4.2. The same guest with virtio-net serves 5000 files of
       100 KB of pseudo-random bytes (hk-mkfiles, in a tmpfs) with busybox
       httpd. Debian's siege runs 128 concurrent clients in random order
       from L1 (the harness timestamps each verbose line siege prints);
       after --web-before seconds a postcopy migration starts, and siege
       runs --web-after seconds more. Source and destination each have
       their own TAP in one Linux bridge with ageing_time 0 (it floods every
       frame to both TAPs, so frames reach whichever side the guest runs
       on: two processes cannot open one TAP, and hakoniwa announces no
       move). Rows: async PF on / off, background push as --web-background.

modes  Precopy, postcopy and hybrid of the same guest, idle and under a
       memory-dirtying workload (`hk-memtouch -d`: a paced rate, a fraction
       of the measured link bandwidth, and as fast as the guest can),
       beside QEMU's precopy and postcopy (QMP `migrate` with the
       postcopy-ram capability and `migrate-start-postcopy` at once, and
       after the first pass as QEMU's operator-driven hybrid) of the same
       kernel and initramfs (`-enable-kvm -cpu host`). Downtime and total
       time from each VMM's own report, beside RAM / the link bandwidth
       measured over loopback at the start, and the mean throughput (MiB
       sent / total time). --auth (default none,tls) runs each mode over
       plain TCP and over TLS 1.3 with certificates both ways (hakoniwa's
       `tls=DIR`, QEMU's tls-creds-x509 with verify-peer), credentials
       made with openssl once per run (lib/tlscreds.py): TLS's cost.

--link-delay-ms (default 0,2) repeats the touch and web rows with the
migration stream's loopback delayed by netem (`tc qdisc ... netem delay D`
on lo, D each way: a round trip of 2D). In the rig a page fault costs ~1 ms
of emulated CPU on both sides, so on plain loopback the faults are bound by
CPU, not by waiting, and a sleeping task has nothing to overlap; the paper's
faults waited on a network (hundreds of us on GbE). The delay makes the
wait dominate again, as on a real link. The web clients reach the guest
through the bridge, not lo, so only the migration stream is delayed.

Writes bench/results/migration.{json,md,png} (--out, --name: another
directory or name). Normally run through
scripts/bench-migration (the test rig where there is no hardware KVM).
`--replot JSON` rebuilds the md and png from a json without running
anything (into --out, under the JSON's name unless --name says). Needs
root (TAPs, bridge, userfaultfd for QEMU).
"""

import argparse
import json
import os
import pty
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import CMDLINE as GUEST_CMDLINE  # noqa: E402
from lib.console import PROMPT_RE, shell  # noqa: E402
from lib.environment import (first_line, git_state, machine_memory_mib,  # noqa: E402
                             vmm_environment)
from lib.hakoniwa import HkPair, api_get, trim_report  # noqa: E402
from lib.kvmtrace import KvmTrace, stuck_report  # noqa: E402
from lib.memtouch import (DIRTY_DONE, DIRTY_READY, TOUCH_DONE,  # noqa: E402
                          TOUCH_GUEST, TOUCH_READY, TOUCH_THREAD)
from lib.options import add_path_options, exit_status  # noqa: E402
from lib.plots import panels, save_figure  # noqa: E402
from lib.procstat import ThreadCpu, busy_seconds  # noqa: E402
from lib.qemu import Qmp, qemu_argv  # noqa: E402
from lib.tables import md_table, text_table  # noqa: E402
from lib.tlscreds import check_credentials, describe, make_credentials  # noqa: E402
from lib.vmm import Proc, free_port  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CMDLINE = GUEST_CMDLINE
# %s: L1's vCPUs, counted when the benchmark runs (scripts/rig's HK_RIG_CPUS).
RIG_NOTE = ("inside L1 under TCG with nested KVM; source, destination, the link "
            "(loopback) and the clients share %s; absolute figures mean "
            "little, compare rows of the same run")
MAC = "52:54:00:12:34:56"
MIB = 1 << 20
PARTS = ["touch", "web", "modes"]
WORKLOADS = ["idle", "dirty", "heavy"]
HK_MODES = ["precopy", "postcopy", "hybrid"]
QEMU_MODES = ["precopy", "postcopy", "hybrid"]
# The modes rows' link: plain TCP (hakoniwa's `auth=none`, QEMU's default)
# or TLS 1.3 with certificates both ways (hakoniwa's `tls=DIR`, QEMU's
# tls-creds-x509 with verify-peer=on), the same credentials for both.
AUTHS = ["none", "tls"]
LINK = {"none": "plain", "tls": "TLS 1.3"}

# Seed 003's figures (10GbE, 1 vCPU / 1 GB VM, +-8 prefetch, no background
# transfer during the measurements).
PAPER = {
    "touch_s": {"on": 9.8, "off": 17.6},
    "touch_cut": 0.44,
    "run_fraction": {"on": 0.55, "off": 0.38},
    "web_switch_s": {"on": 1.3, "off": 1.8},
    "web_plus25_s": {"on": 0.5, "off": 0.75},
    "web_before_s": 0.25,
    "minor_fault": "a few us",
    "major_fault": "hundreds of us (GbE)",
}

T0 = time.monotonic()


def log(*a):
    print("[%6.1f] %s" % (time.monotonic() - T0, " ".join(str(x) for x in a)), flush=True)


# -------------------------------------------------------------- samplers ----

class VcpuSampler:
    """Every 100 ms: the vCPU threads' time in guest mode (guest_time, field
    43 of /proc/PID/task/TID/stat, clock ticks) and on CPU (schedstat, ns),
    summed over the VM's vCPU threads."""

    NAME = re.compile(r"^(vcpu\d+|CPU \d+/KVM)$")

    def __init__(self, pid, period=0.1):
        self.pid, self.period = pid, period
        self.samples = []
        self.stop_ev = threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _tids(self):
        tids = []
        try:
            for tid in os.listdir("/proc/%d/task" % self.pid):
                try:
                    with open("/proc/%d/task/%s/comm" % (self.pid, tid)) as f:
                        if self.NAME.match(f.read().strip()):
                            tids.append(tid)
                except OSError:
                    pass
        except OSError:
            pass
        return tids

    def _run(self):
        tids = []
        while not self.stop_ev.is_set():
            if not tids:
                tids = self._tids()
            guest = oncpu = 0
            for tid in tids:
                try:
                    with open("/proc/%d/task/%s/stat" % (self.pid, tid)) as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    guest += int(fields[40])
                    with open("/proc/%d/task/%s/schedstat" % (self.pid, tid)) as f:
                        oncpu += int(f.read().split()[0])
                except (OSError, IndexError, ValueError):
                    pass
            if tids:
                self.samples.append((time.monotonic(), guest / self.tick, oncpu / 1e9))
            self.stop_ev.wait(self.period)

    def stop(self):
        self.stop_ev.set()
        self.thread.join(2)
        return self.samples


def fractions(samples, t_ref, window):
    """[(t, guest fraction, on-CPU fraction)] per WINDOW seconds, t from
    T_REF (one vCPU's worth = 1)."""
    out = []
    if len(samples) < 2:
        return out
    i = 0
    while i < len(samples) - 1:
        j = i + 1
        while j < len(samples) - 1 and samples[j][0] - samples[i][0] < window - 1e-3:
            j += 1
        dt = samples[j][0] - samples[i][0]
        if dt <= 0:
            break
        out.append((round(samples[i][0] - t_ref, 2),
                    round((samples[j][1] - samples[i][1]) / dt, 3),
                    round((samples[j][2] - samples[i][2]) / dt, 3)))
        i = j
    return out


def hk_fraction_mean(windows, t_from, t_to):
    """The mean of hakoniwa's run_fraction over [t_from, t_to): its list
    stops at the last window in which a vCPU waited (later ones are 1)."""
    have = {int(round(t * 10)): f for t, f in windows}
    ks = range(int(t_from * 10), int(t_to * 10))
    return round(statistics.mean(have.get(k, 1.0) for k in ks), 3) if ks else None


def mean_fraction(samples, t_from, t_to):
    """(guest, on-CPU) fraction over [t_from, t_to] from the samples."""
    inside = [s for s in samples if t_from <= s[0] <= t_to]
    if len(inside) < 2 or inside[-1][0] - inside[0][0] <= 0:
        return None, None
    dt = inside[-1][0] - inside[0][0]
    return (round((inside[-1][1] - inside[0][1]) / dt, 3),
            round((inside[-1][2] - inside[0][2]) / dt, 3))


class ReportPoller:
    """The destination's vm.migration every PERIOD seconds while a row runs
    (faults and pages over time)."""

    KEYS = [("faults", "major"), ("faults", "minor"), ("faults", "double"),
            ("faults", "vcpu"), ("faults", "async_worker"), ("faults", "vmm"),
            ("pages", "demand"), ("pages", "prefetch"), ("pages", "background")]

    def __init__(self, sock, t_ref, period=1.0):
        self.sock, self.t_ref, self.period = sock, t_ref, period
        self.series = []
        self.last = None
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop_ev.is_set():
            r = api_get(self.sock, "vm.migration")
            if r:
                self.last = r
                row = {"t": round(time.monotonic() - self.t_ref, 2), "phase": r.get("phase"),
                       "remaining": r.get("remaining_pages")}
                for a, b in self.KEYS:
                    row["%s_%s" % (a, b)] = r.get(a, {}).get(b)
                self.series.append(row)
            self.stop_ev.wait(self.period)

    def stop(self):
        self.stop_ev.set()
        self.thread.join(5)
        return self.series


# ------------------------------------------------------------- hakoniwa ----

def hk_flags(args, async_pf, net=None):
    f = ["--kernel", args.kernel_copy, "--initramfs", args.initrd_copy, "--cmdline", CMDLINE,
         "--cpus", str(args.cpus), "--memory", "%dM" % args.memory_mib,
         "--async-pf", async_pf]
    if net:
        f += ["--net", "tap=%s,mac=%s" % (net, MAC)]
    return f


def hk_pair(args, tag, async_pf="on", src_net=None, dst_net=None, tls=None):
    """A source booted to its shell (and ended if it does not get there);
    TLS: the credentials' directory for a TLS link, None for plain TCP."""
    pair = HkPair(args.hk, args.work, tag, hk_flags(args, async_pf, src_net),
                  hk_flags(args, async_pf, dst_net), tls=tls)
    try:
        pair.wait_prompt(args.boot_timeout)
    except RuntimeError:
        pair.close()
        raise
    return pair


def vm_qemu_argv(args, qmp, incoming=False, tls=None):
    """QEMU for the modes rows; TLS: the credentials' directory, loaded as
    object tls0 (the destination's as the server's, verifying the
    source's certificate; the source's as the client's)."""
    # Named threads (CPU 0/KVM, live_migration, return path, ...): the
    # rows' CPU by thread.
    extra = ["-name", "hk-bench,debug-threads=on"]
    if tls:
        extra += ["-object", "tls-creds-x509,id=tls0,dir=%s,endpoint=%s,verify-peer=on" % (
            tls, "server" if incoming else "client")]
    return qemu_argv(args.qemu, args.kernel_copy, args.initrd_copy, CMDLINE, args.memory_mib,
                     cpus=args.cpus, qmp=qmp, incoming=incoming, extra=extra)


class LinkDelay:
    """netem delay on lo (each way) for the rows that ask for one: started
    when the migration starts (booting and filling are not delayed),
    stopped by the row's cleanup."""

    def __init__(self, ms):
        self.ms, self.on = ms, False

    def start(self):
        if self.ms:
            r = subprocess.run(["tc", "qdisc", "replace", "dev", "lo", "root", "netem", "delay",
                                "%dms" % self.ms, "limit", "100000"], capture_output=True,
                               text=True)
            if r.returncode != 0:
                raise RuntimeError("tc netem on lo: %s" % r.stderr.strip())
            self.on = True

    def stop(self):
        if self.on:
            subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
            self.on = False


def row_label(async_pf, background, delay_ms):
    label = "async PF %s, background %s" % (async_pf, background)
    return label + (", link +%d ms" % delay_ms if delay_ms else "")


def row_failed(rec, e, pair=None):
    """Records and logs why a row failed; with PAIR, what its VMMs said
    too (a guest that triple-faulted ends its VMM)."""
    rec["error"] = str(e)[:3000]
    for side in ("src", "dst"):
        p = getattr(pair, side, None) if pair else None
        if p:
            rec["error"] += "\n%s%s: %s" % (
                p.name, "" if p.alive() else " (exited, status %s)" % p.proc.returncode,
                p.tails())
    log("  FAILED:", rec["error"][:600])


def end_row(delay, samplers, vms):
    """A touch or web row's cleanup, whatever it got to: the link delay
    off, the samplers stopped, the VMMs (and the bridge) closed."""
    delay.stop()
    for x in samplers:
        if x:
            x.stop()
    for x in vms:
        if x:
            x.close()


# ---------------------------------------------------------------- touch ----

def memtouch_cmd(args, go_at_once=False):
    return "hk-memtouch -t %d -m %d -s %d -P %d%s" % (
        args.touch_threads, args.touch_mib, args.touch_stride, args.touch_marks,
        " -g" if go_at_once else "")


def parse_memtouch(buf, start):
    text = bytes(buf[start:])
    done = TOUCH_DONE.search(text)
    threads = [{"thread": int(m.group(1)), "seconds": float(m.group(2)),
                "start_s": float(m.group(3)), "check": m.group(4).decode(),
                "marks": [float(x) for x in m.group(5).decode().split(",")]}
               for m in TOUCH_THREAD.finditer(text)]
    g = TOUCH_GUEST.search(text)
    guest = ({"ctxt": int(g.group(1)), "apf_ready_irqs": int(g.group(2)),
              "timer_irqs": int(g.group(3))} if g else None)
    return done, threads, guest


def touch_baseline(args, pair):
    """The touch without a migration, on the first source (compute time)."""
    con = pair.src.con
    start = con.size()
    t = time.monotonic()
    con.send(memtouch_cmd(args, go_at_once=True) + "\n")
    ready = con.wait(TOUCH_READY, start, args.row_timeout)
    t_ready = time.monotonic()
    m = con.wait(TOUCH_DONE, start, args.row_timeout)
    if not m:
        raise RuntimeError("baseline touch did not finish: " + pair.src.tails())
    con.wait(PROMPT_RE, m.end(), 30)
    with con.cond:
        done, threads, guest = parse_memtouch(con.buf, start)
    return {"fill_s": round(t_ready - t, 1) if ready else None, "threads": threads,
            "guest_counters": guest,
            "max_s": float(done.group(4)), "mean_s": float(done.group(5)),
            "check": done.group(6).decode()}


def touch_row(args, async_pf, background, with_baseline, delay_ms=0):
    label = row_label(async_pf, background, delay_ms)
    rec = {"label": label, "async_pf": async_pf, "background": background,
           "delay_ms": delay_ms, "ok": False}
    log("touch:", label)
    pair = None
    sampler = poller = None
    delay = LinkDelay(delay_ms)
    try:
        pair = hk_pair(args, "touch-%s-%s-%d" % (async_pf, background, delay_ms), async_pf)
        if with_baseline:
            rec["baseline"] = touch_baseline(args, pair)
            log("  baseline (no migration): max %.2f s" % rec["baseline"]["max_s"])
        con = pair.src.con
        start = con.size()
        t = time.monotonic()
        con.send(memtouch_cmd(args) + "\n")
        if not con.wait(TOUCH_READY, start, args.row_timeout):
            raise RuntimeError("hk-memtouch not ready: " + pair.src.tails())
        rec["fill_s"] = round(time.monotonic() - t, 1)
        pair.start_destination()
        extra = ["--prefetch", str(args.prefetch)]
        if background == "off":
            extra.append("--no-background")
        delay.start()
        # HK_BENCH_KVM_TRACE=1: KVM's events from here on, kept if it fails.
        ktrace = KvmTrace() if os.environ.get("HK_BENCH_KVM_TRACE") else None
        if ktrace:
            ktrace.start()
        t_migrate = time.monotonic()
        pair.migrate("postcopy", extra)
        pair.wait_dst_phase(("postcopy", "completed"), 120)
        t_switch = time.monotonic()
        pair.dst.con.send("go\n")
        t_go = time.monotonic()
        sampler = VcpuSampler(pair.dst.proc.pid)
        poller = ReportPoller(pair.dst_sock, t_go)
        m = pair.dst.con.wait(TOUCH_DONE, 0, args.row_timeout)
        t_done = time.monotonic()
        if ktrace and m:
            ktrace.stop()
        samples = sampler.stop()
        series = poller.stop()
        if not m:
            # The trace first: stuck_report traces anew, clearing it.
            if ktrace:
                path = os.path.join(args.out, "kvm-trace-%s.txt" % re.sub(r"\W+", "-", label))
                with open(path, "w") as f:
                    f.write(ktrace.tail(4000))
                log("  KVM trace of the last moments: " + path)
            # Where the destination's guest is stuck, for the record.
            rec["stuck"] = stuck_report(pair.dst.proc.pid)
            log("  destination stuck:\n" + rec["stuck"])
            raise RuntimeError("the touch did not finish on the destination: "
                               + pair.dst.tails())
        with pair.dst.con.cond:
            done, threads, guest = parse_memtouch(pair.dst.con.buf, 0)
        report = api_get(pair.dst_sock, "vm.migration") or poller.last
        src_report = api_get(pair.src_sock, "vm.migration")
        rec.update({
            "switch_after_s": round(t_switch - t_migrate, 3),
            "go_after_switch_s": round(t_go - t_switch, 3),
            "threads": threads,
            "guest_counters": guest,
            "max_s": float(done.group(4)),
            "mean_s": float(done.group(5)),
            "check": done.group(6).decode(),
            "report": trim_report(report),
            "source_report": trim_report(src_report),
            "run_fraction_hk": [(x["t_ms"] / 1000.0, x["fraction"])
                                for x in (report or {}).get("run_fraction", [])],
            "vcpu_windows": fractions(samples, t_go, 1.0),
            "report_series": series,
            "touch_window_s": round(t_done - t_go, 2),
        })
        g, c = mean_fraction(samples, t_go, t_done)
        rec["guest_fraction"], rec["oncpu_fraction"] = g, c
        rec["run_fraction_hk_mean"] = hk_fraction_mean(rec["run_fraction_hk"], 0,
                                                       t_done - t_switch)
        if background == "on":
            # The push finishes the migration: its total time.
            try:
                fin = pair.wait_dst_phase(("completed",), args.row_timeout)
                rec["total_ms"] = fin.get("total_ms")
                rec["report"] = trim_report(fin)
            except RuntimeError as e:
                rec["total_error"] = str(e)
        rec["ok"] = rec["check"] == "ok" and len(threads) == args.touch_threads
        if not rec["ok"]:
            rec["error"] = "the guest's check of its memory failed (%s)" % rec["check"]
        f = rec["report"]["faults"] if rec.get("report") else {}
        log("  threads %s s (max %.2f); guest fraction %s, on-CPU %s, hakoniwa run_fraction "
            "%s; faults major %s minor %s double %s, vcpu %s async %s" % (
                ", ".join("%.2f" % t["seconds"] for t in threads), rec["max_s"], g, c,
                rec["run_fraction_hk_mean"], f.get("major"), f.get("minor"), f.get("double"),
                f.get("vcpu"), f.get("async_worker")))
    except Exception as e:  # noqa: BLE001 - a failed row is recorded, the run goes on
        row_failed(rec, e)
    finally:
        end_row(delay, (sampler, poller), (pair,))
    return rec


def part_touch(args):
    rows = []
    first = True
    for background in args.touch_background:
        # Delayed rows in the paper's setting only (no background push).
        for delay_ms in (args.link_delay_ms if background == "off" else [0]):
            for async_pf in args.async_pf:
                rows.append(touch_row(args, async_pf, background, first, delay_ms))
                first = False
    return {"rows": rows}


# ------------------------------------------------------------------ web ----

SIEGE_LINE = re.compile(r"HTTP/\d\.\d\s+(\d{3})\s+([0-9.]+) secs:\s+(\d+) bytes ==> "
                        r"(\w+)\s+(\S+)")
SIEGE_ERROR = re.compile(r"^\[(error|alert|fatal)\]\s*(.*)$")
GUEST_IP, HOST_IP = "10.214.0.2", "10.214.0.1"


def ip(*argv):
    subprocess.run(["ip", *argv], check=True, stdout=subprocess.DEVNULL)


class Bridge:
    """A bridge with the host's address and a TAP for each side; ageing 0
    makes it flood: frames reach whichever TAP the guest is behind."""

    def __init__(self, name, taps):
        self.names = []
        ip("link", "add", name, "type", "bridge", "ageing_time", "0")
        self.names.append(name)
        ip("addr", "add", HOST_IP + "/24", "dev", name)
        ip("link", "set", name, "up")
        for tap in taps:
            ip("tuntap", "add", "dev", tap, "mode", "tap")
            self.names.append(tap)
            ip("link", "set", tap, "master", name)
            ip("link", "set", tap, "up")

    def close(self):
        for name in reversed(self.names):
            subprocess.run(["ip", "link", "del", name], stderr=subprocess.DEVNULL)


class Siege:
    """siege under a pty (line-buffered verbose output); each line is
    timestamped when read."""

    def __init__(self, args, urls_file, seconds):
        rc = os.path.join(args.work, "siegerc")
        with open(rc, "w") as f:
            f.write("\n".join([
                "verbose = true", "color = off", "quiet = false", "json_output = false",
                "show-logfile = false", "logging = false", "protocol = HTTP/1.1",
                "connection = close", "chunked = true", "cache = false",
                "concurrent = %d" % args.web_clients, "internet = true",
                "benchmark = true", "parser = false", "limit = 1024",
                "timeout = 120", "failures = 1000000", "accept-encoding = identity",
                "delay = 0", ""]))
        self.argv = [args.siege, "-R", rc, "-c", str(args.web_clients), "-i", "-b",
                     "-t", "%dS" % seconds, "-f", urls_file]
        master, slave = pty.openpty()
        env = dict(os.environ, HOME=args.work)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=slave,
                                     stderr=slave, close_fds=True, env=env)
        os.close(slave)
        self.master = master
        self.lines = []  # (t, text)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        pending = b""
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                break
            if not data:
                break
            t = time.monotonic()
            pending += data
            *done, pending = pending.split(b"\n")
            for line in done:
                self.lines.append((t, line.decode("utf-8", "replace").strip()))
        if pending:
            self.lines.append((time.monotonic(), pending.decode("utf-8", "replace").strip()))

    def wait(self, timeout):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(30)
        self.thread.join(10)
        os.close(self.master)


def siege_requests(lines, t_ref):
    """[(arrival s, response s, status)] with times from T_REF, errors, summary."""
    reqs, errors, summary, other = [], [], {}, []
    for t, text in lines:
        m = SIEGE_LINE.search(text)
        if m:
            resp = float(m.group(2))
            reqs.append((round(t - t_ref - resp, 3), resp, int(m.group(1))))
            continue
        e = SIEGE_ERROR.match(text)
        if e:
            errors.append((round(t - t_ref, 2), text[:200]))
            continue
        if ":" in text:
            k, _, v = text.partition(":")
            k = k.strip()
            if k in ("Transactions", "Availability", "Elapsed time", "Response time",
                     "Transaction rate", "Throughput", "Concurrency",
                     "Successful transactions", "Failed transactions",
                     "Longest transaction", "Shortest transaction"):
                summary[k] = v.strip()
                continue
        if text and len(other) < 40:
            other.append(text[:200])
    reqs.sort()
    return reqs, errors, summary, other


def binned_means(reqs, width, t_from, t_to):
    """[(bin start, mean response, count)] by arrival time."""
    bins = {}
    for a, r, _ in reqs:
        if t_from <= a < t_to:
            bins.setdefault(int((a - t_from) // width), []).append(r)
    return [(round(t_from + k * width, 2), round(statistics.mean(v), 3), len(v))
            for k, v in sorted(bins.items())]


def window_mean(reqs, t_from, t_to):
    v = [r for a, r, _ in reqs if t_from <= a < t_to]
    return (round(statistics.mean(v), 3), len(v)) if v else (None, 0)


def web_row(args, async_pf, background, serial, delay_ms=0):
    label = row_label(async_pf, background, delay_ms)
    rec = {"label": label, "async_pf": async_pf, "background": background,
           "delay_ms": delay_ms, "ok": False}
    log("web:", label)
    br = pair = siege = sampler = poller = None
    delay = LinkDelay(delay_ms)
    try:
        taps = ("hkmw%d-s" % serial, "hkmw%d-d" % serial)
        br = Bridge("hkmwbr%d" % serial, taps)
        pair = hk_pair(args, "web-%d" % serial, async_pf, src_net=taps[0], dst_net=taps[1])
        con = pair.src.con
        out = shell(con, "ip link set eth0 up && ip addr add %s/24 dev eth0 && mkdir -p /www && "
                    "mount -t tmpfs -o size=%dm tmpfs /www && hk-mkfiles /www %d %d && "
                    "httpd -p 80 -h /www && free -m | sed -n 2p"
                    % (GUEST_IP, args.web_tmpfs_mib, args.web_files, args.web_file_kb * 1000),
                    args.row_timeout)
        rec["guest_setup"] = out.strip()
        if "hk-mkfiles: files=%d" % args.web_files not in out:
            raise RuntimeError("web content not made: %r" % out[-400:])
        pair.start_destination()
        urls = os.path.join(args.work, "urls.txt")
        with open(urls, "w") as f:
            for i in range(args.web_files):
                f.write("http://%s/%d.bin\n" % (GUEST_IP, i))
        # One fetch to see the server answers at all.
        sub = subprocess.run([sys.executable, "-c", "import urllib.request,sys; "
                              "sys.stdout.write(str(len(urllib.request.urlopen("
                              "'http://%s/0.bin', timeout=60).read())))" % GUEST_IP],
                             capture_output=True, text=True, timeout=90)
        if sub.stdout.strip() != str(args.web_file_kb * 1000):
            raise RuntimeError("the guest's httpd does not answer: %s %s" % (
                sub.stdout, sub.stderr[-300:]))
        siege = Siege(args, urls, args.web_before + args.web_after)
        time.sleep(args.web_before)
        extra = ["--prefetch", str(args.prefetch)]
        if background == "off":
            extra.append("--no-background")
        delay.start()
        t_migrate = time.monotonic()
        pair.migrate("postcopy", extra)
        pair.wait_dst_phase(("postcopy", "completed"), 120)
        t_switch = time.monotonic()
        sampler = VcpuSampler(pair.dst.proc.pid)
        poller = ReportPoller(pair.dst_sock, t_migrate)
        siege.wait(args.web_after + 120)
        samples = sampler.stop()
        series = poller.stop()
        report = api_get(pair.dst_sock, "vm.migration") or poller.last
        reqs, errors, summary, other = siege_requests(siege.lines, t_migrate)
        t_sw = round(t_switch - t_migrate, 3)
        before = window_mean(reqs, -args.web_before + 5, 0)
        peak = max((b for b in binned_means(reqs, 1.0, t_sw, t_sw + 5)), key=lambda x: x[1],
                   default=(None, None, 0))
        plus25 = window_mean(reqs, t_sw + 24, t_sw + 26)
        after_ok = sum(1 for a, r, s in reqs if a > t_sw and s == 200)
        rec.update({
            "switch_after_s": t_sw,
            "siege_argv": siege.argv,
            "siege_summary": summary,
            "siege_errors": errors[:50],
            "siege_error_count": len(errors),
            "siege_other_lines": other,
            "requests": reqs,
            "non_200": sum(1 for _, _, s in reqs if s != 200),
            "answered_after_switch": after_ok,
            "mean_before_s": before[0],
            "mean_before_n": before[1],
            "peak_1s_mean_after_switch_s": peak[1],
            "peak_at_s": peak[0],
            "mean_plus25_s": plus25[0],
            "mean_plus25_n": plus25[1],
            "means_100ms": binned_means(reqs, 0.1, -args.web_before, args.web_after + 5),
            "means_1s": binned_means(reqs, 1.0, -args.web_before, args.web_after + 5),
            "report": trim_report(report),
            "run_fraction_hk": [(x["t_ms"] / 1000.0 + t_sw, x["fraction"])
                                for x in (report or {}).get("run_fraction", [])],
            "vcpu_windows": fractions(samples, t_migrate, 1.0),
            "report_series": series,
        })
        g, c = mean_fraction(samples, t_switch, t_switch + 30)
        rec["guest_fraction_30s"], rec["oncpu_fraction_30s"] = g, c
        rec["run_fraction_hk_30s"] = hk_fraction_mean(
            [(x["t_ms"] / 1000.0, x["fraction"]) for x in (report or {}).get("run_fraction", [])],
            0, 30)
        # The server keeps answering after the switch-over.
        alive = shell(pair.dst.con, "echo $((6*7))", 60)
        rec["dst_shell_ok"] = "42" in alive
        rec["ok"] = after_ok > 0 and rec["dst_shell_ok"]
        if not rec["ok"]:
            rec["error"] = "no answer after the switch-over (%d) or the shell is gone" % after_ok
        log("  %d requests (%d after the switch), mean before %s s, peak 1 s mean after switch "
            "%s s, +25 s %s s; guest fraction %s" % (
                len(reqs), after_ok, before[0], peak[1], plus25[0], g))
    except Exception as e:  # noqa: BLE001
        row_failed(rec, e, pair)
        if siege and siege.proc.poll() is None:
            siege.proc.kill()
    finally:
        end_row(delay, (sampler, poller), (pair, br))
    return rec


def part_web(args):
    rows = []
    serial = 0
    for background in args.web_background:
        for delay_ms in (args.link_delay_ms if background == "off" else [0]):
            for async_pf in args.async_pf:
                serial += 1
                rows.append(web_row(args, async_pf, background, serial, delay_ms))
    return {"rows": rows}


# ---------------------------------------------------------------- modes ----

def workload_cmd(args, workload):
    if workload == "idle":
        return None
    rate = args.dirty_rate if workload == "dirty" else 0
    return "hk-memtouch -d -m %d -r %d" % (args.dirty_mib, rate)


def start_workload(args, con, workload):
    cmd = workload_cmd(args, workload)
    if not cmd:
        return
    start = con.size()
    con.send(cmd + " &\n")
    if not con.wait(DIRTY_READY, start, args.row_timeout):
        raise RuntimeError("workload not ready: %r" % con.tail(400))
    time.sleep(2)  # at its pace


def stop_workload(args, con, workload):
    """Stops the dirtying on the destination (which shows its job table
    migrated too)."""
    if workload == "idle":
        return
    start = con.size()
    con.send("kill %1\n")
    if not con.wait(DIRTY_DONE, start, 60):
        raise RuntimeError("the dirtying job did not end on the destination: %r"
                           % con.tail(300))


def link_mib_per_s(rec, seconds):
    """The mean throughput of a row's migration: MiB sent over SECONDS."""
    if rec.get("bytes") is None or not seconds:
        return None
    return round(rec["bytes"] / MIB / seconds, 1)


class RowCpu:
    """CPU seconds by thread of a modes row's source and destination from
    the migration command on, each thread up to its last reading (every
    second, and at the end: the source ends soon after completing, its
    TLS pump with the connection), and how busy L1's CPUs were
    meanwhile: where a slow link's time goes (a TLS pump, the migration
    thread, the guest)."""

    def __init__(self, src_pid, dst_pid):
        self.src, self.dst = ThreadCpu(src_pid), ThreadCpu(dst_pid)
        self.busy0 = busy_seconds()
        self.t = time.monotonic()

    def tick(self, force=False):
        if force or time.monotonic() - self.t >= 1:
            self.src.tick()
            self.dst.tick()
            self.t = time.monotonic()

    def record(self, rec):
        """Into REC: "cpu_s" and "cpu_system_s" (source, destination:
        {thread: s}, all CPU time and its kernel part) and "l1_busy"
        (busy share of L1's CPU time since the command)."""
        self.tick(force=True)
        busy = busy_seconds()
        src, dst = self.src.by_name(), self.dst.by_name()
        for i, key in enumerate(("cpu_s", "cpu_system_s")):
            rec[key] = {"source": src[i], "destination": dst[i]}
        span = busy[1] - self.busy0[1]
        rec["l1_busy"] = (round(min(1.0, (busy[0] - self.busy0[0]) / span), 3) if span > 0
                          else None)


def hk_mode_row(args, workload, mode, serial, auth="none"):
    rec = {"vmm": "hakoniwa", "workload": workload, "mode": mode, "auth": auth, "ok": False}
    log("modes: hakoniwa %s, %s, %s link" % (mode, workload, LINK[auth]))
    pair = None
    try:
        pair = hk_pair(args, "mode-%d" % serial, "on",
                       tls=args.tls_dir if auth == "tls" else None)
        start_workload(args, pair.src.con, workload)
        pair.start_destination()
        cpu = RowCpu(pair.src.proc.pid, pair.dst.proc.pid)
        t0 = time.monotonic()
        pair.migrate(mode)
        src_last = None
        deadline = t0 + args.row_timeout
        # The source ends soon after completing: keep its last report.
        while time.monotonic() < deadline and pair.src.alive():
            r = api_get(pair.src_sock, "vm.migration", timeout=5)
            if r:
                src_last = r
                if r.get("phase") in ("completed", "failed"):
                    break
            cpu.tick()
            time.sleep(0.1)
        if src_last and src_last.get("phase") == "failed":
            raise RuntimeError("migration failed: %s" % src_last.get("error"))
        if pair.src.alive() and (src_last or {}).get("phase") != "completed":
            # Not done within --row-timeout: say how far it got.
            cpu.record(rec)
            rec["source_report"] = trim_report(src_last)
            s = src_last or {}
            raise RuntimeError(
                "not completed within --row-timeout %d s: the source in phase %s, round %s, "
                "%.0f MiB sent (%.1f MiB/s), %s pages left; CPU s since the command: "
                "source %s, destination %s; L1 busy %s" % (
                    args.row_timeout, s.get("phase"), s.get("rounds"),
                    (s.get("bytes") or 0) / MIB, (s.get("bytes") or 0) / MIB / args.row_timeout,
                    s.get("remaining_pages"),
                    top_threads(rec["cpu_s"]["source"], rec["cpu_system_s"]["source"]),
                    top_threads(rec["cpu_s"]["destination"], rec["cpu_system_s"]["destination"]),
                    rec["l1_busy"]))
        dst = pair.wait_dst_phase(("completed",), max(10, deadline - time.monotonic()))
        rec["wall_s"] = round(time.monotonic() - t0, 2)
        cpu.record(rec)
        stop_workload(args, pair.dst.con, workload)
        rounds = [x["dirty_pages_per_s"] for x in (src_last or {}).get("round_log", [])]
        rec["dirty_pages_per_s_seen"] = round(max(rounds)) if rounds else None
        alive = shell(pair.dst.con, "echo $((6*7))", 60)
        if "42" not in alive:
            raise RuntimeError("the guest's shell does not answer on the destination")
        rec.update({
            "downtime_ms": dst.get("downtime_ms"),
            "total_ms": dst.get("total_ms"),
            "source_total_ms": (src_last or {}).get("total_ms"),
            "source_downtime_ms": (src_last or {}).get("source_downtime_ms"),
            "bytes": (src_last or dst).get("bytes"),
            "rounds": (src_last or {}).get("rounds"),
            "switch_reason": (src_last or {}).get("switch_reason"),
            "pages": dst.get("pages"),
            "faults": dst.get("faults"),
            "report": trim_report(dst),
            "source_report": trim_report(src_last),
        })
        rec["mib_per_s"] = link_mib_per_s(rec, (rec["total_ms"] or 0) / 1000)
        rec["ok"] = True
        log("  downtime %.0f ms, total %.2f s, %.0f MiB sent (%s MiB/s), %s rounds%s" % (
            rec["downtime_ms"] or -1, (rec["total_ms"] or 0) / 1000,
            (rec["bytes"] or 0) / MIB, num(rec["mib_per_s"], "%.1f"), rec["rounds"],
            (", switched: " + rec["switch_reason"]) if rec["switch_reason"] else ""))
    except Exception as e:  # noqa: BLE001
        row_failed(rec, e, pair)
    finally:
        if pair:
            pair.close()
    return rec


def qemu_mode_row(args, workload, mode, serial, auth="none"):
    rec = {"vmm": "qemu", "workload": workload, "mode": mode, "auth": auth, "ok": False}
    log("modes: QEMU %s, %s, %s link" % (mode, workload, LINK[auth]))
    tls = args.tls_dir if auth == "tls" else None
    src = dst = qs = qd = None
    try:
        sq = os.path.join(args.work, "q%d-src.qmp" % serial)
        dq = os.path.join(args.work, "q%d-dst.qmp" % serial)
        src = Proc(vm_qemu_argv(args, sq, tls=tls), "QEMU source")
        if not src.con.wait(PROMPT_RE, 0, args.boot_timeout):
            raise RuntimeError("no guest prompt: " + src.tails())
        start_workload(args, src.con, workload)
        dst = Proc(vm_qemu_argv(args, dq, incoming=True, tls=tls), "QEMU destination")
        qs, qd = Qmp(sq, alive=src.alive), Qmp(dq, alive=dst.alive)
        post = mode in ("postcopy", "hybrid")
        port = free_port()
        caps = [{"capability": "postcopy-ram", "state": True}] if post else []
        if post:
            qd.cmd("migrate-set-capabilities",
                   capabilities=caps + [{"capability": "postcopy-blocktime", "state": True}])
            qs.cmd("migrate-set-capabilities", capabilities=caps)
        if tls:
            # TLS both ways: the destination verifies the source's
            # certificate (verify-peer=on), the source the destination's
            # for the address it dials.
            qd.cmd("migrate-set-parameters", **{"tls-creds": "tls0"})
        qd.cmd("migrate-incoming", uri="tcp:127.0.0.1:%d" % port)
        # No bandwidth cap (QEMU's default is 128 MiB/s; hakoniwa has none);
        # the downtime limit is both VMMs' default, 300 ms.
        params = {"max-bandwidth": 100 << 30, "downtime-limit": 300}
        if tls:
            params.update({"tls-creds": "tls0", "tls-hostname": "127.0.0.1"})
        qs.cmd("migrate-set-parameters", **params)
        cpu = RowCpu(src.proc.pid, dst.proc.pid)
        t0 = time.monotonic()
        qs.cmd("migrate", uri="tcp:127.0.0.1:%d" % port)
        started_post = None
        if mode == "postcopy":
            qs.cmd("migrate-start-postcopy")
            started_post = 0.0
        deadline = t0 + (args.qemu_precopy_timeout if mode == "precopy" else args.row_timeout)
        info = {}
        seen = []
        while True:
            info = qs.cmd("query-migrate")
            st = info.get("status")
            if info.get("ram", {}).get("dirty-pages-rate"):
                seen.append(info["ram"]["dirty-pages-rate"])
            if st in ("completed", "failed", "cancelled"):
                break
            if (mode == "hybrid" and started_post is None
                    and info.get("ram", {}).get("dirty-sync-count", 0) >= 2):
                qs.cmd("migrate-start-postcopy")
                started_post = round(time.monotonic() - t0, 2)
            if time.monotonic() > deadline:
                break
            cpu.tick()
            time.sleep(0.1)
        cpu.record(rec)
        if info.get("status") not in ("completed", "failed", "cancelled"):
            # Precopy that does not converge: QEMU would go on for ever (it
            # has no round limit). A result, not a failure of the run.
            ram = info.get("ram", {})
            rec.update({"converged": False, "timed_out_s": round(time.monotonic() - t0, 1),
                        "dirty_pages_per_s_seen": max(seen) if seen else None,
                        "bytes": ram.get("transferred"), "rounds": ram.get("dirty-sync-count"),
                        "downtime_ms": None, "total_ms": None, "info": info})
            rec["mib_per_s"] = link_mib_per_s(rec, rec["timed_out_s"])
            qs.cmd("migrate_cancel")
            rec["ok"] = True
            log("  %s in %.0f s (%d dirty syncs, %.0f MiB sent): cancelled" % (
                "first pass not done" if mode == "hybrid" else "did not converge",
                rec["timed_out_s"], rec["rounds"] or 0, (rec["bytes"] or 0) / MIB))
            return rec
        rec["wall_s"] = round(time.monotonic() - t0, 2)
        rec["dirty_pages_per_s_seen"] = max(seen) if seen else None
        if info.get("status") != "completed":
            raise RuntimeError("QEMU migration %s: %s" % (info.get("status"),
                                                           info.get("error-desc")))
        dinfo = {}
        try:
            dinfo = qd.cmd("query-migrate")
        except RuntimeError:
            pass
        try:
            qs.cmd("quit")
        except (RuntimeError, OSError):
            pass  # it went before answering
        stop_workload(args, dst.con, workload)
        alive = shell(dst.con, "echo $((6*7))", 60)
        if "42" not in alive:
            raise RuntimeError("the guest's shell does not answer on the destination")
        ram = info.get("ram", {})
        rec.update({
            "downtime_ms": info.get("downtime"),
            "total_ms": info.get("total-time"),
            "setup_ms": info.get("setup-time"),
            "bytes": ram.get("transferred"),
            "rounds": ram.get("dirty-sync-count"),
            "postcopy_started_s": started_post,
            "postcopy_requests": ram.get("postcopy-requests"),
            "postcopy_blocktime_ms": dinfo.get("postcopy-blocktime"),
            "info": info,
            "destination_info": dinfo,
        })
        rec["mib_per_s"] = link_mib_per_s(rec, (rec["total_ms"] or 0) / 1000)
        rec["ok"] = True
        log("  downtime %s ms, total %.2f s, %.0f MiB sent (%s MiB/s), %s dirty syncs" % (
            rec["downtime_ms"], (rec["total_ms"] or 0) / 1000, (rec["bytes"] or 0) / MIB,
            num(rec["mib_per_s"], "%.1f"), rec["rounds"]))
    except Exception as e:  # noqa: BLE001
        row_failed(rec, e, argparse.Namespace(src=src, dst=dst))
    finally:
        for q in (qs, qd):
            if q:
                q.close()
        for p in (src, dst):
            if p:
                p.kill()
    return rec


def measure_link(args, tls=None):
    """TCP over L1's loopback, one stream, --link-mib MiB in 1 MiB writes;
    with TLS (the credentials' directory), TLS 1.3 over it with Python's
    ssl (OpenSSL: neither VMM's TLS library, but what one stream's
    cipher costs on this CPU), certificates both ways as the VMMs do."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    total = args.link_mib * MIB
    got = [0]
    sctx = cctx = None
    if tls:
        sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        for ctx, role in ((sctx, "server"), (cctx, "client")):
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
            ctx.load_verify_locations(os.path.join(tls, "ca-cert.pem"))
            ctx.load_cert_chain(os.path.join(tls, "%s-cert.pem" % role),
                                os.path.join(tls, "%s-key.pem" % role))
        sctx.verify_mode = ssl.CERT_REQUIRED

    def sink():
        c, _ = srv.accept()
        if sctx:
            c = sctx.wrap_socket(c, server_side=True)
        buf = bytearray(MIB)
        while got[0] < total:
            n = c.recv_into(buf)
            if not n:
                break
            got[0] += n
        c.close()

    th = threading.Thread(target=sink, daemon=True)
    th.start()
    c = socket.create_connection(("127.0.0.1", port))
    if cctx:
        c = cctx.wrap_socket(c, server_hostname="127.0.0.1")  # the handshake
    data = os.urandom(MIB)
    t = time.monotonic()
    for _ in range(args.link_mib):
        c.sendall(data)
    th.join()
    secs = time.monotonic() - t
    out = {"mib": args.link_mib, "seconds": round(secs, 3),
           "mib_per_s": round(got[0] / MIB / secs, 1)}
    if cctx:
        out.update({"tls_version": c.version(), "cipher": c.cipher()[0],
                    "library": ssl.OPENSSL_VERSION})
    c.close()
    srv.close()
    return out


def make_tls(args):
    """The credentials of the TLS rows, once per run (lib.tlscreds), in
    the run's work directory; what the results say about them. Ends the
    run when openssl cannot make them."""
    try:
        args.tls_dir = make_credentials(os.path.join(args.work, "tls"))
        check_credentials(args.tls_dir)
        return describe(args.tls_dir)
    except (OSError, RuntimeError) as e:
        raise SystemExit("migration.py: TLS credentials: %s" % e) from None


def part_modes(args, link):
    """Each VMM's modes per workload, each mode once per link (--auth),
    plain and TLS side by side."""
    rows = []
    serial = 0
    out = {"auth": args.auth}
    for workload in args.workloads:
        for vmm in args.vmms:
            for mode in (HK_MODES if vmm == "hakoniwa" else QEMU_MODES):
                for auth in args.auth:
                    serial += 1
                    if vmm == "hakoniwa":
                        rows.append(hk_mode_row(args, workload, mode, serial, auth))
                    else:
                        rows.append(qemu_mode_row(args, workload, mode, serial, auth))
    out.update({"rows": rows,
                "ram_over_link_s": round(args.memory_mib / link["mib_per_s"], 2),
                "dirty_rate_pages_per_s": args.dirty_rate, "dirty_mib": args.dirty_mib})
    return out


# ----------------------------------------------------------- environment --

def l1_vcpus(n=None):
    """'L1's N vCPU(s)' for the notes; N defaults to this machine's count."""
    n = n or os.cpu_count()
    return "L1's %s" % ("one vCPU" if n == 1 else "%d vCPUs" % n)


def environment(args):
    commit, uncommitted = git_state(ROOT, 20)
    return vmm_environment(
        RIG_NOTE % l1_vcpus(), "figures", args.hakoniwa, args.qemu if args.qemu_path else None,
        args.kernel, args.initramfs, CMDLINE, vcpus=args.cpus, memory_mib=args.memory_mib,
        relative_to=ROOT, machine={"memory_mib_l1": machine_memory_mib()},
        tools={"siege_version": first_line([args.siege, "--version"])
               if args.siege_path else None},
        run={"other_rigs_at_start": os.environ.get("HK_BENCH_OTHER_RIGS"),
             "git_commit": commit, "git_uncommitted": uncommitted})


# -------------------------------------------------------------- reading ----

def num(v, fmt="%.2f"):
    return "-" if v is None else fmt % v


def touch_rows(result):
    return (result.get("touch") or {}).get("rows", [])


def find_touch(result, apf, bg, delay_ms=0):
    for r in touch_rows(result):
        if (r["async_pf"] == apf and r["background"] == bg
                and r.get("delay_ms", 0) == delay_ms and r.get("ok")):
            return r
    return None


def touch_table(result):
    rows = [["row", "threads' times (s)", "max s", "vs off", "paper s",
             "guest-mode fraction", "on-CPU", "hakoniwa run_fraction",
             "guest: task switches / async-PF ready irqs / timer irqs", "switch-over s",
             "total s"]]
    for r in touch_rows(result):
        if not r.get("ok"):
            rows.append([r["label"], "failed: " + r.get("error", "")[:80]] + [""] * 9)
            continue
        gc = r.get("guest_counters") or {}
        counters = "%s / %s / %s" % (gc.get("ctxt", "-"),
                                     gc.get("apf_ready_irqs") if gc.get("apf_ready_irqs", -1)
                                     >= 0 else "none", gc.get("timer_irqs", "-"))
        off = find_touch(result, "off", r["background"], r.get("delay_ms", 0))
        cut = ("%+.0f %%" % (100 * (r["max_s"] / off["max_s"] - 1))
               if off and r["async_pf"] == "on" else "")
        paper = "%.1f" % PAPER["touch_s"][r["async_pf"]] if r["background"] == "off" else "-"
        rows.append([r["label"], ", ".join("%.1f" % t["seconds"] for t in r["threads"]),
                     "%.1f" % r["max_s"], cut, paper,
                     "%s (paper %.2f)" % (num(r.get("guest_fraction")),
                                          PAPER["run_fraction"][r["async_pf"]]),
                     num(r.get("oncpu_fraction")), num(r.get("run_fraction_hk_mean")),
                     counters, num(r.get("switch_after_s")),
                     num((r.get("total_ms") or 0) / 1000 if r.get("total_ms") else None, "%.1f")])
    base = next((r["baseline"] for r in touch_rows(result) if r.get("baseline")), None)
    if base:
        rows.append(["no migration (compute only)",
                     ", ".join("%.1f" % t["seconds"] for t in base["threads"]),
                     "%.1f" % base["max_s"], "", "-", "", "", "", "", "", ""])
    return rows


def fault_table(result):
    rows = [["row", "major", "minor", "double", "by vCPU", "by async worker", "by VMM",
             "requests", "demand pages", "prefetch pages", "background pages",
             "mean latency ms", "max latency ms"]]
    for r in touch_rows(result) + web_rows(result):
        rep = r.get("report")
        if not r.get("ok") or not rep:
            continue
        f, p, lat = rep["faults"], rep["pages"], rep["fault_latency"]
        n = sum(lat["counts"])
        part = "4.1" if r in touch_rows(result) else "4.2"
        rows.append(["%s %s" % (part, r["label"]), f["major"], f["minor"], f["double"], f["vcpu"],
                     f["async_worker"], f["vmm"], rep["requests"], p["demand"], p["prefetch"],
                     p["background"], num(lat["total_us"] / n / 1000 if n else None),
                     num(lat["max_us"] / 1000, "%.1f")])
    return rows


def latency_table(result):
    rows = None
    for r in touch_rows(result) + web_rows(result):
        rep = r.get("report")
        if not r.get("ok") or not rep:
            continue
        lat = rep["fault_latency"]
        if rows is None:
            b = lat["bounds_us"]
            rows = [["row"] + ["<= %s" % fmt_us(x) for x in b] + ["> %s" % fmt_us(b[-1])]]
        part = "4.1" if r in touch_rows(result) else "4.2"
        rows.append(["%s %s" % (part, r["label"])] + [str(c) for c in lat["counts"]])
    return rows


def mean_latency_ms(r):
    lat = ((r.get("report") or {}).get("fault_latency")) or {}
    n = sum(lat.get("counts") or [])
    return lat["total_us"] / n / 1000 if n else None


def fmt_us(us):
    return "%g ms" % (us / 1000) if us >= 1000 else "%d us" % us


def web_rows(result):
    return (result.get("web") or {}).get("rows", [])


def web_table(result):
    rows = [["row", "requests (after switch)", "mean before s (paper 0.25)",
             "peak 1 s mean after switch s", "paper", "mean at +25 s", "paper +25 s",
             "guest-mode fraction, 30 s after switch", "failed / non-200"]]
    for r in web_rows(result):
        if not r.get("ok"):
            rows.append([r["label"], "failed: " + r.get("error", "")[:80]] + [""] * 7)
            continue
        apf = r["async_pf"]
        rows.append([r["label"], "%d (%d)" % (len(r["requests"]), r["answered_after_switch"]),
                     num(r["mean_before_s"]), num(r["peak_1s_mean_after_switch_s"]),
                     "%.1f" % PAPER["web_switch_s"][apf], num(r["mean_plus25_s"]),
                     ("< %.1f" if apf == "on" else "%.2f") % PAPER["web_plus25_s"][apf],
                     num(r.get("guest_fraction_30s")),
                     "%d / %d" % (r["siege_error_count"], r["non_200"])])
    return rows


def mode_rows(result):
    return (result.get("modes") or {}).get("rows", [])


def link_of(r):
    """A modes row's link as the tables say it; rows from before the TLS
    rows ran over plain TCP."""
    return LINK[r.get("auth", "none")]


def rate(r):
    """A modes row's MiB/s; for rows from before the column, worked out
    the same way from their bytes and total time."""
    if r.get("mib_per_s") is not None:
        return r["mib_per_s"]
    if r.get("converged") is False:
        return link_mib_per_s(r, r.get("timed_out_s"))
    return link_mib_per_s(r, (r.get("total_ms") or 0) / 1000)


def modes_table(result):
    rows = [["workload", "VMM", "mode", "link", "downtime ms", "total s", "MiB sent", "MiB/s",
             "rounds / syncs", "note"]]
    for r in mode_rows(result):
        head = [r["workload"], r["vmm"], r["mode"], link_of(r)]
        if not r.get("ok"):
            rows.append(head + ["-", "-", "-", "-", "-", "failed: " + r.get("error", "")[:120]])
            continue
        if r.get("converged") is False:
            what = ("the first pass not done (no postcopy yet)"
                    if r["vmm"] == "qemu" and r["mode"] == "hybrid" else "did not converge")
            rows.append(head + ["-", "-", num((r["bytes"] or 0) / MIB, "%.0f"),
                                num(rate(r), "%.1f"), str(r.get("rounds")),
                                "%s: cancelled after %s s" % (what, r.get("timed_out_s"))])
            continue
        note = r.get("switch_reason") or ""
        if r["vmm"] == "qemu" and r["mode"] == "hybrid":
            note = ("migrate-start-postcopy at %s s (after the first pass)"
                    % r["postcopy_started_s"] if r.get("postcopy_started_s") is not None
                    else "precopy converged before the first pass ended: no postcopy")
        if r.get("postcopy_blocktime_ms") is not None:
            note += "%svCPUs blocked %s ms in postcopy" % ("; " if note else "",
                                                         r["postcopy_blocktime_ms"])
        if r.get("dirty_pages_per_s_seen"):
            note += "%sdirty rate seen by the VMM up to %d pages/s" % (
                "; " if note else "", r["dirty_pages_per_s_seen"])
        rows.append(head + [num(r["downtime_ms"], "%.0f"), num((r["total_ms"] or 0) / 1000),
                            num((r["bytes"] or 0) / MIB, "%.0f"),
                            num(rate(r), "%.1f"), str(r.get("rounds")), note])
    return rows


def top_threads(cpu, system=None, n=3):
    """The N threads with the most CPU seconds of a ThreadCpu reading
    and the process's sum: "12.3 (migrate-tls 8.0, vcpuN 2.1, ...)"; with
    SYSTEM (the same of kernel time), each one's kernel part in brackets."""
    if not cpu:
        return "-"
    top = sorted(cpu.items(), key=lambda kv: -kv[1])[:n]
    return "%.1f (%s)" % (sum(cpu.values()), ", ".join(
        "%s %.1f%s" % (k, v, " [%.1f]" % system[k] if system and k in system else "")
        for k, v in top))


def cpu_table(result):
    """Per modes row with CPU figures: L1 busy and each side's CPU seconds
    by thread from the migration command on; None when no row has them."""
    rows = [["workload", "VMM", "mode", "link", "total s", "L1 busy",
             "source CPU s (top threads)", "destination CPU s (top threads)"]]
    for r in mode_rows(result):
        c = r.get("cpu_s")
        if not c:
            continue
        cs = r.get("cpu_system_s") or {}
        total = (r.get("total_ms") or 0) / 1000 if r.get("total_ms") else r.get("timed_out_s")
        rows.append([r["workload"], r["vmm"], r["mode"], link_of(r),
                     num(total) if total else ("failed" if not r.get("ok") else "-"),
                     num(r.get("l1_busy")), top_threads(c.get("source"), cs.get("source")),
                     top_threads(c.get("destination"), cs.get("destination"))])
    return rows if len(rows) > 1 else None


def ratio(a, b):
    """a / b, or None where either is missing or b is 0."""
    return a / b if a is not None and b else None


def tls_ratios(result):
    """For each VMM, workload and mode with a plain and a TLS row, both
    finished: TLS / plain of downtime, total time and throughput, in the
    rows' order: [(vmm, workload, mode, downtime, total, throughput)]
    (None where a figure is missing: a precopy that did not converge)."""
    plain = {(r["vmm"], r["workload"], r["mode"]): r for r in mode_rows(result)
             if r.get("ok") and r.get("auth", "none") == "none"}
    out = []
    for r in mode_rows(result):
        p = plain.get((r["vmm"], r["workload"], r["mode"]))
        if r.get("auth") != "tls" or not r.get("ok") or not p:
            continue
        out.append((r["vmm"], r["workload"], r["mode"], ratio(r["downtime_ms"], p["downtime_ms"]),
                    ratio(r["total_ms"], p["total_ms"]),
                    ratio(rate(r), rate(p))))
    return out


def tls_reading(result):
    """One line per VMM and workload: the TLS / plain ratios per mode."""
    out = []
    groups = {}
    for vmm, workload, mode, down, total, thr in tls_ratios(result):
        groups.setdefault((vmm, workload), []).append(
            "%s %s / %s / %s" % (mode, num(down), num(total), num(thr)))
    for (vmm, workload), parts in groups.items():
        out.append("- TLS / plain, %s, %s (downtime / total time / throughput): %s." % (
            vmm, workload, "; ".join(parts)))
    pumps = []
    for r in mode_rows(result):
        c, cs = r.get("cpu_s") or {}, r.get("cpu_system_s") or {}
        mib = (r.get("bytes") or (r.get("source_report") or {}).get("bytes") or 0) / MIB
        user = [(c.get(side) or {}).get("migrate-tls", 0) - (cs.get(side) or {}).get("migrate-tls", 0)
                for side in ("source", "destination")]
        if r["vmm"] == "hakoniwa" and r.get("auth") == "tls" and mib and user[0] > 0:
            pumps.append("%s %s %.0f / %.0f" % (r["mode"], r["workload"], mib / user[0],
                                                 mib / user[1] if user[1] > 0 else 0))
    if pumps:
        out.append("- hakoniwa's TLS pumps (`migrate-tls`), MiB sent per second of user CPU, "
                   "source (encrypts) / destination (decrypts): %s." % "; ".join(pumps))
    return out


def write_md(path, result):
    env = result["environment"]
    a = result["parameters"]
    link = result.get("link") or {}
    L = ["# Live migration benchmark (seed 003)", ""]
    L.append("Generated by `%s` on %s (%s), %.0f min." % (
        result["command"], env["date_utc"], env["where"], result["total_s"] / 60))
    L.append("")
    L.append("**Context: %s.** The paper ran source and destination on two hosts over "
             "10GbE (150 us ping); here both hakoniwa processes, the loopback link and the "
             "clients share %s under TCG, so a page request costs "
             "milliseconds, not hundreds of microseconds." % (env["note"], l1_vcpus(env["cpus"])))
    L.append("")
    L.append("Guest: %s, busybox initramfs `%s`, %d vCPU, %d MiB (the paper's VM: 1 vCPU, "
             "1 GB). Postcopy with `--prefetch %d` (the paper's +-8). Link: TCP over L1's "
             "loopback, %s MiB/s measured with one stream before the runs (RAM / link = "
             "%s s)." % (env["guest_kernel_package"] or env["guest_kernel_version"],
                         env["guest_initramfs"], env["vcpus"], env["memory_mib"],
                         a["prefetch"], link.get("mib_per_s"),
                         (result.get("modes") or {}).get("ram_over_link_s",
                                                         num(a["memory_mib"] /
                                                             link["mib_per_s"])
                                                         if link.get("mib_per_s") else "-")))
    L.append("")
    delays = sorted({r.get("delay_ms", 0) for r in touch_rows(result) + web_rows(result)} - {0})
    if delays:
        L.append("Rows marked *link +D ms* ran with the migration stream's loopback delayed "
                 "D ms each way by netem (a round trip of 2D) from the migration command on. "
                 "On plain loopback a page fault here costs ~1-2 ms of emulated CPU on both "
                 "sides and almost nothing of waiting, so a task put to sleep has nothing to "
                 "overlap; the paper's faults waited on a network. The delay brings the wait "
                 "back. The web clients reach the guest through a bridge, not lo: only the "
                 "migration is delayed.")
        L.append("")
    if touch_rows(result):
        L.append("## 4.1: %d threads touching %d MiB each after the switch-over" % (
            a["touch_threads"], a["touch_mib"]))
        L.append("")
        L.append("`%s` in the guest; each thread's time from the go line (typed on the "
                 "destination's console as soon as its `vm.migration` said postcopy) to its "
                 "last byte. The paper: 9.8 s with its mechanism, 17.6 s without (-44 %%), "
                 "no background transfer. *guest-mode fraction*: the destination's vCPU "
                 "thread's guest time (L1's accounting, the paper's VMX non-root time) per "
                 "wall second while the threads ran; paper 0.55 on / 0.38 off. *on-CPU*: the "
                 "same thread's CPU time (guest + exits). *hakoniwa run_fraction*: the "
                 "report's 1 - (vCPU waiting for pages) per 100 ms, averaged over the same "
                 "time." % result["touch"].get("command", "hk-memtouch"))
        L.append("")
        L.append(md_table(touch_table(result)))
        L.append("")
    if web_rows(result):
        w = result["web"]
        L.append("## 4.2: web server under 128 clients across a postcopy migration")
        L.append("")
        L.append("busybox httpd in the guest (one process per connection, like the "
                 "paper's Apache prefork) serving %d files of %d KB of pseudo-random bytes "
                 "from a %d MiB tmpfs (the paper: 5000 x 100 KB from the page cache of a "
                 "1 GB VM); `%s` from L1, %d clients, random order, no delay. Migration "
                 "starts %d s into the run; the switch-over is when the destination reports "
                 "postcopy. Response times are siege's, placed at their arrival time "
                 "(the harness's read time of siege's line minus the response time)." % (
                     a["web_files"], a["web_file_kb"], a["web_tmpfs_mib"],
                     " ".join(w.get("siege_argv", ["siege"])[:1] + ["-c", str(a["web_clients"]),
                                                                  "-i", "-b"]),
                     a["web_clients"], a["web_before"]))
        L.append("")
        L.append(md_table(web_table(result)))
        L.append("")
    if touch_rows(result) or web_rows(result):
        L.append("## Faults (the destination's report)")
        L.append("")
        L.append("major: fetched over the link; minor: the page had arrived by the time the "
                 "fault was read; double: a fault on a page already requested. By vCPU: the "
                 "vCPU thread itself waited; by async worker: KVM's async-PF worker waited "
                 "(with async PF on, the guest ran another task meanwhile; with it off, KVM "
                 "held the vCPU in an artificial halt that only interrupts break: "
                 "docs/migration.md); by VMM: one of hakoniwa's own threads waited (virtio "
                 "devices reading or writing guest buffers), which async PF cannot help. "
                 "Latency: request to arrival of major faults (paper: hundreds of us for a "
                 "major fault over GbE, a few us for a minor one).")
        L.append("")
        L.append(md_table(fault_table(result)))
        L.append("")
        lt = latency_table(result)
        if lt:
            L.append("Fault latency histogram (major faults per bucket):")
            L.append("")
            L.append(md_table(lt))
            L.append("")
    if (result.get("modes") or {}).get("rows"):
        m = result["modes"]
        L.append("## Precopy, postcopy, hybrid: hakoniwa and QEMU%s" % (
            ", plain and TLS" if any(r.get("auth") == "tls" for r in mode_rows(result)) else ""))
        L.append("")
        L.append("Same guest, same kernel and initramfs under both VMMs (QEMU: `-M pc "
                 "-enable-kvm -cpu host`, no devices). Workloads: *idle* (a shell); *dirty*: "
                 "`hk-memtouch -d -m %d -r %d` (one byte in each page of %d MiB, %d pages/s "
                 "= %.0f MiB/s); *heavy*: the same as fast as the guest can. Downtime and "
                 "total time are each VMM's own: hakoniwa's destination report "
                 "(`downtime_ms`: source stop to destination running; `total_ms`: start "
                 "to the last page), QEMU's `query-migrate` on the source (`downtime`, "
                 "`total-time`). QEMU runs without a bandwidth cap (max-bandwidth raised; "
                 "its default is 128 MiB/s) and with its default 300 ms downtime limit "
                 "(hakoniwa's default too); QEMU precopy gets %d s before it is cancelled "
                 "(it has no round limit; hakoniwa stops after 30 rounds). QEMU has no "
                 "automatic hybrid: its *hybrid* row is precopy with `postcopy-ram` and "
                 "`migrate-start-postcopy` once the first pass is done. RAM / link = %s s." % (
                     a["dirty_mib"], a["dirty_rate"], a["dirty_mib"], a["dirty_rate"],
                     a["dirty_rate"] * 4096 / MIB, a["qemu_precopy_timeout"],
                     m.get("ram_over_link_s")))
        L.append("")
        L.append(modes_link_text(result))
        L.append("")
        L.append(md_table(modes_table(result)))
        L.append("")
        ct = cpu_table(result)
        if ct:
            L.append("Where the time went: CPU seconds of each VMM process by thread (digits "
                     "as N) from the migration command to the end (each thread read every "
                     "second and at the end; one that ended counts up to its last reading), and "
                     "the share of L1's CPU time that was busy meanwhile (any process in L1, "
                     "which has one vCPU; other rigs on the machine slow L1 down but do not "
                     "show here); in brackets the kernel's part, where rows have it. "
                     "hakoniwa's TLS pump is `migrate-tls`.")
            L.append("")
            L.append(md_table(ct))
            L.append("")
    text = reading(result)
    if text:
        L.append("## Reading")
        L.append("")
        L.extend(text)
        L.append("")
    L.append("![figure](%s)" % (os.path.splitext(os.path.basename(path))[0] + ".png"))
    L.append("")
    L.append("## Environment")
    L.append("")
    for k, val in env.items():
        L.append("- %s: %s" % (k, val))
    L.append("- parameters: %s" % ", ".join("%s=%s" % kv for kv in sorted(a.items())))
    L.append("")
    failed = [r for part in ("touch", "web", "modes") for r in (result.get(part) or {}).get(
        "rows", []) if not r.get("ok")]
    if failed:
        L.append("## Failed rows")
        L.append("")
        for r in failed:
            L.append("- %s: %s" % (r.get("label") or "%s %s %s" % (
                r.get("vmm"), r.get("mode"), r.get("workload")), r.get("error")))
        L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L))


def modes_link_text(result):
    """What the modes table's *link* and *MiB/s* columns say."""
    text = ("*MiB/s*: MiB sent / total time, the mean rate of the whole migration (of a "
            "precopy that did not converge, until it was cancelled). *link*: ")
    if not any(r.get("auth") == "tls" for r in mode_rows(result)):
        return text + "plain TCP over the loopback (hakoniwa's `auth=none`)."
    tls = result.get("tls") or {}
    text += ("*plain* is TCP over the loopback (hakoniwa's `auth=none`, QEMU without "
             "`tls-creds`); *TLS 1.3* the same with TLS and certificates both ways, one "
             "private CA and keys (%s, %s) made with `openssl` for the run "
             "(bench/lib/tlscreds.py): hakoniwa's `tls=DIR` on both sides (rustls, "
             "docs/migration.md), QEMU's `-object tls-creds-x509,dir=DIR,endpoint=server"
             "|client,verify-peer=on` with `migrate-set-parameters tls-creds=tls0` on both "
             "sides and `tls-hostname=127.0.0.1` on the source (GnuTLS)." % (
                 tls.get("key", "EC P-256"), tls.get("signature", "ECDSA")))
    tl, pl = result.get("link_tls") or {}, result.get("link") or {}
    if tl.get("mib_per_s"):
        text += (" For scale: one TLS stream of Python's ssl (%s, %s, %s) moved %s MiB/s over "
                 "the same loopback, plain TCP %s MiB/s (%s MiB each, before the rows)." % (
                     tl.get("library"), tl.get("tls_version"), tl.get("cipher"),
                     tl["mib_per_s"], pl.get("mib_per_s"), tl.get("mib")))
    return text


def reading(result):
    """Sentences derived from the numbers (no hand-written figures)."""
    out = list(tls_reading(result))
    on, off = find_touch(result, "on", "off"), find_touch(result, "off", "off")
    for d in sorted({r.get("delay_ms", 0) for r in touch_rows(result)} - {0}):
        a, b = find_touch(result, "on", "off", d), find_touch(result, "off", "off", d)
        if a and b:
            out.append("- 4.1 with the migration stream delayed %d ms each way: %.1f s with "
                       "async page faults, %.1f s without (%+.0f %%); guest-mode fraction %s "
                       "vs %s; mean fault latency %s vs %s ms." % (
                           d, a["max_s"], b["max_s"], 100 * (a["max_s"] / b["max_s"] - 1),
                           num(a.get("guest_fraction")), num(b.get("guest_fraction")),
                           num(mean_latency_ms(a)), num(mean_latency_ms(b))))
    if on and off:
        out.append("- 4.1, paper's setting (no background push): with async page faults the "
                   "slowest thread took %.1f s, without %.1f s (%+.0f %%; paper 9.8 vs 17.6 s, "
                   "-44 %%). The guest spent %s of each second in guest mode with them and %s "
                   "without (paper 0.55 vs 0.38)." % (
                       on["max_s"], off["max_s"], 100 * (on["max_s"] / off["max_s"] - 1),
                       num(on.get("guest_fraction")), num(off.get("guest_fraction"))))
        fo, ff = on["report"]["faults"], off["report"]["faults"]
        out.append("- With async PF on, %d of %d faults were taken by KVM's async worker (the "
                   "guest ran another thread meanwhile) and %d by the vCPU itself; with it "
                   "off, %d by the vCPU. Major faults: %d on, %d off." % (
                       fo["async_worker"], fo["async_worker"] + fo["vcpu"] + fo["vmm"],
                       fo["vcpu"], ff["vcpu"], fo["major"], ff["major"]))
    bon, boff = find_touch(result, "on", "on"), find_touch(result, "off", "on")
    if bon and boff:
        out.append("- With the background push (hakoniwa's default), %.1f s on vs %.1f s off "
                   "(%+.0f %%)." % (bon["max_s"], boff["max_s"],
                                    100 * (bon["max_s"] / boff["max_s"] - 1)))
    wr = {(r["async_pf"], r["background"], r.get("delay_ms", 0)): r
          for r in web_rows(result) if r.get("ok")}
    for bg, d in sorted({(k[1], k[2]) for k in wr}):
        a, b = wr.get(("on", bg, d)), wr.get(("off", bg, d))
        if a and b:
            out.append("- 4.2, background %s%s: peak 1 s mean response after the switch-over %s s "
                       "with async PF, %s s without (paper 1.3 vs 1.8 s); at +25 s %s vs %s s "
                       "(paper < 0.5 vs 0.75); before the migration %s / %s s (paper 0.25)." % (
                           bg, ", link +%d ms" % d if d else "",
                           num(a["peak_1s_mean_after_switch_s"]),
                           num(b["peak_1s_mean_after_switch_s"]), num(a["mean_plus25_s"]),
                           num(b["mean_plus25_s"]), num(a["mean_before_s"]),
                           num(b["mean_before_s"])))
    return out


# ----------------------------------------------------------------- plot ----

# The modes bars: each VMM's colour, lighter over TLS.
MODE_COLORS = {("hakoniwa", "none"): "#1f77b4", ("hakoniwa", "tls"): "#8fbce6",
               ("qemu", "none"): "#ff7f0e", ("qemu", "tls"): "#ffc58f"}


def mode_color(r):
    return MODE_COLORS[(r["vmm"], r.get("auth", "none"))]


def color_key(a, result, extra=()):
    """A legend of the VMM and link colours present, after EXTRA's
    handles (the panel's own lines)."""
    from matplotlib.patches import Patch
    seen = {(r["vmm"], r.get("auth", "none")) for r in mode_rows(result)}
    handles = list(extra) + [
        Patch(color=MODE_COLORS[k], label="%s, %s" % ("hakoniwa" if k[0] == "hakoniwa" else "QEMU",
                                                      LINK[k[1]]))
        for k in MODE_COLORS if k in seen]
    a.legend(handles=handles, fontsize=7)


def mode_labels(rows):
    return ["%s\n%s\n%s%s" % (r["workload"], "hk" if r["vmm"] == "hakoniwa" else "QEMU",
                              r["mode"], "\nTLS" if r.get("auth") == "tls" else "")
            for r in rows]


def mark_unfinished(a, rows):
    """A word at the foot of each row's place that has no bar."""
    for i, r in enumerate(rows):
        what = ("failed" if not r.get("ok") else
                "no convergence" if r.get("converged") is False else None)
        if what:
            a.text(i, 0.02, what, ha="center", va="bottom", color="r", fontsize=6,
                   rotation=90, transform=a.get_xaxis_transform())


def plot_mode_times(a, result):
    """The modes rows' total time (solid) and downtime (hatched)."""
    mrows = mode_rows(result)
    x = list(range(len(mrows)))
    tot = [(r.get("total_ms") or 0) / 1000 if r.get("ok") else 0 for r in mrows]
    down = [(r.get("downtime_ms") or 0) / 1000 if r.get("ok") else 0 for r in mrows]
    col = [mode_color(r) for r in mrows]
    a.bar([i - 0.2 for i in x], tot, 0.4, color=col)
    a.bar([i + 0.2 for i in x], down, 0.4, color=col, alpha=0.5, hatch="//")
    mark_unfinished(a, mrows)
    lim = (result.get("modes") or {}).get("ram_over_link_s")
    lines = []
    if lim:
        lines.append(a.axhline(lim, color="k", lw=0.8, ls="--",
                               label="RAM / link (%.1f s)" % lim))
    a.set_xticks(x, mode_labels(mrows), fontsize=6)
    a.set_yscale("symlog", linthresh=0.1)
    a.set_ylabel("seconds")
    a.set_title("precopy / postcopy / hybrid: total (solid) and downtime (hatched)")
    color_key(a, result, lines)


def plot_mode_rates(a, result):
    """The modes rows' mean throughput (MiB sent / total time), beside one
    stream's over the same loopback, plain and TLS."""
    mrows = mode_rows(result)
    x = list(range(len(mrows)))
    a.bar(x, [(rate(r) or 0) if r.get("ok") else 0 for r in mrows], 0.6,
          color=[mode_color(r) for r in mrows])
    mark_unfinished(a, mrows)
    lines = []
    for key, ls, what in (("link", "--", "one TCP stream"),
                          ("link_tls", ":", "one TLS 1.3 stream (Python ssl)")):
        v = (result.get(key) or {}).get("mib_per_s")
        if v:
            lines.append(a.axhline(v, color="k", lw=0.8, ls=ls,
                                   label="%s: %.0f MiB/s" % (what, v)))
    a.set_xticks(x, mode_labels(mrows), fontsize=6)
    a.set_yscale("log")
    a.set_ylabel("MiB sent / total time, MiB/s")
    a.set_title("mean migration throughput (MiB sent / total time)")
    color_key(a, result, lines)


def plot(path, result):
    if not touch_rows(result) and not web_rows(result):
        # Only the modes (a run of --parts modes): their two panels.
        if not mode_rows(result):
            return None
        fig, ax = panels(2, 1, (max(10, 0.5 * len(mode_rows(result))), 10))
        if fig is None:
            return None
        plot_mode_times(ax[0], result)
        plot_mode_rates(ax[1], result)
        save_figure(fig, path, 90)
        return path
    fig, ax = panels(3, 2, (15, 14))
    if fig is None:
        return None
    colors = {("on", "off", False): "C0", ("off", "off", False): "C3",
              ("on", "on", False): "C2", ("off", "on", False): "C1",
              ("on", "off", True): "C9", ("off", "off", True): "C6",
              ("on", "on", True): "C8", ("off", "on", True): "C5"}

    def color_of(r):
        return colors[(r["async_pf"], r["background"], bool(r.get("delay_ms")))]

    # (a) 4.1 progress of each thread.
    for r in touch_rows(result):
        if not r.get("ok"):
            continue
        c = color_of(r)
        for i, t in enumerate(r["threads"]):
            n = len(t["marks"])
            ax[0].plot([0] + t["marks"], [0] + [(k + 1) / n for k in range(n)], color=c,
                       lw=1, label=r["label"] if i == 0 else None)
    for apf, ls in (("on", ":"), ("off", "--")):
        ax[0].axvline(PAPER["touch_s"][apf], color="k", ls=ls, lw=0.8,
                      label="paper, async PF %s (%.1f s)" % (apf, PAPER["touch_s"][apf]))
    ax[0].set_xlabel("seconds since the go line (switch-over)")
    prm = result.get("parameters") or {}
    ax[0].set_ylabel("fraction of its area read")
    ax[0].set_title("4.1: each of %s threads touching %s MiB (paper: 4 x 200 MB)" % (
        prm.get("touch_threads", 4), prm.get("touch_mib", 200)))
    ax[0].legend(fontsize=7)

    # (b) 4.1 guest-mode fraction over time.
    for r in touch_rows(result):
        if not r.get("ok"):
            continue
        c = color_of(r)
        w = r["vcpu_windows"]
        ax[1].plot([x[0] for x in w], [x[1] for x in w], color=c, lw=1.2,
                   label="%s: guest mode" % r["label"])
        h = r["run_fraction_hk"]
        ax[1].plot([x[0] for x in h], [x[1] for x in h], color=c, lw=0.5, ls=":", alpha=0.7)
    for apf in ("on", "off"):
        ax[1].axhline(PAPER["run_fraction"][apf], color="k", lw=0.8,
                      ls=":" if apf == "on" else "--",
                      label="paper, async PF %s (%.2f)" % (apf, PAPER["run_fraction"][apf]))
    ax[1].set_ylim(0, 1.05)
    ax[1].set_xlabel("seconds since the go line")
    ax[1].set_ylabel("fraction of wall time (1 s windows)")
    ax[1].set_title("4.1: destination vCPU in guest mode (solid); hakoniwa run_fraction "
                    "(dotted)", fontsize=9)
    ax[1].legend(fontsize=7)

    # (c, d) 4.2 response times, async PF on / off (paper figs 6, 7).
    for k, apf in enumerate(("on", "off")):
        a = ax[2 + k]
        for r in web_rows(result):
            if not r.get("ok") or r["async_pf"] != apf:
                continue
            c = color_of(r)
            reqs = r["requests"]
            a.scatter([q[0] for q in reqs], [q[1] for q in reqs], s=1, color=c, alpha=0.25)
            m = r["means_1s"]
            a.plot([x[0] + 0.5 for x in m], [x[1] for x in m], color=c, lw=1.5,
                   label="%s: 1 s mean" % r["label"])
            a.axvline(r["switch_after_s"], color=c, lw=0.8, ls="--")
        a.axhline(PAPER["web_switch_s"][apf], color="k", lw=0.6, ls="--",
                  label="paper at switch-over (%.1f s)" % PAPER["web_switch_s"][apf])
        a.axhline(PAPER["web_plus25_s"][apf], color="k", lw=0.6, ls=":",
                  label="paper at +25 s (%.2f s)" % PAPER["web_plus25_s"][apf])
        tops = [x[1] for r in web_rows(result) if r.get("ok") and r["async_pf"] == apf
                for x in r["means_1s"]]
        if tops:
            # Single requests stuck in TCP retransmission reach tens of
            # seconds; the means are what the figure is about.
            a.set_ylim(0, max(2.5, 1.5 * max(tops)))
        a.set_xlabel("request arrival, s from the migration command")
        a.set_ylabel("response time, s")
        a.set_title("4.2: async PF %s (paper fig. %d)" % (apf, 6 if apf == "on" else 7))
        a.legend(fontsize=7)

    # (e) 4.2 guest-mode fraction (paper figs 8, 9).
    for r in web_rows(result):
        if not r.get("ok"):
            continue
        c = color_of(r)
        w = r["vcpu_windows"]
        ax[4].plot([x[0] for x in w], [x[1] for x in w], color=c, lw=1.2, label=r["label"])
    ax[4].set_ylim(0, 1.05)
    ax[4].set_xlabel("s from the migration command")
    ax[4].set_ylabel("destination vCPU in guest mode (1 s windows)")
    ax[4].set_title("4.2: guest run-time fraction (paper figs. 8, 9)")
    if web_rows(result):
        ax[4].legend(fontsize=7)

    # (f) modes: downtime and total time.
    if mode_rows(result):
        plot_mode_times(ax[5], result)
    save_figure(fig, path, 90)
    return path


# ---------------------------------------------------------------- main ----

def parse_list(text, allowed, what):
    items = [x for x in text.split(",") if x]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise SystemExit("migration.py: bad %s '%s' (one or more of %s, comma-separated)"
                         % (what, text, ",".join(allowed)))
    return items


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default=",".join(PARTS),
                   help="touch, web, modes, comma-separated (default all)")
    p.add_argument("--async-pf", default="on,off", help="rows of touch and web (default on,off)")
    p.add_argument("--touch-background", default="off,on",
                   help="background push in the touch rows (default off,on; off is the "
                        "paper's setting)")
    p.add_argument("--web-background", default="off",
                   help="background push in the web rows (default off, the paper's)")
    p.add_argument("--link-delay-ms", default="0,2",
                   help="touch and web rows (background off) at each netem delay on lo, "
                        "ms each way (default 0,2)")
    p.add_argument("--cpus", type=int, default=1)
    p.add_argument("--memory-mib", type=int, default=1024)
    p.add_argument("--prefetch", type=int, default=8)
    p.add_argument("--touch-threads", type=int, default=4)
    p.add_argument("--touch-mib", type=int, default=200)
    p.add_argument("--touch-stride", type=int, default=1)
    p.add_argument("--touch-marks", type=int, default=40)
    p.add_argument("--web-files", type=int, default=5000)
    p.add_argument("--web-file-kb", type=int, default=100)
    p.add_argument("--web-tmpfs-mib", type=int, default=640)
    p.add_argument("--web-clients", type=int, default=128)
    p.add_argument("--web-before", type=int, default=20,
                   help="seconds of load before the migration (default 20)")
    p.add_argument("--web-after", type=int, default=45,
                   help="seconds of load after it (default 45)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--auth", default=",".join(AUTHS),
                   help="the modes rows' link, each mode once per value: none (plain TCP), "
                        "tls (TLS 1.3, certificates both ways; made with openssl for the "
                        "run), comma-separated (default none,tls)")
    p.add_argument("--vmms", default="hakoniwa,qemu")
    p.add_argument("--dirty-mib", type=int, default=256)
    p.add_argument("--dirty-rate", type=int, default=6400,
                   help="the dirty workload's pages/s (default 6400: 25 MiB/s, about a "
                        "quarter of what the VMMs move per second in the rig)")
    p.add_argument("--link-mib", type=int, default=1024)
    p.add_argument("--qemu-precopy-timeout", type=float, default=120)
    p.add_argument("--row-timeout", type=float, default=900)
    p.add_argument("--boot-timeout", type=float, default=180)
    add_path_options(p, "kernel", "initramfs", "hakoniwa", "qemu")
    p.add_argument("--siege", default="siege")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    p.add_argument("--name", help="the results' file name without .json/.md/.png (default "
                                  "migration; with --replot, the JSON's own name)")
    p.add_argument("--replot", metavar="JSON",
                   help="rebuild NAME.md and .png in --out from JSON; run nothing")
    args = p.parse_args()
    if args.name is not None and (not args.name or "/" in args.name):
        sys.exit("migration.py: --name: a file name without a directory")

    if args.replot:
        try:
            with open(args.replot) as f:
                result = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit("migration.py: --replot %s: %s" % (args.replot, e))
        name = args.name or os.path.splitext(os.path.basename(args.replot))[0]
        write_md(os.path.join(args.out, name + ".md"), result)
        plot(os.path.join(args.out, name + ".png"), result)
        print("wrote %s/%s.{md,png}" % (os.path.relpath(args.out, ROOT), name))
        return 0
    name = args.name or "migration"

    args.parts = parse_list(args.parts, PARTS, "--parts")
    args.async_pf = parse_list(args.async_pf, ["on", "off"], "--async-pf")
    args.touch_background = parse_list(args.touch_background, ["on", "off"],
                                       "--touch-background")
    args.web_background = parse_list(args.web_background, ["on", "off"], "--web-background")
    args.workloads = parse_list(args.workloads, WORKLOADS, "--workloads")
    args.auth = parse_list(args.auth, AUTHS, "--auth")
    args.tls_dir = None
    try:
        args.link_delay_ms = [int(x) for x in args.link_delay_ms.split(",") if x.strip()]
    except ValueError:
        sys.exit("migration.py: --link-delay-ms: comma-separated whole milliseconds")
    if not args.link_delay_ms or min(args.link_delay_ms) < 0:
        sys.exit("migration.py: --link-delay-ms: at least one delay, none negative")
    args.vmms = parse_list(args.vmms, ["hakoniwa", "qemu"], "--vmms")
    args.kernel = os.path.abspath(args.kernel)
    args.initramfs = os.path.abspath(args.initramfs)
    for path in (args.kernel, args.initramfs):
        if not os.path.isfile(path):
            sys.exit("migration.py: %s is missing (scripts/build-guest builds it)" % path)
    if not os.access(args.hakoniwa, os.X_OK):
        sys.exit("migration.py: %s is missing (cargo build --release)" % args.hakoniwa)
    args.qemu_path = shutil.which(args.qemu)
    args.siege_path = shutil.which(args.siege)
    if "modes" in args.parts and "qemu" in args.vmms and not args.qemu_path:
        sys.exit("migration.py: %s not found (apt-get install qemu-system-x86)" % args.qemu)
    if "modes" in args.parts and "tls" in args.auth and not shutil.which("openssl"):
        sys.exit("migration.py: openssl not found (apt-get install openssl; the TLS rows' "
                 "credentials)")
    if "web" in args.parts and not args.siege_path:
        sys.exit("migration.py: %s not found (apt-get install siege)" % args.siege)
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        sys.exit("migration.py: /dev/kvm is not usable here")
    if os.geteuid() != 0:
        sys.exit("migration.py: needs root (TAPs, a bridge, userfaultfd)")
    if args.dirty_rate < 1:
        sys.exit("migration.py: --dirty-rate must be at least 1 page/s")
    subprocess.run(["ip", "link", "set", "lo", "up"], stderr=subprocess.DEVNULL)

    # Private copies: the binary in the tree may be rebuilt while this runs
    # (a running process whose file is rewritten can crash), and the guest
    # files on a local file system for both VMMs.
    args.work = tempfile.mkdtemp(prefix="hk-bench-migration.")
    args.hk = shutil.copy(args.hakoniwa, os.path.join(args.work, "hakoniwa"))
    args.kernel_copy = shutil.copy(args.kernel, os.path.join(args.work, "vmlinuz"))
    args.initrd_copy = shutil.copy(args.initramfs, os.path.join(args.work, "initramfs.cpio.gz"))
    env = environment(args)
    print("migration benchmark: %s" % env["note"], flush=True)
    result = {"benchmark": "migration",
              "command": "scripts/bench-migration" + "".join(" " + x for x in sys.argv[1:]),
              "environment": env, "paper": PAPER}
    os.makedirs(args.out, exist_ok=True)
    jpath = os.path.join(args.out, name + ".json")

    def save(partial):
        # After each part too: a run cut short (the rig's L1 can die)
        # keeps the parts it finished (`--replot` draws them).
        result["partial"] = partial
        result["total_s"] = round(time.monotonic() - T0, 1)
        with open(jpath, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    try:
        link = measure_link(args)
        result["link"] = link
        log("link: %.1f MiB/s over loopback (%d MiB); RAM / link = %.1f s" % (
            link["mib_per_s"], link["mib"], args.memory_mib / link["mib_per_s"]))
        if "modes" in args.parts and "tls" in args.auth:
            result["tls"] = make_tls(args)
            try:
                tl = result["link_tls"] = measure_link(args, args.tls_dir)
                log("link over TLS: %.1f MiB/s (%s, %s; Python ssl, %s)" % (
                    tl["mib_per_s"], tl["tls_version"], tl["cipher"], tl["library"]))
            except (OSError, ssl.SSLError) as e:
                # Only the figure for scale: the rows go on without it.
                result["link_tls"] = {"error": str(e)}
                log("link over TLS: not measured: %s" % e)
        result["parameters"] = {k: getattr(args, k) for k in (
            "cpus", "memory_mib", "prefetch", "touch_threads", "touch_mib", "touch_stride",
            "touch_marks", "web_files", "web_file_kb", "web_tmpfs_mib", "web_clients",
            "web_before", "web_after", "dirty_mib", "dirty_rate", "link_delay_ms",
            "qemu_precopy_timeout", "row_timeout", "auth")}
        if "touch" in args.parts:
            result["touch"] = part_touch(args)
            result["touch"]["command"] = memtouch_cmd(args)
            save(True)
        if "web" in args.parts:
            result["web"] = part_web(args)
            rows = result["web"]["rows"]
            if rows and rows[0].get("siege_argv"):
                result["web"]["siege_argv"] = rows[0]["siege_argv"]
            save(True)
        if "modes" in args.parts:
            result["modes"] = part_modes(args, link)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    save(False)
    write_md(os.path.join(args.out, name + ".md"), result)
    png = plot(os.path.join(args.out, name + ".png"), result)

    print()
    print("Context: %s." % env["note"])
    if touch_rows(result):
        print()
        print("4.1 touch (paper: 9.8 s with async PF, 17.6 s without; run fraction 0.55 / 0.38):")
        print(text_table(touch_table(result)))
    if web_rows(result):
        print()
        print("4.2 web (paper: at switch-over 1.3 s on / 1.8 s off; +25 s < 0.5 / 0.75; "
              "before 0.25):")
        print(text_table(web_table(result)))
    if touch_rows(result) or web_rows(result):
        print()
        print("faults:")
        print(text_table(fault_table(result)))
    if (result.get("modes") or {}).get("rows"):
        print()
        print("precopy / postcopy / hybrid (RAM / link = %s s):" % result["modes"][
            "ram_over_link_s"])
        print(text_table(modes_table(result)))
        for line in tls_reading(result):
            print(line)
    print()
    print("wrote %s, %s.md%s (%.0f s)" % (os.path.relpath(jpath, ROOT), name,
                                          ", %s.png" % name if png else "",
                                                 result["total_s"]))
    failed = sum(1 for part in ("touch", "web", "modes")
                 for r in (result.get(part) or {}).get("rows", []) if not r.get("ok"))
    return exit_status("migration.py", failed, "row(s)", name + ".json")


if __name__ == "__main__":
    sys.exit(main())
