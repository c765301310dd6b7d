"""Profiles one TLS precopy of an idle guest in L1: perf (cpu-clock,
the whole of L1) over the migration, then the source's and the
destination's samples. Run in the rig, from the tree's root:
scripts/rig -- build/pyenv/bin/python3 bench/results/evidence/migration-tls-profile.py tls"""
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from lib.hakoniwa import HkPair  # noqa: E402
from lib.tlscreds import make_credentials  # noqa: E402

work = "/tmp/tlsprof"
os.makedirs(work, exist_ok=True)
out = os.path.join(ROOT, "build")
tls = make_credentials(os.path.join(work, "tls"))
hk = os.path.join(ROOT, "target", "release", "hakoniwa")
flags = ["--memory", "512M"]
pair = HkPair(hk, work, "p", flags, flags, tls=tls if sys.argv[1] == "tls" else None)
pair.wait_prompt(120)
pair.start_destination()
perfs = [subprocess.Popen(["perf", "record", "-q", "-a", "-e", "cpu-clock", "-F", "499",
                          "-o", "%s/%s-all.perf" % (out, sys.argv[1])])]
print("pids: src", pair.src.proc.pid, "dst", pair.dst.proc.pid)
time.sleep(1)
t0 = time.monotonic()
pair.migrate("precopy")
r = pair.wait_dst_phase(("completed",), 600)
print("migration", sys.argv[1], "%.1f s" % (time.monotonic() - t0),
      {k: r.get(k) for k in ("downtime_ms", "total_ms", "bytes")})
for p in perfs:
    p.send_signal(signal.SIGINT)
    p.wait()
pair.close()
f = "%s/%s-all.perf" % (out, sys.argv[1])
for pid in (pair.src.proc.pid, pair.dst.proc.pid):
    rep = subprocess.run(["perf", "report", "-i", f, "--no-children", "--pid", str(pid),
                          "--sort", "comm,dso,sym", "--stdio", "--percent-limit", "0.7"],
                         capture_output=True, text=True)
    print("===== pid", pid)
    print("\n".join(line for line in rep.stdout.splitlines()[:70] if not line.startswith("#")))
