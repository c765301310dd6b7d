"""Shared pieces of the benchmarks that drive a hakoniwa guest: its serial
console (stdin/stdout of `hakoniwa run`) and `hakoniwa ctl`. Standard
library only."""

import collections
import json
import os
import re
import subprocess
import threading
import time

PROMPT = b"hakoniwa:/# "
PROMPT_RE = re.compile(re.escape(PROMPT))


class Console:
    """The guest console: a reader thread collects stdout; `wait` finds a
    regex in what arrived after a position."""

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


def ctl(hakoniwa, socket, *cmd):
    """`hakoniwa ctl`; the parsed JSON answer, or its text."""
    out = subprocess.run([hakoniwa, "ctl", "--api-socket", socket, *cmd],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError("ctl %s: status %d: %s" % (" ".join(cmd), out.returncode,
                                                     (out.stderr or out.stdout).strip()))
    return json.loads(out.stdout) if out.stdout.strip().startswith("{") else out.stdout


def stuck_report(pid, seconds=2.0):
    """Why a VM looks stuck: for each of hakoniwa `pid`'s threads, its name,
    scheduler state and kernel stack (root only), read twice `seconds`
    apart, and what KVM's trace events say its vCPUs did meanwhile (exit
    reasons and guest RIPs, where tracefs is writable). A vCPU thread
    blocked in handle_userfault waits for a page; in kvm_vcpu_block (or
    kvm_vcpu_halt) the guest is halted, waiting for an interrupt; running
    with exits, the guest spins. Returns a text, never raises."""
    import glob

    def threads():
        out = []
        for task in sorted(glob.glob("/proc/%d/task/*" % pid)):
            try:
                comm = open(task + "/comm").read().strip()
                stat = open(task + "/stat").read().rsplit(")", 1)[1].split()
                try:
                    stack = [line.split()[1].split("+")[0]
                             for line in open(task + "/stack").read().splitlines()]
                except OSError:
                    stack = []
                out.append("%s %s %s utime=%s stime=%s [%s]" % (
                    os.path.basename(task), comm, stat[0], stat[11], stat[12],
                    " < ".join(stack[:8])))
            except OSError:
                continue
        return out

    lines = ["threads:"] + ["  " + t for t in threads()]
    trace = KvmTrace()
    try:
        trace.start(kib_per_cpu=4096)
        time.sleep(seconds)
        if trace.usable:
            reasons = collections.Counter()
            rips = collections.Counter()
            other = collections.Counter()
            for line in trace.tail(None).splitlines():
                if "kvm_exit:" in line:
                    words = line.split()
                    if "reason" in words:
                        reasons[words[words.index("reason") + 1]] += 1
                    if "rip" in words:
                        rips[words[words.index("rip") + 1]] += 1
                elif ": kvm_" in line:
                    other[line.split(": kvm_")[1].split(":")[0]] += 1
            lines.append("KVM over %.1f s: exits by reason %s; top RIPs %s; other events %s" % (
                seconds, dict(reasons.most_common(8)), dict(rips.most_common(5)), dict(other)))
    except OSError as e:
        lines.append("tracing: %s" % e)
    lines += ["threads again:"] + ["  " + t for t in threads()]
    return "\n".join(lines)


class KvmTrace:
    """KVM's trace events in this kernel's ring buffer (root and tracefs
    only; otherwise it does nothing): `start` clears and enables them,
    `tail` stops tracing and returns the last lines, e.g. the exits and
    injected exceptions before a guest's triple fault."""

    EVENTS = ("kvm_entry", "kvm_exit", "kvm_inj_exception", "kvm_userspace_exit",
              "kvm_async_pf_not_present", "kvm_async_pf_ready", "kvm_async_pf_completed")

    def __init__(self, root="/sys/kernel/tracing"):
        self.root = root
        self.usable = os.access(root + "/tracing_on", os.W_OK) and os.path.isdir(root + "/events/kvm")

    def _write(self, name, value):
        with open(os.path.join(self.root, name), "w") as f:
            f.write(value)

    def start(self, kib_per_cpu=16384):
        if not self.usable:
            return
        self._write("tracing_on", "0")
        self._write("buffer_size_kb", str(kib_per_cpu))
        for event in self.EVENTS:
            if os.path.exists("%s/events/kvm/%s/enable" % (self.root, event)):
                self._write("events/kvm/%s/enable" % event, "1")
        self._write("trace", "")
        self._write("tracing_on", "1")

    def tail(self, lines=400):
        """The last `lines` lines (None: all of them)."""
        if not self.usable:
            return ""
        self._write("tracing_on", "0")
        with open(os.path.join(self.root, "trace")) as f:
            return "".join(collections.deque(f, lines))

    def stop(self):
        if self.usable:
            self._write("tracing_on", "0")
