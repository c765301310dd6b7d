"""The guest's serial console (stdin/stdout of `hakoniwa run` or QEMU's
`-serial stdio`) and commands typed into the guest shell."""

import os
import re
import threading
import time

PROMPT = b"hakoniwa:/# "
PROMPT_RE = re.compile(re.escape(PROMPT))


class PipeReader:
    """A pipe's bytes, collected by a thread as they arrive (at most LIMIT
    bytes: the rest is dropped; None: all). WATCH: (name, regex) pairs;
    the first match of each is kept in `found` with the time its last
    bytes were read."""

    def __init__(self, fd, limit=None, watch=()):
        self.fd, self.limit = fd, limit
        self.watch = dict(watch)
        self.found = {}  # name -> (monotonic time, match)
        self.buf = bytearray()
        self.eof = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                data = b""
            now = time.monotonic()
            with self.cond:
                if not data:
                    self.eof = True
                    self.cond.notify_all()
                    return
                if self.limit is None or len(self.buf) < self.limit:
                    self.buf += data
                for name, regex in self.watch.items():
                    if name not in self.found:
                        m = regex.search(self.buf)
                        if m:
                            self.found[name] = (now, m)
                self.cond.notify_all()

    def wait_found(self, name, deadline, alive):
        """Waits until watched pattern NAME was seen; its (time, match), or
        None at the (monotonic) deadline, at EOF, or once alive() is false."""
        with self.cond:
            while name not in self.found:
                left = deadline - time.monotonic()
                if left <= 0 or self.eof or not alive():
                    return None
                self.cond.wait(min(left, 0.2))
            return self.found[name]

    def wait_until(self, regex, start, deadline, stopped):
        """The first match of REGEX from offset START on; None at the
        (monotonic) deadline or once stopped() is true."""
        with self.cond:
            while True:
                m = regex.search(self.buf, start)
                if m:
                    return m
                left = deadline - time.monotonic()
                if left <= 0 or stopped():
                    return None
                self.cond.wait(min(left, 0.2))

    def size(self):
        with self.cond:
            return len(self.buf)

    def text(self, tail=None):
        """What arrived (its last TAIL bytes), as text."""
        with self.cond:
            data = bytes(self.buf if tail is None else self.buf[-tail:])
        return data.decode("utf-8", "replace")


class Console(PipeReader):
    """The guest console of a VMM process (its stdout); `wait` finds a regex
    in what arrived after a position."""

    def __init__(self, proc, limit=None, watch=()):
        self.proc = proc
        super().__init__(proc.stdout.fileno(), limit, watch)

    def wait(self, regex, start, timeout):
        return self.wait_until(regex, start, time.monotonic() + timeout,
                               lambda: self.proc.poll() is not None)

    def send(self, text):
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def tail(self, n=600):
        return self.text(n)


SHELL_N = [0]


def shell_start(con, command):
    """Types COMMAND into the guest shell and returns at once; a token for
    shell_wait. Several consoles' commands can so run at the same time."""
    SHELL_N[0] += 2
    n = SHELL_N[0]
    start = con.size()
    con.send("echo __b$((%d+1))__; %s; echo __e$((%d+2))__\n" % (n, command, n))
    return (n, start, command)


def shell_wait(con, token, timeout):
    """The output of the command shell_start typed (the typed line's echo
    never matches the markers: they are computed by the shell)."""
    n, start, command = token
    begin = re.compile(rb"__b%d__\r?\n" % (n + 1))
    end = re.compile(rb"__e%d__" % (n + 2))
    m = con.wait(begin, start, timeout)
    if not m:
        raise RuntimeError("guest shell: %r did not start: %r" % (command, con.tail(400)))
    e = con.wait(end, m.end(), timeout)
    if not e:
        raise RuntimeError("guest shell: %r did not finish: %r" % (command, con.tail(400)))
    with con.cond:
        return bytes(con.buf[m.end():e.start()]).decode("utf-8", "replace").replace("\r", "")


def shell(con, command, timeout):
    """Runs COMMAND in the guest shell; its output."""
    return shell_wait(con, shell_start(con, command), timeout)
