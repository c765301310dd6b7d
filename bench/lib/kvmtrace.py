"""KVM's trace events in L1 (or the host) and, for a VM that looks stuck,
where its threads are."""

import collections
import glob
import os
import re
import time


class KvmTrace:
    """KVM's trace events in this kernel's ring buffer (root and tracefs
    only; otherwise it does nothing): `start` clears and enables them,
    `tail` stops tracing and returns the last lines, e.g. the exits and
    injected exceptions before a guest's triple fault."""

    EVENTS = ("kvm_entry", "kvm_exit", "kvm_inj_exception", "kvm_userspace_exit",
              "kvm_async_pf_not_present", "kvm_async_pf_ready", "kvm_async_pf_completed")

    def __init__(self, root="/sys/kernel/tracing"):
        self.root = root
        self.usable = (os.access(root + "/tracing_on", os.W_OK)
                       and os.path.isdir(root + "/events/kvm"))

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


TRACE_TIME = re.compile(r"\s\d+\.\d+: ")


def fold_repeats(lines, max_period=8, min_repeats=3):
    """Trace lines with each run of a repeating block (up to MAX_PERIOD
    lines, seen MIN_REPEATS times or more in a row; only the events count,
    not their times and flags) kept
    once and counted: a guest stuck in a loop of exits fills the buffer
    with one block."""
    norm = []
    for line in lines:
        t = TRACE_TIME.search(line)
        norm.append(line[t.end():] if t else line)
    out = []
    i = 0
    while i < len(lines):
        best = None
        for p in range(1, max_period + 1):
            k = 1
            while norm[i + k * p:i + (k + 1) * p] == norm[i:i + p]:
                k += 1
            if k >= min_repeats and (best is None or k * p > best[0] * best[1]):
                best = (k, p)
        if best:
            k, p = best
            out += lines[i:i + p]
            last = lines[i + k * p - 1]
            t = TRACE_TIME.search(last)
            out.append("[... the %d line%s above %d more times, up to%s...]\n" % (
                p, "s" if p > 1 else "", k - 1, t.group(0).rstrip(": ") if t else ""))
            i += k * p
        else:
            out.append(lines[i])
            i += 1
    return out


def stuck_report(pid, seconds=2.0):
    """Why a VM looks stuck: for each of hakoniwa `pid`'s threads, its name,
    scheduler state and kernel stack (root only), read twice `seconds`
    apart, and what KVM's trace events say its vCPUs did meanwhile (exit
    reasons and guest RIPs, where tracefs is writable). A vCPU thread
    blocked in handle_userfault waits for a page; in kvm_vcpu_block (or
    kvm_vcpu_halt) the guest is halted, waiting for an interrupt; running
    with exits, the guest spins. Returns a text, never raises."""

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
