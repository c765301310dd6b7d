#!/usr/bin/env python3
"""virtio benchmark: hakoniwa's virtio-blk and virtio-net against QEMU's.

Block: one raw image (default 512 MiB of random data, written once with dd
from /dev/urandom into --workdir, which must allow O_DIRECT), attached as
the second virtio-blk disk of the Debian guest (scripts/build-guest-debian;
its root is the first, read-only) under each VMM configuration and each
cache mode (writeback, none, unsafe): hakoniwa (its default engine,
io_uring where the kernel allows it) and QEMU with aio=io_uring and with
aio=threads (-drive ...,cache=MODE,aio=AIO -device virtio-blk-pci), each
with one queue per vCPU. Each run boots the guest once, after `sync` and
dropping the host's page cache, and runs fio in it (O_DIRECT, libaio;
lib/fio.py), each job a phase framed by markers at which the host samples
the VMM's CPU time by thread (lib/procstat.py) and, for hakoniwa, its
per-request stage counters:

  randread-qdN  4 KiB reads at random offsets in the image's upper part
                ([--seq-mib, --image-mib) MiB) for --randread-seconds at
                each queue depth of --qd (default 1 and 32): IOPS;
  randread-mq   the same with one job per vCPU, each pinned to its vCPU
                and so submitting on its own queue, --mq-qd each: IOPS;
  seqread       1 MiB reads of the lower --seq-mib MiB: MB/s;
  seqwrite      1 MiB writes over the same --seq-mib MiB, then one FLUSH
                (which cache=unsafe ignores): MB/s including the flush
                (and, as an extra, without it);

then reads back the first --check-mib MiB of each region with dd and prints
their md5, which must match the host's md5 of the image (the upper region
as written at the start; the lower one after the VMM exited): a data check.
The two regions keep the random reads from warming the host page cache for
the sequential read. With cache=writeback, reads that hit what is already in
the host page cache are served from it: that is the mode, reported as
measured. Beside the speeds: the device side's CPU seconds per GiB moved
(every VMM thread but the vCPUs) and the VMM's resident memory outside the
guest's RAM.

Network: per run a fresh TAP device (host side 10.213.N.1/24, guest eth0
10.213.N.2/24) and a virtio-net NIC on it (QEMU: -netdev tap,...
-device virtio-net-pci). The host listens on two TCP ports; the guest sends
--net-mib MiB to the first (`hk-ioperf tcpsend`) and then receives --net-mib
MiB from the second (`hk-ioperf tcprecv`). MB/s is taken at the host end:
guest -> host from accept to end of stream; host -> guest from accept to the
guest's close after it read everything. The guest's own figures are kept
as a cross-check. A transfer that moves nothing for --stall-seconds stops
its VM (a failed run, "stalled").

All combinations round-robin (round 1: every cache mode x every VMM, then
the network runs; round 2; ...), --runs rounds (default 3); medians, min and
max; block ratios against QEMU's best configuration on each row, network
ratios hakoniwa / QEMU (above 1: hakoniwa does better). A run
that fails (VMM status, timeout, missing figure, data check) is recorded
and reported, never dropped, and the script exits 1.

Writes bench/results/virtio.json (raw runs, summary, environment),
bench/results/virtio.md (tables) and bench/results/virtio.png (with
matplotlib, the project's Python environment). Normally
run through scripts/bench-virtio, which picks the test rig or the host
(hardware KVM) and builds what is missing. Needs root (TAP devices,
drop_caches).
"""

import argparse
import base64
import functools
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import CMDLINE as GUEST_CMDLINE  # noqa: E402
from lib.environment import in_rig, vmm_environment  # noqa: E402
from lib.hakoniwa import DISK_STAGES, api_get, disk_stages, stage_deltas  # noqa: E402
from lib.fio import Phase, disk_seen  # noqa: E402
from lib.fio import figures as fio_figures  # noqa: E402
from lib.fio import packed as fio_packed  # noqa: E402
from lib.fio import script as fio_script  # noqa: E402
from lib.options import add_path_options, exit_status  # noqa: E402
from lib.qemu import qemu_argv  # noqa: E402
from lib.tables import (cell, fmt_range, fmt_ratio, md_command_lines, md_context,  # noqa: E402
                        md_environment, md_table, stats, text_table)
from lib.plots import panels, save_figure  # noqa: E402
from lib.procstat import PhaseSampler  # noqa: E402
from lib.vmm import run_to_end  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CMDLINE = GUEST_CMDLINE
RIG_NOTE = ("inside L1 under TCG with nested KVM; absolute figures mean little, "
            "compare ratios")
SEED_002 = ("seed 002's question: which cache helps for which workload; this "
            "table is the raw device speed per mode")
VMMS = ["hakoniwa", "qemu"]
QEMU_AIO = ["io_uring", "threads"]
MODES = ["writeback", "none", "unsafe"]
MAC = "52:54:00:12:34:56"
PORT_G2H, PORT_H2G = 5201, 5202
MIB = 1024 * 1024
GIB = 1024 * MIB
# The Debian guest of the block runs: its root is the first disk,
# read-only under a tmpfs overlay (docs/guest.md).
DEBIAN_CMDLINE = "console=ttyS0 root=/dev/vda ro hk.overlay quiet io_delay=none panic=-1"
RESULT_RE = re.compile(r"^(tcpsend|tcprecv) (.*)$", re.M)
CHECK_RE = re.compile(r"^check (rand|seq) md5=([0-9a-f]{32})$", re.M)


# ---------------------------------------------------------------- VMMs ----

def block_disks_argv(vmm, root, image, mode, queues):
    """The block runs' two disks: the Debian root (read-only, first: the
    guest's /dev/vda) and the measured image in cache mode MODE with QUEUES
    queues. VMM: hakoniwa (its default engine, io_uring where the kernel
    allows it), qemu-io_uring or qemu-threads (QEMU's aio=)."""
    if vmm == "hakoniwa":
        return ["--disk", "path=%s,readonly=on" % root,
                "--disk", "path=%s,cache=%s,num_queues=%d" % (image, mode, queues)]
    aio = vmm.split("-", 1)[1]
    esc = lambda p: p.replace(",", ",,")  # noqa: E731
    return ["-drive", "file=%s,if=none,id=root,format=raw,readonly=on" % esc(root),
            "-device", "virtio-blk-pci,drive=root",
            "-drive", "file=%s,if=none,id=d0,format=raw,cache=%s,aio=%s" % (esc(image), mode, aio),
            "-device", "virtio-blk-pci,drive=d0,num-queues=%d" % queues]


def vmm_argv(args, vmm, kernel, initrd, cmd, cmdline=CMDLINE, extra=()):
    """argv of one VM running the guest command CMD (hk.cmd= on CMDLINE);
    VMM: hakoniwa, or QEMU (qemu, qemu-io_uring, qemu-threads); EXTRA: its
    device arguments."""
    cmdline = cmdline + " hk.cmd=" + base64.b64encode(cmd.encode()).decode()
    if vmm == "hakoniwa":
        return [args.hakoniwa, "run", "--kernel", kernel, "--initramfs", initrd,
                "--cmdline", cmdline, "--cpus", str(args.cpus),
                "--memory", "%dM" % args.memory_mib] + list(extra)
    # debug-threads: QEMU names its threads (vCPUs "CPU N/KVM"), so that
    # lib.procstat can tell them apart.
    return qemu_argv(args.qemu, kernel, initrd, cmdline, args.memory_mib, cpus=args.cpus,
                     extra=["-name", "hk,debug-threads=on", "-no-reboot",
                            "-device", "isa-debug-exit,iobase=0x501,iosize=1"] + list(extra))


def net_argv(vmm, tap):
    if vmm == "hakoniwa":
        return ["--net", "tap=%s,mac=%s" % (tap, MAC)]
    return ["-netdev", "tap,id=n0,ifname=%s,script=no,downscript=no" % tap,
            "-device", "virtio-net-pci,netdev=n0,mac=%s" % MAC]


def guest_status(vmm, status):
    """The guest command's exit status from the VMM's, or None."""
    if vmm == "hakoniwa":
        return status
    # QEMU's isa-debug-exit: (N << 1) | 1; anything else is no guest status.
    return status >> 1 if status is not None and status > 0 and status & 1 else None


def parse_figures(text):
    """{'tcpsend': {...}, 'tcprecv': {...}} from hk-ioperf's lines."""
    figs = {}
    for m in RESULT_RE.finditer(text):
        vals = {}
        for item in m.group(2).split():
            k, _, v = item.partition("=")
            try:
                vals[k] = float(v)
            except ValueError:
                pass
        figs[m.group(1)] = vals
    return figs


def failed(rec, err, vm, argv):
    """REC, a failed run: why, the ends of the VM's output, its argv."""
    rec["error"] = err
    rec["stdout_tail"] = vm["stdout"][-3000:]
    rec["stderr_tail"] = vm["stderr"][-3000:]
    rec["argv"] = argv
    return rec


def vm_error(vmm, vm):
    if vm.get("stalled"):
        return "stalled: %s (VMM stopped)" % vm["stalled"]
    if vm["timed_out"]:
        return "timed out (VMM stopped)"
    g = guest_status(vmm, vm["status"])
    if g is None:
        return "VMM exited with status %s, not through the guest's debug-exit" % vm["status"]
    if g != 0:
        return "guest command exited with status %d" % g
    return None


# ------------------------------------------------------------- host side --

def sh(*argv):
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def md5_region(path, start_mib, mib):
    h = hashlib.md5()
    with open(path, "rb") as f:
        f.seek(start_mib * MIB)
        for _ in range(mib):
            h.update(f.read(MIB))
    return h.hexdigest()


def check_o_direct(directory):
    path = os.path.join(directory, "odirect-probe")
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
        try:
            import mmap
            buf = mmap.mmap(-1, 4096)  # page-aligned
            os.write(fd, buf)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def fs_type(path):
    best, kind = "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, "%s on %s (%s)" % (parts[2], mnt, parts[0])
    except OSError:
        pass
    return kind


class Listener:
    """One TCP transfer at the host end of a TAP: 'recv' counts what the guest
    sends until it half-closes; 'send' sends NBYTES, half-closes and waits
    for the guest's close. Times run from accept()."""

    def __init__(self, addr, port, mode, nbytes, timeout):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((addr, port))
        self.sock.listen(1)
        self.sock.settimeout(timeout)
        self.mode, self.nbytes = mode, nbytes
        self.result = {"ok": False}
        # Live progress, for stall detection and for the record of a
        # transfer that never ended.
        self.accepted = None
        self.moved = 0
        self.last_progress = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            conn, _ = self.sock.accept()
        except OSError as e:
            self.result["error"] = "no connection: %s" % e
            return
        t0 = self.accepted = self.last_progress = time.monotonic()
        total = 0
        try:
            conn.settimeout(self.sock.gettimeout())
            if self.mode == "recv":
                buf = bytearray(MIB)
                while True:
                    n = conn.recv_into(buf)
                    if not n:
                        break
                    total += n
                    self.moved, self.last_progress = total, time.monotonic()
            else:
                chunk = bytes(MIB)
                view = memoryview(chunk)
                while total < self.nbytes:
                    n = conn.send(view[:min(MIB, self.nbytes - total)])
                    total += n
                    self.moved, self.last_progress = total, time.monotonic()
                conn.shutdown(socket.SHUT_WR)
                while conn.recv(65536):
                    pass
            t1 = time.monotonic()
            self.result = {"ok": total == self.nbytes, "bytes": total, "seconds": t1 - t0,
                           "mbps": total / 1e6 / (t1 - t0)}
            if total != self.nbytes:
                self.result["error"] = "%d bytes moved, %d expected" % (total, self.nbytes)
        except OSError as e:
            self.result = {"ok": False, "bytes": total, "error": "transfer: %s" % e}
        finally:
            conn.close()

    def stalled(self, seconds):
        """A reason if the transfer started but moved nothing for SECONDS."""
        if self.thread.is_alive() and self.accepted is not None:
            idle = time.monotonic() - self.last_progress
            if idle > seconds:
                return "nothing moved for %.0f s after %d of %d bytes %s" % (
                    idle, self.moved, self.nbytes,
                    "received" if self.mode == "recv" else "handed to TCP")
        return None

    def close(self):
        self.sock.close()
        self.thread.join(5)
        if self.thread.is_alive():
            self.result = {"ok": False, "bytes": self.moved,
                           "error": "unfinished at the VM's end: %s" % (
                               "%d of %d bytes moved" % (self.moved, self.nbytes)
                               if self.accepted is not None else "no connection")}


# ------------------------------------------------------------- one run ----

def block_phases(args):
    """The fio jobs of a block run, in order (lib.fio.Phase): 4 KiB random
    reads over the upper region at each --qd, then with one job per vCPU
    (each pinned to its vCPU, so each submits on its own queue), then
    1 MiB sequential reads and writes of the lower region, the writes
    followed by a FLUSH."""
    rand = ["--offset=%dm" % args.seq_mib, "--size=%dm" % (args.image_mib - args.seq_mib),
            "--rw=randread", "--bs=4k", "--runtime=%g" % args.randread_seconds,
            "--time_based", "--randrepeat=0"]
    phases = [Phase("randread-qd%d" % q, "read", rand + ["--iodepth=%d" % q]) for q in args.qd]
    if args.cpus > 1:
        phases.append(Phase("randread-mq", "read", rand + [
            "--iodepth=%d" % args.mq_qd, "--numjobs=%d" % args.cpus,
            "--cpus_allowed=0-%d" % (args.cpus - 1), "--cpus_allowed_policy=split",
            "--group_reporting"]))
    seq = ["--offset=0", "--size=%dm" % args.seq_mib, "--bs=1m", "--iodepth=1"]
    phases.append(Phase("seqread", "read", seq + ["--rw=read"]))
    phases.append(Phase("seqwrite", "write", seq + ["--rw=write"], flush=True))
    return phases


def disk_stages_of(sock, disk):
    return disk_stages(api_get(sock, "vm.counters", timeout=2), disk)


def phase_stages(extras):
    """{phase: {stage: {"requests", "ns"}}} from the begin and end readings
    of hakoniwa's stage counters."""
    begin, out = {}, {}
    for kind, name, stages in extras:
        if stages is None:
            continue
        if kind == "begin":
            begin[name] = stages
        elif name in begin:
            out[name] = stage_deltas(begin[name], stages)
    return out


def block_cmd(args):
    rand_start, rand_span = args.seq_mib, args.image_mib - args.seq_mib
    tail = []
    for name, start, mib in (("rand", rand_start, min(args.check_mib, rand_span)),
                             ("seq", 0, min(args.check_mib, args.seq_mib))):
        tail.append("echo check %s md5=$(dd if=$dev bs=1M skip=%d count=%d "
                    "iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)" % (name, start, mib))
    return fio_script(block_phases(args), args.image_mib * MIB, tail)


def block_run(args, vmm, mode, image, rand_md5, rnd):
    rec = {"kind": "block", "vmm": vmm, "cache": mode, "round": rnd, "ok": False}
    rec["page_cache_dropped"] = drop_caches()
    phases = block_phases(args)
    argv = vmm_argv(args, vmm, args.run_kernel, args.run_debian_initramfs,
                    fio_packed(block_cmd(args)),
                    cmdline=DEBIAN_CMDLINE,
                    extra=block_disks_argv(vmm, args.debian_image, image, mode, args.cpus))
    extra = None
    if vmm == "hakoniwa":
        # hakoniwa's own stage counters at each marker: where a request's
        # time went, phase by phase (the profile behind a slow row).
        sock = os.path.join(os.path.dirname(image), "api-%d.sock" % os.getpid())
        argv += ["--api-socket", sock]
        extra = functools.partial(disk_stages_of, sock, "disk1")
    sampler = PhaseSampler(args.memory_mib * 1024 // 2, extra)
    vm = run_to_end(argv, vmm, args.timeout, tick=sampler.tick)
    rec.update({k: vm[k] for k in ("status", "timed_out", "wall_s", "vmm_cpu_s")})
    err = vm_error(vmm, vm)
    try:
        figs = fio_figures(vm["stdout"], phases)
    except ValueError as e:
        figs, err = {}, err or "a fio report is not JSON: %s" % e
    rec["figures"] = figs
    rec["disk_seen"] = disk_seen(vm["stdout"])
    cpu = sampler.phases()
    rec["phase_cpu"] = cpu
    rec["phase_threads"] = sampler.threads
    if extra:
        rec["phase_stages"] = phase_stages(sampler.extras)
    rss = sampler.rss_kib()
    checks = dict(CHECK_RE.findall(vm["stdout"]))
    rec["guest_md5"] = checks
    missing = [p.name for p in phases if p.name not in figs or p.name not in cpu]
    if not err and missing:
        err = "missing figures or CPU samples: %s" % ", ".join(missing)
    if not err and (not rec["disk_seen"] or rec["disk_seen"][1] != args.cpus):
        err = "the guest saw %s, not a disk with %d queues" % (rec["disk_seen"], args.cpus)
    if not err and not rss:
        err = "no memory sample"
    if not err:
        host_seq = md5_region(image, 0, min(args.check_mib, args.seq_mib))
        rec["host_md5"] = {"rand": rand_md5, "seq": host_seq}
        if checks.get("rand") != rand_md5:
            err = "data check: the guest read %s from the random-read region, the " \
                  "image holds %s" % (checks.get("rand"), rand_md5)
        elif checks.get("seq") != host_seq:
            err = "data check: the guest read back %s after seqwrite, the image " \
                  "holds %s" % (checks.get("seq"), host_seq)
    if err:
        return failed(rec, err, vm, argv)
    for p in phases:
        key = p.name.replace("-", "_")
        f = figs[p.name]
        rec[key + ("_iops" if p.name.startswith("randread") else "_mbps")] = (
            f["iops"] if p.name.startswith("randread") else f["mbps"])
        rec[key + "_cpu_s_per_gib"] = cpu[p.name]["device_cpu_s"] / (f["bytes"] / GIB)
    rec["seqwrite_mbps_nosync"] = rec["seqwrite_mbps"]
    rec["seqwrite_mbps"] = figs["seqwrite"]["mbps_with_flush"]
    rec["seqwrite_flush_s"] = figs["seqwrite"]["flush_s"]
    rec["rss_mib"] = rss[0] / 1024.0
    rec["guest_ram_rss_mib"] = rss[1] / 1024.0
    rec["ok"] = True
    return rec


def net_run(args, vmm, kernel, initrd, rnd, serial):
    rec = {"kind": "net", "vmm": vmm, "round": rnd, "ok": False}
    tap = "hkbv%d.%d" % (os.getpid() % 10000, serial)
    net = serial % 250 + 1
    host, guest = "10.213.%d.1" % net, "10.213.%d.2" % net
    rec["tap"] = tap
    nbytes = args.net_mib * MIB
    cmd = ("set -e\nip link set eth0 up\nip addr add %s/24 dev eth0\n"
           "hk-ioperf tcpsend %s %d %d\nhk-ioperf tcprecv %s %d"
           % (guest, host, PORT_G2H, args.net_mib, host, PORT_H2G))
    argv = vmm_argv(args, vmm, kernel, initrd, cmd, extra=net_argv(vmm, tap))
    g2h = h2g = None
    try:
        sh("ip", "tuntap", "add", "dev", tap, "mode", "tap")
        sh("ip", "addr", "add", host + "/24", "dev", tap)
        sh("ip", "link", "set", tap, "up")
        g2h = Listener(host, PORT_G2H, "recv", nbytes, args.timeout)
        h2g = Listener(host, PORT_H2G, "send", nbytes, args.timeout)

        def stalled():
            for name, lst in (("guest -> host", g2h), ("host -> guest", h2g)):
                why = lst.stalled(args.stall_seconds)
                if why:
                    return "%s: %s" % (name, why)
            return None
        vm = run_to_end(argv, vmm, args.timeout, stalled)
    except (OSError, subprocess.CalledProcessError) as e:
        rec.update({"error": "host side: %s" % e, "stdout_tail": "", "stderr_tail": "",
                    "argv": argv})
        return rec
    finally:
        for lst in (g2h, h2g):
            if lst:
                lst.close()
        subprocess.run(["ip", "link", "del", tap], stderr=subprocess.DEVNULL)
    rec.update({k: vm[k] for k in ("status", "timed_out", "stalled", "wall_s", "vmm_cpu_s")})
    figs = parse_figures(vm["stdout"])
    rec["guest_figures"] = figs
    rec["host_g2h"], rec["host_h2g"] = g2h.result, h2g.result
    err = vm_error(vmm, vm)
    if not err:
        for name, r in (("guest -> host", g2h.result), ("host -> guest", h2g.result)):
            if not r["ok"]:
                err = "%s: %s" % (name, r.get("error", "failed"))
                break
    if not err and figs.get("tcprecv", {}).get("bytes") != nbytes:
        err = "the guest received %s bytes, %d sent" % (
            figs.get("tcprecv", {}).get("bytes"), nbytes)
    if err:
        return failed(rec, err, vm, argv)
    rec["g2h_mbps"] = g2h.result["mbps"]
    rec["h2g_mbps"] = h2g.result["mbps"]
    rec["g2h_mbps_guest"] = figs["tcpsend"]["mbps"]
    rec["h2g_mbps_guest"] = figs["tcprecv"]["mbps"]
    rec["ok"] = True
    return rec


# ------------------------------------------------------------- summary ----

def block_metrics(args):
    """(key, label) of each throughput row of the block table."""
    m = []
    for p in block_phases(args):
        key = p.name.replace("-", "_")
        if p.name == "randread-mq":
            m.append((key + "_iops", "4 KiB random read, %d jobs x QD %d on %d queues, IOPS"
                      % (args.cpus, args.mq_qd, args.cpus)))
        elif p.name.startswith("randread"):
            m.append((key + "_iops", "4 KiB random read, QD %s, IOPS" % p.name[len("randread-qd"):]))
        elif p.name == "seqread":
            m.append((key + "_mbps", "1 MiB sequential read, MB/s"))
        else:
            m.append((key + "_mbps", "1 MiB sequential write + flush, MB/s"))
            m.append((key + "_mbps_nosync", "(1 MiB sequential write before the flush, MB/s)"))
    return m


def cpu_metrics(args):
    """(key, label) of each row of the CPU table: the device side's CPU
    seconds per GiB moved, per phase."""
    return [(p.name.replace("-", "_") + "_cpu_s_per_gib", p.name) for p in block_phases(args)]


NET_METRICS = [("g2h_mbps", "guest -> host, MB/s"), ("h2g_mbps", "host -> guest, MB/s"),
               ("g2h_mbps_guest", "(guest -> host, guest's clock, MB/s)"),
               ("h2g_mbps_guest", "(host -> guest, guest's clock, MB/s)")]
NAMES = {"hakoniwa": "hakoniwa", "qemu": "QEMU", "qemu-io_uring": "QEMU aio=io_uring",
         "qemu-threads": "QEMU aio=threads"}


def median(s, key):
    v = s.get(key) if s else None
    return v["median"] if v else None


def best_ratio(summary_mode, qemus, key, lower_is_better=False):
    """hakoniwa against QEMU's best configuration on KEY: (ratio, the
    configuration); above 1 hakoniwa does better (for a cost, LOWER_IS_BETTER:
    QEMU's / hakoniwa's)."""
    hk = median(summary_mode.get("hakoniwa"), key)
    cands = [(median(summary_mode.get(q), key), q) for q in qemus]
    cands = [(v, q) for v, q in cands if v]
    if not hk or not cands:
        return None, None
    if lower_is_better:
        v, q = min(cands)
        return v / hk, q
    v, q = max(cands)
    return hk / v, q


def summarize(args, runs):
    summary = {"block": {}, "net": {}}
    ratios = {"block": {}, "block_cpu": {}, "net": {}}
    keys = block_metrics(args) + cpu_metrics(args) + [("rss_mib", ""), ("seqwrite_flush_s", "")]
    for mode in args.modes:
        for vmm in args.block_vmms:
            mine = [r for r in runs if r["kind"] == "block" and r["vmm"] == vmm
                    and r["cache"] == mode]
            ok = [r for r in mine if r["ok"]]
            s = {"runs": len(mine), "ok": len(ok)}
            for key, _ in keys:
                s[key] = stats([r[key] for r in ok])
            summary["block"].setdefault(mode, {})[vmm] = s
    for vmm in args.vmms:
        mine = [r for r in runs if r["kind"] == "net" and r["vmm"] == vmm]
        ok = [r for r in mine if r["ok"]]
        s = {"runs": len(mine), "ok": len(ok)}
        for key, _ in NET_METRICS:
            s[key] = stats([r[key] for r in ok])
        summary["net"][vmm] = s

    qemus = [v for v in args.block_vmms if v != "hakoniwa"]
    for mode, sm in summary["block"].items():
        ratios["block"][mode] = {k: best_ratio(sm, qemus, k) for k, _ in block_metrics(args)}
        ratios["block_cpu"][mode] = {k: best_ratio(sm, qemus, k, lower_is_better=True)
                                     for k, _ in cpu_metrics(args) + [("rss_mib", "")]}
    if "hakoniwa" in args.vmms and "qemu" in args.vmms and summary["net"]:
        for key, _ in NET_METRICS:
            ratios["net"][key] = best_ratio(summary["net"], ["qemu"], key)
    return summary, ratios


def stage_table(args, runs):
    """hakoniwa's profile: per cache mode and phase, the median over runs
    of the mean time per request in each stage (us), and the requests."""
    rows = [["cache", "phase", "requests"] + ["%s, us" % st.replace("_", " ")
                                             for st in DISK_STAGES]]
    for mode in args.modes:
        mine = [r for r in runs if r["kind"] == "block" and r["vmm"] == "hakoniwa"
                and r["cache"] == mode and r["ok"] and r.get("phase_stages")]
        for p in block_phases(args):
            per = [r["phase_stages"].get(p.name) for r in mine]
            per = [x for x in per if x]
            if not per:
                continue
            row = [mode, p.name, fmt_range(stats([x["dequeue_to_submit"]["requests"]
                                                  for x in per]), "%.0f")]
            for st in DISK_STAGES:
                means = [x[st]["ns"] / 1000.0 / x[st]["requests"] for x in per
                         if x[st]["requests"]]
                row.append(fmt_range(stats(means), "%.0f"))
            rows.append(row)
    return rows if len(rows) > 1 else None


def ratio_cell(r):
    value, against = r
    if value is None:
        return "-"
    return "%s (%s)" % (fmt_ratio(value), NAMES[against].replace("QEMU ", ""))


def tables(args, summary, ratios):
    """The block throughput table, the block cost table (CPU per GiB and
    memory) and the network table (None without network runs)."""
    vmms = args.block_vmms
    qemus = len([v for v in vmms if v != "hakoniwa"])
    head = ["cache", "measure"] + [NAMES[v] for v in vmms]
    if "hakoniwa" in vmms and qemus:
        head.append("hakoniwa / QEMU's best")
    block, cost = [head], [head[:]]
    for mode in summary["block"]:
        sm = summary["block"][mode]
        for key, label in block_metrics(args):
            f = "%.0f" if "iops" in key else "%.1f"
            row = [mode, label] + [fmt_range(sm[v][key], f) for v in vmms]
            if len(head) > len(row):
                row.append(ratio_cell(ratios["block"][mode][key]))
            block.append(row)
        for key, label in cpu_metrics(args) + [("rss_mib", "")]:
            if key == "rss_mib":
                label, f = "resident memory outside guest RAM, MiB", "%.1f"
            else:
                label, f = "device-side CPU s per GiB, %s" % label, "%.2f"
            row = [mode, label] + [fmt_range(sm[v][key], f) for v in vmms]
            if len(head) > len(row):
                row.append(ratio_cell(ratios["block_cpu"][mode][key]))
            cost.append(row)
    if not summary["net"]:
        return block, cost, None
    net = [["direction"] + [NAMES[v] for v in args.vmms]
           + (["hakoniwa / QEMU"] if len(args.vmms) == 2 else [])]
    for key, label in NET_METRICS:
        row = [label] + [fmt_range(summary["net"][v][key], "%.1f") for v in args.vmms
                         if v in summary["net"]]
        if len(args.vmms) == 2:
            row.append(fmt_ratio(ratios["net"].get(key, (None, None))[0]))
        net.append(row)
    return block, cost, net


# --------------------------------------------------------- environment ----

def debian_guest(args):
    """The block runs' guest: the Debian image's manifest lines that say
    what it is (its suite, tree digest and fio's version)."""
    info = {"image": os.path.relpath(args.debian_image, ROOT),
            "initramfs": os.path.relpath(args.debian_initramfs, ROOT),
            "cmdline": DEBIAN_CMDLINE + " hk.cmd=<base64 of the command>"}
    try:
        with open(os.path.join(os.path.dirname(args.debian_image), "debian.MANIFEST")) as f:
            for line in f:
                key, sep, val = line.strip().partition(": ")
                if sep and key in ("suite", "tree-sha256", "root"):
                    info[key] = val
                elif line.startswith("  fio "):
                    info["fio"] = line.split()[1]
    except OSError:
        pass
    return info


def environment(args, image_info):
    env = vmm_environment(RIG_NOTE, "figures", args.hakoniwa, args.qemu, args.kernel,
                          args.initramfs, CMDLINE + " hk.cmd=<base64 of the command>",
                          vcpus=args.cpus, memory_mib=args.memory_mib, relative_to=ROOT)
    env["image"] = image_info
    if not args.no_block:
        env["block_guest"] = debian_guest(args)
    if in_rig():
        env["rig_storage"] = ("the image lives on L1's /tmp: ext4 on a virtio-blk disk of "
                              "the rig's TCG QEMU (cache=unsafe, a sparse file on the "
                              "machine), so L1's 'disk' is the machine's page cache "
                              "behind an emulated device")
    return env


# -------------------------------------------------------------- figure ----

def draw(path, args, summary, ratios):
    """virtio.png: left, hakoniwa against QEMU's best on every block row
    (above 1: hakoniwa does better); right, the device-side CPU seconds
    per GiB of each configuration per phase and cache mode. False when
    matplotlib is missing."""
    fig, axes = panels(1, 2, (14, 6))
    if fig is None:
        return False
    left, right = axes
    labels, values = [], []
    for mode in summary["block"]:
        for key, label in block_metrics(args):
            if key.endswith("_nosync"):
                continue
            v = ratios["block"][mode][key][0]
            labels.append("%s: %s" % (mode, label.replace(", IOPS", "").replace(", MB/s", "")))
            values.append(v or 0)
    y = range(len(labels))
    left.barh(y, values, color=["tab:green" if v >= 1 else "tab:red" for v in values])
    left.axvline(1.0, color="black", linewidth=1)
    left.set_yticks(list(y))
    left.set_yticklabels(labels, fontsize=7)
    left.invert_yaxis()
    left.set_xlabel("median hakoniwa / median QEMU's best (above 1: hakoniwa faster)")
    left.set_title("virtio-blk throughput against QEMU's best")
    width = 0.8 / max(1, len(args.block_vmms))
    phases = cpu_metrics(args)
    groups = ["%s\n%s" % (mode, label) for mode in summary["block"] for _, label in phases]
    for i, vmm in enumerate(args.block_vmms):
        vals = [median(summary["block"][mode][vmm], key) or 0
                for mode in summary["block"] for key, _ in phases]
        right.bar([g + i * width for g in range(len(groups))], vals, width, label=NAMES[vmm])
    right.set_xticks([g + width * (len(args.block_vmms) - 1) / 2 for g in range(len(groups))])
    right.set_xticklabels(groups, fontsize=6, rotation=90)
    right.set_ylabel("device-side CPU s per GiB moved")
    right.set_yscale("log")
    right.set_title("What the host paid (all threads but the vCPUs)")
    right.legend(fontsize=8)
    save_figure(fig, path, 110)
    return True


# ------------------------------------------------------------ markdown ----

def write_markdown(path, result, block, cost, net, args, figure):
    env = result["environment"]
    L = ["# virtio benchmark: hakoniwa vs QEMU (virtio-blk, virtio-net)", ""]
    L.append("Generated by `%s` on %s (%s)." % (result["command"], env["date_utc"],
                                                 env["where"]))
    L.append("")
    L += md_context(env, "In the rig each VMM process, its device threads, L1's page cache, "
                    "the TAP and the host end of every TCP transfer run in L1 under TCG, and "
                    "L1's own disk is an emulated device: device work done in the VMM's "
                    "user space costs far more than natively, so the figures below are small "
                    "and the ratios show the VMMs' device paths under that load, not native "
                    "speed.")
    bg = env.get("block_guest", {})
    L.append("Same guests for every VMM: kernel %s, %d vCPUs, %d MiB. Block runs: the Debian "
             "guest (`%s`, %s, root read-only under a tmpfs overlay; initramfs `%s`) running "
             "fio %s with O_DIRECT and libaio on the measured disk; network runs: the default "
             "guest (initramfs `%s`) with `hk-ioperf` (guest/tools/hk-ioperf.c). %d round(s), "
             "round-robin; median (min-max)."
             % (env["guest_kernel_package"] or env["guest_kernel_version"], env["vcpus"],
                env["memory_mib"], bg.get("image"), bg.get("suite"), bg.get("initramfs"),
                bg.get("fio"), env["guest_initramfs"], result["rounds"]))
    L.append("")
    L.append("Block ratios compare hakoniwa with QEMU's best configuration on each row (named "
             "in parentheses): median(hakoniwa) / median(QEMU's best) for throughput, "
             "median(QEMU's best) / median(hakoniwa) for costs; above 1, hakoniwa does "
             "better. MB/s = 10^6 bytes/s.")
    L.append("")
    if len(block) > 1:
        L.append("## virtio-blk")
        L.append("")
        L.append(md_table(block))
        L.append("")
        L.append(SEED_002[0].upper() + SEED_002[1:] + ".")
        L.append("")
        if figure:
            L.append("![hakoniwa against QEMU's best, and CPU per GiB](virtio.png)")
            L.append("")
        stages = stage_table(args, result["runs"])
        if stages:
            L.append("### Where hakoniwa's time went")
            L.append("")
            L.append("hakoniwa's stage counters (`vm.counters`, docs/devices.md) read at each "
                     "phase's markers: the mean time per request from the queue thread's "
                     "wake-up on the kick to taking the request off the ring, to handing it "
                     "to the engine, to its completion by the host, to the interrupt; median "
                     "(min-max) over runs.")
            L.append("")
            L.append(md_table(stages))
            L.append("")
        L.append("### What the host paid")
        L.append("")
        L.append("Device-side CPU: user + system time of every VMM thread but the vCPU "
                 "threads (hakoniwa's `vcpuN`, QEMU's `CPU N/KVM`, which run the guest), "
                 "io_uring's and QEMU's worker threads included, over each phase, per GiB "
                 "the phase moved. Resident memory: the VMM's RSS (/proc/PID/smaps) outside "
                 "the guest's RAM mapping, the largest seen at a phase's end.")
        L.append("")
        L.append(md_table(cost))
        L.append("")
    if net:
        L.append("## virtio-net (TCP over a TAP device)")
        L.append("")
        L.append(md_table(net))
        L.append("")
    im = env["image"]
    L.append("## What is measured")
    L.append("")
    L.append("- **Image**: %d MiB raw file of random data (dd from /dev/urandom) on %s. "
             "Lower %d MiB: the sequential region; upper %d MiB: the random-read region."
             % (im["mib"], im["filesystem"], args.seq_mib, args.image_mib - args.seq_mib))
    L.append("- **Each block run** boots the Debian guest once with its root as /dev/vda "
             "(read-only) and the image as a second disk in one cache mode with %d queues "
             "(hakoniwa `num_queues=`, QEMU `num-queues=`), after `sync` and `echo 3 > "
             "/proc/sys/vm/drop_caches` on the host (cold host page cache). The guest finds "
             "the image by its size, checks it has %d hardware queues, then runs these fio "
             "jobs in this order (options below), each framed by markers at which the host "
             "samples the VMM's CPU time:" % (args.cpus, args.cpus))
    for p in block_phases(args):
        L.append("  - `%s`: `fio %s`%s" % (p.name, " ".join(p.options),
                                           "; then one FLUSH (dd's fsync of the block "
                                           "device), timed in the guest" if p.flush else ""))
    L.append("  - Random reads cover the image's upper %d MiB, sequential ones its lower %d "
             "MiB. The write row's MB/s includes the FLUSH; the figure before it is shown "
             "in parentheses. With cache=unsafe the VMM ignores the flush; with writeback it "
             "syncs the image (written data sits in the host page cache until then); with "
             "none the writes already went to the file with O_DIRECT."
             % (args.image_mib - args.seq_mib, args.seq_mib))
    L.append("  - a data check: the guest reads the first %d MiB of each region with dd and "
             "prints their md5; the random-read region must match the image as created, "
             "the sequential one the host's read of the image after the VMM exited."
             % args.check_mib)
    L.append("- With cache=writeback (and unsafe) the VMM reads through the host page cache: "
             "a random read of a block read before in the same run is served from memory. "
             "That is what these modes do; it is reported as measured.")
    L.append("- **Each network run** creates a TAP device (host 10.213.N.1/24, guest "
             "10.213.N.2/24, MTU 1500), boots the guest with a virtio-net NIC on it, and "
             "the guest connects twice to the host: `hk-ioperf tcpsend` sends %d MiB "
             "(guest -> host), then `hk-ioperf tcprecv` reads %d MiB (host -> guest). "
             "MB/s at the host end (a Python receiver/sender in the same machine as the "
             "VMM): from accept() to the end of the stream, or for host -> guest to the "
             "guest's close after it read everything. The guest's own clock (from connect) "
             "is shown in parentheses. A transfer that moves nothing for %g s stops "
             "the VM: a failed run (\"stalled\")." % (args.net_mib, args.net_mib,
                                                      args.stall_seconds))
    L.append("- The VMM's CPU time (user + system, all threads, whole VM life including "
             "boot) and wall time of each run are in virtio.json.")
    L.append("")
    L.append("## Command lines")
    L.append("")
    L += md_command_lines(result["argv"])
    L.append("")
    L.append("Guest command, block runs (base64 in `hk.cmd=`):")
    L.append("")
    L.append("```")
    L.append(result["guest_cmd"]["block"])
    L.append("```")
    L.append("")
    L.append("Guest command, network runs:")
    L.append("")
    L.append("```")
    L.append(result["guest_cmd"]["net"])
    L.append("```")
    L.append("")
    L.append("## Environment")
    L.append("")
    L += md_environment(env)
    L.append("")
    L.append("## All runs")
    L.append("")
    qcols = [k for k, _ in block_metrics(args) if k.endswith("_iops")]
    rows = [["round", "kind", "VMM", "cache", "ok"]
            + ["IOPS " + k[len("randread_"):-len("_iops")] for k in qcols]
            + ["seqread MB/s", "seqwrite MB/s", "g2h MB/s", "h2g MB/s", "VMM CPU s",
               "wall s", "error"]]
    for r in result["runs"]:
        g = functools.partial(cell, r)
        rows.append([str(r["round"] + 1), r["kind"], r["vmm"], r.get("cache", "-"),
                     "yes" if r["ok"] else "**no**"]
                    + [g(c, "%.0f") for c in qcols]
                    + [g("seqread_mbps", "%.1f"), g("seqwrite_mbps", "%.1f"),
                       g("g2h_mbps", "%.1f"), g("h2g_mbps", "%.1f"),
                       g("vmm_cpu_s", "%.1f"), g("wall_s", "%.1f"), r.get("error", "")])
    L.append(md_table(rows))
    L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L))


# ---------------------------------------------------------------- main ----

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3,
                   help="rounds: runs per VMM and cache mode, and network runs per VMM "
                        "(default 3)")
    p.add_argument("--vmms", nargs="+", default=VMMS, choices=VMMS, metavar="VMM",
                   help="hakoniwa and/or qemu (default both)")
    p.add_argument("--modes", nargs="+", default=MODES, choices=MODES, metavar="MODE",
                   help="cache modes (default: %s)" % " ".join(MODES))
    p.add_argument("--image-mib", type=int, default=512, help="image size (default 512)")
    p.add_argument("--seq-mib", type=int, default=256,
                   help="sequential read/write size, the image's lower part (default 256)")
    p.add_argument("--randread-seconds", type=float, default=8,
                   help="time of each random-read phase (default 8)")
    p.add_argument("--qd", type=int, nargs="+", default=[1, 32],
                   help="random-read queue depths of one job, each a phase (default 1 32)")
    p.add_argument("--mq-qd", type=int, default=16,
                   help="queue depth of each of the multi-queue phase's jobs, one per "
                        "vCPU (default 16)")
    p.add_argument("--qemu-aio", nargs="+", default=QEMU_AIO, choices=QEMU_AIO,
                   metavar="AIO", help="QEMU's aio= for the block runs (default: %s)"
                   % " ".join(QEMU_AIO))
    p.add_argument("--check-mib", type=int, default=8,
                   help="MiB per region read back for the md5 check (default 8)")
    p.add_argument("--net-mib", type=int, default=256,
                   help="MiB per direction per network run (default 256)")
    p.add_argument("--stall-seconds", type=float, default=30,
                   help="stop a network run whose transfer moved nothing for this "
                        "long (default 30)")
    p.add_argument("--no-block", action="store_true", help="skip the virtio-blk runs")
    p.add_argument("--no-net", action="store_true", help="skip the virtio-net runs")
    p.add_argument("--cpus", type=int, default=2, help="guest vCPUs (default 2)")
    p.add_argument("--memory-mib", type=int, default=512)
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds one VM may run (default 300)")
    p.add_argument("--workdir", default="/tmp",
                   help="where the image goes; must allow O_DIRECT (default /tmp)")
    add_path_options(p, "kernel", "initramfs", "hakoniwa", "qemu")
    p.add_argument("--debian-image", default=os.path.join(ROOT, "build/guest/debian.img"),
                   help="the block runs' guest root (scripts/build-guest-debian)")
    p.add_argument("--debian-initramfs",
                   default=os.path.join(ROOT, "build/guest/debian-initramfs.cpio.gz"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"),
                   help="directory for virtio.json and virtio.md")
    args = p.parse_args()

    args.vmms = [v for v in VMMS if v in args.vmms]
    args.modes = [m for m in MODES if m in args.modes]
    args.qd = sorted(set(args.qd))
    args.block_vmms = (["hakoniwa"] if "hakoniwa" in args.vmms else []) + (
        ["qemu-" + a for a in QEMU_AIO if a in args.qemu_aio] if "qemu" in args.vmms else [])
    if not 0 < args.seq_mib < args.image_mib:
        sys.exit("virtio.py: --seq-mib must be below --image-mib")
    if any(q < 1 or q > 256 for q in args.qd + [args.mq_qd]):
        sys.exit("virtio.py: queue depths must be 1-256")
    for name in ("kernel", "initramfs", "debian_image", "debian_initramfs"):
        setattr(args, name, os.path.abspath(getattr(args, name)))
    for path in (args.kernel, args.initramfs):
        if not os.path.isfile(path):
            sys.exit("virtio.py: %s is missing (scripts/build-guest builds it)" % path)
    for path in ([] if args.no_block else [args.debian_image, args.debian_initramfs]):
        if not os.path.isfile(path):
            sys.exit("virtio.py: %s is missing (scripts/build-guest-debian builds it)" % path)
    if "hakoniwa" in args.vmms and not os.access(args.hakoniwa, os.X_OK):
        sys.exit("virtio.py: %s is missing (cargo build --release)" % args.hakoniwa)
    if "qemu" in args.vmms and not shutil.which(args.qemu):
        sys.exit("virtio.py: %s not found (apt-get install qemu-system-x86)" % args.qemu)
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        sys.exit("virtio.py: /dev/kvm is not usable here")
    if os.geteuid() != 0:
        sys.exit("virtio.py: needs root (TAP devices, drop_caches)")
    work = tempfile.mkdtemp(prefix="hk-bench-virtio.", dir=args.workdir)
    if not args.no_block and not check_o_direct(work):
        shutil.rmtree(work, ignore_errors=True)
        sys.exit("virtio.py: %s does not allow O_DIRECT (cache=none needs it); "
                 "pick --workdir on a disk file system" % args.workdir)
    if not args.no_net:
        subprocess.run(["ip", "link", "set", "lo", "up"], stderr=subprocess.DEVNULL)

    t_start = time.monotonic()
    runs = []
    try:
        # The guest files and the image on a local file system (in the rig the
        # project tree is 9p), the same copies for every run.
        kernel = shutil.copy(args.kernel, os.path.join(work, "vmlinuz"))
        initrd = shutil.copy(args.initramfs, os.path.join(work, "initramfs.cpio.gz"))
        # The Debian root stays where it is (read-only, 2 GB sparse): the
        # guest reads it while booting, not while measuring.
        args.run_kernel = kernel
        args.run_debian_initramfs = shutil.copy(
            args.debian_initramfs, os.path.join(work, "debian-initramfs.cpio.gz"))
        image = os.path.join(work, "disk.img")
        image_info = {"mib": args.image_mib, "filesystem": fs_type(work)}
        rand_md5 = None
        if not args.no_block:
            t = time.monotonic()
            subprocess.run(["dd", "if=/dev/urandom", "of=" + image, "bs=1M",
                            "count=%d" % args.image_mib, "status=none"], check=True)
            os.sync()
            image_info["create_s"] = round(time.monotonic() - t, 1)
            rand_md5 = md5_region(image, args.seq_mib,
                                  min(args.check_mib, args.image_mib - args.seq_mib))
        env = environment(args, image_info)
        print("virtio benchmark: %s" % env["note"], flush=True)
        print("guest: %s, %d vCPUs, %d MiB; image %d MiB on %s" % (
            env["guest_kernel_version"], args.cpus, args.memory_mib, args.image_mib,
            image_info["filesystem"]), flush=True)

        serial = 0
        for rnd in range(args.runs):
            label = "run %d/%d" % (rnd + 1, args.runs)
            for mode in ([] if args.no_block else args.modes):
                for vmm in args.block_vmms:
                    r = block_run(args, vmm, mode, image, rand_md5, rnd)
                    runs.append(r)
                    if r["ok"]:
                        print("%-8s block %-13s %-9s %s  [RSS %.1f MiB, VMM CPU %.1f s, "
                              "%.0f s]" % (
                                  label, vmm, mode,
                                  "  ".join("%s %.0f" % (k.replace("_iops", " IOPS").replace(
                                      "_mbps", " MB/s"), r[k]) for k, _ in block_metrics(args)),
                                  r["rss_mib"], r["vmm_cpu_s"], r["wall_s"]),
                              flush=True)
                    else:
                        print("%-8s block %-8s %-9s FAILED: %s" % (label, vmm, mode,
                                                                  r["error"]), flush=True)
                        print("  console tail: %r" % r["stdout_tail"][-600:], flush=True)
                        print("  stderr tail: %r" % r["stderr_tail"][-600:], flush=True)
            for vmm in ([] if args.no_net else args.vmms):
                serial += 1
                r = net_run(args, vmm, kernel, initrd, rnd, serial)
                runs.append(r)
                if r["ok"]:
                    print("%-8s net   %-8s guest->host %6.1f MB/s  host->guest %6.1f MB/s  "
                          "(guest clock %.1f / %.1f)  [VMM CPU %.1f s, %.0f s]" % (
                              label, vmm, r["g2h_mbps"], r["h2g_mbps"], r["g2h_mbps_guest"],
                              r["h2g_mbps_guest"], r["vmm_cpu_s"], r["wall_s"]), flush=True)
                else:
                    print("%-8s net   %-8s FAILED: %s" % (label, vmm, r["error"]), flush=True)
                    print("  console tail: %r" % r["stdout_tail"][-600:], flush=True)
                    print("  stderr tail: %r" % r["stderr_tail"][-600:], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summary, ratios = summarize(args, runs)
    shown = lambda a: [("'%s'" % x) if " " in x else x for x in  # noqa: E731
                       (os.path.relpath(x, ROOT) if x.startswith(ROOT + os.sep) else
                        re.sub(r"hk\.cmd=\S+", "hk.cmd=BASE64", x.replace(work, "$WORK"))
                        for x in a)]
    argv_shown = {}
    for vmm in ([] if args.no_block else args.block_vmms):
        argv_shown["%s, block" % vmm] = shown(vmm_argv(
            args, vmm, args.kernel, args.debian_initramfs, "CMD", cmdline=DEBIAN_CMDLINE,
            extra=block_disks_argv(vmm, args.debian_image, os.path.join(work, "disk.img"),
                                   "MODE", args.cpus)))
    for vmm in ([] if args.no_net else args.vmms):
        argv_shown["%s, net" % vmm] = shown(vmm_argv(
            args, vmm, args.kernel, args.initramfs, "CMD", extra=net_argv(vmm, "TAP")))
    result = {
        "benchmark": "virtio",
        "command": "scripts/bench-virtio" + "".join(" " + a for a in sys.argv[1:]),
        "environment": env,
        "rounds": args.runs,
        "vmms": args.vmms,
        "block_vmms": [] if args.no_block else args.block_vmms,
        "cache_modes": [] if args.no_block else args.modes,
        "parameters": {k: getattr(args, k) for k in (
            "image_mib", "seq_mib", "randread_seconds", "qd", "mq_qd", "check_mib", "net_mib",
            "cpus", "memory_mib", "timeout", "stall_seconds")},
        "argv": argv_shown,
        "guest_cmd": {"block": block_cmd(args),
                      "net": "set -e\nip link set eth0 up\nip addr add GUEST/24 dev eth0\n"
                             "hk-ioperf tcpsend HOST %d %d\nhk-ioperf tcprecv HOST %d"
                             % (PORT_G2H, args.net_mib, PORT_H2G)},
        "seed_002": SEED_002,
        "summary": summary,
        "ratios": ratios,
        "ratio_definition": "block: median(hakoniwa) / median(QEMU's best configuration) "
                            "for throughput, median(QEMU's best) / median(hakoniwa) for "
                            "costs (CPU per GiB, memory), each [ratio, that configuration]; "
                            "net: median(hakoniwa) / median(QEMU); above 1 means hakoniwa "
                            "does better",
        "total_s": round(time.monotonic() - t_start, 1),
        "runs": runs,
    }
    block, cost, net = tables(args, summary, ratios)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "virtio.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    drawn = False if args.no_block else draw(os.path.join(args.out, "virtio.png"), args,
                                             summary, ratios)
    write_markdown(os.path.join(args.out, "virtio.md"), result, block, cost, net, args, drawn)

    print()
    print("Context: %s." % env["note"])
    print("Median (min-max) of %d run(s); ratios hakoniwa against QEMU's best, above 1: "
          "hakoniwa does better." % args.runs)
    if not args.no_block:
        print()
        print("virtio-blk (%s):" % SEED_002)
        print(text_table(block))
        print()
        print("virtio-blk, what the host paid:")
        print(text_table(cost))
    if not args.no_net:
        print()
        print("virtio-net:")
        print(text_table(net))
    print()
    print("wrote %s and %s%s (%.0f s)" % (
        os.path.relpath(os.path.join(args.out, "virtio.json"), ROOT),
        os.path.relpath(os.path.join(args.out, "virtio.md"), ROOT),
        " and virtio.png" if drawn else " (no figure: matplotlib is missing)",
        result["total_s"]))
    failed = sum(1 for r in runs if not r["ok"])
    return exit_status("virtio.py", failed, "run(s)", "virtio.json")


if __name__ == "__main__":
    sys.exit(main())
