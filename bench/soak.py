#!/usr/bin/env python3
"""Migration soak: the same migrations, many times, with hakoniwa and with
QEMU as the control, to tell hakoniwa's failures from the rig's.

Migrated guests sometimes hang or triple-fault in the rig (docs/rig.md,
docs/migration.md). A failure that QEMU's migrations show as often as
hakoniwa's points at the rig (TCG's emulated nested SVM, L1's KVM); one
that only hakoniwa shows points at hakoniwa. So every run here starts two
fresh VMs of one VMM, the source and the destination, with the same kernel,
initramfs, command line and guest tools for both VMMs (QEMU: `-M pc
-enable-kvm -cpu host -no-reboot`), gives the guest a workload, migrates it
over loopback and checks the guest on the destination. Modes:

precopy-dirty  1 vCPU, 512 MiB. 96 MiB of random data in /dev/shm with its
               md5sum, a counter, and `hk-memtouch -d -m 128 -r 0` dirtying
               as fast as it can. hakoniwa: precopy, --max-rounds 6 (it
               stops after its rounds, converged or not); QEMU: precopy,
               and after 6 dirty syncs the downtime limit raised to 60 s
               so that it completes the same way.
postcopy-bg    1 vCPU, 1024 MiB. The data and counter, then `hk-memtouch -t
               4 -m 100 -P 10` fills 400 MiB and waits; postcopy with the
               background push (hakoniwa --prefetch 8; QEMU postcopy-ram,
               migrate-start-postcopy at once); the go line is typed on the
               destination as soon as it runs the guest, and every byte is
               read back there (check=ok). Odd iterations add no-kvmapf to
               the guest's command line (async page faults off), for both
               VMMs alike.
hybrid         1 vCPU, 512 MiB. The data and counter, and a loop copying
               the data again and again; hakoniwa: hybrid, --max-downtime 1
               --max-rounds 4 --max-bandwidth 16; QEMU: postcopy-ram, 16
               MiB/s, migrate-start-postcopy after 2 dirty syncs.

After each migration: the destination's shell answers, the counter
advances, the data's md5sum is the source's, the dirtying job is alive.
In hybrid, --counter-check says when the counter is read: once the
copying loop is stopped (settled), while it runs (churn), or as the
first commands on the destination, while it runs (first: what
tests/guest_migration.rs's chain does).
Each run has one outcome: ok, triple_fault, guest_panic, vmm_error, hang,
data_mismatch, migration_failed, l1_panic or harness_error; a failing run
keeps its evidence (consoles, stderrs, reports, hakoniwa's dumps, where
the threads were, KVM's trace) in bench/results/migration-soak/runs/.

Iterations interleave the VMMs (for i in 1..N: for each mode: both VMMs,
which first alternating with i). In the rig, one L1 runs a batch of up to
--runs-per-l1 runs and is then replaced, and a new one takes over the rest
of its batch when an L1 dies; --parallel N keeps N L1s running side by
side, each with a batch of its own. State (plan, outcomes) is kept in
build/soak/state.json; --resume continues a soak that was stopped.
Results: bench/results/migration-soak.{json,md}.

Normally run through scripts/migration-soak. Inside L1 (or on a host with
hardware KVM, as root) the runs themselves are `soak.py --worker`.
"""

import argparse
import fcntl
import json
import os
import platform
import re
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import CMDLINE as GUEST_CMDLINE  # noqa: E402
from lib.console import PROMPT_RE, shell  # noqa: E402
from lib.environment import (bzimage_version, cpu_model, first_line,  # noqa: E402
                             git_state, guest_manifest, machine_memory_mib, placement,
                             sha256_file, utc_now)
from lib.hakoniwa import HkPair, api_get, hk_ctl, trim_report  # noqa: E402
from lib.kvmtrace import KvmTrace, fold_repeats, stuck_report  # noqa: E402
from lib.memtouch import DIRTY_DONE, DIRTY_READY, TOUCH_DONE, TOUCH_READY  # noqa: E402
from lib.options import add_path_options  # noqa: E402
from lib.qemu import Qmp, qemu_argv  # noqa: E402
from lib.rigfaults import read_evidence, signature  # noqa: E402
from lib.tables import md_table  # noqa: E402
from lib.vmm import Proc, free_port  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = "migration-soak"
RESULTS = os.path.join(ROOT, "bench/results")


def set_name(name):
    """Where a soak named NAME keeps its state (build/soak/ for the default
    name, build/soak-NAME/ otherwise) and writes its results
    (bench/results/NAME.{json,md}, evidence in bench/results/NAME/runs/):
    soaks of different rig settings side by side."""
    global STATE_DIR, STATE, RUNS_DIR, RESULTS_JSON, RESULTS_MD
    STATE_DIR = os.path.join(ROOT, "build/soak" if name == PROG else "build/soak-" + name)
    STATE = os.path.join(STATE_DIR, "state.json")
    RUNS_DIR = os.path.join(RESULTS, name, "runs")
    RESULTS_JSON = os.path.join(RESULTS, name + ".json")
    RESULTS_MD = os.path.join(RESULTS, name + ".md")


set_name(PROG)
# L1's memory without HK_RIG_MEM: 8 GiB, and 6 GiB each for L1s side by
# side, which is still room for postcopy-bg's two 1 GiB guests (rig_memory).
RIG_MEM_MIB = 8192
RIG_MEM_PARALLEL_MIB = 6144
# What the host keeps beside its L1s (--parallel: check_rig_memory).
HOST_RESERVE_MIB = 3072
RIG_NOTE = ("inside L1 under TCG with nested KVM; source and destination share "
            "L1's vCPUs")

# The guest command line of both VMMs: bench/migration.py's.
CMDLINE = GUEST_CMDLINE
MODES = ["precopy-dirty", "postcopy-bg", "hybrid"]
VMMS = ["hakoniwa", "qemu"]
MEMORY_MIB = {"precopy-dirty": 512, "postcopy-bg": 1024, "hybrid": 512}
# When hybrid reads the destination's counter (--counter-check), as the
# report says it.
COUNTER_CHECKS = ["settled", "churn", "first"]
COUNTER_CHECK_TEXT = {
    "settled": " (in hybrid once the copying loop is stopped)",
    "churn": " (in hybrid while the copying loop still runs: --counter-check churn)",
    "first": " (in hybrid as tests/guest_migration.rs's chain reads it: the first commands "
             "on the destination, while the copying loop still runs: --counter-check first)",
}


def counter_check(params):
    """A soak's --counter-check (soaks of 2026-11-27 said count_with_churn)."""
    return params.get("counter_check") or (
        "churn" if params.get("count_with_churn") else "settled")


# Worst first: a run takes the first kind its evidence shows (classify).
OUTCOMES = ["ok", "triple_fault", "guest_panic", "vmm_error", "hang", "data_mismatch",
            "migration_failed", "l1_panic", "harness_error"]
STAGES = ["boot", "workload", "migrate", "after"]

# hakoniwa's migration per mode (`ctl migrate` flags); --verify-pages is
# added where the binary has it.
HK_MIGRATE = {
    "precopy-dirty": ["--mode", "precopy", "--max-rounds", "6"],
    "postcopy-bg": ["--mode", "postcopy", "--prefetch", "8"],
    "hybrid": ["--mode", "hybrid", "--max-downtime", "1", "--max-rounds", "4",
               "--max-bandwidth", "16"],
}
# QEMU's stand-ins for hakoniwa's round limit and switch-over.
QEMU_PRECOPY_SYNCS = 6        # then downtime-limit QEMU_LAST_DOWNTIME_MS
QEMU_LAST_DOWNTIME_MS = 60000
QEMU_HYBRID_SYNCS = 2         # then migrate-start-postcopy
HYBRID_MIB_S = 16

BLOB_CMD = ("dd if=/dev/urandom of=/dev/shm/blob bs=1M count=96 2>/dev/null; "
            "md5sum /dev/shm/blob | cut -d' ' -f1")
# Written aside and renamed: `echo > /tmp/count` truncates first, and a
# `cat` in between read an empty file (a QEMU run counted as a mismatch).
COUNTER_CMD = ("(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; "
               "mv /tmp/count.new /tmp/count; sleep 0.1; done) & "
               "while [ ! -e /tmp/count ]; do sleep 0.05; done")
CHURN_CMD = "(while :; do cp /dev/shm/blob /dev/shm/churn; done) & true"
DIRTY_CMD = "hk-memtouch -d -m 128 -r 0 &"
TOUCH_CMD = "hk-memtouch -t 4 -m 100 -P 10"
# Job numbers in the guest shell: the counter is %1, the dirtying job %2.
DIRTY_JOB = "%2"

# What the evidence says (classify). The guest's kernel prints these even
# with `quiet` (KERN_EMERG, or console_verbose() once it oopses).
GUEST_PANIC_RE = re.compile(r"Kernel panic|BUG:|Oops|general protection fault")
GUEST_REBOOT_RE = re.compile(r"reboot: Restarting")
HK_TRIPLE_FAULT_RE = re.compile(r"triple-faulted")
# KVM_EXIT_INTERNAL_ERROR and failed VM entries (both VMMs' wording), and
# the VMM itself crashing.
VMM_ERROR_RE = re.compile(r"KVM internal error|VM entry failed|KVM: entry failed|"
                          r"panicked at|Segmentation fault|core dumped")
# hakoniwa's `--verify-pages` failure ("--verify-pages: N of M pages
# differ from the source's; the first: ...").
VERIFY_RE = re.compile(r"--verify-pages:|pages differ from the source")

EVIDENCE_TAIL = 8192          # bytes of each console and stderr kept
DUMP_FILE_MAX = 256 * 1024    # bytes of each hakoniwa dump file kept
TRACE_RAW_LINES = 20000       # lines of KVM's trace read, repeats folded,
TRACE_LINES = 400             # and kept

T0 = time.monotonic()


def log(*a):
    print("[soak %6.1f] %s" % (time.monotonic() - T0, " ".join(str(x) for x in a)), flush=True)


def die(message):
    print("%s: %s" % (PROG, message), file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- state ----

def write_json(path, data):
    """Writes atomically (a file next to it, renamed): a reader, or a
    soak killed meanwhile, never sees half a file. Every file has one
    writer: state.json the driver, each L1's files its worker (see
    merge_l1_results), so no update is lost either."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except ValueError as e:
        die("%s: %s" % (os.path.relpath(path, ROOT), e))


def plan(runs, modes, vmms):
    """Every run of the soak in order: iterations outermost, both VMMs of a
    mode next to each other, the first of them alternating."""
    out = []
    for i in range(1, runs + 1):
        for mode in modes:
            for vmm in (vmms if i % 2 else list(reversed(vmms))):
                out.append({"id": len(out) + 1, "iteration": i, "vmm": vmm, "mode": mode,
                            "async_pf": "off" if mode == "postcopy-bg" and i % 2 else "on"})
    return out


def pending(state):
    return [r for r in state["plan"] if str(r["id"]) not in state["results"]]


def run_dir_name(spec):
    return "%03d-%s-%s" % (spec["id"], spec["vmm"], spec["mode"])


def l1_file(kind, l1):
    """An L1's own file in the state directory: "results" (its worker's
    outcomes and environment) or "progress" (the run it is in, written
    before each stage), or its console "log"."""
    if kind == "log":
        return os.path.join(STATE_DIR, "l1-%03d.log" % l1)
    return os.path.join(STATE_DIR, "%s-l1-%03d.json" % (kind, l1))


L1_FILE_RE = re.compile(r"(?:l1-\d+\.log|(?:results|progress)-l1-\d+\.json|progress\.json)$")


def write_progress(data):
    write_json(l1_file("progress", data["l1"]), data)


def merge_l1_results(state):
    """Takes every L1's outcomes and environment into STATE (the driver's,
    the only writer of state.json); True if anything was new. Workers in
    L1 write only files of their own: a lock could not keep them apart
    from each other and from the driver, as QEMU's 9p server, which shares
    the tree with L1, grants every lock without taking it."""
    changed = False
    for name in sorted(os.listdir(STATE_DIR)):
        m = re.match(r"results-l1-(\d+)\.json$", name)
        if not m:
            continue
        mine = read_json(os.path.join(STATE_DIR, name)) or {}
        l1 = str(int(m.group(1)))
        if mine.get("environment") and state["l1_environments"].get(l1) != mine["environment"]:
            state["l1_environments"][l1] = mine["environment"]
            changed = True
        for run, rec in (mine.get("results") or {}).items():
            if run not in state["results"]:
                state["results"][run] = rec
                changed = True
    return changed


def id_ranges(ids):
    """[1, 2, 3, 7] -> "1-3, 7"."""
    out = []
    for i in ids:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join("%d" % a if a == b else "%d-%d" % (a, b) for a, b in out)


# -------------------------------------------------------------- failures ---

class Failure(Exception):
    """How a run failed where it was seen: an outcome, or "exited" (a VMM
    ended; classify looks at why), and a reason."""

    def __init__(self, kind, reason):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def wait_guest(proc, regex, start, timeout, what):
    """The match of REGEX on PROC's console after START; a hang or an exit
    otherwise."""
    m = proc.con.wait(regex, start, timeout)
    if m:
        return m
    if not proc.alive():
        raise Failure("exited", "%s ended (status %s) while waiting for %s" % (
            proc.name, proc.proc.returncode, what))
    raise Failure("hang", "%s: no %s within %d s" % (proc.name, what, timeout))


def guest_shell(proc, command, timeout):
    try:
        return shell(proc.con, command, timeout)
    except (RuntimeError, OSError):
        if not proc.alive():
            raise Failure("exited", "%s ended (status %s) during `%s`" % (
                proc.name, proc.proc.returncode, command)) from None
        raise Failure("hang", "%s: the guest shell did not answer `%s` within %d s" % (
            proc.name, command, timeout)) from None


# ------------------------------------------------------------- hakoniwa ----

class Vms:
    """A run's source and destination VMM (HkVms, QemuVms)."""

    src = dst = None

    def sides(self):
        return [(name, p) for name, p in (("src", self.src), ("dst", self.dst)) if p]


class HkVms(Vms):
    """A run's two hakoniwa processes."""

    vmm = "hakoniwa"

    def __init__(self, ctx, mode, cmdline):
        self.ctx, self.mode = ctx, mode
        flags = ["--kernel", ctx.kernel, "--initramfs", ctx.initrd, "--cmdline", cmdline,
                 "--cpus", "1", "--memory", "%dM" % MEMORY_MIB[mode]]
        self.dump_dirs = {}
        side_flags = {}
        for side in ("src", "dst"):
            side_flags[side] = list(flags)
            if ctx.features["dump_dir"]:
                self.dump_dirs[side] = os.path.join(ctx.run_work, "dump-" + side)
                os.makedirs(self.dump_dirs[side])
                side_flags[side] += ["--dump-dir", self.dump_dirs[side]]
        self.side_flags = side_flags
        self.pair = None
        self.src_report = self.dst_report = None
        self.src_exit = None

    def start_source(self):
        self.pair = HkPair(self.ctx.hk, self.ctx.run_work, "hk", self.side_flags["src"],
                           self.side_flags["dst"])
        self.src = self.pair.src

    def start_destination(self):
        try:
            self.pair.start_destination()
        except RuntimeError as e:
            raise Failure("exited" if not self.pair.dst.alive() else "harness_error",
                          str(e)) from e
        finally:
            self.dst = self.pair.dst
        return self.dst

    def start_migration(self):
        extra = HK_MIGRATE[self.mode][2:]
        if self.ctx.features["verify_pages"] and self.ctx.verify_pages:
            extra = extra + ["--verify-pages"]
        try:
            self.pair.migrate(HK_MIGRATE[self.mode][1], extra)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            raise Failure("migration_failed", "ctl migrate: %s" % e) from e

    def _src_finished(self):
        return ((self.src_report or {}).get("phase") == "completed"
                or (not self.src.alive() and "migrated to" in self.src.stderr()))

    def poll(self):
        """{"switched": the destination runs the guest, "completed": every
        page is there}; a Failure when either side failed or ended."""
        if self.src.alive():
            self.src_report = api_get(self.pair.src_sock, "vm.migration", 5) or self.src_report
        if os.path.exists(self.pair.dst_sock):
            self.dst_report = api_get(self.pair.dst_sock, "vm.migration", 5) or self.dst_report
        for side, r in (("source", self.src_report), ("destination", self.dst_report)):
            if r and r.get("phase") in ("failed", "paused"):
                raise Failure("migration_failed", "hakoniwa %s: migration %s: %s" % (
                    side, r.get("phase"), r.get("error")))
        if not self.dst.alive():
            raise Failure("exited", "the hakoniwa destination ended (status %s)"
                          % self.dst.proc.returncode)
        if not self.src.alive() and not self._src_finished():
            raise Failure("exited", "the hakoniwa source ended (status %s) before the "
                          "migration completed" % self.src.proc.returncode)
        phase = (self.dst_report or {}).get("phase")
        return {"switched": phase in ("postcopy", "completed"), "completed": phase == "completed"}

    def finish(self):
        """After completion: the source ends by itself ("migrated to ...")."""
        try:
            self.src.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        self.src_exit = self.src.proc.poll()

    def figures(self):
        d, s = self.dst_report or {}, self.src_report or {}
        pages = d.get("pages") or {}
        return {
            "downtime_ms": d.get("downtime_ms"),
            "total_ms": d.get("total_ms"),
            "mib_sent": round((s.get("bytes") or d.get("bytes") or 0) / (1 << 20), 1),
            "rounds": s.get("rounds"),
            "switch_reason": s.get("switch_reason"),
            "pages": pages,
            "requests": d.get("requests"),
            "faults_major": (d.get("faults") or {}).get("major"),
            "guest_async_pf": d.get("guest_async_pf"),
            "verify_pages": d.get("verify_pages"),
            "wrong_pages": d.get("wrong_pages") or None,
            "source_exit": self.src_exit,
        }

    def reports(self):
        return {"source vm.migration": trim_report(self.src_report),
                "destination vm.migration": trim_report(self.dst_report)}

    def triple_fault(self, proc):
        m = HK_TRIPLE_FAULT_RE.search(proc.stderr())
        return "%s: %s" % (proc.name, last_line_with(proc.stderr(), m)) if m else None

    def data_error(self):
        """hakoniwa's --verify-pages finding, if any."""
        for p in (self.src, self.dst):
            if p:
                m = VERIFY_RE.search(p.stderr())
                if m:
                    return "%s: %s" % (p.name, last_line_with(p.stderr(), m))
        for r in (self.dst_report, self.src_report):
            wrong = (r or {}).get("pages", {}).get("wrong")
            if r and (wrong or VERIFY_RE.search(r.get("error") or "")):
                return "%s pages wrong: %s" % ((r.get("pages") or {}).get("wrong"),
                                               r.get("error") or r.get("wrong_pages"))
        return None

    def inspect(self, side, proc, out):
        """A live VMM's state before it is killed: hakoniwa's dump."""
        if self.ctx.features["ctl_dump"]:
            sock = self.pair.src_sock if side == "src" else self.pair.dst_sock
            try:
                text = hk_ctl(self.ctx.hk, sock, "dump", timeout=30)
                out["ctl-dump-%s.txt" % side] = text if isinstance(text, str) else json.dumps(
                    text, indent=1)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                out["ctl-dump-%s.txt" % side] = "ctl dump: %s\n" % e

    def collect(self, out):
        """hakoniwa's dump files (--dump-dir), each cut to DUMP_FILE_MAX."""
        for side, d in sorted(self.dump_dirs.items()):
            for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
                with open(os.path.join(d, name), "rb") as f:
                    data = f.read(DUMP_FILE_MAX + 1)
                text = data[:DUMP_FILE_MAX].decode("utf-8", "replace")
                if len(data) > DUMP_FILE_MAX:
                    text += "\n[cut at %d bytes]\n" % DUMP_FILE_MAX
                out["dump-%s-%s" % (side, name)] = text

    def kill(self):
        if self.pair:
            self.pair.close()

    close = kill


# ----------------------------------------------------------------- QEMU ----

def connect_qmp(path, proc):
    """QMP of a QEMU just started (None if it ended before its socket)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if not proc.alive() or time.monotonic() > deadline:
            return None
        time.sleep(0.05)
    return Qmp(path)


class QemuVms(Vms):
    """A run's two QEMU processes and their QMP sockets."""

    vmm = "qemu"

    def __init__(self, ctx, mode, cmdline):
        self.ctx, self.mode = ctx, mode
        self.sq = os.path.join(ctx.run_work, "src.qmp")
        self.dq = os.path.join(ctx.run_work, "dst.qmp")
        self.argv = lambda qmp, incoming: qemu_argv(
            ctx.qemu, ctx.kernel, ctx.initrd, cmdline, MEMORY_MIB[mode], qmp=qmp,
            incoming=incoming, extra=["-no-reboot"])
        self.qs = self.qd = None
        self.src_info = self.dst_info = None
        self.t_migrate = None
        self.raised_at = self.postcopy_at = None
        self.port = free_port()
        self.postcopy = mode in ("postcopy-bg", "hybrid")

    def start_source(self):
        self.src = Proc(self.argv(self.sq, False), "QEMU source")
        self.qs = connect_qmp(self.sq, self.src)

    def _qmp(self, q, proc, name, **arguments):
        """A QMP command; a Failure when QEMU ended or does not answer."""
        try:
            if q is None:
                raise RuntimeError("no QMP connection")
            return q.cmd(name, **arguments)
        except (RuntimeError, OSError) as e:
            if not proc.alive():
                raise Failure("exited", "%s ended (status %s) during QMP %s" % (
                    proc.name, proc.proc.returncode, name)) from e
            raise Failure("hang", "%s: QMP %s: %s" % (proc.name, name, e)) from e

    def start_destination(self):
        self.dst = Proc(self.argv(self.dq, True), "QEMU destination")
        self.qd = connect_qmp(self.dq, self.dst)
        if self.postcopy:
            self._qmp(self.qd, self.dst, "migrate-set-capabilities",
                      capabilities=[{"capability": "postcopy-ram", "state": True},
                                    {"capability": "postcopy-blocktime", "state": True}])
        self._qmp(self.qd, self.dst, "migrate-incoming", uri="tcp:127.0.0.1:%d" % self.port)
        return self.dst

    def start_migration(self):
        if self.postcopy:
            self._qmp(self.qs, self.src, "migrate-set-capabilities",
                      capabilities=[{"capability": "postcopy-ram", "state": True}])
        if self.mode == "hybrid":
            # hakoniwa's --max-bandwidth caps the precopy rounds and the
            # background push alike; QEMU has a parameter for each.
            params = {"max-bandwidth": HYBRID_MIB_S << 20,
                      "max-postcopy-bandwidth": HYBRID_MIB_S << 20}
        else:
            # No cap (QEMU's default is 128 MiB/s; hakoniwa has none).
            params = {"max-bandwidth": 100 << 30}
        self._qmp(self.qs, self.src, "migrate-set-parameters", **{"downtime-limit": 300},
                  **params)
        self.t_migrate = time.monotonic()
        self._qmp(self.qs, self.src, "migrate", uri="tcp:127.0.0.1:%d" % self.port)
        if self.mode == "postcopy-bg":
            self._qmp(self.qs, self.src, "migrate-start-postcopy")
            self.postcopy_at = 0.0

    def poll(self):
        for q, proc in ((self.qs, self.src), (self.qd, self.dst)):
            shutdown = [e for e in (q.events if q else []) if e.get("event") == "SHUTDOWN"]
            if shutdown or not proc.alive():
                raise Failure("exited", "%s ended (status %s%s)" % (
                    proc.name, proc.proc.poll(),
                    ", SHUTDOWN %s" % shutdown[0].get("data") if shutdown else ""))
        info = self.src_info = self._qmp(self.qs, self.src, "query-migrate")
        status = info.get("status")
        if status in ("failed", "cancelled"):
            raise Failure("migration_failed", "QEMU source: migration %s: %s" % (
                status, info.get("error-desc")))
        syncs = (info.get("ram") or {}).get("dirty-sync-count", 0)
        since = round(time.monotonic() - self.t_migrate, 2)
        if (self.mode == "precopy-dirty" and self.raised_at is None
                and syncs >= QEMU_PRECOPY_SYNCS and status == "active"):
            # QEMU has no round limit: a downtime limit it meets at once
            # ends it the way hakoniwa's --max-rounds does.
            self._qmp(self.qs, self.src, "migrate-set-parameters",
                      **{"downtime-limit": QEMU_LAST_DOWNTIME_MS})
            self.raised_at = since
        if (self.mode == "hybrid" and self.postcopy_at is None
                and syncs >= QEMU_HYBRID_SYNCS and status == "active"):
            self._qmp(self.qs, self.src, "migrate-start-postcopy")
            self.postcopy_at = since
        dinfo = self.dst_info = self._qmp(self.qd, self.dst, "query-migrate")
        dstatus = dinfo.get("status")
        if dstatus == "failed":
            raise Failure("migration_failed", "QEMU destination: migration failed: %s" %
                          dinfo.get("error-desc"))
        switched = dstatus in ("postcopy-active", "completed")
        if not switched and self.mode == "postcopy-bg":
            switched = bool(self._qmp(self.qd, self.dst, "query-status").get("running"))
        return {"switched": switched, "completed": status == "completed" and dstatus == "completed"}

    def finish(self):
        pass  # the source stays paused ("postmigrate") until the run ends

    def figures(self):
        s, d = self.src_info or {}, self.dst_info or {}
        ram = s.get("ram") or {}
        return {
            "downtime_ms": s.get("downtime"),
            "total_ms": s.get("total-time"),
            "mib_sent": round((ram.get("transferred") or 0) / (1 << 20), 1),
            "rounds": ram.get("dirty-sync-count"),
            "postcopy_requests": ram.get("postcopy-requests"),
            "postcopy_blocktime_ms": d.get("postcopy-blocktime"),
            "postcopy_started_s": self.postcopy_at,
            "downtime_limit_raised_s": self.raised_at,
        }

    def reports(self):
        return {"source query-migrate": self.src_info, "destination query-migrate": self.dst_info,
                "source QMP events": self.qs.events if self.qs else None,
                "destination QMP events": self.qd.events if self.qd else None}

    def triple_fault(self, proc):
        """QEMU with -no-reboot ends at a guest reset (SHUTDOWN, reason
        guest-reset): a triple fault, unless the guest rebooted itself."""
        q = self.qs if proc is self.src else self.qd
        for e in (q.events if q else []):
            data = e.get("data") or {}
            if e.get("event") == "SHUTDOWN" and data.get("reason") == "guest-reset":
                text = proc.con.tail(1 << 20)
                if not GUEST_REBOOT_RE.search(text) and not GUEST_PANIC_RE.search(text):
                    return "%s: SHUTDOWN %s, no reboot or panic on the console" % (
                        proc.name, data)
        return None

    def data_error(self):
        return None

    def inspect(self, side, proc, out):
        """A live QEMU's vCPUs before it is killed."""
        q = self.qs if side == "src" else self.qd
        if not q:
            return
        try:
            q.sock.settimeout(10)
            text = json.dumps(q.cmd("query-status")) + "\n\n"
            text += q.cmd("human-monitor-command", **{"command-line": "info registers -a"})
        except (RuntimeError, OSError) as e:
            text = "QMP: %s\n" % e
        out["qemu-registers-%s.txt" % side] = text

    def collect(self, out):
        # What QEMU sent before it ended (a SHUTDOWN event says why).
        for q, proc in ((self.qs, self.src), (self.qd, self.dst)):
            if q and proc and not proc.alive():
                q.drain()

    def kill(self):
        for p in (self.src, self.dst):
            if p:
                p.kill()

    def close(self):
        self.kill()
        for q in (self.qs, self.qd):
            if q:
                q.close()


# -------------------------------------------------------------- one run ----

def last_line_with(text, m):
    """The whole line around match M of TEXT."""
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start:end if end >= 0 else len(text)].strip()[:300]


def start_workload(ctx, proc, mode, marks):
    """The guest's workload on the source; what the checks need later.
    MARKS gets the seconds each step took."""
    t = time.monotonic()
    out = guest_shell(proc, BLOB_CMD, ctx.hang_timeout)
    m = re.search(r"\b[0-9a-f]{32}\b", out)
    if not m:
        raise Failure("harness_error", "no md5sum of the data: %r" % out[-300:])
    marks["data_s"] = round(time.monotonic() - t, 2)
    work = {"md5": m.group(0)}
    guest_shell(proc, COUNTER_CMD, ctx.hang_timeout)
    if mode == "hybrid":
        guest_shell(proc, CHURN_CMD, ctx.hang_timeout)
    work["count_before"] = read_count(proc, ctx)
    start = proc.con.size()
    t = time.monotonic()
    if mode == "precopy-dirty":
        proc.con.send(DIRTY_CMD + "\n")
        wait_guest(proc, DIRTY_READY, start, ctx.hang_timeout, "hk-memtouch's ready line")
        marks["fill_s"] = round(time.monotonic() - t, 2)
    elif mode == "postcopy-bg":
        proc.con.send(TOUCH_CMD + "\n")
        wait_guest(proc, TOUCH_READY, start, ctx.hang_timeout, "hk-memtouch's ready line")
        marks["fill_s"] = round(time.monotonic() - t, 2)
    return work


def read_count(proc, ctx):
    out = guest_shell(proc, "cat /tmp/count", ctx.hang_timeout).strip()
    if not out.isdigit():
        raise Failure("data_mismatch", "%s: /tmp/count reads %r" % (proc.name, out[-200:]))
    return int(out)


def migrate(ctx, vms, rec):
    """Starts the destination and the migration and follows it to its end;
    in postcopy-bg, types the go line once the destination runs the guest
    and waits for hk-memtouch's verdict there."""
    mode = rec["mode"]
    vms.start_destination()
    t = time.monotonic()
    vms.start_migration()
    go_at = completed_at = touch = None
    while True:
        st = vms.poll()
        now = time.monotonic()
        if mode == "postcopy-bg" and go_at is None and st["switched"]:
            vms.dst.con.send("\n")
            go_at = now
            rec["figures_run"]["go_after_s"] = round(go_at - t, 2)
        if st["completed"] and completed_at is None:
            completed_at = now
            rec["figures_run"]["completed_after_s"] = round(completed_at - t, 2)
        if go_at is not None and touch is None:
            with vms.dst.con.cond:
                touch = TOUCH_DONE.search(vms.dst.con.buf)
            if touch:
                rec["figures_run"]["touch_max_s"] = float(touch.group(4))
        if completed_at is not None and (mode != "postcopy-bg" or touch):
            break
        if now - t > ctx.migrate_timeout:
            raise Failure("hang", "the migration did not complete within %d s" %
                          ctx.migrate_timeout)
        if go_at is not None and touch is None and now - go_at > ctx.hang_timeout:
            raise Failure("hang", "hk-memtouch did not finish within %d s of the go line "
                          "on the destination" % ctx.hang_timeout)
        time.sleep(0.1)
    vms.finish()
    if touch and touch.group(6) != b"ok":
        raise Failure("data_mismatch", "hk-memtouch on the destination: check=%s" %
                      touch.group(6).decode())


def stop_churn(ctx, dst):
    """Stops hybrid's copying loop, which must still be running."""
    out = guest_shell(dst, "kill %s && echo churn-stopped" % DIRTY_JOB, ctx.hang_timeout)
    if "churn-stopped" not in out:
        raise Failure("data_mismatch", "the copying loop is gone: %r" % out.strip()[-200:])


def counter_advances(ctx, dst, work):
    """The guest's counter is at least the source's last and moves within
    1.5 s (two reads, each a shell command)."""
    first = read_count(dst, ctx)
    time.sleep(1.5)
    second = read_count(dst, ctx)
    if first < work["count_before"]:
        raise Failure("data_mismatch", "the counter went back from %d (source) to %d" % (
            work["count_before"], first))
    if second <= first:
        raise Failure("hang", "the guest's counter stopped at %d" % first)


def after_checks(ctx, vms, mode, work):
    dst = vms.dst
    # hybrid, --counter-check first: tests/guest_migration.rs's order.
    early = mode == "hybrid" and ctx.counter_check == "first"
    if early:
        counter_advances(ctx, dst, work)
    if mode == "postcopy-bg":
        wait_guest(dst, PROMPT_RE, 0, ctx.hang_timeout, "the prompt after hk-memtouch")
    out = guest_shell(dst, "echo $((6*7))", ctx.hang_timeout)
    if "42" not in out:
        raise Failure("data_mismatch", "the destination's shell says 6*7 is %r" % out.strip())
    # The dirtying job first: it is alive, and once stopped it no longer
    # takes the guest's one vCPU from the checks below.
    if mode == "precopy-dirty":
        start = dst.con.size()
        out = guest_shell(dst, "kill %s" % DIRTY_JOB, ctx.hang_timeout)
        # The job's last line may come before the shell's end marker (it
        # answers the signal at once): that is the job alive, not an error.
        if DIRTY_DONE.sub(b"", out.encode()).strip():
            raise Failure("data_mismatch", "the dirtying job is gone: `kill %s` says %r" % (
                DIRTY_JOB, out.strip()[-200:]))
        wait_guest(dst, DIRTY_DONE, start, 60, "the dirtying job's last line")
    elif mode == "hybrid" and ctx.counter_check == "settled":
        stop_churn(ctx, dst)
    if not early:
        counter_advances(ctx, dst, work)
    if mode == "hybrid" and ctx.counter_check != "settled":
        stop_churn(ctx, dst)
    md5 = guest_shell(dst, "md5sum /dev/shm/blob | cut -d' ' -f1", ctx.hang_timeout).strip()
    if md5 != work["md5"]:
        raise Failure("data_mismatch", "md5sum of the data: %s on the source, %r on the "
                      "destination" % (work["md5"], md5[-200:]))


def classify(failure, vms, stage):
    """The run's one outcome from what was seen (FAILURE) and from the
    evidence: the guest's own word first (panic, triple fault), then the
    VMM's (errors, --verify-pages), then what the harness saw."""
    sides = vms.sides() if vms else []
    for _, p in sides:
        text = p.con.tail(1 << 20)
        m = GUEST_PANIC_RE.search(text)
        if m:
            return "guest_panic", "%s console: %s" % (p.name, last_line_with(text, m))
    for _, p in sides:
        why = vms.triple_fault(p)
        if why:
            return "triple_fault", why
    for _, p in sides:
        m = VMM_ERROR_RE.search(p.stderr())
        if m:
            return "vmm_error", "%s: %s" % (p.name, last_line_with(p.stderr(), m))
    why = vms.data_error() if vms else None
    if why:
        return "data_mismatch", why
    if failure.kind == "exited":
        # A VMM ended and said nothing the kinds above know.
        said = "; ".join("%s: %s" % (p.name, p.stderr().strip().splitlines()[-1][:200])
                         for _, p in sides if not p.alive() and p.stderr().strip())
        reason = failure.reason + (" (%s)" % said if said else "")
        for _, p in sides:
            if GUEST_REBOOT_RE.search(p.con.tail(1 << 20)):
                return "harness_error", reason + "; the guest rebooted"
        return ("migration_failed" if stage == "migrate" else "harness_error"), reason
    return failure.kind, failure.reason


def run_one(ctx, spec):
    rec = dict(spec)
    rec.update({"outcome": None, "stage": None, "reason": None, "l1": ctx.l1,
                "started_utc": utc_now(), "durations": {}, "figures": {},
                "figures_run": {}, "evidence": None})
    cmdline = CMDLINE + (" no-kvmapf" if spec["async_pf"] == "off" else "")
    rec["cmdline"] = cmdline
    ctx.run_work = tempfile.mkdtemp(prefix="run-%03d." % spec["id"], dir=ctx.work)
    trace = KvmTrace() if ctx.kvm_trace else None
    if trace:
        trace.start(kib_per_cpu=8192)
    marks = []
    t0 = time.monotonic()

    def stage(name):
        rec["stage"] = name
        marks.append((name, time.monotonic()))
        write_progress({"run": spec["id"], "vmm": spec["vmm"], "mode": spec["mode"],
                        "stage": name, "l1": ctx.l1, "at_utc": utc_now()})

    vms = failure = None
    try:
        try:
            stage("boot")
            vms = (HkVms if spec["vmm"] == "hakoniwa" else QemuVms)(ctx, spec["mode"], cmdline)
            vms.start_source()
            wait_guest(vms.src, PROMPT_RE, 0, ctx.hang_timeout, "the guest prompt")
            stage("workload")
            work = start_workload(ctx, vms.src, spec["mode"], rec["figures_run"])
            stage("migrate")
            migrate(ctx, vms, rec)
            stage("after")
            after_checks(ctx, vms, spec["mode"], work)
            marks.append(("end", time.monotonic()))
            rec["outcome"], rec["stage"] = "ok", None
        except Failure as e:
            failure = e
        except Exception as e:  # noqa: BLE001 - recorded as the run's outcome
            failure = Failure("harness_error", "%s: %s\n%s" % (
                type(e).__name__, e, traceback.format_exc(limit=4)))
        if marks[-1][0] != "end":
            marks.append(("end", time.monotonic()))
        for (name, t), (_, t_next) in zip(marks, marks[1:]):
            rec["durations"][name + "_s"] = round(t_next - t, 2)
        if vms:
            rec["figures"] = vms.figures()
        if failure:
            evidence = {}
            if trace:
                # First: stuck_report traces anew, which clears the buffer.
                evidence["kvm-trace.txt"] = "".join(fold_repeats(
                    trace.tail(TRACE_RAW_LINES).splitlines(True))[-TRACE_LINES:])
            for side, p in vms.sides() if vms else []:
                if p.alive():
                    vms.inspect(side, p, evidence)
                    evidence["stuck-%s.txt" % side] = stuck_report(p.proc.pid)
            if vms:
                vms.kill()
                vms.collect(evidence)
            rec["outcome"], rec["reason"] = classify(failure, vms, rec["stage"])
            rec["evidence"] = write_evidence(spec, rec, vms, evidence)
            rec["signature"] = signature(evidence, MEMORY_MIB[spec["mode"]])
    finally:
        # Also when the soak is stopped (SIGINT, SIGTERM): no VM is left.
        if trace:
            trace.stop()
        if vms:
            vms.close()
        shutil.rmtree(ctx.run_work, ignore_errors=True)
    rec["durations"]["total_s"] = round(time.monotonic() - t0, 2)
    return rec


def write_evidence(spec, rec, vms, files):
    """A failing run's evidence directory (text, each piece cut short)."""
    d = os.path.join(RUNS_DIR, run_dir_name(spec))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    summary = ["run %d: %s %s, guest command line %r" % (
        spec["id"], spec["vmm"], spec["mode"], rec["cmdline"]),
        "outcome: %s at stage %s" % (rec["outcome"], rec["stage"]),
        "reason: %s" % rec["reason"], "L1: %s, started %s" % (rec["l1"], rec["started_utc"]),
        "durations: %s" % rec["durations"], "figures: %s" % rec["figures"],
        "run figures: %s" % rec["figures_run"]]
    for side, p in vms.sides() if vms else []:
        summary.append("%s: exit status %s; argv %s" % (p.name, p.proc.poll(),
                                                        " ".join(p.argv)))
        files["%s-console.txt" % side] = p.con.tail(EVIDENCE_TAIL)
        files["%s-stderr.txt" % side] = p.stderr()[-EVIDENCE_TAIL:]
    if vms:
        files["reports.json"] = json.dumps(vms.reports(), indent=1) + "\n"
    files["summary.txt"] = "\n".join(summary) + "\n"
    for name, text in files.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    return os.path.relpath(d, ROOT)


# ---------------------------------------------------------------- worker ---

class Ctx:
    """What every run of one worker shares."""


def hk_features(hk):
    """hakoniwa's debugging aids, where this binary has them."""
    def help_text(*argv):
        try:
            return subprocess.run([hk, *argv, "--help"], capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"dump_dir": "--dump-dir" in help_text("run"),
            "ctl_dump": bool(re.search(r"^\s+dump\s", help_text("ctl"), re.M)),
            "verify_pages": "--verify-pages" in help_text("ctl", "migrate")}


def l1_environment(ctx, params):
    _, kind, where, note = placement(RIG_NOTE, "figures")
    manifest = guest_manifest(params["kernel"])
    return {
        "date_utc": utc_now(),
        "where": where,
        "note": note,
        "kvm": kind,
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "memory_mib": machine_memory_mib(),
        "thp": first_line(["cat", "/sys/kernel/mm/transparent_hugepage/enabled"]),
        "qemu_version": first_line([ctx.qemu, "--version"]) if ctx.qemu else None,
        "hakoniwa_version": first_line([ctx.hk, "--version"]),
        "hakoniwa_binary_sha256": sha256_file(ctx.hk),
        "hakoniwa_features": ctx.features,
        "guest_kernel_version": bzimage_version(ctx.kernel),
        "guest_kernel_package": manifest.get("kernel-package"),
        "guest_initramfs_sha256": sha256_file(ctx.initrd),
        "kvm_trace": ctx.kvm_trace and KvmTrace().usable,
    }


def worker(l1, ids, after_run=None):
    """Runs the runs IDS (all pending ones: None) here, in plan order,
    recording each as it ends in this L1's results file, which the driver
    merges into the state; AFTER_RUN, if any, is called after each."""
    state = read_json(STATE)
    if not state:
        die("no soak state in %s" % os.path.relpath(STATE, ROOT))
    params = state["parameters"]
    by_id = {r["id"]: r for r in state["plan"]}
    unknown = [i for i in ids or [] if i not in by_id]
    if unknown:
        die("--ids: no run %s in the plan" % ",".join(map(str, unknown)))
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        die("/dev/kvm is not usable here")
    if os.geteuid() != 0:
        die("needs root (userfaultfd for QEMU's postcopy, KVM's trace events)")
    ctx = Ctx()
    ctx.l1 = l1
    ctx.hang_timeout = params["hang_timeout"]
    ctx.migrate_timeout = params["migrate_timeout"]
    ctx.kvm_trace = params["kvm_trace"]
    ctx.verify_pages = params.get("verify_pages", True)
    ctx.counter_check = counter_check(params)
    # Private copies: the binary in the tree may be rebuilt while this runs
    # (a running process whose file is rewritten can crash), and the guest
    # files on a local file system for both VMMs.
    ctx.work = tempfile.mkdtemp(prefix="hk-soak.")
    ctx.hk = shutil.copy(params["hakoniwa"], os.path.join(ctx.work, "hakoniwa"))
    ctx.kernel = shutil.copy(params["kernel"], os.path.join(ctx.work, "vmlinuz"))
    ctx.initrd = shutil.copy(params["initramfs"], os.path.join(ctx.work, "initramfs.cpio.gz"))
    ctx.qemu = shutil.which(params["qemu"])
    if "qemu" in params["vmms"] and not ctx.qemu:
        die("%s not found (apt-get install qemu-system-x86)" % params["qemu"])
    ctx.features = hk_features(ctx.hk)
    subprocess.run(["ip", "link", "set", "lo", "up"], stderr=subprocess.DEVNULL)
    env = l1_environment(ctx, params)
    log("L1 %s: %s; QEMU %s; hakoniwa features %s" % (
        l1, env["kernel"], env["qemu_version"], ctx.features))
    # What an earlier worker of the same number (0: on the host, before a
    # --resume) recorded stays.
    mine_path = l1_file("results", l1)
    mine = read_json(mine_path) or {"l1": l1, "results": {}}
    mine["environment"] = env
    write_json(mine_path, mine)
    todo = pending(state) if ids is None else [
        by_id[i] for i in sorted(ids) if str(i) not in state["results"]]
    try:
        for spec in todo:
            log("run %d/%d: %s %s, async PF %s" % (
                spec["id"], len(state["plan"]), spec["vmm"], spec["mode"], spec["async_pf"]))
            rec = run_one(ctx, spec)
            mine["results"][str(spec["id"])] = rec
            write_json(mine_path, mine)
            write_progress({"run": None, "last": spec["id"], "l1": l1, "at_utc": utc_now()})
            if after_run:
                after_run()
            d = rec["durations"]
            log("  %s%s in %.0f s (boot %s, workload %s, migrate %s, after %s)%s" % (
                rec["outcome"], " at " + rec["stage"] if rec["stage"] else "",
                d.get("total_s", 0), d.get("boot_s"), d.get("workload_s"), d.get("migrate_s"),
                d.get("after_s"), ": " + rec["reason"].splitlines()[0][:300]
                if rec["reason"] else ""))
    finally:
        shutil.rmtree(ctx.work, ignore_errors=True)
    return 0


# ------------------------------------------------------------------ host ---

def host_environment(params):
    rig = rig_settings() if params["rig"] else {}
    commit, uncommitted = git_state(ROOT, 30)
    return {
        "date_utc": utc_now(),
        "host_kernel": platform.release(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "rig_qemu": first_line([rig["HK_RIG_QEMU"], "--version"]) if rig else None,
        "rig_memory_mib": rig_memory(params["parallel"]) if rig else None,
        # L1's vCPUs, TCG threading, timer and extra kernel words, as
        # scripts/rig resolves them (its defaults are said there only).
        "rig_cpus": int(rig["HK_RIG_CPUS"]) if rig else None,
        "rig_tcg": rig.get("HK_RIG_TCG"),
        "rig_timer": rig.get("HK_RIG_TIMER"),
        "rig_append": rig.get("HK_RIG_APPEND"),
        # L1s side by side (--parallel).
        "rig_parallel": params["parallel"] if rig else None,
        "python": platform.python_version(),
        "git_commit": commit,
        "git_uncommitted": uncommitted,
        "guest_kernel": os.path.relpath(params["kernel"], ROOT),
        "guest_initramfs": os.path.relpath(params["initramfs"], ROOT),
        "guest_cmdline": CMDLINE,
    }


def rig_settings():
    """L1's settings as scripts/rig resolves them from HK_RIG_* and its
    defaults: {"HK_RIG_CPUS": "1", ...}."""
    out = subprocess.run([os.path.join(ROOT, "scripts", "rig"), "--settings"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        die("scripts/rig --settings failed: %s" % (out.stderr.strip() or out.returncode))
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def rig_memory(parallel):
    """Each L1's memory in MiB: HK_RIG_MEM, else RIG_MEM_MIB, or
    RIG_MEM_PARALLEL_MIB for L1s side by side."""
    default = RIG_MEM_MIB if parallel == 1 else RIG_MEM_PARALLEL_MIB
    try:
        return int(os.environ.get("HK_RIG_MEM") or default)
    except ValueError:
        die("HK_RIG_MEM=%r: MiB, a whole number" % os.environ["HK_RIG_MEM"])


def check_rig_memory(parallel):
    """L1s side by side must fit in the host's memory with room to spare:
    an L1's QEMU keeps every page L1 has ever used, so over its runs each
    grows towards its whole HK_RIG_MEM."""
    if parallel == 1:
        return
    with open("/proc/meminfo") as f:
        total = int(re.search(r"^MemTotal:\s+(\d+) kB", f.read(), re.M).group(1)) >> 10
    mem = rig_memory(parallel)
    need = parallel * mem + HOST_RESERVE_MIB
    if need > total:
        die("--parallel %d: %d L1s of %d MiB (HK_RIG_MEM) and %d MiB for the host need %d "
            "MiB, more than MemTotal's %d MiB: set HK_RIG_MEM lower (%d is enough for the "
            "soak's guests) or --parallel lower" % (
                parallel, parallel, mem, HOST_RESERVE_MIB, need, total, RIG_MEM_PARALLEL_MIB))


def l1_death_line(text):
    """The line of L1's console that says why it died, if any."""
    for pattern in (r"Kernel panic[^\n]*", r"BUG:[^\n]*", r"general protection[^\n]*",
                    r"Oops[^\n]*", r"timed out after[^\n]*", r"^rig: [^\n]*"):
        m = re.search(pattern, text, re.M)
        if m:
            return m.group(0).strip()[:300]
    return None


def run_signature(rec):
    """The rig fault a failed run's evidence shows (bench/lib/rigfaults.py):
    recorded with the run, or read from its evidence directory (results
    from before the signatures)."""
    if "signature" in rec:
        return rec["signature"]
    if not rec.get("evidence"):
        return None
    return signature(read_evidence(os.path.join(ROOT, rec["evidence"])),
                     MEMORY_MIB[rec["mode"]])


def l1_console_evidence(log_path):
    """What to keep of a dead L1's console: from just before the first line
    of its panic (whose call trace says where it was) on, up to 96 KiB, or
    else its last 16 KiB."""
    with open(log_path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    m = re.search(r"^.*(BUG: |Kernel panic|general protection|Oops)", text, re.M)
    if m:
        start = text.rfind("\n", 0, max(0, m.start() - 2048)) + 1
        return text[start:start + (96 << 10)]
    return text[-(16 << 10):]


def record_lost_run(state, progress, status, log_path):
    """The run an L1 was in when it ended without recording it: l1_panic
    when the rig died (125) or timed out (124), else harness_error."""
    spec = next(r for r in state["plan"] if r["id"] == progress["run"])
    tail = l1_console_evidence(log_path)
    why = l1_death_line(tail)
    if status in (124, 125):
        outcome = "l1_panic"
        reason = "the rig ended with status %d (%s) during the run's %s stage%s" % (
            status, "L1 died" if status == 125 else "HK_RIG_TIMEOUT", progress.get("stage"),
            ": " + why if why else "")
    else:
        outcome = "harness_error"
        reason = "the worker ended with status %d during the run's %s stage%s" % (
            status, progress.get("stage"), ": " + why if why else "")
    rec = dict(spec)
    rec.update({"outcome": outcome, "stage": progress.get("stage"), "reason": reason,
                "l1": progress.get("l1"), "started_utc": progress.get("at_utc"),
                "durations": {}, "figures": {}, "figures_run": {}})
    d = os.path.join(RUNS_DIR, run_dir_name(spec))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "l1-console.txt"), "w") as f:
        f.write(tail)
    with open(os.path.join(d, "summary.txt"), "w") as f:
        f.write("run %d: %s %s\noutcome: %s at stage %s\nreason: %s\nprogress file: %s\n" % (
            spec["id"], spec["vmm"], spec["mode"], outcome, progress.get("stage"), reason,
            json.dumps(progress)))
    rec["evidence"] = os.path.relpath(d, ROOT)
    rec["signature"] = signature({"l1-console.txt": tail}, MEMORY_MIB[spec["mode"]])
    state["results"][str(spec["id"])] = rec
    log("run %d (L1 %s): %s: %s" % (spec["id"], progress.get("l1"), outcome, reason))


class Rig:
    """One L1 at work: its rig (a session of its own, so that stopping the
    soak stops this rig and its L1, and nothing else), its batch of runs,
    and its console, copied to l1-NNN.log and to ours (each line after
    PREFIX: the L1's number when L1s run side by side)."""

    def __init__(self, l1, ids, argv, env, prefix):
        self.l1, self.ids, self.prefix = l1, ids, prefix
        self.log_path = l1_file("log", l1)
        self.log = open(self.log_path, "wb")
        self.partial = b""
        self.t0 = time.monotonic()
        # The rig is started with SIGINT and SIGTERM blocked (run_rigs),
        # and a blocked signal stays blocked across exec: unblocked, or
        # the rig and its QEMU would not stop at a SIGTERM.
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                     preexec_fn=lambda: signal.pthread_sigmask(
                                         signal.SIG_SETMASK, set()))

    def copy_output(self):
        """Copies what the rig wrote since the last call; False at its end."""
        data = os.read(self.proc.stdout.fileno(), 65536)
        self.log.write(data)
        self.log.flush()
        *lines, self.partial = (self.partial + data).split(b"\n")
        if not data and self.partial:
            lines, self.partial = [self.partial], b""
        for line in lines:
            sys.stdout.buffer.write(self.prefix + line + b"\n")
        sys.stdout.flush()
        return bool(data)

    def signal(self, signum):
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def close(self):
        self.proc.stdout.close()
        self.log.close()


def stop_rigs(state, rigs):
    """Stops every rig and its L1 (SIGTERM; SIGKILL for one that lingers:
    then its run directory in build/rig/ stays behind); the runs they were
    in keep no outcome, for --resume to run again."""
    for rig in rigs:
        rig.signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for rig in rigs:
        try:
            rig.proc.wait(max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rig.signal(signal.SIGKILL)
            rig.proc.wait()
        rig.close()
    merge_l1_results(state)
    for rig in rigs:
        entry = next(e for e in state["l1s"] if e["index"] == rig.l1)
        entry.update({"ended_utc": utc_now(), "status": rig.proc.returncode,
                      "wall_s": round(time.monotonic() - rig.t0, 1), "stopped": True,
                      "runs": sum(str(i) in state["results"] for i in rig.ids)})


def start_rig(state, ids):
    """A new L1 running the runs IDS."""
    params = state["parameters"]
    l1 = len(state["l1s"]) + 1
    # A backstop for an L1 that wedges: every run has its own timeouts.
    per_run = 4 * params["hang_timeout"] + params["migrate_timeout"] + 180
    timeout = os.environ.get("HK_RIG_TIMEOUT") or str(len(ids) * per_run + 600)
    state["l1s"].append({"index": l1, "started_utc": utc_now(), "ids": ids})
    write_json(STATE, state)
    write_progress({"run": None, "l1": l1, "at_utc": utc_now()})
    env = dict(os.environ, HK_RIG_MEM=str(rig_memory(params["parallel"])),
               HK_RIG_TIMEOUT=timeout)
    argv = [os.path.join(ROOT, "scripts/rig"), "--", sys.executable,
            os.path.abspath(__file__), "--worker", "--l1", str(l1),
            "--ids", ",".join(map(str, ids)), "--name", params.get("name", PROG)]
    log("L1 %d: runs %s (%d left); its console: %s" % (
        l1, id_ranges(ids), len(pending(state)), os.path.relpath(l1_file("log", l1), ROOT)))
    prefix = "[L1 %d] " % l1 if params["parallel"] > 1 else ""
    return Rig(l1, ids, argv, env, prefix.encode())


def end_rig(state, rig, status):
    """What an L1 that ended leaves: its outcomes, and the run it was in
    when it died, if any (record_lost_run). The rest of its batch is
    pending again, for another L1."""
    merge_l1_results(state)
    entry = next(e for e in state["l1s"] if e["index"] == rig.l1)
    entry.update({"ended_utc": utc_now(), "status": status,
                  "wall_s": round(time.monotonic() - rig.t0, 1)})
    progress = read_json(l1_file("progress", rig.l1)) or {}
    if progress.get("run") and str(progress["run"]) not in state["results"]:
        record_lost_run(state, progress, status, rig.log_path)
    entry["runs"] = sum(str(i) in state["results"] for i in rig.ids)
    write_json(STATE, state)
    write_results(state)


def run_rigs(state, args):
    """Keeps up to --parallel L1s running until every run has an outcome.
    Each new L1 takes the first pending runs no other L1 has, in plan
    order: --runs-per-l1 of them, or fewer when fewer are left to share
    among the L1s to start."""
    params = state["parameters"]
    parallel = params["parallel"]
    rigs = {}       # its output's fd -> Rig
    sel = selectors.DefaultSelector()
    idle_l1s = 0
    merged_at = time.monotonic()
    try:
        while True:
            taken = {i for rig in rigs.values() for i in rig.ids}
            free = [r["id"] for r in pending(state) if r["id"] not in taken]
            while free and len(rigs) < parallel:
                count = min(params["runs_per_l1"], -(-len(free) // (parallel - len(rigs))))
                # A stop comes after the rig is in RIGS, where it is stopped.
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
                try:
                    rig = start_rig(state, free[:count])
                    rigs[rig.proc.stdout.fileno()] = rig
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
                free = free[count:]
                sel.register(rig.proc.stdout, selectors.EVENT_READ, rig)
            if not rigs:
                break
            for key, _ in sel.select(timeout=5):
                rig = key.data
                if rig.copy_output():
                    continue
                sel.unregister(rig.proc.stdout)
                del rigs[key.fd]
                status = rig.proc.wait()
                rig.close()
                end_rig(state, rig, status)
                entry = next(e for e in state["l1s"] if e["index"] == rig.l1)
                if status not in (0, 124, 125) and not entry["runs"]:
                    die("L1 %d ended with status %d and ran nothing: %s" % (
                        rig.l1, status, os.path.relpath(rig.log_path, ROOT)))
                idle_l1s = idle_l1s + 1 if not entry["runs"] else 0
                if idle_l1s >= 3:
                    die("three L1s in a row ran nothing; see %s" % os.path.relpath(
                        rig.log_path, ROOT))
            # The outcomes of the L1s still at work, as they come.
            if time.monotonic() - merged_at >= 5:
                merged_at = time.monotonic()
                if merge_l1_results(state):
                    write_json(STATE, state)
                    write_results(state)
    except BaseException:
        # Stopped (SIGINT, SIGTERM) or given up (die): no L1 is left, and
        # the outcomes they recorded are kept.
        stop_rigs(state, list(rigs.values()))
        write_json(STATE, state)
        raise
    return state


def lock_soak():
    """One driver per soak: a second one (a --resume while the soak still
    runs) would start L1s for the same runs. The lock lives on the host,
    where flock works; the workers in L1 never need it."""
    f = open(os.path.join(STATE_DIR, "driver.lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        die("another driver (pid %s) is running the soak in %s" % (
            f.read().strip() or "?", os.path.relpath(STATE_DIR, ROOT)))
    f.truncate(0)
    f.write("%d\n" % os.getpid())
    f.flush()
    return f


def drive(args):
    """The host side: a new or resumed soak, run in L1s or here."""
    os.makedirs(STATE_DIR, exist_ok=True)
    lock = lock_soak()  # noqa: F841 - held until the soak ends
    state = read_json(STATE)
    if args.resume:
        if not state:
            die("nothing to resume: no %s" % os.path.relpath(STATE, ROOT))
        params = state["parameters"]
        # --parallel may change on resuming; without it, the soak's own.
        parallel = args.parallel or params.get("parallel", 1)
        if args.rig:
            check_rig_memory(parallel)
        # What its L1s recorded after the last driver last looked (one
        # killed with SIGKILL, say).
        merge_l1_results(state)
        log("resuming: %d of %d runs done" % (len(state["results"]), len(state["plan"])))
        params["rig"] = args.rig
        if params.get("parallel", 1) != parallel and args.rig and state.get("host"):
            state["host"].update(rig_parallel=parallel, rig_memory_mib=rig_memory(parallel))
        params["parallel"] = parallel
        write_json(STATE, state)
    else:
        if state and pending(state) and not args.fresh:
            die("%s holds a soak with %d of %d runs done: --resume continues it, --fresh "
                "starts over" % (os.path.relpath(STATE, ROOT), len(state["results"]),
                                 len(state["plan"])))
        args.parallel = args.parallel or 1
        if args.rig:
            check_rig_memory(args.parallel)
        params = {k: getattr(args, k) for k in (
            "runs", "modes", "vmms", "runs_per_l1", "hang_timeout", "migrate_timeout",
            "kvm_trace", "verify_pages", "counter_check", "rig", "hakoniwa", "kernel", "initramfs", "qemu",
            "name", "parallel")}
        state = {"soak": "migration", "command": "scripts/migration-soak" + "".join(
                     " " + a for a in sys.argv[1:] if a != "--rig"),
                 "started_utc": utc_now(), "parameters": params,
                 "plan": plan(args.runs, args.modes, args.vmms), "results": {}, "l1s": [],
                 "l1_environments": {}}
        # The last soak's evidence stays at hand until the next one.
        previous = os.path.join(STATE_DIR, "previous-runs")
        shutil.rmtree(previous, ignore_errors=True)
        if os.path.isdir(RUNS_DIR):
            shutil.move(RUNS_DIR, previous)
        for name in os.listdir(STATE_DIR):
            if L1_FILE_RE.match(name):
                os.remove(os.path.join(STATE_DIR, name))
        state["host"] = host_environment(params)
        write_json(STATE, state)
        log("%d runs: %d iterations of %s with %s" % (
            len(state["plan"]), args.runs, ", ".join(args.modes), " and ".join(args.vmms)))
    t = time.monotonic()

    def stop(signum, frame):
        # Once: a second ^C must not cut short the stopping of the rigs
        # (which ends with SIGKILL for any that lingers).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        if args.rig:
            state = run_rigs(state, args)
        else:
            ids = [r["id"] for r in pending(state)]
            state["l1s"].append({"index": 0, "started_utc": utc_now(), "ids": ids})
            write_json(STATE, state)
            t_here = time.monotonic()

            def merge_here():
                merge_l1_results(state)
                write_json(STATE, state)
                write_results(state)
            worker(0, ids, merge_here)
            merge_l1_results(state)
            state["l1s"][-1].update({"ended_utc": utc_now(), "status": 0,
                                     "wall_s": round(time.monotonic() - t_here, 1),
                                     "runs": sum(str(i) in state["results"] for i in ids)})
            write_json(STATE, state)
    except KeyboardInterrupt:
        # The runs in progress have no outcome: --resume runs them again.
        log("stopped: %d of %d runs done; --resume continues" % (
            len(read_json(STATE)["results"]), len(state["plan"])))
        return 130
    finally:
        state = read_json(STATE)
        merge_l1_results(state)
        state["wall_s"] = round(state.get("wall_s", 0) + time.monotonic() - t, 1)
        write_json(STATE, state)
        write_results(state)
    print(text_summary(state))
    print("wrote %s and .md" % os.path.relpath(RESULTS_JSON, ROOT))
    return 0


# --------------------------------------------------------------- results ---

def runs_of(result):
    return sorted(result["runs"], key=lambda r: r["id"])


def write_results(state):
    """bench/results/migration-soak.{json,md} from the state."""
    result = {k: state.get(k) for k in ("soak", "command", "started_utc", "parameters",
                                        "host", "l1_environments", "l1s", "wall_s")}
    result["planned"] = len(state["plan"])
    result["runs"] = [state["results"][k] for k in sorted(state["results"], key=int)]
    write_json(RESULTS_JSON, result)
    write_md(RESULTS_MD, result)


def group_key(r):
    """Rows of the tables: mode (postcopy-bg split by async PF) and VMM."""
    label = r["mode"]
    if r["mode"] == "postcopy-bg":
        label += ", async PF %s" % r["async_pf"]
    return label, r["vmm"]


def groups(result):
    out = {}
    for r in runs_of(result):
        out.setdefault(group_key(r), []).append(r)
    order = {m: i for i, m in enumerate(MODES)}
    return sorted(out.items(), key=lambda kv: (
        order.get(kv[1][0]["mode"], 9), kv[0][0],
        VMMS.index(kv[0][1]) if kv[0][1] in VMMS else 9))


def spread(values, fmt="%.0f"):
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    if len(v) == 1:
        return fmt % v[0]
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(v), min(v), max(v))


def outcome_table(result):
    kinds = [k for k in OUTCOMES if k != "ok"]
    rows = [["mode", "VMM", "runs", "ok"] + kinds]
    for (label, vmm), rs in groups(result):
        rows.append([label, vmm, str(len(rs)), str(sum(r["outcome"] == "ok" for r in rs))]
                    + [str(sum(r["outcome"] == k for r in rs) or "") for k in kinds])
    return rows


def time_table(result):
    rows = [["mode", "VMM", "runs", "boot s", "workload s", "migrate s", "after s",
             "whole run s"]]
    for (label, vmm), rs in groups(result):
        rows.append([label, vmm, str(len(rs))] + [
            spread([r["durations"].get(k) for r in rs if r["outcome"] == "ok"], "%.1f")
            for k in ("boot_s", "workload_s", "migrate_s", "after_s")] + [
            spread([r["durations"].get("total_s") for r in rs], "%.0f")])
    return rows


def figure_table(result):
    rows = [["mode", "VMM", "ok runs", "downtime ms", "total s", "MiB sent",
             "rounds / dirty syncs", "notes"]]
    for (label, vmm), rs in groups(result):
        ok = [r for r in rs if r["outcome"] == "ok"]
        if not ok:
            continue
        f = [r["figures"] for r in ok]
        notes = []
        touch = [r["figures_run"].get("touch_max_s") for r in ok]
        if any(t is not None for t in touch):
            notes.append("touch after the go line %s s" % spread(touch, "%.1f"))
        if vmm == "qemu" and ok[0]["mode"] == "hybrid":
            notes.append("postcopy from %s s" % spread([x.get("postcopy_started_s")
                                                        for x in f], "%.1f"))
        if vmm == "qemu" and ok[0]["mode"] == "precopy-dirty":
            raised = [x.get("downtime_limit_raised_s") for x in f]
            n = sum(x is not None for x in raised)
            notes.append("downtime limit raised in %d of %d, at %s s" % (
                n, len(f), spread(raised, "%.1f")) if n else
                "converged within %d dirty syncs (downtime limit never raised)"
                % QEMU_PRECOPY_SYNCS)
        # "round 2: the guest dirties ..." -> "round 2"
        reasons = [x["switch_reason"].split(":")[0] for x in f if x.get("switch_reason")]
        if reasons:
            notes.append("switched to postcopy after " + ", ".join(
                "%s (%d)" % (r, reasons.count(r)) for r in sorted(set(reasons))))
        verified = [(x.get("pages") or {}).get("verified") for x in f]
        if any(verified):
            notes.append("pages verified %s" % spread(verified))
        rows.append([label, vmm, str(len(ok)), spread([x.get("downtime_ms") for x in f]),
                     spread([(x.get("total_ms") or 0) / 1000 if x.get("total_ms") is not None
                             else None for x in f], "%.1f"),
                     spread([x.get("mib_sent") for x in f]),
                     spread([x.get("rounds") for x in f]), "; ".join(notes)])
    return rows


def text_summary(state):
    result = {"runs": list(state["results"].values())}
    lines = ["outcomes:"]
    for row in outcome_table(result)[1:]:
        bad = ", ".join("%s %s" % (n, k) for n, k in zip(row[4:], OUTCOMES[1:]) if n)
        lines.append("  %-28s %-8s %s of %s ok%s" % (
            row[0], row[1], row[3], row[2], "; " + bad if bad else ""))
    return "\n".join(lines)


def write_md(path, result):
    params, host = result["parameters"], result.get("host") or {}
    envs = result.get("l1_environments") or {}
    first_env = envs[min(envs, key=int)] if envs else {}
    runs = runs_of(result)
    L = ["# Migration soak: hakoniwa and QEMU, the same migrations", ""]
    L.append("Generated by `%s`, started %s (%s): %d of %d runs, %d L1%s, %.0f min." % (
        result["command"], result["started_utc"], "rig" if params["rig"] else "host",
        len(runs), result["planned"], len(result.get("l1s") or []),
        "" if len(result.get("l1s") or []) == 1 else "s", (result.get("wall_s") or 0) / 60))
    L.append("")
    L.append("Each run boots a fresh source VM of one VMM, gives its guest a workload, "
             "migrates it over loopback to a fresh destination and checks the guest "
             "there; hakoniwa and QEMU (`-M pc -enable-kvm -cpu host -no-reboot`) run the "
             "same kernel, initramfs, command line (`%s`) and guest tools, interleaved "
             "(iteration by iteration, both VMMs of a mode next to each other, which "
             "first alternating)%s. A kind of failure QEMU shows as often as hakoniwa "
             "points at the rig; one only hakoniwa shows points at hakoniwa." % (
                 CMDLINE, ", in L1s of up to %d runs each, a new one after any L1 died"
                 % params["runs_per_l1"] if params["rig"] else ""))
    L.append("")
    L.append("- **precopy-dirty**: 1 vCPU, 512 MiB; 96 MiB of random data in /dev/shm, a "
             "counter, `%s` (as fast as it can). hakoniwa `ctl migrate %s`; QEMU precopy "
             "without a bandwidth cap, and after %d dirty syncs `downtime-limit` %d ms so "
             "that it stops the way hakoniwa's round limit does." % (
                 DIRTY_CMD.rstrip(" &"), " ".join(HK_MIGRATE["precopy-dirty"]),
                 QEMU_PRECOPY_SYNCS, QEMU_LAST_DOWNTIME_MS))
    L.append("- **postcopy-bg**: 1 vCPU, 1024 MiB; the data, the counter and `%s` (fills "
             "400 MiB, waits); hakoniwa `ctl migrate %s` (background push on); QEMU "
             "`postcopy-ram` and `migrate-start-postcopy` at once; the go line is typed "
             "on the destination as soon as it runs the guest, and every byte is read "
             "back (check=ok). Odd iterations add `no-kvmapf` to the guest's command "
             "line (async page faults off) for both VMMs." % (
                 TOUCH_CMD, " ".join(HK_MIGRATE["postcopy-bg"])))
    L.append("- **hybrid**: 1 vCPU, 512 MiB; the data, the counter and a loop copying the "
             "data again and again; hakoniwa `ctl migrate %s`; QEMU `postcopy-ram`, "
             "%d MiB/s (precopy and postcopy), `migrate-start-postcopy` after %d dirty "
             "syncs." % (" ".join(HK_MIGRATE["hybrid"]), HYBRID_MIB_S, QEMU_HYBRID_SYNCS))
    L.append("")
    L.append("After each migration, on the destination: the shell answers, the counter "
             "advances over 1.5 s%s, the data's md5sum is the source's, the dirtying job "
             "is alive. hakoniwa runs with `--dump-dir`%s where the binary has them "
             "(features per L1 below)." % (
                 COUNTER_CHECK_TEXT[counter_check(params)],
                 " and `migrate --verify-pages`" if params.get("verify_pages", True) else
                 " (not `migrate --verify-pages`: --verify-pages off)"))
    L.append("")
    L.append("## Outcomes")
    L.append("")
    L.append(md_table(outcome_table(result)))
    L.append("")
    L.append("*triple_fault*: hakoniwa said \"triple-faulted\", or QEMU ended with a "
             "guest-reset SHUTDOWN and no reboot or panic on the console; *guest_panic*: "
             "the guest's console shows a panic, BUG, Oops or general protection fault; "
             "*vmm_error*: the VMM stopped on an error of its own or of KVM (KVM internal "
             "error, failed VM entry, a crash); *hang*: no answer within %d s (a shell "
             "command, the prompt, the go line's result, a QMP command) or a migration "
             "not done within %d s, or a stopped counter; *data_mismatch*: the md5sum, "
             "the counter, hk-memtouch's check or hakoniwa's --verify-pages disagree, or "
             "the dirtying job died; *migration_failed*: the VMM reported the migration "
             "failed (or its destination ended during it without a reason above); "
             "*l1_panic*: the rig's L1 died (status 125) or timed out (124) during the "
             "run; *harness_error*: anything else." % (
                 params["hang_timeout"], params["migrate_timeout"]))
    L.append("")
    failed = [r for r in runs if r["outcome"] != "ok"]
    if failed:
        signed = {vmm: [r for r in failed if r["vmm"] == vmm and run_signature(r)]
                  for vmm in params["vmms"]}
        L.append("Failing runs whose evidence shows a known fault of the rig "
                 "(bench/lib/rigfaults.py; docs/rig.md, \"L1's state in L2\"): %s." % ", ".join(
                     "%s %d of %d" % (vmm, len(signed[vmm]),
                                      sum(1 for r in failed if r["vmm"] == vmm))
                     for vmm in signed))
        L.append("")
        L.append("## Failing runs")
        L.append("")
        for r in failed:
            ev = r.get("evidence")
            link = ("[%03d](%s/)" % (r["id"], os.path.relpath(os.path.join(ROOT, ev), RESULTS))
                    if ev else "%03d" % r["id"])
            sig = run_signature(r)
            L.append("- %s %s %s%s, L1 %s: **%s** at %s: %s%s" % (
                link, r["vmm"], r["mode"], ", async PF off" if r["async_pf"] == "off" else "",
                r.get("l1"), r["outcome"], r.get("stage"),
                (r.get("reason") or "").splitlines()[0][:400] if r.get("reason") else "",
                ". *Rig fault*: " + sig if sig else ""))
        L.append("")
    L.append("## Time per run")
    L.append("")
    L.append("Seconds, median (min-max); stages of the runs that passed, the whole run "
             "(with the teardown and any evidence) of all.")
    L.append("")
    L.append(md_table(time_table(result)))
    L.append("")
    if any(r["outcome"] == "ok" for r in runs):
        L.append("## Migration figures")
        L.append("")
        L.append("Runs that passed; median (min-max). Downtime and total time are each "
                 "VMM's own: hakoniwa's destination report, QEMU's `query-migrate` on "
                 "the source.")
        L.append("")
        L.append(md_table(figure_table(result)))
        L.append("")
    L.append("## Environment")
    L.append("")
    L.append("- host: %s, %s, %s CPUs; git %s%s" % (
        host.get("host_kernel"), host.get("cpu_model"), host.get("cpus"),
        host.get("git_commit"), " with uncommitted changes to %s" % ", ".join(
            line[3:] for line in host.get("git_uncommitted") or [])
        if host.get("git_uncommitted") else ""))
    if params["rig"]:
        parallel = host.get("rig_parallel") or 1
        L.append("- rig (L1's emulator): %s; %s, each with %s vCPU%s (TCG %s) and %s MiB" % (
            host.get("rig_qemu"), "%d L1s side by side" % parallel if parallel > 1 else
            "one L1 at a time", host.get("rig_cpus") or "-",
            "" if host.get("rig_cpus") == 1 else "s", host.get("rig_tcg") or "-",
            host.get("rig_memory_mib")))
        if host.get("rig_timer") or host.get("rig_append"):
            L.append("- L1's timer: %s%s" % (
                {"periodic": "a periodic local APIC tick (`lapic=notscdeadline nohz=off "
                             "highres=off`)",
                 "oneshot": "TSC deadline, tickless (the kernel's choice)"}.get(
                     host.get("rig_timer"), host.get("rig_timer") or "-"),
                "; more kernel words: `%s`" % host["rig_append"] if host.get("rig_append") else ""))
    if first_env:
        L.append("- %s: kernel %s, %s CPUs, %s MiB, THP %s, KVM %s" % (
            "L1" if params["rig"] else "host", first_env.get("kernel"), first_env.get("cpus"),
            first_env.get("memory_mib"), first_env.get("thp"), first_env.get("kvm")))
        L.append("- QEMU under test (in L1): %s" % first_env.get("qemu_version"))
        L.append("- guest: %s, initramfs sha256 %s, command line `%s`" % (
            first_env.get("guest_kernel_package") or first_env.get("guest_kernel_version"),
            (first_env.get("guest_initramfs_sha256") or "-")[:16], CMDLINE))
    shas = sorted({(e.get("hakoniwa_version"), e.get("hakoniwa_binary_sha256"),
                    json.dumps(e.get("hakoniwa_features"), sort_keys=True))
                   for e in envs.values()})
    for version, sha, features in shas:
        l1s = [k for k, e in sorted(envs.items(), key=lambda kv: int(kv[0]))
               if (e.get("hakoniwa_version"), e.get("hakoniwa_binary_sha256"),
                   json.dumps(e.get("hakoniwa_features"), sort_keys=True))
               == (version, sha, features)]
        L.append("- %s, binary sha256 %s, features %s (L1 %s)" % (
            version, (sha or "-")[:16], features, ", ".join(l1s)))
    L.append("- KVM trace kept for failing runs: %s" % (
        "yes" if first_env.get("kvm_trace") else "no"))
    L.append("- L1s: %s" % "; ".join(
        "%s: %s, %s runs, %s s" % (
            e["index"], "stopped with the soak" if e.get("stopped") else
            "status %s" % e.get("status", "-"), e.get("runs", "-"), e.get("wall_s", "-"))
        for e in result.get("l1s") or []))
    L.append("- parameters: %s" % ", ".join(
        "%s=%s" % (k, ",".join(v) if isinstance(v, list) else v)
        for k, v in sorted(params.items()) if k not in ("hakoniwa", "kernel", "initramfs")))
    L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L))


# ------------------------------------------------------------------ main ---

class OneLineParser(argparse.ArgumentParser):
    """Bad flags: one clear line, status 2."""

    def error(self, message):
        die(message)


def parse_list(text, allowed, what):
    items = [x for x in text.split(",") if x]
    bad = [x for x in items if x not in allowed]
    if bad or not items or len(set(items)) != len(items):
        die("bad %s '%s' (one or more of %s, comma-separated)" % (
            what, text, ",".join(allowed)))
    return items


def main():
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30, help="iterations (default 30)")
    p.add_argument("--modes", default=",".join(MODES), help="default all: " + ",".join(MODES))
    p.add_argument("--vmms", default=",".join(VMMS), help="default both: hakoniwa,qemu")
    p.add_argument("--runs-per-l1", type=int, default=12,
                   help="runs before the L1 is replaced (default 12)")
    p.add_argument("--parallel", type=int, metavar="N",
                   help="L1s side by side, each with runs of its own (default 1; on "
                        "--resume, the soak's); with HK_RIG_CPUS=1, one a host core")
    p.add_argument("--hang-timeout", type=int, default=120,
                   help="seconds the guest may take to answer (default 120)")
    p.add_argument("--migrate-timeout", type=int, default=300,
                   help="seconds a migration may take (default 300)")
    p.add_argument("--kvm-trace", choices=["on", "off"], default="on",
                   help="KVM's trace events during each run, kept for failing runs "
                        "(default on)")
    p.add_argument("--verify-pages", choices=["on", "off"], default="on",
                   help="hakoniwa's `migrate --verify-pages`, where the binary has it "
                        "(default on; it checksums every page while the guest is stopped)")
    p.add_argument("--counter-check", choices=COUNTER_CHECKS, default="settled",
                   help="when hybrid reads the destination's counter: settled (default), "
                        "after a first shell command and with the copying loop stopped; "
                        "churn, after that command with the loop still running; first, as "
                        "tests/guest_migration.rs's chain does: the first commands, the "
                        "loop still running")
    p.add_argument("--resume", action="store_true", help="continue the soak in build/soak")
    p.add_argument("--fresh", action="store_true",
                   help="start over even if build/soak holds an unfinished soak")
    p.add_argument("--rig", action="store_true",
                   help="run in the test rig's L1s (scripts/migration-soak decides)")
    p.add_argument("--report", metavar="JSON",
                   help="rebuild migration-soak.md from JSON; run nothing")
    add_path_options(p, "hakoniwa", "kernel", "initramfs", "qemu")
    p.add_argument("--name", default=PROG,
                   help="a soak of its own: state in build/soak-NAME/, results in "
                   "bench/results/NAME.{json,md} (default %s)" % PROG)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--l1", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    args = p.parse_args()
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", args.name):
        die("--name %r: use lowercase letters, digits and dashes" % args.name)
    set_name(args.name)

    if args.report:
        result = read_json(os.path.abspath(args.report))
        if not result:
            die("--report %s: no such file" % args.report)
        write_md(RESULTS_MD, result)
        print("wrote %s" % os.path.relpath(RESULTS_MD, ROOT))
        return 0
    if args.worker:
        try:
            ids = [int(x) for x in args.ids.split(",")] if args.ids else None
        except ValueError:
            die("--ids %r: run numbers, comma-separated" % args.ids)
        return worker(args.l1, ids)
    if args.runs < 1 or args.runs_per_l1 < 1:
        die("--runs and --runs-per-l1 must be at least 1")
    if args.parallel is not None and args.parallel < 1:
        die("--parallel must be at least 1")
    if (args.parallel or 1) > 1 and not args.rig:
        die("--parallel runs L1s side by side, in the test rig (--rig); here runs go one "
            "at a time")
    if args.hang_timeout < 10 or args.migrate_timeout < 10:
        die("--hang-timeout and --migrate-timeout must be at least 10 s")
    if args.resume and args.fresh:
        die("--resume and --fresh exclude each other")
    args.modes = parse_list(args.modes, MODES, "--modes")
    args.vmms = parse_list(args.vmms, VMMS, "--vmms")
    args.kvm_trace = args.kvm_trace == "on"
    args.verify_pages = args.verify_pages == "on"
    for path in (args.kernel, args.initramfs):
        if not os.path.isfile(path):
            die("%s is missing (scripts/build-guest builds it)" % path)
    if not os.access(args.hakoniwa, os.X_OK):
        die("%s is missing (cargo build --release)" % args.hakoniwa)
    for k in ("hakoniwa", "kernel", "initramfs"):
        setattr(args, k, os.path.abspath(getattr(args, k)))
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
