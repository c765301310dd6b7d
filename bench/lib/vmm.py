"""A VMM process (hakoniwa or QEMU) with its console and stderr, one run
to its end, and a free TCP port for a migration."""

import os
import signal
import socket
import subprocess
import time

from .console import Console, PipeReader


class Proc:
    """A VMM process: its console (stdout) and its stderr, both collected
    (at most LIMIT bytes of each; WATCH: console patterns timestamped as
    they arrive, PipeReader). STDIN: the console's input, a pipe unless
    said otherwise (subprocess.DEVNULL)."""

    def __init__(self, argv, name, stdin=subprocess.PIPE, limit=None, watch=()):
        self.name = name
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, close_fds=True)
        self.con = Console(self.proc, limit, watch)
        self.err = PipeReader(self.proc.stderr.fileno(), limit)

    def stderr(self):
        return self.err.text()

    def wait_stderr(self, text, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.stderr():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def stop(self, grace=5):
        """SIGTERM, and SIGKILL after GRACE seconds: (exit status, seconds
        it took, whether it was killed)."""
        proc = self.proc
        t = time.monotonic()
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return proc.returncode, time.monotonic() - t, True
        return proc.returncode, time.monotonic() - t, False

    def tails(self):
        return "console: %r; stderr: %r" % (self.con.tail(400), self.stderr()[-600:])


def run_to_end(argv, name, timeout, stalled=None, tick=None):
    """Runs a VMM (its console's input empty) to its end; a dict with its
    status, its output, times and its CPU time (user + system, all
    threads). At TIMEOUT seconds it gets SIGTERM, and SIGKILL 5 s later.
    STALLED, if given, is polled: a true value (a reason) stops it at once
    the same way. TICK, if given, is called with the Proc at every poll
    (every 50 ms) while the VMM runs (lib.procstat.PhaseSampler.tick)."""
    t0 = time.monotonic()
    vm = Proc(argv, name, stdin=subprocess.DEVNULL)
    proc = vm.proc
    deadline = t0 + timeout
    timed_out = False
    stall = None
    rusage = None
    while True:
        pid, wstatus, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if tick:
            tick(vm)
        if not timed_out and stalled and not stall:
            stall = stalled()
            if stall:
                deadline = 0
        if time.monotonic() > deadline and not timed_out:
            timed_out = True
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
        elif timed_out and time.monotonic() > deadline:
            proc.kill()
            deadline = float("inf")
        time.sleep(0.05)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(wstatus)
    for reader in (vm.con, vm.err):
        reader.thread.join(5)
    return {
        "status": proc.returncode,
        "timed_out": timed_out,
        "stalled": stall,
        "wall_s": wall,
        "vmm_cpu_s": rusage.ru_utime + rusage.ru_stime,
        "stdout": vm.con.text(),
        "stderr": vm.err.text(),
    }


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
