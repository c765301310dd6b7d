#!/usr/bin/env python3
"""Guest and host caches (seed 002): the paper's experiment on hakoniwa.

Several Debian guests (scripts/build-guest-debian) run at once on one host,
each with its own data disk (ext4, cache=writeback) and swap disk, so that
they share the host page cache as the paper's six Xen VMs did. Each data
disk is a dm-delay device over a loop device over a file in --workdir with
direct I/O to that file (`losetup --direct-io=on`): the host page cache of
the disk is then the dm device's alone, and its /sys/block/dm-N/stat is
that VM's physical layer, not the whole host disk's. dm-delay makes a read
the host cache misses wait --miss-delay-ms, as the paper's disk made it
seek: in the rig, L1's own disk is served from L0's page cache about as
fast as a hit, and without a cost for a miss the host cache could not
matter (the delay is off while the caches are settled). The host's memory
is what the rig gives L1 (HK_RIG_MEM; scripts/bench-iocache sets it),
which the guests' memory and the host page cache share.

Per guest memory size (--small-mib and --large-mib, the paper's 128 MB and
1 GB scaled to the rig), one boot of --vms guests; in it, per data set
size (--sizes, MiB per VM), the files are laid out once, then every guest
runs the same cell at the same time:

  ffsb      the paper's FFSB profile with fio: 64 KiB files, 16 KiB
            operations, 50/50 read/write at random, one thread, for
            --seconds; ops/s = fio's read + write IOPS (table 5), for
            buffered and direct (O_DIRECT) I/O, swap on and off;
  postmark  Postmark with 1 MiB files, 1 MiB reads and writes, 50/50
            (table 3), --postmark-transactions transactions: transactions/s;
  dd        a sequential read of one file of the data set's size, twice,
            buffered and direct: the second read's MB/s (figure 2).

The first guest is traced (`ctl iotrace`, with the guest agent's
application layer where it answers) in every ffsb cell: figures 8-11 come
from those reports. The advisor (`ctl advise`, asked while the workload
runs and applied through the balloon as `--apply` sizes it) is then run
from a bad starting configuration at the smallest and the largest data set
(--advisors; all
guests at once: a small guest with direct I/O on a small data set, the
balloon holding the difference; a large guest with buffered I/O on a large
one), and the starting and the advised configuration take turns,
--advisor-rounds cells each: the gain is the median round's ratio. The
tracer's own cost is the ffsb cell with direct I/O at --overhead-size (by
default the smallest, whose reads all hit the host cache: the fastest
requests, where a per-request cost shows most), tracing off and on in
turn, --overhead-pairs times: ops/s and the VMMs' CPU seconds.

Writes bench/results/iocache.json (every cell, the reports, the
environment), iocache.md (table 5 beside ours, figures 8-11's numbers, the
advisor's runs, the tracer's cost) and iocache.png. Normally run through
scripts/bench-iocache. Needs root (losetup, drop_caches).
"""

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.console import shell_start, shell_wait  # noqa: E402
from lib.environment import vmm_environment  # noqa: E402
from lib.hakoniwa import hk_ctl  # noqa: E402
from lib.options import add_path_options, exit_status  # noqa: E402
from lib.plots import panels, save_figure  # noqa: E402
from lib.procstat import thread_cpu  # noqa: E402
from lib.tables import md_context, md_environment, md_table, text_table  # noqa: E402
from lib.vmm import Proc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024 * 1024
ROOT_PROMPT = re.compile(rb"root@hakoniwa:~# ")
DEBIAN_CMDLINE = "console=ttyS0 root=/dev/vda ro hk.overlay quiet io_delay=none panic=-1"
RIG_NOTE = ("inside L1 under TCG with nested KVM, one L1 vCPU for every guest; "
            "absolute figures mean little, compare the cells")
# The guest agent's vsock port is the VMM's business; the guests get CIDs
# from 3.
FIRST_CID = 3
# The advisor is asked this long before its cell's counted time ends: the
# three guests' agents answer within a few seconds of each other (about 2 s
# each under load, bench-iocache's first run), all before fio exits.
DURING_BEFORE_END_S = 6
# Requests in a second that say a cell's I/O has begun: fio's setup (its
# files' stat and open) reads little, and the slowest cell's I/O makes
# about 30 ops/s per guest.
IO_BEGAN_OPS = 10
IO_MODES = ["buffered", "direct"]
SWAP_MODES = ["off", "on"]

# Table 5 of the paper (FFSB ops/s, 6 VMs; data set MB per VM): the rows
# are (guest memory MB, I/O, swap).
PAPER_SIZES = [64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
PAPER_TABLE5 = {
    (128, "buffered", "on"): [110.94, 102.90, 103.15, 99.82, 98.06, 95.09, 92.59, 45.28,
                              28.08, 17.55, 15.54],
    (128, "direct", "on"): [2602.09, 1798.69, 1655.55, 190.55, 208.38, 190.63, 157.74,
                            96.39, 30.44, 16.36, 15.47],
    (128, "buffered", "off"): [125.84, 116.74, 114.76, 101.74, 98.55, 96.93, 96.27, 47.97,
                               42.63, 28.07, 16.34],
    (128, "direct", "off"): [2667.63, 2525.69, 1966.14, 1421.76, 66.33, 35.31, 23.95,
                             23.46, 16.90, 15.46, 14.51],
    (1024, "buffered", "on"): [5143.74, 4154.43, 3858.24, 2502.90, 1856.29, 199.70, 104.73,
                               46.76, 27.93, 18.84, 16.18],
    (1024, "direct", "on"): [2978.51, 2324.25, 2040.38, 913.42, 22.82, 18.24, 17.61,
                             16.54, 16.98, 15.48, 14.24],
    (1024, "buffered", "off"): [5630.10, 4988.70, 4756.78, 3970.90, 2321.41, 1166.97,
                                162.20, 86.32, 32.74, 16.34, 15.55],
    (1024, "direct", "off"): [2908.09, 1161.67, 933.72, 679.91, 19.86, 18.41, 17.10,
                              17.24, 15.90, 16.23, 13.15],
}


# ------------------------------------------------------------- the host ----

def sh(cmd):
    return subprocess.run(cmd, shell=True, check=True, capture_output=True,
                          text=True).stdout.strip()


def drop_host_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def data_tree(work, sizes):
    """The FFSB data sets as fio names them (`sSIZE/ffsb.0.N`, 64 KiB
    each, with the `sSIZE.done` marker the guest's layout step looks
    for), in a directory of the host: mkfs.ext4 -d copies it into every
    data disk. fio's own layout in the guests wrote about 1 MiB/s per
    guest in the rig (a 512 MiB data set took 9 minutes); this takes
    seconds. The bytes are random (mke2fs would leave zeros as holes)."""
    root = os.path.join(work, "data-tree")
    blob = os.urandom(64 * 1024)
    for size in sizes:
        d = os.path.join(root, "s%d" % size)
        os.makedirs(d)
        for i in range(ffsb_files(size)):
            with open(os.path.join(d, "ffsb.0.%d" % i), "wb") as f:
                f.write(blob)
        open(os.path.join(root, "s%d.done" % size), "w").close()
    return root


def dmsetup(args):
    """dmsetup without udev (L1 runs none): it makes /dev/mapper's nodes
    itself."""
    return sh("DM_DISABLE_UDEV=1 dmsetup --noudevsync %s" % args)


class DataDisk:
    """A VM's data disk: an ext4 file system (holding TREE) on a loop
    device (direct I/O to its backing file, so no page cache below it), under
    a dm-delay device that the VM opens (cache=writeback: the dm device's
    page cache is the host cache of this disk, and its /sys/block/dm-N/stat
    the physical layer); and its swap disk, a plain file.

    dm-delay is the host's disk: in the rig, a read the host cache misses
    goes to L1's virtual disk, which L0's page cache serves at about the
    speed of a hit, so without it the host cache would not matter. Reads
    that reach it wait --miss-delay-ms (writes none: the host's write-back
    absorbs them in every configuration alike); see set_read_delay."""

    def __init__(self, work, n, data_mib, swap_mib, tree, first=None):
        self.file = os.path.join(work, "data%d.img" % n)
        self.swap = os.path.join(work, "swap%d.img" % n)
        self.name = "hk-iocache-%d" % n
        if first:  # the same file system: a copy is faster than mke2fs
            sh("cp --sparse=always %s %s" % (first.file, self.file))
        else:
            sh("truncate -s %dM %s" % (data_mib, self.file))
            sh("mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 -d %s %s"
               % (tree, self.file))
        self.loop = sh("losetup --find --show --direct-io=on %s" % self.file)
        self.sectors = int(sh("blockdev --getsz %s" % self.loop))
        dmsetup("create %s --table '%s'" % (self.name, self.table(0)))
        self.dev = "/dev/mapper/" + self.name
        sh("truncate -s %dM %s && mkswap -q %s" % (swap_mib, self.swap, self.swap))

    def table(self, read_delay_ms):
        return "0 %d delay %s 0 %d %s 0 0" % (self.sectors, self.loop, read_delay_ms, self.loop)

    def set_read_delay(self, ms):
        """Changes the device's read delay under the running VM (its I/O
        waits while the device is suspended)."""
        dmsetup("suspend --nolockfs %s" % self.name)
        dmsetup("load %s --table '%s'" % (self.name, self.table(ms)))
        dmsetup("resume %s" % self.name)

    def close(self):
        subprocess.run("DM_DISABLE_UDEV=1 dmsetup --noudevsync remove %s; losetup -d %s"
                       % (self.name, self.loop), shell=True, stderr=subprocess.DEVNULL)


# ------------------------------------------------------------ the guests ----

class Guest:
    """One Debian guest under hakoniwa with its console shell, API socket
    and vsock (the guest agent's channel)."""

    def __init__(self, args, n, mem_mib, disk, work):
        self.n = n
        self.hakoniwa = args.hakoniwa
        self.mem_mib = mem_mib
        self.sock = os.path.join(work, "api%d.sock" % n)
        self.vsock = os.path.join(work, "vsock%d.sock" % n)
        for path in (self.sock, self.vsock):
            if os.path.exists(path):
                os.unlink(path)
        self.argv = [args.hakoniwa, "run", "--kernel", args.kernel,
                     "--initramfs", args.debian_initramfs, "--cmdline", DEBIAN_CMDLINE,
                     "--cpus", "1", "--memory", "%dM" % mem_mib,
                     "--disk", "path=%s,readonly=on" % args.debian_image,
                     "--disk", "path=%s,cache=writeback,id=data" % disk.dev,
                     "--disk", "path=%s,cache=writeback,id=swap" % disk.swap,
                     "--vsock", "cid=%d,uds=%s" % (FIRST_CID + n, self.vsock),
                     "--balloon", "--api-socket", self.sock]
        self.vm = Proc(self.argv, "vm%d" % n)
        self.shell_pid = None

    def wait_ready(self, timeout):
        if not self.vm.con.wait(ROOT_PROMPT, 0, timeout):
            raise RuntimeError("vm%d: no shell prompt in %ds: %s" % (self.n, timeout,
                                                                     self.vm.tails()))

    def start(self, command):
        return shell_start(self.vm.con, command)

    def wait(self, token, timeout):
        if not self.vm.alive():
            raise RuntimeError("vm%d ended: %s" % (self.n, self.vm.tails()))
        return shell_wait(self.vm.con, token, timeout)

    def ctl(self, *cmd, timeout=60):
        return hk_ctl(self.hakoniwa, self.sock, *cmd, timeout=timeout)

    def cpu_seconds(self):
        """The VMM's device-side CPU seconds so far: every thread but the
        vCPUs (whose time is the guest's), where the tracer's cost lands."""
        cpu = thread_cpu(self.vm.proc.pid)
        return cpu[0] - cpu[1] if cpu else 0.0


def on_all(guests, command, timeout):
    """COMMAND (a format string of the guest) in every guest at once; their
    outputs."""
    tokens = [(g, g.start(command(g) if callable(command) else command)) for g in guests]
    return [g.wait(t, timeout) for g, t in tokens]


# ------------------------------------------------------------ workloads ----

def host_memory(guests):
    """Where the host's memory is as a cell ends (MiB): each VMM's resident
    set (its guest's RAM as far as the guest touched it and the balloon did
    not take it back), the page cache every VM's data disk shares, and what is
    free. The advisor's direct-I/O advice counts on memory a guest gives
    back becoming host cache; this is where a run shows whether it did."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) // 1024
    vmm_rss = []
    for g in guests:
        try:
            with open("/proc/%d/status" % g.vm.proc.pid) as f:
                rss = next(int(line.split()[1]) // 1024 for line in f
                           if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            rss = None
        vmm_rss.append(rss)
    # The data disks are block devices (dm-delay) the VMMs open: their
    # page cache counts as Buffers, not Cached (files: the guests' swap).
    return {"free_mib": info["MemFree"], "disk_cache_mib": info["Buffers"],
            "file_cache_mib": info["Cached"], "anon_mib": info["AnonPages"],
            "vmm_rss_mib": vmm_rss}


def ffsb_files(size_mib):
    return size_mib * 1024 // 64


def ffsb_options(size_mib):
    """fio's options for table 4's FFSB profile over a data set of SIZE_MIB.
    overwrite=1: without it fio unlinks and lays out every file again at
    each write job's start (its `layout unlink`), and every cell would
    begin by rewriting the whole data set."""
    return ("--name=ffsb --directory=/data/s%d --nrfiles=%d --filesize=64k "
            "--bs=16k --ioengine=psync --file_service_type=random --fallocate=none "
            "--overwrite=1" % (size_mib, ffsb_files(size_mib)))


def layout(guests, size_mib, timeout):
    """Lays out the data set in every guest, written and synced, unless an
    earlier boot did (the data disks outlive the boots)."""
    on_all(guests, "test -f /data/s%d.done || { mkdir -p /data/s%d && ulimit -n 65536 && "
           "fio %s --rw=write --create_only=1 --eta=never --output=/dev/null && sync && "
           "touch /data/s%d.done; }" % (size_mib, size_mib, ffsb_options(size_mib), size_mib),
           timeout)


def settle(guests, disks, size_mib, delay_ms, timeout):
    """The same start for every configuration: both caches dropped, then
    the data set read once in each guest (what a long run's first pass
    does), which leaves in each cache what fits there. The pass reads with
    the disks' delay off (it would take as long as the cells themselves),
    and the delay is on again for the cells."""
    for d in disks:
        d.set_read_delay(0)
    drop_host_caches()
    on_all(guests, "sync; echo 3 > /proc/sys/vm/drop_caches; "
           "find /data/s%d -type f -exec cat {} + > /dev/null" % size_mib, timeout)
    for d in disks:
        d.set_read_delay(delay_ms)


def ffsb_command(size_mib, io, seconds, ramp):
    """The cell's fio run; its report on one line (`hk-ffsb {...}`), or
    fio's status and last words (`hk-ffsb-failed N: ...`)."""
    # invalidate=0: fio would otherwise drop the files from the guest's
    # cache at the start, and every cell would start cold; the caches
    # carry over from cell to cell, as in the paper's long runs, and
    # ramp_time lets them settle before fio counts. randrepeat=0: with
    # fio's default seed every cell read the same blocks in the same order
    # as the cell before it, so a direct cell after a buffered one found
    # in the host cache exactly what it was about to read (host hit ratio
    # 0.75, 68 ops/s per VM, where the same cell after settling had 0.23
    # and 52: evidence iocache-replayed-seed-2026-11-29).
    return ("rm -f /tmp/ffsb.json; ulimit -n 65536; fio %s --rw=randrw --rwmixread=50 "
            "--direct=%d --invalidate=0 --randrepeat=0 --ramp_time=%d --time_based "
            "--runtime=%d "
            "--eta=never --output-format=json "
            "--output=/tmp/ffsb.json >/tmp/ffsb.err 2>&1; s=$?; if [ $s = 0 ]; then "
            "echo \"hk-ffsb $(tr -d '\\n' < /tmp/ffsb.json)\"; else "
            "echo \"hk-ffsb-failed $s: $(tail -c 300 /tmp/ffsb.err | tr '\\n' ' ')\"; fi"
            % (ffsb_options(size_mib), io == "direct", ramp, seconds))


FFSB_RE = re.compile(r"^hk-ffsb (\{.*\})$", re.M)
FAILED_RE = re.compile(r"^hk-ffsb-failed (.*)$", re.M)


def ffsb_result(out):
    """{ops_s, read_iops, write_iops, read_bytes, write_bytes} of one guest's
    fio report; None when there is none."""
    m = FFSB_RE.search(out)
    if not m:
        return None
    job = json.loads(m.group(1))["jobs"][0]
    r, w = job["read"], job["write"]
    return {"ops_s": r["iops"] + w["iops"], "read_iops": r["iops"], "write_iops": w["iops"],
            "read_bytes": r["io_bytes"], "write_bytes": w["io_bytes"],
            "ops": r["total_ios"] + w["total_ios"]}


def set_swap(guests, swap):
    on_all(guests, "swapoff -a 2>/dev/null; %s" % ("swapon /dev/vdc" if swap == "on" else "true"),
           120)


POSTMARK_RE = re.compile(r"(\d+) seconds of transactions \((\d+) per second\)")


def postmark_command(size_mib, transactions):
    conf = "\\n".join([
        "set location /data/pm", "set number %d" % size_mib,
        "set size 1048576 1048576", "set read 1048576", "set write 1048576",
        "set bias read 5", "set transactions %d" % transactions, "run", "quit"])
    return "mkdir -p /data/pm && printf '%s\\n' | postmark 2>&1 | grep 'per second'" % conf


def dd_command(size_mib, io):
    flag = " iflag=direct" if io == "direct" else ""
    return ("test -f /data/dd%d || dd if=/dev/zero of=/data/dd%d bs=1M count=%d "
            "conv=fsync status=none; dd if=/data/dd%d of=/dev/null bs=1M%s 2>/dev/null; "
            "dd if=/data/dd%d of=/dev/null bs=1M%s 2>&1 | tail -1"
            % (size_mib, size_mib, size_mib, size_mib, flag, size_mib, flag))


DD_RE = re.compile(r"copied, ([\d.]+) s, ")


def dd_result(out, size_mib):
    m = DD_RE.search(out)
    return size_mib * MIB / 1e6 / float(m.group(1)) if m else None


# -------------------------------------------------------------- tracing ----

class Tracer:
    """`ctl iotrace` on the first guest's data disk, naming the workload to
    the guest agent when this hakoniwa can: fio's processes (`--comm fio`)
    while they run, which is when the advisor asks, and the shell that
    starts them (`--pid`), whose /proc/PID/io counts them once reaped,
    which is when a cell's report is taken. The two never count the same
    bytes: fio's processes are gone by the time the shell has their I/O."""

    def __init__(self, args, guest):
        self.args, self.guest = args, guest
        usage = subprocess.run(
            [args.hakoniwa, "ctl", "--api-socket", "x", "iotrace", "--help"],
            capture_output=True, text=True).stdout
        self.app = "--pid" in usage
        self.comm = "--comm" in usage

    def start(self, guest=None):
        g = guest or self.guest
        # No residency walk: it costs the guest CPU at each report, and
        # the figures need only the layers.
        cmd = ["iotrace", "start", "--disk", "data", "--guest-dev", "none"]
        if self.app and g.shell_pid:
            cmd += ["--pid", str(g.shell_pid)]
        if self.comm:
            cmd += ["--comm", "fio"]
        hk_ctl(self.args.hakoniwa, g.sock, *cmd)

    def stop(self, guest=None):
        g = guest or self.guest
        return hk_ctl(self.args.hakoniwa, g.sock, "iotrace", "stop", "--disk", "data", "--json")


def layer_summary(report):
    """Figures 8-11's numbers of an iotrace report: per application
    operation, each layer's bytes and requests, and each layer's average
    request size."""
    if not report:
        return None
    lay = report["layers"]
    out = {"absent": lay.get("absent_layers", []),
           "guest_hit_ratio": lay["guest_cache"]["hit_ratio"],
           "host_hit_ratio": lay["host_cache"]["hit_ratio"],
           "host_probed_hit_ratio": lay["host_cache"]["probed_hit_ratio"],
           "double_cached": lay.get("double_cached")}
    for layer in ("application", "virtual_disk", "physical_device"):
        s = lay[layer]
        out[layer] = {"bytes": s["read_bytes"] + s["write_bytes"],
                      "requests": s["read_requests"] + s["write_requests"],
                      "avg_request": s.get("average_request_bytes")}
    out["per_op"] = lay.get("per_application_operation")
    return out


def per_op_from_fio(summary, fio):
    """Per application operation from fio's own counts where the guest
    agent gave no application layer (fio's operations are the
    application's file reads and writes)."""
    if summary is None or not fio or not fio.get("ops"):
        return None
    ops = fio["ops"]
    out = {"application": {"bytes": (fio["read_bytes"] + fio["write_bytes"]) / ops,
                           "requests": 1.0}}
    for layer in ("virtual_disk", "physical_device"):
        out[layer] = {"bytes": summary[layer]["bytes"] / ops,
                      "requests": summary[layer]["requests"] / ops}
    return out


# ---------------------------------------------------------------- cells ----

def ffsb_cell(args, guests, tracer, mem_label, size, io, swap, trace=True, tag=None,
              during=None):
    """One ffsb cell on every guest at once; the cell's record. DURING, if
    given, is called a few seconds before the cell's counted time ends,
    with the workload still running."""
    print("  ffsb%s mem=%s size=%dM io=%s swap=%s" % (
        " " + tag if tag else "", mem_label, size, io, swap), flush=True)
    trace_error = None
    if trace:
        try:
            tracer.start()
        except RuntimeError as e:
            trace, trace_error = False, str(e)
            print("    tracing failed: %s" % e, flush=True)
    cpu0 = [g.cpu_seconds() for g in guests]
    t0 = time.monotonic()
    command = ffsb_command(size, io, args.seconds, args.ramp)
    tokens = [(g, g.start(command)) for g in guests]
    if during:
        began = io_began(guests[0], t0 + (args.seconds + args.ramp) * 4)
        time.sleep(max(0.0, began + args.ramp + args.seconds - DURING_BEFORE_END_S
                       - time.monotonic()))
        during()
    outs = [g.wait(token, (args.seconds + args.ramp) * 4 + 300) for g, token in tokens]
    wall = time.monotonic() - t0
    memory = host_memory(guests)
    cpu = [g.cpu_seconds() - c for g, c in zip(guests, cpu0)]
    report = None
    if trace:
        try:
            report = tracer.stop()
        except RuntimeError as e:
            trace_error = str(e)
            print("    tracing failed: %s" % e, flush=True)
    per_vm = [ffsb_result(o) for o in outs]
    rec = {"bench": "ffsb", "mem": mem_label, "mem_mib": guests[0].mem_mib, "size_mib": size,
           "io": io, "swap": swap, "tag": tag, "traced": trace, "per_vm": per_vm,
           "wall_s": wall, "vmm_cpu_s": cpu, "host_memory": memory,
           "ok": all(per_vm) and not trace_error}
    if trace_error:
        rec["error"] = "tracing: %s" % trace_error
    if rec["ok"]:
        rec["ops_s"] = sum(v["ops_s"] for v in per_vm) / len(per_vm)
        print("    %.1f ops/s per VM (%s); host: disks' cache %d MiB, VMMs resident %s MiB, "
              "free %d MiB" % (rec["ops_s"], ", ".join("%.0f" % v["ops_s"] for v in per_vm),
                               memory["disk_cache_mib"],
                               ", ".join(map(str, memory["vmm_rss_mib"])), memory["free_mib"]),
              flush=True)
    else:
        rec["error"] = "; ".join("vm%d: %s" % (i, (FAILED_RE.search(o) or [None, "no report"])[1])
                                 for i, (v, o) in enumerate(zip(per_vm, outs)) if not v)
        print("    failed: %s" % rec["error"], flush=True)
    if report:
        rec["trace"] = layer_summary(report)
        print("    first VM: guest hit ratio %s, host hit ratio %s" % (
            fmt_opt(rec["trace"]["guest_hit_ratio"]), fmt_opt(rec["trace"]["host_hit_ratio"])),
            flush=True)
        rec["trace"]["fio_per_op"] = per_op_from_fio(rec["trace"], per_vm[0])
        rec["trace_report"] = report
    return rec


def disk_ops(guest, disk="data"):
    """The requests DISK of GUEST completed so far (`ctl counters`)."""
    got = guest.ctl("counters", "--json").get(disk, {})
    return sum(v for k, v in got.items() if k.endswith("_ops") and isinstance(v, int))


def io_began(guest, deadline):
    """When the cell's I/O began on GUEST's data disk: the first second in
    which it completed IO_BEGAN_OPS requests (or DEADLINE). fio spends most
    of a cell setting up before its first I/O (a 20 s cell took 47-250 s
    in the rig, 2026-11-26), so the cell's start says little of when its
    counted time ends."""
    last = disk_ops(guest)
    while time.monotonic() < deadline:
        time.sleep(1)
        now = disk_ops(guest)
        if now - last >= IO_BEGAN_OPS:
            return time.monotonic() - 1
        last = now
    return deadline


def balloon_for_guest_memory(guest, mib):
    """Sets GUEST's balloon so the guest has MIB of memory (`ctl balloon
    --guest-memory`, the sizing `ctl advise --apply` uses); the balloon's
    target in MiB."""
    guest.ctl("balloon", "--guest-memory", "%dM" % mib)
    return guest.ctl("balloon")["target_mib"]


def advice_reasons(a):
    """One line of what an advice weighed: the working set, the host's
    share, the window's read costs and the two configurations' predicted
    read times."""
    adv, costs = a["advice"], a["window"]["read_costs"]
    hit = a.get("guest_hit_ratio")
    line = "working set %d MiB (%s), guest hit ratio %s, host share %d MiB; reads: %d host " \
        "hits at %s ms, %d misses at %s ms" % (
            adv["working_set_bytes"] // MIB, adv["working_set_method"],
            "unknown" if hit is None else "%.0f %%" % (hit * 100),
            a["facts"]["host_cache_share_bytes"] // MIB, costs["host_hits"],
            fmt_ms(costs["host_hit_ns"]), costs["host_misses"], fmt_ms(costs["host_miss_ns"]))
    p = adv.get("predicted")
    if p:
        line += "; predicted read: buffered %d MiB %s ms, direct %d MiB %s ms" % (
            p["buffered_guest_bytes"] // MIB, fmt_ms(p["buffered_read_ns"]),
            p["direct_guest_bytes"] // MIB, fmt_ms(p["direct_read_ns"]))
        if p.get("switch_pays_back_seconds") is not None:
            line += "; the switch repays after %.0f s" % p["switch_pays_back_seconds"]
    return line


def advised_runs(args, guests, disks, tracer, mem_label, size, start_io, start_swap,
                 start_guest_mib):
    """The advisor from a starting configuration: every guest runs the cell
    traced, is advised while the cell runs (`ctl advise`, its memory set
    after the cell as `--apply` would), and then the advised and the starting
    configuration take turns, --advisor-rounds cells each (I/O mode, swap
    and balloon set anew, the caches settled before each cell). The gain is
    the median of each round's advised/start ratio: in the rig two cells a
    minute apart can differ by half (bench/results/evidence/
    iocache-overhead-pairs-2026-11-28), so one cell before and one after
    cannot judge advice. START_GUEST_MIB: the guest's memory at the start,
    through the balloon (`ctl balloon --guest-memory`: as much as a guest
    booted with that much has, which is more than the VM's memory less
    that), or None for no balloon."""
    start_targets = [0] * len(guests)
    if start_guest_mib is not None:
        start_targets = [balloon_for_guest_memory(g, start_guest_mib) for g in guests]
    balloon_mib = start_targets[0]
    print("  advisor at size=%dM from io=%s swap=%s balloon=%dM" % (
        size, start_io, start_swap, balloon_mib), flush=True)
    start_balloons = configure(args, guests, disks, size, start_targets, start_swap)
    for g in guests:
        tracer.start(g)
    advice = []

    def ask_one(g):
        try:
            return g.ctl("advise", "--disk", "data", "--json")
        except RuntimeError as e:
            return {"error": str(e)}

    def ask():
        with concurrent.futures.ThreadPoolExecutor(len(guests)) as pool:
            advice.extend(pool.map(ask_one, guests))

    # Advice is taken while the workload runs, as it would be for a
    # service: the guest's own memory (MemTotal - MemAvailable) has fio's
    # files and memory in it only then (about 42 MiB of a 128 MiB guest;
    # taken after the cell, the advisor sized a direct guest without
    # them). It is applied after the cell, through the balloon's sizing
    # that `ctl advise --apply` uses (`ctl balloon --guest-memory`), so
    # the balloon does not move under the cell it compares against.
    before = ffsb_cell(args, guests, tracer, mem_label, size, start_io, start_swap,
                       trace=False, tag="advisor-start", during=ask)
    reports = [tracer.stop(g) for g in guests]
    if args.advisor_parts:
        # As the later rounds' cells with --advisor-parts: the first
        # guest's layers.
        before["trace"] = layer_summary(reports[0])
    a0 = advice[0] if advice else {"error": "no advice"}
    if "error" in a0:
        return {"bench": "advisor", "mem": mem_label, "size_mib": size, "before": before,
                "advice": advice, "ok": False, "error": a0["error"]}
    io = a0["advice"]["guest_io"]["recommended"]
    swap = a0["advice"]["guest_swap"]["recommended"]
    targets = []
    for g, a, t in zip(guests, advice, start_targets):
        if "error" in a:
            targets.append(t)
            continue
        memory = a["advice"]["guest_memory_bytes"]["recommended"]
        targets.append(balloon_for_guest_memory(g, memory // MIB))
        print("    vm%d advised: %d MiB (its own %d MiB, %s), io=%s, swap=%s" % (
            g.n, memory // MIB, a["facts"]["guest_non_cache_bytes"] // MIB,
            a["advice"]["regime"], a["advice"]["guest_io"]["recommended"],
            a["advice"]["guest_swap"]["recommended"]), flush=True)
        print("      %s" % advice_reasons(a), flush=True)
    rounds = []
    parts = args.advisor_parts
    for r in range(args.advisor_rounds):
        if r > 0:
            start_balloons = configure(args, guests, disks, size, start_targets, start_swap)
            before = advisor_cell(args, guests, tracer, mem_label, size, start_io, start_swap,
                                  "advisor-start", trace=parts)
        balloons = configure(args, guests, disks, size, targets, swap)
        print("    balloon %s MiB: guests' MemTotal %s MiB" % (
            ", ".join(map(str, targets)),
            ", ".join(str(b["total_mib"]) for b in balloons)), flush=True)
        after = advisor_cell(args, guests, tracer, mem_label, size, io, swap,
                             "advisor-advised", trace=parts)
        ok = before["ok"] and after["ok"]
        gain = after["ops_s"] / before["ops_s"] if ok and before["ops_s"] else None
        print("    round %d: %s" % (r, "%.2fx" % gain if gain else "failed"), flush=True)
        rounds.append({"before": before, "after": after, "start_balloons": start_balloons,
                       "balloons": balloons, "ok": ok, "gain": gain})
        if parts:
            # The advice without its memory: which part of the gain is
            # the I/O mode's and swap's, which the memory's.
            configure(args, guests, disks, size, start_targets, swap)
            io_only = advisor_cell(args, guests, tracer, mem_label, size, io, swap,
                                   "advisor-io-only", trace=True)
            rounds[-1]["io_only"] = io_only
            if io_only["ok"] and before["ok"]:
                rounds[-1]["io_only_gain"] = io_only["ops_s"] / before["ops_s"]
                print("    round %d, I/O mode and swap alone: %.2fx" % (
                    r, rounds[-1]["io_only_gain"]), flush=True)
    for g in guests:
        g.ctl("balloon", "--target", "0")
    wait_balloon(args, guests, [0] * len(guests))
    gains = [r["gain"] for r in rounds if r["gain"]]
    ok = bool(rounds) and all(r["ok"] for r in rounds)
    failed = next((r for r in rounds if not r["ok"]), None)
    return {"bench": "advisor", "mem": mem_label, "size_mib": size, "start": {
        "io": start_io, "swap": start_swap, "balloon_mib": balloon_mib},
        "advised": {"io": io, "swap": swap, "balloon_mib": targets[0],
                    "balloon_targets_mib": targets},
        "advice": advice, "rounds": rounds, "ok": ok,
        "error": None if failed is None else (failed["after"].get("error")
                                              or failed["before"].get("error")),
        "gain": statistics.median(gains) if gains else None}


def advisor_cell(args, guests, tracer, mem_label, size, io, swap, tag, trace=False):
    """One cell of the advisor's rounds (the first guest traced if TRACE). A
    cell that did not finish (a guest thrashing, its OOM killer taking fio
    or the shell) is this round's failure, not the boot's: it is
    interrupted and the boot goes on."""
    try:
        return ffsb_cell(args, guests, tracer, mem_label, size, io, swap, trace=trace,
                         tag=tag)
    except RuntimeError as e:
        print("    failed: %s" % str(e)[-300:], flush=True)
        for g in guests:
            g.vm.con.send("\x03")
        time.sleep(5)
        on_all(guests, "true", 600)
        return {"ok": False, "error": str(e)[-600:]}


def configure(args, guests, disks, size, targets, swap):
    """Every guest's balloon to its target (MiB, one per guest) and its swap
    on or off, then the caches settled: the next cell's configuration. The
    guests' balloons as seen."""
    for g, target in zip(guests, targets):
        g.ctl("balloon", "--target", str(target))
    balloons = wait_balloon(args, guests, targets)
    set_swap(guests, swap)
    settle(guests, disks, size, args.miss_delay_ms, 1800)
    return balloons


def wait_balloon(args, guests, targets_mib, timeout=120):
    """Waits until every guest's balloon is within 4 MiB of its target (MiB,
    one per guest); each guest's balloon as last seen: {actual_mib,
    total_mib (the guest's MemTotal by its statistics, None before any)}.
    A balloon that did not get there in TIMEOUT seconds is said, not
    hidden: the cell after it would run in a guest of another size than
    the record says."""
    deadline = time.monotonic() + timeout
    seen = []
    for g, target_mib in zip(guests, targets_mib):
        info = {}
        while True:
            got = g.ctl("balloon")
            info = got if isinstance(got, dict) else {}
            if abs(info.get("actual_mib", 0) - target_mib) <= 4 or time.monotonic() > deadline:
                break
            time.sleep(1)
        # `ctl balloon`'s statistics are the ones the guest sent before
        # the call (the call asks for the next): taken at the call that saw
        # the balloon arrive, they showed MemTotal from before it moved
        # (80, 80, 284 MiB for three fully deflated 512 MiB guests, bench
        # run of 2026-11-28). The call after next has the guest's own.
        for _ in range(2):
            time.sleep(2)
            got = g.ctl("balloon")
            info = got if isinstance(got, dict) else info
        total = info.get("stats", {}).get("total_memory")
        seen.append({"target_mib": target_mib, "actual_mib": info.get("actual_mib"),
                     "total_mib": total >> 20 if total else None})
        if abs(info.get("actual_mib", 0) - target_mib) > 4:
            print("    vm%d: balloon at %s MiB, not %d, after %d s" % (
                g.n, info.get("actual_mib"), target_mib, timeout), flush=True)
    return seen


def overhead_runs(args, guests, tracer, mem_label):
    """The tracer's cost: the same cell, tracing every guest's data disk off
    and on in turn."""
    size = args.overhead_size
    out = []
    for i in range(args.overhead_pairs):
        for traced in (False, True):
            if traced:
                for g in guests:
                    tracer.start(g)
            rec = ffsb_cell(args, guests, tracer, mem_label, size, "direct", "off",
                            trace=False, tag="overhead-%s" % ("on" if traced else "off"))
            if traced:
                reports = [tracer.stop(g) for g in guests]
                rec["records"] = [r["records"] for r in reports]
                rec["dropped"] = [r["dropped"] for r in reports]
            rec["bench"], rec["tracing"], rec["pair"] = "overhead", traced, i
            out.append(rec)
    return out


def run_boot(args, mem_label, mem_mib, disks, work, results):
    print("boot: %d guests of %d MiB" % (args.vms, mem_mib), flush=True)
    guests = []
    try:
        # One after another: three Debian guests booting at once on the
        # rig's one L1 vCPU timed out in systemd (no /dev/ttyS0 device in
        # its 90 s, so no serial getty) in 3 of 3 runs on 2026-11-28, where
        # one guest alone came up at once (evidence iocache-boot-2026-11-28).
        for i, d in enumerate(disks):
            guests.append(Guest(args, i, mem_mib, d, work))
            guests[-1].wait_ready(args.boot_timeout)
        # overcommit_memory=1: with the heuristic default, a 128 MiB guest
        # without swap cannot even start Debian's fio (ld.so's mapping of
        # libceph-common's zero-fill pages is refused: "cannot map zero-fill
        # pages"), though it never touches them.
        outs = on_all(guests, "sysctl -qw vm.overcommit_memory=1 && mkdir -p /data && "
                      "mount -o noatime /dev/vdb /data && echo pid=$$", 120)
        for g, o in zip(guests, outs):
            m = re.search(r"pid=(\d+)", o)
            g.shell_pid = int(m.group(1)) if m else None
        tracer = Tracer(args, guests[0])
        for size in args.sizes:
            t = time.monotonic()
            layout(guests, size, 3600)
            print("  layout %d MiB per VM: %.0f s" % (size, time.monotonic() - t), flush=True)
            for swap in SWAP_MODES if not args.only_advisors else []:
                if swap == "on" and size not in args.swap_sizes:
                    continue
                set_swap(guests, swap)
                t = time.monotonic()
                settle(guests, disks, size, args.miss_delay_ms, 1800)
                print("  settle %d MiB: %.0f s" % (size, time.monotonic() - t), flush=True)
                for io in IO_MODES:
                    results.append(ffsb_cell(args, guests, tracer, mem_label, size, io, swap))
            if mem_label == "large" and size == args.overhead_size and not args.only_advisors:
                results.extend(overhead_runs(args, guests, tracer, mem_label))
            if mem_label == "large" and size == min(args.sizes) and "small-data" in args.advisors:
                results.append(advised_runs(args, guests, disks, tracer, mem_label, size,
                                            "direct", "on", args.small_mib))
            if mem_label == "large" and size == max(args.sizes) and "large-data" in args.advisors:
                results.append(advised_runs(args, guests, disks, tracer, mem_label, size,
                                            "buffered", "on", None))
        set_swap(guests, "off")
        for size in args.postmark_sizes if not args.only_advisors else []:
            print("  postmark mem=%s size=%dM" % (mem_label, size), flush=True)
            outs = on_all(guests, postmark_command(size, args.postmark_transactions), 3600)
            tps = [int(m.group(2)) if m else None
                   for m in (POSTMARK_RE.search(o) for o in outs)]
            results.append({"bench": "postmark", "mem": mem_label, "mem_mib": mem_mib,
                            "size_mib": size, "per_vm": tps, "ok": None not in tps,
                            "tps": sum(tps) / len(tps) if None not in tps else None})
            on_all(guests, "rm -rf /data/pm", 600)
        for size in args.dd_sizes if not args.only_advisors else []:
            for io in IO_MODES:
                print("  dd mem=%s size=%dM io=%s" % (mem_label, size, io), flush=True)
                outs = on_all(guests, dd_command(size, io), 1800)
                mbps = [dd_result(o, size) for o in outs]
                results.append({"bench": "dd", "mem": mem_label, "mem_mib": mem_mib,
                                "size_mib": size, "io": io, "per_vm": mbps,
                                "ok": None not in mbps,
                                "mbps": sum(mbps) / len(mbps) if None not in mbps else None})
            on_all(guests, "rm -f /data/dd%d" % size, 600)
        on_all(guests, "sync; umount /data", 300)
    finally:
        for g in guests:
            try:
                g.ctl("shutdown", timeout=10)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        for g in guests:
            g.vm.stop(grace=20)


# -------------------------------------------------------------- summary ----

def boot_of(record):
    """The guest memory (boot) a result came from. Advisor records from
    before 2026-11-28 did not say; the advisor runs only in the large boot."""
    return record.get("mem") or ("large" if record["bench"] == "advisor" else "?")


def kept_results(args, env):
    """With --merge: the other boots' results from that file, and its run's
    date and path in ENV (`merged`), for the summary to say where each
    boot's cells come from."""
    if not args.merge:
        return []
    with open(args.merge) as f:
        old = json.load(f)
    kept = [r for r in old["results"] if boot_of(r) not in args.boots]
    boots = sorted({boot_of(r) for r in kept})
    env["merged"] = {"from": os.path.relpath(os.path.abspath(args.merge), ROOT),
                     "date_utc": old["environment"].get("date_utc"), "boots": boots}
    print("kept %d results of %s from %s" % (len(kept), ", ".join(boots), args.merge),
          flush=True)
    return kept


def write_outputs(args, env, results):
    """iocache.json, iocache.md and iocache.png in --out; the exit status."""
    os.makedirs(args.out, exist_ok=True)
    png = os.path.join(args.out, "iocache.png")
    drew = draw(args, results, png)
    with open(os.path.join(args.out, "iocache.json"), "w") as f:
        json.dump({"environment": env, "args": vars(args), "results": results,
                   "overhead": overhead_summary(results)}, f, indent=1)
    write_md(args, env, results, os.path.join(args.out, "iocache.md"), drew)
    rows, _ = table5_rows(args, results)
    print(text_table(rows))
    failed = sum(1 for r in results if not r.get("ok"))
    return exit_status("iocache.py", failed, "cell(s)", os.path.join(args.out, "iocache.json"))


def render(args):
    """--render RESULTS: the summary again from a results file, without a
    run: its --boots' results, with --merge's other boots. The run's own
    arguments (sizes, memory, delays) are taken from RESULTS."""
    with open(args.render) as f:
        run = json.load(f)
    keep = {"render": args.render, "merge": args.merge, "boots": args.boots, "out": args.out}
    vars(args).update(run["args"])
    vars(args).update(keep)
    env = run["environment"]
    env.pop("merged", None)
    results = kept_results(args, env)
    results += [r for r in run["results"] if boot_of(r) in args.boots]
    return write_outputs(args, env, results)


def table5_rows(args, results):
    """Our table 5: ops/s per configuration and data set size, the best of
    each size marked."""
    cells = {(r["mem"], r["io"], r["swap"], r["size_mib"]): r.get("ops_s")
             for r in results if r["bench"] == "ffsb" and r.get("tag") is None}
    configs = [(m, io, sw) for m in ("small", "large") for sw in ("on", "off")
               for io in IO_MODES]
    best = {}
    for size in args.sizes:
        vals = [(cells.get((m, io, sw, size)) or 0, (m, io, sw)) for m, io, sw in configs]
        best[size] = max(vals)[1]
    rows = [["guest memory", "I/O", "swap"] + ["%d MiB" % s for s in args.sizes]]
    for m, io, sw in configs:
        row = ["%s (%d MiB)" % (m, args.small_mib if m == "small" else args.large_mib), io, sw]
        for size in args.sizes:
            v = cells.get((m, io, sw, size))
            text = "-" if v is None else "%.0f" % v
            row.append("**%s**" % text if best[size] == (m, io, sw) and v else text)
        rows.append(row)
    return rows, best


def paper_table5_rows():
    rows = [["guest memory", "I/O", "swap"] + ["%d MB" % s for s in PAPER_SIZES]]
    best = [max(PAPER_TABLE5, key=lambda k: PAPER_TABLE5[k][i]) for i in range(len(PAPER_SIZES))]
    for key in [(m, io, sw) for m in (128, 1024) for sw in ("on", "off") for io in IO_MODES]:
        vals = PAPER_TABLE5[key]
        rows.append(["%d MB" % key[0], key[1], key[2]] + [
            "**%.0f**" % v if best[i] == key else "%.0f" % v for i, v in enumerate(vals)])
    return rows


def figure_rows(results):
    """Figures 8-11's numbers: per application operation, bytes and
    requests at each layer, and each layer's average request size."""
    rows = [["cell", "layer", "bytes/op", "requests/op", "avg request", "guest hit",
             "host hit (probed)"]]
    for r in results:
        if r["bench"] != "ffsb" or r.get("tag") or "trace" not in r or r["swap"] != "off":
            continue
        t = r["trace"]
        per_op = t.get("per_op") or t.get("fio_per_op")
        if not per_op:
            continue
        name = "%s %dM %s" % (r["mem"], r["size_mib"], r["io"])
        for layer in ("application", "virtual_disk", "physical_device"):
            p = per_op[layer]
            avg = t[layer]["avg_request"]
            rows.append([name, layer, "%.0f" % p["bytes"], "%.2f" % p["requests"],
                         "-" if avg is None else "%.1f KiB" % (avg / 1024),
                         fmt_opt(t["guest_hit_ratio"]), fmt_opt(t["host_probed_hit_ratio"])])
            name = ""
    return rows


def fmt_ms(ns):
    return "%.2f" % (ns / 1e6) if ns is not None else "-"


def fmt_opt(v, fmt="%.2f"):
    return "-" if v is None else fmt % v


def overhead_summary(results):
    runs = [r for r in results if r["bench"] == "overhead" and r["ok"]]
    off = [r for r in runs if not r["tracing"]]
    on = [r for r in runs if r["tracing"]]
    if not off or not on:
        return None

    def mean(rs, f):
        return sum(f(r) for r in rs) / len(rs)
    ops_off, ops_on = mean(off, lambda r: r["ops_s"]), mean(on, lambda r: r["ops_s"])
    cpu_off = mean(off, lambda r: sum(r["vmm_cpu_s"]) / r["wall_s"])
    cpu_on = mean(on, lambda r: sum(r["vmm_cpu_s"]) / r["wall_s"])
    return {"ops_s_off": ops_off, "ops_s_on": ops_on,
            "throughput_change": ops_on / ops_off - 1,
            "vmm_cores_off": cpu_off, "vmm_cores_on": cpu_on,
            "cores_added": cpu_on - cpu_off, "pairs": len(on),
            "records": sum(sum(r["records"]) for r in on),
            "dropped": sum(sum(r["dropped"]) for r in on)}


def draw(args, results, path):
    fig, axes = panels(1, 3, (17, 5))
    if fig is None:
        return False
    ax = axes[0]
    for m in ("small", "large"):
        for io in IO_MODES:
            pts = sorted((r["size_mib"], r["ops_s"]) for r in results
                         if r["bench"] == "ffsb" and not r.get("tag") and r["mem"] == m
                         and r["io"] == io and r["swap"] == "off" and r["ok"])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        label="%s guest, %s" % (m, io))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("data set per VM (MiB)")
    ax.set_ylabel("FFSB-like ops/s per VM (swap off)")
    ax.set_title("table 5 / figures 5-6: where the answer flips")
    ax.legend(fontsize=8)
    ax = axes[1]
    labels, ratios = [], []
    for r in results:
        if r["bench"] == "ffsb" and not r.get("tag") and r["swap"] == "on" and r["ok"]:
            twin = next((o for o in results if o["bench"] == "ffsb" and not o.get("tag")
                         and o["swap"] == "off" and o["ok"] and o["mem"] == r["mem"]
                         and o["io"] == r["io"] and o["size_mib"] == r["size_mib"]), None)
            if twin:
                labels.append("%s %s\n%dM" % (r["mem"][0], r["io"][0], r["size_mib"]))
                ratios.append(r["ops_s"] / twin["ops_s"])
    ax.bar(range(len(ratios)), ratios)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=6)
    ax.set_ylabel("ops/s swap on / swap off")
    ax.set_title("figure 7: swap on vs off")
    ax = axes[2]
    rows = figure_rows(results)[1:]
    cells, vd, ph, app = [], [], [], []
    cur = None
    for row in rows:
        if row[0]:
            cur = row[0]
            cells.append(cur)
        val = float(row[2])
        {"application": app, "virtual_disk": vd, "physical_device": ph}[row[1]].append(val)
    x = range(len(cells))
    w = 0.27
    ax.bar([i - w for i in x], [a / 1024 for a in app], w, label="application")
    ax.bar(list(x), [v / 1024 for v in vd], w, label="virtual disk")
    ax.bar([i + w for i in x], [p / 1024 for p in ph], w, label="physical")
    ax.set_xticks(list(x))
    ax.set_xticklabels(cells, rotation=60, fontsize=6, ha="right")
    ax.set_ylabel("KiB per application operation")
    ax.set_title("figures 8-9: I/O per operation at each layer")
    ax.legend(fontsize=8)
    save_figure(fig, path, 110)
    return True


def advisor_rounds(a):
    """An advisor record's (start, advised) rounds; a record from before the
    rounds (one cell each) is one round."""
    if "rounds" in a:
        return a["rounds"]
    if a.get("ok"):
        return [{"before": a["before"], "after": a["after"], "gain": a["gain"]}]
    return []


def write_md(args, env, results, path, drew):
    rows, best = table5_rows(args, results)
    lines = ["# Guest and host caches (seed 002): the paper's experiment", ""]
    lines += md_context(env, "Inside the rig every guest shares one L1 vCPU; the host page "
                        "cache is L1's (HK_RIG_MEM=%s MiB). A read the host cache misses "
                        "waits %d ms at the data disk (dm-delay), the host's disk: without "
                        "it L0's page cache would serve L1's misses about as fast as a hit."
                        % (env.get("l1_memory_mib"), args.miss_delay_ms))
    merged = env.get("merged")
    if merged:
        lines += ["**The %s boot's results are from the run of %s** (kept from %s with "
                  "`--merge`), the others from this run's: the rig's speed differs from "
                  "day to day, so compare across the two boots with care." % (
                      " and ".join(merged["boots"]), merged["date_utc"],
                      merged["from"]), ""]
    lines += ["## FFSB-like fio (table 5): ops/s per VM, %d VMs at once" % args.vms, "",
              "Guest memory %d MiB (small) and %d MiB (large), the paper's 128 MB and 1 GB "
              "scaled to the rig; the best configuration of each data set size in bold."
              % (args.small_mib, args.large_mib), "", md_table(rows), "",
              "The paper's table 5 (6 VMs, host 8 GB):", "", md_table(paper_table5_rows()), ""]
    lines += ["Best per size here: " + ", ".join(
        "%d MiB: %s guest %s swap %s" % (s, b[0], b[1], b[2]) for s, b in best.items()), ""]
    lines += ["## Figures 8-11: per application operation, layer by layer (first VM, "
              "swap off)", "", md_table(figure_rows(results)), ""]
    adv = [r for r in results if r["bench"] == "advisor"]
    if adv:
        arows = [["data set", "start", "advised", "ops/s start", "ops/s advised",
                  "gain (median)", "each round"]]
        for a in adv:
            rounds = advisor_rounds(a)
            if not rounds:
                arows.append(["%d MiB" % a["size_mib"], "-", a.get("error", "-"), "-", "-",
                              "-", "-"])
                continue
            ok = [r for r in rounds if r.get("gain")]
            start_ops = statistics.median(r["before"]["ops_s"] for r in ok) if ok else None
            advised_ops = statistics.median(r["after"]["ops_s"] for r in ok) if ok else None
            arows.append(["%d MiB" % a["size_mib"],
                          "%(io)s, swap %(swap)s, balloon %(balloon_mib)d MiB" % a["start"],
                          "%(io)s, swap %(swap)s, balloon %(balloon_mib)d MiB" % a["advised"],
                          fmt_opt(start_ops, "%.0f"), fmt_opt(advised_ops, "%.0f"),
                          fmt_opt(a["gain"], "%.2fx"),
                          ", ".join(fmt_opt(r.get("gain"), "%.2fx") for r in rounds)])
        lines += ["## The advisor (`ctl advise` on every guest, applied through the balloon)", "",
                  "The starting and the advised configuration take turns, each cell from "
                  "its own settled caches; the gain is the median of the rounds' "
                  "advised/start ratios.", "", md_table(arows), ""]
        for a in adv:
            parts = [r["io_only_gain"] for r in advisor_rounds(a) if r.get("io_only_gain")]
            if parts:
                lines.append("- %d MiB, the advised I/O mode and swap without the advised "
                             "memory (--advisor-parts): %s" % (a["size_mib"], ", ".join(
                                 "%.2fx" % g for g in parts)))
            first = (a.get("advice") or [{}])[0]
            window = first.get("window", {})
            costs = window.get("read_costs", {})
            if costs:
                lines.append("- %d MiB, first VM's window (%.0f s): %s reads the host cache "
                             "held at %s ms, %s it missed at %s ms; working set %s MiB (%s)"
                             % (a["size_mib"], window.get("seconds", 0),
                                costs.get("host_hits"), fmt_ms(costs.get("host_hit_ns")),
                                costs.get("host_misses"), fmt_ms(costs.get("host_miss_ns")),
                                first.get("advice", {}).get("working_set_bytes", 0) >> 20,
                                first.get("advice", {}).get("working_set_method", "-")))
            for line in first.get("explanations", []):
                lines.append("- %s" % line)
        lines.append("")
    ov = overhead_summary(results)
    if ov:
        lines += ["## The tracer's own cost", "",
                  "FFSB-like, direct I/O, %d MiB, %d pairs off/on: ops/s %.1f off, %.1f on "
                  "(%+.2f %%); the VMMs' CPU %.3f vs %.3f cores (%+.4f of a core); %d records, "
                  "%d dropped." % (args.overhead_size, ov["pairs"], ov["ops_s_off"],
                                   ov["ops_s_on"], ov["throughput_change"] * 100,
                                   ov["vmm_cores_off"], ov["vmm_cores_on"], ov["cores_added"],
                                   ov["records"], ov["dropped"]), ""]
    other = [["bench", "guest memory", "data set", "I/O", "per VM"]]
    for r in results:
        if r["bench"] == "postmark":
            other.append(["postmark", r["mem"], "%d MiB" % r["size_mib"], "buffered",
                          fmt_opt(r["tps"], "%.1f tx/s")])
        elif r["bench"] == "dd":
            other.append(["dd (2nd read)", r["mem"], "%d MiB" % r["size_mib"], r["io"],
                          fmt_opt(r["mbps"], "%.1f MB/s")])
    lines += ["## Postmark and dd", "", md_table(other), ""]
    if drew:
        lines += ["![iocache](iocache.png)", ""]
    lines += ["## Environment", ""] + md_environment(env)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_path_options(p, "hakoniwa", "kernel")
    p.add_argument("--debian-image", default=os.path.join(ROOT, "build/guest/debian.img"))
    p.add_argument("--debian-initramfs",
                   default=os.path.join(ROOT, "build/guest/debian-initramfs.cpio.gz"))
    p.add_argument("--vms", type=int, default=3)
    p.add_argument("--small-mib", type=int, default=128)
    p.add_argument("--large-mib", type=int, default=512)
    p.add_argument("--sizes", type=int, nargs="+", default=[32, 256, 1024],
                   help="FFSB data set sizes, MiB per VM")
    p.add_argument("--seconds", type=int, default=15, help="each ffsb cell's counted time")
    p.add_argument("--ramp", type=int, default=5,
                   help="each ffsb cell's time before fio counts (its ramp_time)")
    p.add_argument("--postmark-sizes", type=int, nargs="*", default=[32])
    p.add_argument("--postmark-transactions", type=int, default=400)
    p.add_argument("--dd-sizes", type=int, nargs="*", default=[64])
    p.add_argument("--advisor-rounds", type=int, default=3,
                   help="cells of the starting and the advised configuration, in turn")
    p.add_argument("--advisors", nargs="*", choices=["small-data", "large-data"],
                   default=["small-data", "large-data"],
                   help="the advisor's runs: from a small direct guest at the smallest data "
                   "set, from a large buffered one at the largest")
    p.add_argument("--advisor-parts", action="store_true",
                   help="in each advisor round, also the advised I/O mode and swap without "
                   "the advised memory, and every round's cells traced on the first guest "
                   "(which part of the gain is whose)")
    p.add_argument("--only-advisors", action="store_true",
                   help="the advisor's runs alone: no table 5 cells, tracer pairs, Postmark "
                   "or dd (a check of the advisor; write it apart from bench/results)")
    p.add_argument("--overhead-size", type=int, default=32)
    p.add_argument("--overhead-pairs", type=int, default=3)
    p.add_argument("--miss-delay-ms", type=int, default=40,
                   help="what a read the host cache misses waits at the data disk (dm-delay)")
    p.add_argument("--swap-mib", type=int, default=512)
    p.add_argument("--swap-sizes", type=int, nargs="*", default=[32],
                   help="the data set sizes that also run with swap on")
    p.add_argument("--boot-timeout", type=int, default=300)
    p.add_argument("--boots", nargs="+", default=["small", "large"],
                   choices=["small", "large"], help="which guest memory sizes to boot")
    p.add_argument("--merge", help="a results JSON whose other boots' results to keep")
    p.add_argument("--render", metavar="RESULTS",
                   help="no run: the summary again from RESULTS (a results JSON), its "
                   "--boots' results with --merge's others")
    p.add_argument("--workdir", default="/tmp")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    args = p.parse_args()
    if args.render:
        return render(args)
    args.sizes = sorted(set(args.sizes))
    if args.overhead_size not in args.sizes and not args.only_advisors:
        sys.exit("iocache.py: --overhead-size must be one of --sizes")
    for path in (args.kernel, args.debian_image, args.debian_initramfs):
        if not os.path.isfile(path):
            sys.exit("iocache.py: %s is missing (scripts/build-guest-debian builds it)" % path)
    if not os.access(args.hakoniwa, os.X_OK):
        sys.exit("iocache.py: %s is missing (cargo build --release)" % args.hakoniwa)
    if os.geteuid() != 0:
        sys.exit("iocache.py: needs root (losetup, drop_caches)")
    work = tempfile.mkdtemp(prefix="hk-bench-iocache.", dir=args.workdir)
    results = []
    disks = []
    t_start = time.monotonic()
    try:
        args.kernel = shutil.copy(args.kernel, os.path.join(work, "vmlinuz"))
        args.debian_initramfs = shutil.copy(args.debian_initramfs,
                                            os.path.join(work, "debian-initramfs.cpio.gz"))
        # Every data set stays for the next boot; Postmark's and dd's
        # files come and go.
        data_mib = (sum(args.sizes) + max(args.postmark_sizes + args.dd_sizes + [0])) * 5 // 4 \
            + 512
        t = time.monotonic()
        tree = data_tree(work, args.sizes)
        for i in range(args.vms):
            disks.append(DataDisk(work, i, data_mib, args.swap_mib, tree,
                                  disks[0] if disks else None))
        shutil.rmtree(tree)
        print("data disks with the data sets: %.0f s" % (time.monotonic() - t), flush=True)
        env = vmm_environment(RIG_NOTE, "figures", args.hakoniwa, None, args.kernel,
                              args.debian_initramfs, DEBIAN_CMDLINE, vcpus=1,
                              memory_mib="%d / %d" % (args.small_mib, args.large_mib),
                              relative_to=ROOT)
        with open("/proc/meminfo") as f:
            env["l1_memory_mib"] = int(f.readline().split()[1]) // 1024
        env["vms"] = args.vms
        env["data_disk"] = ("ext4 on dm-delay (reads %d ms) over a loop device (direct I/O to "
                            "its file in %s), cache=writeback; swap %d MiB"
                            % (args.miss_delay_ms, args.workdir, args.swap_mib))
        print("iocache benchmark: %s; host memory %d MiB" % (env["note"], env["l1_memory_mib"]),
              flush=True)
        results += kept_results(args, env)
        for label, mib in (("small", args.small_mib), ("large", args.large_mib)):
            if label not in args.boots:
                continue
            try:
                run_boot(args, label, mib, disks, work, results)
            except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
                print("boot %s failed: %s" % (label, e), flush=True)
                results.append({"bench": "boot", "mem": label, "ok": False, "error": str(e)})
    finally:
        for d in disks:
            d.close()
        shutil.rmtree(work, ignore_errors=True)
    env["wall_s"] = round(time.monotonic() - t_start)
    return write_outputs(args, env, results)


if __name__ == "__main__":
    sys.exit(main())
