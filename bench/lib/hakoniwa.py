"""hakoniwa's control API (`hakoniwa ctl`, and GET over the API socket
where a poll must be cheap) and a migration's source/destination pair."""

import json
import os
import socket
import subprocess
import time

from .console import PROMPT_RE
from .vmm import Proc, free_port


def hk_ctl(hakoniwa, sock, *cmd, timeout=60):
    """`hakoniwa ctl`; the parsed JSON answer, or its text."""
    out = subprocess.run([hakoniwa, "ctl", "--api-socket", sock, *cmd],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError("ctl %s: status %d: %s" % (
            " ".join(cmd), out.returncode, (out.stderr or out.stdout).strip()))
    return json.loads(out.stdout) if out.stdout.strip().startswith("{") else out.stdout


def trim_report(r):
    """A migration report (vm.migration) without its long per-100 ms
    run_fraction list; None for none."""
    if not r:
        return None
    return {k: v for k, v in r.items() if k != "run_fraction"}


def api_get(sock, path, timeout=10):
    """GET /api/v1/PATH on a hakoniwa API socket: the JSON answer, or None."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(sock)
        s.sendall(("GET /api/v1/%s HTTP/1.1\r\nHost: localhost\r\nAccept: application/json"
                   "\r\nConnection: close\r\n\r\n" % path).encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        head, _, body = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            return None
        return json.loads(body)
    except (OSError, ValueError):
        return None


# The stages of a virtio-blk request in vm.counters (docs/devices.md,
# "Counters"), in order: from the queue thread's wake-up on the kick to the
# interrupt.
DISK_STAGES = ("kick_to_dequeue", "dequeue_to_submit", "submit_to_complete",
               "complete_to_interrupt")


def disk_stages(counters, disk):
    """From a vm.counters answer, DISK's stages: {stage: (requests, ns)};
    None when the answer or the disk is missing."""
    try:
        st = counters[disk]["stages"]
        return {s: (st[s]["count"], st[s]["total_ns"]) for s in DISK_STAGES}
    except (KeyError, TypeError):
        return None


def stage_deltas(before, after):
    """The requests and the time each stage took between two disk_stages
    readings: {stage: {"requests": n, "ns": t}}."""
    return {s: {"requests": after[s][0] - before[s][0], "ns": after[s][1] - before[s][1]}
            for s in DISK_STAGES}


class HkPair:
    """A source hakoniwa with a guest shell, and later its destination.
    SRC_FLAGS and DST_FLAGS are the `run` flags of each side beyond the API
    socket and --incoming (the same machine on both). TLS: None for plain
    TCP (`auth=none`), or a directory of credentials (lib.tlscreds) for
    TLS 1.3 with certificates both ways (`tls=DIR`)."""

    def __init__(self, hakoniwa, work, tag, src_flags, dst_flags, tls=None):
        self.hk = hakoniwa
        self.dst_flags = dst_flags
        self.tls = tls
        self.src_sock = os.path.join(work, "%s-src.sock" % tag)
        self.dst_sock = os.path.join(work, "%s-dst.sock" % tag)
        self.port = free_port()
        self.src = Proc([hakoniwa, "run", "--api-socket", self.src_sock, *src_flags],
                        "hakoniwa source")
        self.dst = None

    def wait_prompt(self, timeout):
        if not self.src.con.wait(PROMPT_RE, 0, timeout):
            raise RuntimeError("no guest prompt: " + self.src.tails())

    def address(self):
        """The migration's address, both sides: auth=none where the soak
        and the benchmark's plain rows measure the migration itself on the
        loopback; tls=DIR for the benchmark's TLS rows."""
        return "tcp:127.0.0.1:%d,%s" % (self.port,
                                        "tls=%s" % self.tls if self.tls else "auth=none")

    def start_destination(self):
        self.dst = Proc([self.hk, "run", "--incoming", self.address(),
                         "--api-socket", self.dst_sock, *self.dst_flags],
                        "hakoniwa destination")
        if not self.dst.wait_stderr("waiting for a migration", 60):
            raise RuntimeError("the destination does not listen: " + self.dst.tails())

    def migrate(self, mode, extra=()):
        hk_ctl(self.hk, self.src_sock, "migrate", "--to", self.address(), "--mode", mode,
               "--no-wait", *extra)

    def wait_dst_phase(self, phases, timeout):
        """Polls the destination's report (its API is up once its VM runs)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = api_get(self.dst_sock, "vm.migration") if os.path.exists(self.dst_sock) else None
            if r and r.get("phase") in phases:
                return r
            if r and r.get("phase") == "failed":
                raise RuntimeError("destination: migration failed: %s" % r.get("error"))
            if not self.dst.alive():
                raise RuntimeError("the destination exited with status %s: %s" % (
                    self.dst.proc.returncode, self.dst.tails()))
            time.sleep(0.02)
        raise RuntimeError("destination not %s within %d s: %s" % (
            "/".join(phases), timeout, self.dst.tails()))

    def close(self):
        for p in (self.src, self.dst):
            if p:
                p.kill()
