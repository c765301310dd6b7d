"""A VMM process (hakoniwa or QEMU) with its console and stderr, and a
free TCP port for a migration."""

import signal
import socket
import subprocess
import time

from .console import Console, PipeReader


class Proc:
    """A VMM process: its console (stdout) and its stderr, both collected
    (at most LIMIT bytes of each; WATCH: console patterns timestamped as
    they arrive, PipeReader)."""

    def __init__(self, argv, name, limit=None, watch=()):
        self.name = name
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
