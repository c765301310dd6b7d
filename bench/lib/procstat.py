"""What a VMM process costs the host while a guest works: CPU time by
thread kind (vCPU threads, which run the guest, apart from the rest, which
emulate its devices) and resident memory apart from the guest's RAM, read
from /proc and sampled at the phase markers the guest prints on its
console (`hk-phase begin NAME` / `hk-phase end NAME`)."""

import os
import re

# vCPU threads: hakoniwa names them vcpuN, QEMU "CPU N/KVM".
VCPU_THREAD_RE = re.compile(r"^(vcpu\d+|CPU \d+/KVM)$")
PHASE_RE = re.compile(rb"^hk-phase (begin|end) (\S+?)\r?\n", re.M)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid):
    """(CPU seconds of all threads, of the vCPU threads) of process PID,
    user + system, from /proc/PID/task/*/stat; None once it is gone.
    Threads that ended are counted by the process's own total only, so
    the total is taken from /proc/PID/stat (it includes them)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            total = _stat_ticks(f.read())
        vcpu = 0
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                    comm = f.read().strip()
                if not VCPU_THREAD_RE.match(comm):
                    continue
                with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                    vcpu += _stat_ticks(f.read())
            except OSError:
                continue  # the thread ended meanwhile
        return total / CLK_TCK, vcpu / CLK_TCK
    except OSError:
        return None


def _stat_ticks(stat, system_only=False):
    # utime and stime are fields 14 and 15; the command name (field 2) may
    # hold spaces and parentheses, so count from its closing parenthesis.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[12]) + (0 if system_only else int(fields[11]))


def thread_times(pid):
    """{tid: (thread name with its digits as N, CPU seconds user + system,
    CPU seconds system)} of the threads of process PID alive now, or None
    once it is gone."""
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return None
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                name = re.sub(r"\d+", "N", f.read().strip())
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        out[int(tid)] = (name, _stat_ticks(stat) / CLK_TCK, _stat_ticks(stat, True) / CLK_TCK)
    return out


class ThreadCpu:
    """A process's CPU seconds by thread name from now on, a thread that
    ends counted up to its last reading: `tick()` now and then (each
    reading of a thread replaces its previous one), `by_name()` for the
    sums. For threads that live shorter than the process (a migration's
    TLS pump ends with its connection)."""

    def __init__(self, pid):
        self.pid = pid
        self.base = thread_times(pid) or {}
        self.last = dict(self.base)

    def tick(self):
        """Reads the threads again; False once the process is gone."""
        now = thread_times(self.pid)
        if now is None:
            return False
        self.last.update(now)
        return True

    def by_name(self):
        """({name: CPU s}, {name: system CPU s}) since the start, rounded
        to 10 ms."""
        cpu, system = {}, {}
        for tid, (name, a, s) in self.last.items():
            _, a0, s0 = self.base.get(tid, (name, 0, 0))
            cpu[name] = cpu.get(name, 0) + a - a0
            system[name] = system.get(name, 0) + s - s0
        return ({k: round(v, 2) for k, v in cpu.items()},
                {k: round(v, 2) for k, v in system.items()})


def busy_seconds():
    """(CPU seconds this machine's CPUs were busy, seconds in all) since
    boot, from /proc/stat's first line: busy is all but idle and iowait
    (iowait can step back a little on a tickless kernel)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    total = sum(fields[:8])  # guest time is already inside user
    return (total - fields[3] - fields[4]) / CLK_TCK, total / CLK_TCK


def thread_kinds(pid):
    """{thread name without its digits: count} of process PID (e.g.
    io_uring's workers "iou-wrk-"), or None once it is gone."""
    kinds = {}
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                    kind = re.sub(r"\d+", "N", f.read().strip())
            except OSError:
                continue
            kinds[kind] = kinds.get(kind, 0) + 1
    except OSError:
        return None
    return kinds


def rss_apart_from_guest(pid, guest_min_kib):
    """(resident KiB outside the guest's RAM, resident KiB of the guest's
    RAM) of process PID from /proc/PID/smaps; the guest's RAM is every
    mapping of at least GUEST_MIN_KIB (nothing else a VMM maps is that
    large); None once the process is gone."""
    try:
        with open("/proc/%d/smaps" % pid) as f:
            text = f.read()
    except OSError:
        return None
    other = guest = 0
    size = 0
    for line in text.splitlines():
        if line.startswith("Size:"):
            size = int(line.split()[1])
        elif line.startswith("Rss:"):
            rss = int(line.split()[1])
            if size >= guest_min_kib:
                guest += rss
            else:
                other += rss
    return other, guest


class PhaseSampler:
    """Samples a VMM's CPU time at each phase marker its guest prints, and
    its resident memory at each phase's end; `phases()` gives per phase the
    seconds of CPU of the device side (all threads but the vCPUs) and of
    the vCPU threads, and `rss_kib()` the largest resident size outside the
    guest's RAM. The markers are read from the console as they arrive
    (`tick`, polled by lib.vmm.run_to_end), so a sample lands within a
    poll (50 ms) of its marker: the guest waits a little after each."""

    def __init__(self, guest_min_kib, extra=None):
        """EXTRA, if given, is called at each marker too; what it returns
        is kept in `extras` as (begin|end, phase name, value) (e.g. the
        VMM's own counters)."""
        self.guest_min_kib = guest_min_kib
        self.extra = extra
        self.pos = 0
        self.samples = []  # (begin|end, name, (total, vcpu) or None)
        self.rss = []  # (name, (other, guest))
        self.extras = []
        self.threads = {}  # phase name -> thread_kinds at its end

    def tick(self, vm):
        with vm.con.cond:
            data = bytes(vm.con.buf[self.pos:])
        last = 0
        for m in PHASE_RE.finditer(data):
            kind, name = m.group(1).decode(), m.group(2).decode()
            self.samples.append((kind, name, thread_cpu(vm.proc.pid)))
            if self.extra:
                self.extras.append((kind, name, self.extra()))
            if kind == "end":
                r = rss_apart_from_guest(vm.proc.pid, self.guest_min_kib)
                if r:
                    self.rss.append((name, r))
                self.threads[name] = thread_kinds(vm.proc.pid)
            last = m.end()
        self.pos += last

    def phases(self):
        """{name: {"device_cpu_s", "vcpu_cpu_s"}} for every phase with both
        samples."""
        begin, out = {}, {}
        for kind, name, cpu in self.samples:
            if cpu is None:
                continue
            if kind == "begin":
                begin[name] = cpu
            elif name in begin:
                t0, v0 = begin[name]
                t1, v1 = cpu
                out[name] = {"device_cpu_s": (t1 - v1) - (t0 - v0), "vcpu_cpu_s": v1 - v0}
        return out

    def rss_kib(self):
        """(largest KiB outside the guest's RAM, the guest's RAM KiB then),
        or None."""
        if not self.rss:
            return None
        return max((r for _, r in self.rss), key=lambda r: r[0])
