"""Shared pieces of the benchmarks that drive a hakoniwa guest: its serial
console (stdin/stdout of `hakoniwa run`) and `hakoniwa ctl`. Standard
library only."""

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
