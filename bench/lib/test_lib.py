#!/usr/bin/env python3
"""Checks of bench/lib's pure functions and process handling that need no
KVM, no guest and no network: `python3 bench/lib/test_lib.py` (or
`python -m pytest bench/lib/test_lib.py`, where pytest is installed).
The benchmarks themselves need KVM and run through scripts/bench-*."""

import argparse
import io
import json
import os
import re
import signal
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lib import CMDLINE, ROOT  # noqa: E402
from lib.console import PipeReader  # noqa: E402
from lib.environment import vmm_environment  # noqa: E402
from lib.fio import Phase, disk_seen  # noqa: E402
from lib.fio import figures as fio_figures  # noqa: E402
from lib.fio import packed as fio_packed  # noqa: E402
from lib.fio import script as fio_script  # noqa: E402
from lib.initramfs import extract_from_cpio, newc_archive, with_program  # noqa: E402
from lib.iperf3 import client_argv, parse_report, summarize  # noqa: E402
from lib.memtouch import (DIRTY_DONE, DIRTY_READY, TOUCH_DONE, TOUCH_GUEST,  # noqa: E402
                          TOUCH_READY, TOUCH_THREAD)
from lib.options import PATHS, add_path_options, exit_status  # noqa: E402
from lib.tables import (cell, fmt_range, fmt_ratio, md_command_lines, md_context,  # noqa: E402
                        md_environment, md_table, percentile, spread, stats, text_table)
from lib.procstat import (PhaseSampler, ThreadCpu, busy_seconds,  # noqa: E402
                          rss_apart_from_guest, thread_cpu, thread_times)
from lib.tlscreds import FILES as TLS_FILES  # noqa: E402
from lib.tlscreds import check_credentials, describe, make_credentials  # noqa: E402
from lib.vmm import Proc, run_to_end  # noqa: E402

PY = sys.executable


def test_tables():
    assert stats([]) is None
    s = stats([3, 1, 2])
    assert s == {"median": 2, "min": 1, "max": 3, "n": 3}
    assert fmt_range(s, "%.1f") == "2.0 (1.0-3.0)"
    assert fmt_range(stats([1024, 2048]), "%.1f", 1024) == "1.5 (1.0-2.0)"
    assert fmt_range(None, "%.3f") == "-"
    assert fmt_ratio(None) == "-" and fmt_ratio(0.5) == "0.50"
    assert cell({"a": 1.25}, "a", "%.1f") == "1.2" and cell({"a": None}, "a", "%d") == "-"
    rows = [["name", "value"], ["a", 1], ["bb", 22]]
    assert md_table(rows) == "| name | value |\n|---|---|\n| a | 1 |\n| bb | 22 |"
    assert md_command_lines({"qemu": ["qemu", "-m", "1G"]}) == ["- qemu: `qemu -m 1G`"]
    assert md_environment({"a": 1, "b": {"x": 2, "y": 3}, "c": ["p", "q"], "d": []}) == [
        "- a: 1", "- b: x: 2, y: 3", "- c: p; q", "- d: -"]
    assert text_table(rows).splitlines() == ["name  value", "----  -----", "a     1",
                                             "bb    22"]
    assert percentile([], 50) is None and spread([]) is None
    assert percentile([4, 1, 3, 2], 50) == 2.5 and percentile([5], 99) == 5
    assert percentile(list(range(1, 11)), 99) == 9.91
    assert percentile([1, 2], 0) == 1 and percentile([1, 2], 100) == 2
    d = spread([2, 4, 4, 4, 5, 5, 7, 9])
    assert (d["mean"], d["median"], d["min"], d["max"], d["range"], d["n"]) == (5, 4.5, 2,
                                                                               9, 7, 8)
    assert abs(d["variance"] - 32 / 7) < 1e-12 and abs(d["stdev"] ** 2 - 32 / 7) < 1e-12
    assert d["p50"] == 4.5 and abs(d["p99"] - 8.86) < 1e-12
    assert spread([3.0])["variance"] == 0 and spread([3.0])["range"] == 0
    host = {"note": "on the host", "where": "host"}
    assert md_context(host, "rig text") == ["**Context: on the host.**", ""]
    assert md_context(dict(host, where="rig"), "rig text")[2:] == ["rig text", ""]


def test_pipe_reader_watch_and_limit():
    r, w = os.pipe()
    reader = PipeReader(r, limit=8, watch=[("mark", re.compile(rb"MARK\n"))])
    t0 = time.monotonic()
    os.write(w, b"abc MARK\n")
    found = reader.wait_found("mark", time.monotonic() + 10, lambda: True)
    assert found and found[0] >= t0 and found[1].group(0) == b"MARK\n"
    os.write(w, b"dropped")  # over the limit: not kept
    os.close(w)
    reader.thread.join(10)
    assert reader.eof and reader.text() == "abc MARK\n"
    # At EOF a pattern never seen is given up on at once.
    assert reader.wait_found("other", time.monotonic() + 10, lambda: True) is None


def test_run_to_end():
    vm = run_to_end([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); "
                     "sys.exit(3)"], "fake", 30)
    assert (vm["status"], vm["timed_out"], vm["stalled"]) == (3, False, None)
    assert vm["stdout"] == "out\n" and vm["stderr"] == "err\n"
    assert vm["vmm_cpu_s"] >= 0 and vm["wall_s"] > 0
    vm = run_to_end([PY, "-c", "import time; time.sleep(60)"], "fake", 0.3)
    assert vm["timed_out"] and vm["status"] == -signal.SIGTERM
    vm = run_to_end([PY, "-c", "import time; time.sleep(60)"], "fake", 30, lambda: "stuck")
    assert vm["stalled"] == "stuck" and vm["status"] == -signal.SIGTERM


def test_proc_stop():
    p = Proc([PY, "-c", "import time; print('up', flush=True); time.sleep(60)"], "fake",
             watch=[("up", re.compile(rb"up\n"))])
    assert p.con.wait_found("up", time.monotonic() + 30, p.alive)
    status, _, killed = p.stop(5)
    assert (status, killed) == (-signal.SIGTERM, False)
    # One that ignores SIGTERM is killed after the grace time.
    p = Proc([PY, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "print('up', flush=True); time.sleep(60)"], "fake",
             watch=[("up", re.compile(rb"up\n"))])
    assert p.con.wait_found("up", time.monotonic() + 30, p.alive)
    status, seconds, killed = p.stop(0.5)
    assert (status, killed) == (-signal.SIGKILL, True) and seconds >= 0.5


def test_vmm_environment():
    kernel, initramfs = os.path.join(ROOT, "no/vmlinuz"), os.path.join(ROOT, "no/initrd")
    env = vmm_environment("rig note", "figures", "/nonexistent/hakoniwa", None, kernel,
                          initramfs, CMDLINE, vcpus=2, memory_mib=512, relative_to=ROOT,
                          machine={"memory_mib_l1": 1}, tools={"siege_version": None},
                          run={"git_commit": "abc"})
    assert list(env) == [
        "date_utc", "where", "note", "kvm", "host_kernel", "cpu_model", "cpus",
        "memory_mib_l1", "python", "hakoniwa_version", "hakoniwa_binary_sha256",
        "qemu_version", "siege_version", "guest_kernel", "guest_kernel_version",
        "guest_kernel_package", "guest_initramfs", "guest_initramfs_sha256", "guest_busybox",
        "guest_cmdline", "git_commit", "vcpus", "memory_mib"]
    assert env["guest_kernel"] == "no/vmlinuz" and env["qemu_version"] is None
    assert env["hakoniwa_version"] is None and env["guest_initramfs_sha256"] is None
    env = vmm_environment("rig note", "times", "/nonexistent/hakoniwa", "/nonexistent/qemu",
                          kernel, initramfs, CMDLINE, vcpus=1, memory_mib=512,
                          initramfs_sha256=False)
    assert env["guest_kernel"] == kernel and "guest_initramfs_sha256" not in env


def test_path_options():
    p = argparse.ArgumentParser()
    add_path_options(p, "hakoniwa", "kernel", "initramfs", "qemu")
    assert [a.dest for a in p._actions[1:]] == ["hakoniwa", "kernel", "initramfs", "qemu"]
    args = p.parse_args([])
    assert vars(args) == PATHS and args.qemu == "qemu-system-x86_64"
    assert args.kernel == os.path.join(ROOT, "build/guest/vmlinuz")
    assert exit_status("x.py", 0, "run(s)", "x.json") == 0
    stderr, sys.stderr = sys.stderr, io.StringIO()
    try:
        assert exit_status("x.py", 2, "run(s)", "x.json") == 1
        said = sys.stderr.getvalue()
    finally:
        sys.stderr = stderr
    assert said == "x.py: 2 run(s) failed (see above and x.json)\n"


def test_memtouch_lines():
    """The lines as guest/tools/hk-memtouch.c's printf calls write them."""
    assert TOUCH_READY.search(b"hk-memtouch: ready threads=4 mib=200\r\n")
    m = TOUCH_THREAD.search(b"thread 2 seconds=1.234 start=0.010 check=ok "
                            b"marks=0.100,0.200\r\n")
    assert m and m.group(5) == b"0.100,0.200"
    assert TOUCH_GUEST.search(b"hk-memtouch: guest ctxt=10 hyp_irqs=-1 timer_irqs=5\r\n")
    m = TOUCH_DONE.search(b"hk-memtouch: done threads=4 mib=200 stride=1 max=2.500 "
                          b"mean=2.000 check=ok\r\n")
    assert m and m.group(4) == b"2.500" and m.group(6) == b"ok"
    # Not before the line's end has arrived.
    assert not TOUCH_DONE.search(b"hk-memtouch: done threads=4 mib=200 stride=1 max=2.5")
    assert DIRTY_READY.search(b"hk-memtouch: ready dirty mib=128\n")
    assert DIRTY_DONE.search(b"hk-memtouch: dirtied pages=1000 seconds=1.000 "
                             b"pages_per_s=1000\n")


def test_tls_credentials():
    """The migration benchmark's TLS credentials: the five files, the CA's
    key gone, and openssl's verify accepts each certificate for its
    purpose (the server's for 127.0.0.1, not another address); a key that
    is not its certificate's is caught."""
    import shutil
    import subprocess
    import tempfile
    if not shutil.which("openssl"):
        print("skip test_tls_credentials: no openssl")
        return
    with tempfile.TemporaryDirectory() as d:
        tls = make_credentials(os.path.join(d, "tls"))
        assert sorted(os.listdir(tls)) == sorted(TLS_FILES)
        for role in ("server", "client"):
            assert os.stat(os.path.join(tls, role + "-key.pem")).st_mode & 0o077 == 0
        check_credentials(tls)
        r = subprocess.run(["openssl", "verify", "-CAfile", "ca-cert.pem", "server-cert.pem",
                            "client-cert.pem"], cwd=tls, capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.count(": OK") == 2, r.stdout + r.stderr
        r = subprocess.run(["openssl", "verify", "-CAfile", "ca-cert.pem", "-verify_ip",
                            "127.0.0.2", "server-cert.pem"], cwd=tls, capture_output=True)
        assert r.returncode != 0
        r = subprocess.run(["openssl", "verify", "-CAfile", "ca-cert.pem", "-purpose",
                            "sslserver", "client-cert.pem"], cwd=tls, capture_output=True)
        assert r.returncode != 0
        assert describe(tls)["key"] == "EC P-256, PKCS#8"
        os.replace(os.path.join(tls, "client-key.pem"), os.path.join(tls, "server-key.pem"))
        try:
            check_credentials(tls)
            raise AssertionError("a missing key passed")
        except RuntimeError as e:
            assert "client-key.pem" in str(e)
        shutil.copy(os.path.join(tls, "server-key.pem"), os.path.join(tls, "client-key.pem"))
        try:
            check_credentials(tls)
            raise AssertionError("a swapped key passed")
        except RuntimeError as e:
            assert "server-key.pem is not server-cert.pem's key" in str(e), e


def test_initramfs_append():
    import gzip
    import json
    import tempfile
    arc = newc_archive({"usr/bin/tool": (0o755, b"abc"), "etc/x": (0o644, b"")})
    # Directories first, each once, then the files, then the trailer.
    names = re.findall(rb"070701[0-9A-F]{104}([^\0]+)\0", arc)
    assert names == [b"etc", b"usr", b"usr/bin", b"etc/x", b"usr/bin/tool", b"TRAILER!!!"]
    with tempfile.TemporaryDirectory() as d:
        base = os.path.join(d, "base.gz")
        with open(base, "wb") as f:
            f.write(gzip.compress(newc_archive({"bin/busybox": (0o755, b"bb" * 1000)})))
        out = os.path.join(d, "out.gz")
        added = with_program(base, sys.executable, out)
        assert added["usr/bin/" + os.path.basename(sys.executable)] == os.path.getsize(
            os.path.realpath(sys.executable))
        # The original archive comes first and is still read the same.
        assert extract_from_cpio(out, {"bin/busybox"}) == {"bin/busybox": b"bb" * 1000}
        with gzip.open(out) as f:
            data = f.read()
        assert data.count(b"TRAILER!!!") == 2
        assert any(k.startswith("lib") for k in added), json.dumps(added)


def test_iperf3_report():
    argv = client_argv("10.0.2.2", 5201, 5, True)
    assert argv[:3] == ["iperf3", "-c", "10.0.2.2"] and argv[-1] == "-R" and "-J" in argv
    assert "-R" not in client_argv("h", 1, 1, False)
    report = """{"start": {}, "intervals": [
      {"sum": {"bits_per_second": 1e8, "bytes": 12500000, "seconds": 1.0}},
      {"sum": {"bits_per_second": 3e8, "bytes": 37500000, "seconds": 1.0}}],
     "end": {"sum_sent": {"bits_per_second": 2.1e8, "retransmits": 4},
             "sum_received": {"bits_per_second": 2e8, "seconds": 2.0, "bytes": 5e7},
             "cpu_utilization_percent": {"host_total": 50.0, "remote_total": 3.0}}}"""
    r = parse_report("noise before\n" + report + "\n")
    assert r["mbit_s"] == 200 and r["sender_mbit_s"] == 210 and r["retransmits"] == 4
    assert r["interval_mbit_s"] == [100, 300] and r["cpu_client_pct"] == 50.0
    assert r["silent_seconds"] == 0
    stalled = parse_report(report.replace('"bytes": 37500000', '"bytes": 0'))
    assert stalled["silent_seconds"] == 1
    for bad, says in (('{"error": "unable to connect to server"}', "unable to connect"),
                      ("nothing", "no iperf3 report"), ('{"end": {}}', "sum_sent")):
        try:
            parse_report(bad)
            raise AssertionError("parsed %r" % bad)
        except ValueError as e:
            assert says in str(e), e
    s = summarize([dict(r, ok=True, interrupts=10), dict(r, ok=True, mbit_s=100,
                                                         interrupts=30), {"ok": False}])
    assert s["mbit_s"]["mean"] == 150 and s["mbit_s"]["range"] == 100
    assert s["interrupts"]["mean"] == 20 and s["retransmits"]["mean"] == 4
    assert s["interval_mbit_s"]["n"] == 4 and abs(s["interval_cv"] - 0.5) < 1e-9
    assert s["stalled_runs"] == 0
    assert summarize([dict(stalled, ok=True)])["stalled_runs"] == 1
    assert summarize([])["mbit_s"] is None


def test_disk_stages():
    from lib.hakoniwa import DISK_STAGES, disk_stages, stage_deltas
    def answer(n, ns):
        return {"disk0": {"read_ops": n,
                          "stages": {s: {"count": n, "total_ns": ns * (i + 1), "max_ns": 0}
                                     for i, s in enumerate(DISK_STAGES)}},
                "net0": {"rx_bytes": 0}}
    a, b = disk_stages(answer(10, 1000), "disk0"), disk_stages(answer(25, 4000), "disk0")
    d = stage_deltas(a, b)
    assert d["kick_to_dequeue"] == {"requests": 15, "ns": 3000}
    assert d["complete_to_interrupt"] == {"requests": 15, "ns": 12000}
    assert disk_stages(answer(1, 1), "disk1") is None
    assert disk_stages(None, "disk0") is None


def fio_report(kind, io_bytes, runtime_ms, iops, bw_bytes, mean_ns, p99_ns):
    """One line of the guest script's output: fio 3.33's JSON shape, trimmed."""
    d = {"io_bytes": io_bytes, "runtime": runtime_ms, "iops": iops, "bw_bytes": bw_bytes,
         "clat_ns": {"mean": mean_ns, "percentile": {"1.000000": 1, "99.000000": p99_ns}}}
    other = {"io_bytes": 0, "runtime": 0, "iops": 0, "bw_bytes": 0,
             "clat_ns": {"mean": 0, "percentile": {}}}
    job = {"jobname": "x", "read": other, "write": other}
    job[kind] = d
    return json.dumps({"fio version": "fio-3.33", "jobs": [job]}, indent=1).replace("\n", "")


def test_fio_script_and_figures():
    phases = [Phase("randread-qd32", "read", ["--rw=randread", "--iodepth=32"]),
              Phase("seqwrite", "write", ["--rw=write"], flush=True)]
    sh = fio_script(phases, 512 << 20, ["echo tail"])
    assert '= "1048576" ]' in sh and sh.endswith("echo tail")
    assert "phase randread-qd32 job randread-qd32 --rw=randread --iodepth=32" in sh
    # The flush is inside the write phase's markers.
    assert "run_seqwrite() { job seqwrite --rw=write; flush seqwrite; }" in sh
    assert "date +%s%N" in sh
    # Packed for the command line: smaller, and the same script once unpacked.
    import base64
    import gzip
    cmd = fio_packed(sh)
    assert len(cmd) < len(sh) and cmd.endswith(" | base64 -d | gunzip | sh")
    assert gzip.decompress(base64.b64decode(cmd.split()[1])).decode() == sh
    out = ("noise\r\nhk-disk /dev/vdb queues=2\r\n"
           "hk-fio randread-qd32 %s\r\nhk-flush seqwrite ns=500000000\r\n"
           "hk-fio seqwrite %s\n" % (
               fio_report("read", 4096 * 1000, 2000, 500.0, 2048000, 64000.0, 250000),
               fio_report("write", 100 << 20, 1000, 100.0, 104857600, 9000000.0, 1)))
    assert disk_seen(out) == ("/dev/vdb", 2)
    f = fio_figures(out, phases)
    assert f["randread-qd32"] == {"bytes": 4096000, "seconds": 2.0, "iops": 500.0,
                                  "mbps": 2.048, "lat_mean_us": 64.0, "lat_p99_us": 250.0}
    w = f["seqwrite"]
    assert w["flush_s"] == 0.5 and w["mbps"] == 104.857600
    assert abs(w["mbps_with_flush"] - 104.8576 / 1.5) < 1e-9
    # A phase without its flush line or its report is missing, not zero.
    assert list(fio_figures(out.replace("hk-flush", "x"), phases)) == ["randread-qd32"]
    assert fio_figures("", phases) == {} and disk_seen("") is None
    try:
        fio_figures("hk-fio seqwrite {broken}\n", phases)
        raise AssertionError("a broken report must raise")
    except ValueError:
        pass


def test_procstat():
    import mmap
    # This process's CPU: burn some, the total grows; no vCPU threads here.
    before = thread_cpu(os.getpid())
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    after = thread_cpu(os.getpid())
    assert after[0] - before[0] >= 0.1 and after[1] == 0 == before[1]
    # A 64 MiB mapping, touched: counted as "guest" above a 32 MiB threshold.
    m = mmap.mmap(-1, 64 << 20)
    for off in range(0, 64 << 20, 4096):
        m[off] = 1
    other, guest = rss_apart_from_guest(os.getpid(), 32 << 10)
    assert guest >= 64 << 10 and other > 0
    other2, guest2 = rss_apart_from_guest(os.getpid(), 1 << 30)
    assert guest2 == 0 and other2 >= other + (64 << 10) - 1024
    m.close()
    assert thread_cpu(2 ** 22 + 12345) is None
    # By thread name: a named thread that burns shows under its name, and
    # still counts (to its last reading) once it has ended.
    import threading

    def burn():
        with open("/proc/self/task/%d/comm" % threading.get_native_id(), "w") as f:
            f.write("burner7")
        t = time.thread_time()
        while time.thread_time() - t < 0.3:
            pass
    acc = ThreadCpu(os.getpid())
    th = threading.Thread(target=burn)
    th.start()
    seen = 0
    while th.is_alive():
        assert acc.tick()
        seen = max([seen] + [a for name, a, _ in acc.last.values() if name == "burnerN"])
        time.sleep(0.02)
    th.join()
    # join() returns once Python is done with the thread; its task can
    # stay in /proc a moment longer (5 in 40 runs beside two busy rigs).
    def names():
        return {name for name, _, _ in thread_times(os.getpid()).values()}
    deadline = time.monotonic() + 10
    while "burnerN" in names() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "burnerN" not in names()
    assert acc.tick()
    cpu, system = acc.by_name()
    assert cpu["burnerN"] == round(seen, 2) > 0 and 0 <= system["burnerN"] <= cpu["burnerN"]
    assert all(v >= 0 for v in cpu.values())
    assert thread_times(2 ** 22 + 12345) is None and not ThreadCpu(2 ** 22 + 12345).tick()
    b1 = busy_seconds()
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    b2 = busy_seconds()
    # (iowait may step back on a tickless kernel: busy need not stay
    # under total by a hair.)
    assert b2[0] - b1[0] >= 0.1 and b2[1] - b1[1] >= 0.1


def test_phase_sampler():
    # A process printing markers as a guest would: begin, work, end.
    vm = Proc([PY, "-c", "import time\nprint('hk-phase begin burn', flush=True)\n"
               "time.sleep(0.3)\nt = time.process_time()\n"
               "while time.process_time() - t < 0.3: pass\n"
               "print('hk-phase end burn', flush=True)\ntime.sleep(0.3)\n"
               "print('hk-phase begin half', flush=True)\ntime.sleep(0.3)"], "fake")
    sampler = PhaseSampler(1 << 30)
    while vm.proc.poll() is None:
        sampler.tick(vm)
        time.sleep(0.05)
    vm.proc.wait()
    ph = sampler.phases()
    assert list(ph) == ["burn"], ph  # "half" never ended
    assert 0.2 <= ph["burn"]["device_cpu_s"] <= 0.6 and ph["burn"]["vcpu_cpu_s"] == 0
    assert sampler.rss_kib()[0] > 0 and sampler.rss_kib()[1] == 0


def main():
    tests = [(name, f) for name, f in sorted(globals().items()) if name.startswith("test_")]
    for name, f in tests:
        f()
        print("ok", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
