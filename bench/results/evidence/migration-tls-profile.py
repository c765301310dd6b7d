"""Profiles one TLS precopy of an idle guest: perf (cpu-clock) on the
source and the destination, then each side's migrate-tls symbols."""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, "/work/main/bench")
from lib.hakoniwa import HkPair, api_get  # noqa: E402
from lib.tlscreds import make_credentials  # noqa: E402

work = "/tmp/tlsprof"
os.makedirs(work, exist_ok=True)
out = "/work/main/build/durlogs"
tls = make_credentials(os.path.join(work, "tls"))
hk = "/work/main/target/release/hakoniwa"
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
print("migration", sys.argv[1], "%.1f s" % (time.monotonic() - t0), {k: r.get(k) for k in ("downtime_ms", "total_ms", "bytes")})
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
