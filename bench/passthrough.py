#!/usr/bin/env python3
"""Passthrough benchmark (seed 004): a disk read's time and jitter, and a
NIC's TCP throughput, device passed through vs virtio vs native, under CPU
and I/O load.

Watanabe et al. ("Performance evaluation of PCI Passthrough of Xen") time
`dd` reading the first 1 GB of a disk (128 KB x 8000) in a measured VM, 50
runs per case, with the disk given to the VM by Xen's virtual (split)
driver or passed through (PCI Passthrough), natively for reference, while
other domains or the host carry a CPU-bound (stress) or I/O-bound (a UDP
flood into another VM) load; they report each case's mean, variance and
max - min (their figures 6-9), and the cost per device interrupt against
native (table 3); then netperf's TCP throughput sending and receiving
with the NIC passed through or given by the virtual driver (figure 12).
This is that experiment in the test
rig's IOMMU profile (HK_RIG_PROFILE=iommu, docs/rig.md): L1 has one CPU,
CPU 0, an emulated NVMe disk bound to vfio-pci (HK_RIG_NVME_PCI, its
backing file HK_RIG_NVME_IMAGE) and the native nvme modules staged
(HK_RIG_NATIVE_MODULES). The network half (iperf3 through the rig's
e1000e, HK_RIG_E1000E_PCI) is described where its code begins, below;
--half disk|net measures one half and writes the other's results again
as the earlier passthrough.json has them.

Paths (how the measured reader gets its disk):

  virtio       hakoniwa, virtio-blk on a raw image file in L1's /tmp (--disk
               path=IMG, the default writeback cache), /dev/vda;
  passthrough  hakoniwa, the NVMe passed through (--device path=...,
               irq_affinity=on), /dev/nvme0n1 with the guest's nvme driver;
  native       the same NVMe read in L1 itself: unbound from vfio-pci, the
               native modules inserted, its nvmeXn1; rebound afterwards;
  qemu         QEMU (-accel kvm in L1, `taskset -c 0`) with -device
               vfio-pci,host=... on the same NVMe, the same guest: the
               peer for passthrough.

The VMs have one vCPU pinned to CPU 0 (--cpus boot=1,affinity=[0@[0]]),
--memory-mib of RAM, the default guest and its shell on the console
(bench/lib/console.py). The image and the NVMe's first --mib MiB hold the
same random data, written once before the runs.

Loads, each held for all runs of a cell:

  none      nothing else;
  cpu-l1    `stress --cpu 1` in L1 (the paper's load in Domain-0);
  cpu-vm    a second hakoniwa VM (1 vCPU, also pinned to CPU 0) running
            a shell busy loop (the paper's Domain-U(A) with stress);
  cpu-both  both;
  io        a UDP flood from L1 into that second VM over virtio-net: a TAP
            in L1 and a Python sender (the paper wrote its own, udpsend)
            sending --udp-size-byte datagrams as fast as it can to a port
            nothing listens on (the guest's busybox has no UDP receiver;
            its kernel takes each datagram through the stack and drops it).

L1 has one CPU, so the measured VM, the load VM, stress and the sender all
share CPU 0: the paper's domains each had a core of their own (Domain-0
two), and here every load also takes CPU time from the measured reader.

Each run: `sync` and `echo 3 > /proc/sys/vm/drop_caches` in L1, then in
the reader (the guest's shell, or for native the guest's own busybox sh
and dd run in L1): drop_caches again, the disk's interrupt counts from
/proc/interrupts, the kernel's monotonic clock (/proc/timer_list "now at
N nsecs", read with the shell's own `read`: no process), `dd if=DISK
of=/dev/null bs=128K count=N iflag=direct` (busybox dd, which supports
iflag=direct but prints no time), the clock and the counts again. The
time is the clock's difference (the dd process's start and end
included); the interrupts are the deltas of the disk's vectors (nvmeXq*,
or virtioN-*). After a cell's runs the reader reads the same range once
more through md5sum: it must match the data written (a data check).

Per cell: mean, variance, min, max, max - min, p50, p99 of the times, the
mean's difference from native (no load, as the paper's figure 7) and the
interrupts per run; per path without load, the time per interrupt and the
overhead per interrupt against native, (T_path - T_native) / interrupts
(table 3), with the path's own interrupt count and with native's (the
paper divided by native's). The measured hakoniwa VM's `ctl isolation
--json` is recorded in each of its cells (once per load).

Defaults are scaled to the rig: 64 MiB (512 x 128 KiB) per read and 10
runs per cell; --full gives the paper's 1 GB (count=8000, 1000 MiB) and 50
runs (hours in the rig; HK_RIG_NVME_MB must be at least 1000, which
scripts/bench-passthrough sets). A cell that fails (a VM that does not
boot, a read that fails or times out, a data check) is recorded and
reported, never dropped, and the script exits 1.

Writes bench/results/passthrough.json (every run, the summary, the
environment; the network half under "network"), passthrough.md (tables,
the paper's figures beside ours), passthrough.png (the paper's figures
6-9 for these runs) and passthrough-net.png (figure 12), the figures where
matplotlib is importable. Needs root, /dev/kvm and the rig's IOMMU
profile; run through scripts/bench-passthrough.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import CMDLINE  # noqa: E402
from lib.console import PROMPT_RE, shell  # noqa: E402
from lib.environment import (first_line, git_state, machine_memory_mib,  # noqa: E402
                             vmm_environment)
from lib.hakoniwa import DISK_STAGES, api_get, disk_stages, hk_ctl, stage_deltas  # noqa: E402
from lib.initramfs import extract_from_cpio, with_program  # noqa: E402
from lib import iperf3  # noqa: E402
from lib.options import add_path_options, exit_status  # noqa: E402
from lib.plots import panels, save_figure  # noqa: E402
from lib.qemu import qemu_argv  # noqa: E402
from lib.tables import (md_command_lines, md_context, md_environment, md_table,  # noqa: E402
                        spread, text_table)
from lib.vmm import Proc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RIG_NOTE = ("inside L1 (one vCPU: every VM, load and reader shares CPU 0) under TCG "
            "with nested KVM and an emulated IOMMU and NVMe; absolute times mean little, "
            "compare paths and loads within this run")
IN_RIG = ("The rig's L1 is a QEMU TCG machine (docs/rig.md): the NVMe is QEMU's "
          "emulated device on a file in the host's page cache, the virtio image a file on "
          "L1's ext4 /tmp (itself a QEMU virtio disk on the host), so every read ends in "
          "the host's memory through an emulator, not on a disk: the figures compare "
          "I/O paths and their jitter, not disks.")
PATHS = ["virtio", "passthrough", "native", "qemu"]
PATH_TITLE = {
    "virtio": "virtio-blk (hakoniwa)",
    "passthrough": "NVMe passed through (hakoniwa)",
    "native": "NVMe native in L1",
    "qemu": "NVMe passed through (QEMU vfio-pci)",
}
LOADS = ["none", "cpu-l1", "cpu-vm", "cpu-both", "io"]
LOAD_TITLE = {
    "none": "no load",
    "cpu-l1": "CPU load in L1 (stress --cpu 1)",
    "cpu-vm": "CPU load in a second VM (busy loop)",
    "cpu-both": "CPU load in L1 and in the second VM",
    "io": "I/O load: UDP flood into the second VM (virtio-net)",
}
VM_LOADS = ("cpu-vm", "cpu-both", "io")
BS = 131072
MIB = 1 << 20
LOAD_NET = "10.215.0"
LOAD_MAC = "52:54:00:00:04:02"
UDP_PORT = 5004
PIN = "boot=1,affinity=[0@[0]]"

# Seed 004's figures (shared/seeds/004_*.txt): section 3.2.3, figures 6-9,
# tables 2 and 3.
PAPER = {
    "setup": "Xen 3.4.1 on a Core i7 920 (4 cores; Domain-0 2 cores and 4 GB, the "
             "measured and the load Domain-U 1 core and 1 GB each), a 7200 rpm SATA HDD "
             "on a SiI3132 card (passed through whole, or through the virtual split "
             "driver); dd of the first 1 GB, 128 KB x 8000, 50 runs per case",
    "native_range_ms": 75,
    "passthrough_range_ms": [50, 96],
    "virtual_range_ms": [80, 310],
    "passthrough_extra_s_max": 0.33,
    "virtual_cpu_extra_s_max": 0.35,
    "virtual_io_extra_s_max": 2.82,
    "native_interrupts_per_read": 15854.8,
    # Not printed in the paper: tables 2 x 3, 15854.8 x (1215.43 - 6.68) µs.
    "native_mean_s_derived": 19.164,
    "per_interrupt_us": {"passthrough": 1215.43, "virtio": 1230.73},
    "per_interrupt_overhead_us": {"passthrough": 6.68, "virtio": 21.99},
    "per_interrupt_overhead_pct": {"passthrough": 0.54, "virtio": 1.78},
}

# The sender of the I/O load (the paper's udpsend): datagrams of SIZE bytes
# to HOST:PORT as fast as it can, until SIGTERM; then one JSON line.
UDP_SENDER = r"""
import json, signal, socket, sys, time
dst, payload = (sys.argv[1], int(sys.argv[2])), bytes(int(sys.argv[3]))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n = [0, 0]
t0 = time.monotonic()
def done(*_):
    print(json.dumps({"sent": n[0], "errors": n[1], "seconds": time.monotonic() - t0}),
          flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    try:
        s.sendto(payload, dst)
        n[0] += 1
    except OSError:
        n[1] += 1
"""

RUN_RE = {k: re.compile(r"^hk-%s (.*)$" % k, re.M) for k in ("t0", "t1", "dd")}
NOW_RE = re.compile(r"now at (\d+) nsecs")
IRQ_RE = re.compile(r"^hk-(i0|i1) +(\S+):((?: +\d+)+) +(.*)$", re.M)
MD5_RE = re.compile(r"\b([0-9a-f]{32})\b")


# ------------------------------------------------------------ helpers ----

def log(msg):
    print(msg, flush=True)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def sh(*argv):
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def drop_caches():
    os.sync()
    write("/proc/sys/vm/drop_caches", "3\n")


def read_snippet(dd, dev, count, irq_pattern, tmp):
    """The shell lines of one timed read (see the docstring); the same for
    a guest and for native."""
    return (
        "echo 3 > /proc/sys/vm/drop_caches; "
        "grep -E '{irq}' /proc/interrupts > {tmp}/hk-i0; "
        "{{ read -r _; read -r _; read -r t0; }} < /proc/timer_list; "
        "{dd} if={dev} of=/dev/null bs={bs} count={count} iflag=direct 2> {tmp}/hk-dd; s=$?; "
        "{{ read -r _; read -r _; read -r t1; }} < /proc/timer_list; "
        "grep -E '{irq}' /proc/interrupts > {tmp}/hk-i1; "
        "echo \"hk-t0 $t0\"; echo \"hk-t1 $t1\"; echo \"hk-dd $s\"; "
        "sed 's/^/hk-i0 /' {tmp}/hk-i0; sed 's/^/hk-i1 /' {tmp}/hk-i1; "
        "[ $s = 0 ] || cat {tmp}/hk-dd"
    ).format(irq=irq_pattern, tmp=tmp, dd=dd, dev=dev, bs=BS, count=count)


def parse_run(text):
    """(seconds, interrupts, {vector: delta}) from a read's output, or
    raises ValueError saying what is missing."""
    got = {k: r.search(text) for k, r in RUN_RE.items()}
    missing = [k for k, m in got.items() if not m]
    if missing:
        raise ValueError("no %s line in %r" % (", ".join(missing), text[-400:]))
    if got["dd"].group(1).strip() != "0":
        raise ValueError("dd exited with status %s: %r" % (got["dd"].group(1).strip(),
                                                            text[-400:]))
    t = [NOW_RE.search(got[k].group(1)) for k in ("t0", "t1")]
    if not all(t):
        raise ValueError("unreadable clock: %r" % text[-400:])
    seconds = (int(t[1].group(1)) - int(t[0].group(1))) / 1e9
    counts = {"i0": {}, "i1": {}}
    for m in IRQ_RE.finditer(text):
        name = m.group(4).split()[-1]
        counts[m.group(1)][name] = sum(int(x) for x in m.group(3).split())
    if not counts["i1"]:
        raise ValueError("no interrupt lines for the disk: %r" % text[-400:])
    vectors = {k: v - counts["i0"].get(k, 0) for k, v in counts["i1"].items()}
    return seconds, sum(vectors.values()), vectors


# ------------------------------------------------------------- readers ----

def vm_argv(args, path, sock):
    """The measured VM's argv for PATH (virtio, passthrough or qemu)."""
    kernel, initrd = args.work_kernel, args.work_initramfs
    if path == "qemu":
        return ["taskset", "-c", "0"] + qemu_argv(
            args.qemu, kernel, initrd, CMDLINE, args.memory_mib, cpus=1, machine="pc",
            accel="kvm", extra=["-device", "vfio-pci,host=%s" % args.nvme_pci])
    argv = [args.hakoniwa, "run", "--kernel", kernel, "--initramfs", initrd, "--cmdline",
            CMDLINE, "--cpus", PIN, "--memory", "%dM" % args.memory_mib, "--api-socket", sock]
    if path == "virtio":
        return argv + ["--disk", "path=%s" % args.image]
    return argv + ["--device", "path=/sys/bus/pci/devices/%s,id=nvme0,irq_affinity=on"
                   % args.nvme_pci]


def load_argv(args, tap):
    """The load VM's argv, its NIC on TAP."""
    return [args.hakoniwa, "run", "--kernel", args.work_kernel, "--initramfs",
            args.work_initramfs, "--cmdline", CMDLINE, "--cpus", PIN, "--memory",
            "%dM" % args.load_memory_mib, "--net", "tap=%s,mac=%s" % (tap, LOAD_MAC)]


class VmReader:
    """A measured VM (hakoniwa or QEMU) with its shell on the console."""

    def __init__(self, args, path, work):
        self.path, self.args = path, args
        self.sock = os.path.join(work, "measured-%s.sock" % path)
        self.argv = vm_argv(args, path, self.sock)
        t0 = time.monotonic()
        self.vm = Proc(self.argv, path)
        try:
            self._find_disk(args)
        except BaseException:
            self.vm.stop(5)
            raise
        self.boot_s = time.monotonic() - t0

    def _find_disk(self, args):
        path = self.path
        if not self.vm.con.wait(PROMPT_RE, 0, args.boot_timeout):
            raise RuntimeError("no guest prompt within %d s: %s" % (args.boot_timeout,
                                                                    self.vm.tails()))
        if path == "virtio":
            self.dev = "/dev/vda"
            out = shell(self.vm.con, "basename $(readlink /sys/block/vda/device)", 60)
            name = out.strip()
            if not re.fullmatch(r"virtio\d+", name):
                raise RuntimeError("no virtio disk: %r" % out)
            self.irq = "%s-" % name
        else:
            out = shell(self.vm.con, "for i in $(seq 300); do [ -b /dev/nvme0n1 ] && break; "
                        "sleep 0.1; done; cat /sys/block/nvme0n1/size", 60)
            if not out.strip().isdigit():
                raise RuntimeError("no /dev/nvme0n1 in the guest: %r" % out)
            self.dev, self.irq = "/dev/nvme0n1", "nvme0q[0-9]"

    def alive(self):
        return self.vm.alive()

    def run(self, snippet_args, timeout):
        return shell(self.vm.con, read_snippet("dd", self.dev, *snippet_args, "/tmp"), timeout)

    def md5(self, count, timeout):
        return shell(self.vm.con, "dd if=%s bs=%d count=%d iflag=direct 2>/dev/null | md5sum"
                     % (self.dev, BS, count), timeout)

    def isolation(self):
        if self.path == "qemu":
            return None
        return hk_ctl(self.args.hakoniwa, self.sock, "isolation", "--json")

    def disk_stages(self):
        """The virtio disk's request stages so far (vm.counters); None for
        the other paths."""
        if self.path != "virtio":
            return None
        return disk_stages(api_get(self.sock, "vm.counters"), "disk0")

    def close(self):
        if self.vm.alive():
            try:
                self.vm.con.send("poweroff\n")
                self.vm.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        status, _, killed = self.vm.stop(5)
        return status, killed


class NativeReader:
    """The NVMe driven by L1's own nvme driver, read with the guest's
    busybox sh and dd."""

    def __init__(self, args, work):
        self.args, self.work = args, work
        self.pci = args.nvme_pci
        self.sysfs = "/sys/bus/pci/devices/%s" % self.pci
        t0 = time.monotonic()
        try:
            self._bind_native()
        except BaseException:
            try:
                self.close()
            except (RuntimeError, OSError):
                pass
            raise
        self.iommu_domain = read(os.path.join(self.sysfs, "iommu_group/type"))
        self.boot_s = time.monotonic() - t0

    def _bind_native(self):
        self._unbind_vfio()
        ctrl = None
        for _ in range(300):
            found = [n for n in os.listdir(os.path.join(self.sysfs, "nvme"))
                     if re.fullmatch(r"nvme\d+", n)] if os.path.isdir(
                         os.path.join(self.sysfs, "nvme")) else []
            if found and os.path.exists("/dev/%sn1" % found[0]):
                ctrl = found[0]
                break
            time.sleep(0.1)
        if not ctrl:
            raise RuntimeError("%s: no nvme block device after binding the native driver "
                               "(driver: %s)" % (self.pci, self.driver()))
        self.dev = "/dev/%sn1" % ctrl
        self.irq = "%sq[0-9]" % ctrl

    def driver(self):
        link = os.path.join(self.sysfs, "driver")
        return os.path.basename(os.readlink(link)) if os.path.islink(link) else None

    def _unbind_vfio(self):
        if self.driver():
            write(os.path.join(self.sysfs, "driver/unbind"), self.pci)
        write(os.path.join(self.sysfs, "driver_override"), "\n")
        if not os.path.isdir("/sys/module/nvme"):
            mods = self.args.native_modules
            if mods:
                with open(mods) as f:
                    for mod in f.read().split():
                        name = os.path.basename(mod)[:-3].replace("-", "_")
                        if name == "e1000e":
                            continue  # the NIC's, listed in the same file
                        if not os.path.isdir("/sys/module/" + name):
                            sh("insmod", mod)
            else:
                sh("modprobe", "nvme")
        write("/sys/bus/pci/drivers_probe", self.pci)

    def alive(self):
        return True

    def run(self, snippet_args, timeout):
        bb = self.args.busybox
        out = subprocess.run([bb, "sh", "-c", read_snippet(bb + " dd", self.dev, *snippet_args,
                                                           self.work)],
                             capture_output=True, text=True, timeout=timeout)
        return out.stdout + out.stderr

    def md5(self, count, timeout):
        out = subprocess.run("%s dd if=%s bs=%d count=%d iflag=direct 2>/dev/null | md5sum"
                             % (self.args.busybox, self.dev, BS, count), shell=True,
                             capture_output=True, text=True, timeout=timeout)
        return out.stdout

    def isolation(self):
        return None

    def disk_stages(self):
        return None

    def close(self):
        """Back to vfio-pci for the next cells."""
        if self.driver():
            write(os.path.join(self.sysfs, "driver/unbind"), self.pci)
        write(os.path.join(self.sysfs, "driver_override"), "vfio-pci")
        write("/sys/bus/pci/drivers_probe", self.pci)
        if self.driver() != "vfio-pci":
            raise RuntimeError("%s did not go back to vfio-pci (driver: %s)"
                               % (self.pci, self.driver()))
        return 0, False


# --------------------------------------------------------------- loads ----

class LoadVm:
    """The second hakoniwa VM: one vCPU pinned to CPU 0, a virtio-net NIC on
    a TAP in L1, a shell; a busy loop on demand, the UDP flood's target."""

    def __init__(self, args, work):
        self.args = args
        self.tap = "hkpt%d" % (os.getpid() % 100000)
        self.host, self.guest = LOAD_NET + ".1", LOAD_NET + ".2"
        self.vm = None
        sh("ip", "tuntap", "add", "dev", self.tap, "mode", "tap")
        sh("ip", "addr", "add", self.host + "/24", "dev", self.tap)
        sh("ip", "link", "set", self.tap, "up")
        # No ARP needed before the guest is up.
        sh("ip", "neigh", "replace", self.guest, "lladdr", LOAD_MAC, "dev", self.tap, "nud",
           "permanent")
        self.argv = load_argv(args, self.tap)
        t0 = time.monotonic()
        self.vm = Proc(self.argv, "load VM")
        try:
            if not self.vm.con.wait(PROMPT_RE, 0, args.boot_timeout):
                raise RuntimeError("load VM: no guest prompt: %s" % self.vm.tails())
            shell(self.vm.con, "ip link set eth0 up; ip addr add %s/24 dev eth0" % self.guest,
                  60)
        except BaseException:
            self.close()
            raise
        self.boot_s = time.monotonic() - t0

    def busy(self, on):
        if on:
            shell(self.vm.con, "sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & "
                  "echo $! > /tmp/busy", 60)
        else:
            shell(self.vm.con, "kill $(cat /tmp/busy)", 120)

    def net_counts(self):
        out = shell(self.vm.con, "cat /sys/class/net/eth0/statistics/rx_packets "
                    "/sys/class/net/eth0/statistics/rx_dropped; grep '^Udp: [0-9]' "
                    "/proc/net/snmp", 120)
        words = out.split()
        try:
            # Udp: InDatagrams NoPorts InErrors ...
            return {"rx_packets": int(words[0]), "rx_dropped": int(words[1]),
                    "udp_no_ports": int(words[4])}
        except (IndexError, ValueError):
            return {"raw": out}

    def close(self):
        if self.vm and self.vm.alive():
            try:
                self.vm.con.send("poweroff\n")
                self.vm.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.vm:
            self.vm.stop(5)
        subprocess.run(["ip", "link", "del", self.tap], stderr=subprocess.DEVNULL)


class Load:
    """One load, started and stopped around a cell: stress in L1, the load
    VM's busy loop, the UDP sender. `info` says what ran."""

    def __init__(self, args, name, loadvm):
        self.args, self.name, self.loadvm = args, name, loadvm
        self.stress = self.sender = None
        self.busy = False
        self.info = {"load": name}
        self.rx0 = None
        self.t0 = time.monotonic()

    def start(self):
        args, name, loadvm = self.args, self.name, self.loadvm
        if name in ("cpu-l1", "cpu-both"):
            self.stress = subprocess.Popen(["stress", "--cpu", "1"], stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True)
            self.info["stress_pid"] = self.stress.pid
        if name in ("cpu-vm", "cpu-both"):
            self.busy = True
            loadvm.busy(True)
            self.info["vm_busy_loop"] = True
        if name == "io":
            self.rx0 = loadvm.net_counts()
            self.sender = subprocess.Popen(
                [sys.executable, "-c", UDP_SENDER, loadvm.guest, str(UDP_PORT),
                 str(args.udp_size)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True)
            self.info["udp_size"] = args.udp_size
        self.t0 = time.monotonic()
        time.sleep(args.settle)
        if self.stress and self.stress.poll() is not None:
            raise RuntimeError("stress exited at once with status %s" % self.stress.returncode)
        if self.sender and self.sender.poll() is not None:
            raise RuntimeError("the UDP sender exited at once: %s" % self.sender.stderr.read())

    def stop(self):
        self.info["held_s"] = round(time.monotonic() - self.t0, 1)
        self.info["l1_loadavg"] = read("/proc/loadavg")
        errors = []
        if self.stress:
            if self.stress.poll() is not None:
                errors.append("stress had exited (status %s)" % self.stress.returncode)
            else:
                os.killpg(self.stress.pid, signal.SIGTERM)
            self.stress.wait()
        if self.sender:
            alive = self.sender.poll() is None
            if alive:
                self.sender.send_signal(signal.SIGTERM)
            try:
                out, err = self.sender.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.sender.kill()
                out, err = self.sender.communicate()
            try:
                sent = json.loads(out.strip().splitlines()[-1])
                sent["pps"] = round(sent["sent"] / sent["seconds"]) if sent["seconds"] else None
                sent["mbit_s"] = (round(sent["sent"] * self.args.udp_size * 8 / sent["seconds"]
                                        / 1e6, 1) if sent["seconds"] else None)
                self.info["udp"] = sent
            except (ValueError, IndexError, KeyError):
                errors.append("UDP sender: %r" % (err or out)[-300:])
            if not alive:
                errors.append("the UDP sender had exited")
        if self.busy and self.loadvm.vm.alive():
            try:
                self.loadvm.busy(False)
            except RuntimeError as e:
                errors.append("load VM: %s" % e)
        if self.rx0 is not None and self.loadvm.vm.alive():
            try:
                rx1 = self.loadvm.net_counts()
                self.info["load_vm_rx"] = {k: rx1[k] - self.rx0.get(k, 0) for k in rx1
                                           if isinstance(rx1[k], int)
                                           and isinstance(self.rx0.get(k), int)}
            except RuntimeError as e:
                errors.append("load VM: %s" % e)
        if self.loadvm and not self.loadvm.vm.alive():
            errors.append("the load VM had exited")
        if errors:
            self.info["errors"] = errors
        return errors


# ---------------------------------------------------------------- cells --

def measure(args, reader, cell):
    """The runs of one cell into CELL; the data check after them."""
    timeout = args.read_timeout
    for i in range(args.runs):
        rec = {"run": i, "ok": False}
        cell["runs"].append(rec)
        if not reader.alive():
            rec["error"] = "the reader's VM had exited: %s" % reader.vm.tails()
            break
        try:
            drop_caches()
            before = reader.disk_stages()
            out = reader.run((args.count, reader.irq), timeout)
            after = reader.disk_stages()
            rec["seconds"], rec["interrupts"], rec["vectors"] = parse_run(out)
            if before and after:
                # Where virtio-blk spent its part of the run, stage by stage.
                rec["stages"] = stage_deltas(before, after)
            rec["ok"] = True
        except (RuntimeError, ValueError, subprocess.TimeoutExpired, OSError) as e:
            rec["error"] = str(e)[:2000]
            log("    run %d FAILED: %s" % (i + 1, rec["error"][:300]))
            if isinstance(e, RuntimeError) and "did not" in str(e):
                cell["reader_stuck"] = True
                break  # the guest shell is stuck: no point going on
            continue
        log("    run %2d: %.3f s, %d interrupts" % (i + 1, rec["seconds"], rec["interrupts"]))
    if reader.alive() and not cell.get("reader_stuck"):
        try:
            drop_caches()
            out = reader.md5(args.count, timeout)
            m = MD5_RE.search(out)
            cell["md5"] = m.group(1) if m else None
            if cell["md5"] != args.data_md5:
                cell["check_error"] = "data check: read %s, wrote %s (%r)" % (
                    cell["md5"], args.data_md5, out[-200:])
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
            cell["check_error"] = "data check: %s" % e


def summarize_cell(cell):
    ok = [r for r in cell["runs"] if r["ok"]]
    cell["seconds"] = spread([r["seconds"] for r in ok])
    cell["interrupts"] = spread([r["interrupts"] for r in ok])
    errors = [r["error"] for r in cell["runs"] if not r["ok"]]
    if cell.get("check_error"):
        errors.append(cell["check_error"])
    if len(ok) < cell["runs_wanted"] and not errors and not cell.get("error"):
        errors.append("%d of %d runs" % (len(ok), cell["runs_wanted"]))
    if errors and not cell.get("error"):
        cell["error"] = "; ".join(errors)[:2000]
    cell["ok"] = not cell.get("error")


def overheads(cells, load):
    """Table 3 for LOAD: per path, time per interrupt and overhead per
    interrupt against native, with the path's own and native's counts."""
    by = {c["path"]: c for c in cells if c["load"] == load and c.get("seconds")
          and c.get("interrupts")}
    nat = by.get("native")
    out = {}
    for path in ("passthrough", "virtio", "qemu"):
        c = by.get(path)
        if not c or not c["interrupts"]["mean"]:
            continue
        t, irqs = c["seconds"]["mean"], c["interrupts"]["mean"]
        row = {"mean_s": t, "interrupts": irqs, "us_per_interrupt": t / irqs * 1e6}
        if nat and nat["interrupts"]["mean"]:
            tn, irqn = nat["seconds"]["mean"], nat["interrupts"]["mean"]
            row.update({
                "native_mean_s": tn, "native_interrupts": irqn,
                "overhead_us": (t - tn) / irqs * 1e6,
                "overhead_us_native_count": (t - tn) / irqn * 1e6,
                "overhead_pct": (t - tn) / irqs * 1e6 / (t / irqs * 1e6) * 100,
            })
        out[path] = row
    return out


# -------------------------------------------------------------- output ---

def fmt(x, f, mul=1):
    return "-" if x is None else f % (x * mul)


def cell_rows(args, cells, native_none):
    rows = [["path", "load", "runs", "mean s", "var ms²", "min s", "max s", "max-min ms",
             "p50 s", "p99 s", "mean - native(none) s", "interrupts/run", "ok"]]
    for c in cells:
        s = c.get("seconds")
        delta = (s["mean"] - native_none) if s and native_none is not None else None
        rows.append([
            c["path"], c["load"], "%d/%d" % (s["n"] if s else 0, c["runs_wanted"]),
            fmt(s and s["mean"], "%.3f"), fmt(s and s["variance"], "%.1f", 1e6),
            fmt(s and s["min"], "%.3f"), fmt(s and s["max"], "%.3f"),
            fmt(s and s["range"], "%.0f", 1e3), fmt(s and s["p50"], "%.3f"),
            fmt(s and s["p99"], "%.3f"), fmt(delta, "%+.3f"),
            fmt(c.get("interrupts") and c["interrupts"]["mean"], "%.0f"),
            "yes" if c["ok"] else "**no**"])
    return rows


def paper_rows(args, cells, native_none, table3):
    """Our figures beside the paper's; the percentages are of native's mean
    without load (the paper's derived: PAPER["native_mean_s_derived"])."""
    def get(path, load):
        for c in cells:
            if c["path"] == path and c["load"] == load and c.get("seconds"):
                return c["seconds"]
        return None

    def pct(x, base):
        return " (%.1f %%)" % (x / base * 100) if base else ""

    pbase = PAPER["native_mean_s_derived"]

    def ranges(path, loads=LOADS):
        v = [get(path, ld)["range"] for ld in loads if get(path, ld)]
        if not v:
            return "-"
        return "%.0f-%.0f ms%s" % (min(v) * 1e3, max(v) * 1e3, (
            " (%.1f-%.1f %%)" % (min(v) / native_none * 100, max(v) / native_none * 100)
            if native_none else ""))

    def extra(path, loads):
        v = [(get(path, ld)["mean"] - native_none) for ld in loads if get(path, ld)]
        if not v or native_none is None:
            return "-"
        return "up to %+.3f s%s" % (max(v), pct(max(v), native_none))

    def paper_range(lo, hi):
        return "%d-%d ms (%.1f-%.1f %%)" % (lo, hi, lo / 1e3 / pbase * 100,
                                            hi / 1e3 / pbase * 100)

    nat = get("native", "none")
    cpu = ("cpu-l1", "cpu-vm", "cpu-both")
    rows = [["figure", "paper (1 GB x 50, Xen, HDD)",
             "ours (%d MiB x %d, rig)" % (args.mib, args.runs)]]
    rows.append(["native mean (no load)", "~%.2f s (derived)" % pbase,
                 "%.3f s" % nat["mean"] if nat else "-"])
    rows.append(["native max-min (no load)", "~%d ms%s" % (
        PAPER["native_range_ms"], pct(PAPER["native_range_ms"] / 1e3, pbase)),
        "%.0f ms%s" % (nat["range"] * 1e3, pct(nat["range"], native_none)) if nat else "-"])
    rows.append(["passthrough max-min, over the loads",
                 paper_range(*PAPER["passthrough_range_ms"]),
                 "hakoniwa %s; QEMU %s" % (ranges("passthrough"), ranges("qemu"))])
    rows.append(["virtual driver max-min, over the loads",
                 paper_range(*PAPER["virtual_range_ms"]), ranges("virtio")])
    rows.append(["native max-min, over the loads", "-", ranges("native")])
    rows.append(["passthrough mean - native, CPU or I/O load", "up to +%.2f s%s" % (
        PAPER["passthrough_extra_s_max"], pct(PAPER["passthrough_extra_s_max"], pbase)),
        "hakoniwa %s; QEMU %s" % (extra("passthrough", cpu + ("io",)),
                                  extra("qemu", cpu + ("io",)))])
    rows.append(["virtual driver mean - native, CPU load", "up to +%.2f s%s" % (
        PAPER["virtual_cpu_extra_s_max"], pct(PAPER["virtual_cpu_extra_s_max"], pbase)),
        extra("virtio", cpu)])
    rows.append(["virtual driver mean - native, I/O load", "up to +%.2f s%s" % (
        PAPER["virtual_io_extra_s_max"], pct(PAPER["virtual_io_extra_s_max"], pbase)),
        extra("virtio", ("io",))])
    for path, name in (("passthrough", "passthrough"), ("virtio", "virtual driver")):
        r = table3.get(path, {})
        rows.append(["%s: time per interrupt" % name, "%.2f µs" % PAPER["per_interrupt_us"][
            path], fmt(r.get("us_per_interrupt"), "%.1f µs")])
        rows.append(["%s: overhead per interrupt vs native" % name, "%.2f µs (%.2f %%)" % (
            PAPER["per_interrupt_overhead_us"][path], PAPER["per_interrupt_overhead_pct"][path]),
            "%s (%s); %s with native's count" % (
                fmt(r.get("overhead_us"), "%.1f µs"), fmt(r.get("overhead_pct"), "%.1f %%"),
                fmt(r.get("overhead_us_native_count"), "%.1f µs"))])
    r = table3.get("qemu", {})
    rows.append(["QEMU vfio-pci: overhead per interrupt vs native", "(not in the paper)",
                 "%s (%s)" % (fmt(r.get("overhead_us"), "%.1f µs"),
                              fmt(r.get("overhead_pct"), "%.1f %%"))])
    ni = get_irqs(cells, "native", "none")
    rows.append(["native interrupts per read", "%.1f per 1 GB (table 2)" % PAPER[
        "native_interrupts_per_read"], "%s per %d MiB" % (fmt(ni, "%.0f"), args.mib)])
    return rows


def get_irqs(cells, path, load):
    for c in cells:
        if c["path"] == path and c["load"] == load and c.get("interrupts"):
            return c["interrupts"]["mean"]
    return None


def table3_rows(table3):
    rows = [["path", "mean s", "interrupts/run", "µs per interrupt", "native mean s",
             "overhead µs/interrupt", "share", "overhead with native's count"]]
    for path in ("passthrough", "virtio", "qemu"):
        r = table3.get(path)
        if not r:
            continue
        rows.append([PATH_TITLE[path], "%.3f" % r["mean_s"], "%.0f" % r["interrupts"],
                     "%.1f" % r["us_per_interrupt"], fmt(r.get("native_mean_s"), "%.3f"),
                     fmt(r.get("overhead_us"), "%+.1f"), fmt(r.get("overhead_pct"), "%.1f %%"),
                     fmt(r.get("overhead_us_native_count"), "%+.1f")])
    return rows


def isolation_summary(iso):
    """A line from an IsolationReport: the verdict, its problems and the
    passed-through devices' host IRQs."""
    if not iso or not isinstance(iso, dict):
        return "-"
    if "error" in iso:
        return "error: %s" % iso["error"]
    problems = "; ".join(str(p) for p in iso.get("problems") or []) or "no problems"
    devs = []
    for d in iso.get("devices") or []:
        irqs = d.get("irqs") or []
        inside = sum(1 for i in irqs if i.get("inside_vm_cpus"))
        devs.append("%s: %d host IRQs, %d delivered inside the VM's CPUs" % (
            d.get("id"), len(irqs), inside))
    return "%s: %s%s" % (iso.get("verdict"), problems,
                         (". Devices: " + "; ".join(devs)) if devs else "")


def draw(path, args, cells, native_none):
    fig, axes = panels(2, 2, (13, 9))
    if fig is None:
        return False
    ax_runs, ax_delta, ax_var, ax_range = axes
    colors = {"virtio": "tab:red", "passthrough": "tab:blue", "native": "tab:gray",
              "qemu": "tab:green"}
    paths = [p for p in PATHS if p in args.paths]
    width = 0.8 / max(1, len(paths))
    for j, p in enumerate(paths):
        xs, means, deltas, vars_, ranges_ = [], [], [], [], []
        for i, ld in enumerate(args.loads):
            c = next((c for c in cells if c["path"] == p and c["load"] == ld), None)
            x = i + (j - (len(paths) - 1) / 2) * width
            xs.append(x)
            s = c and c.get("seconds")
            times = [r["seconds"] for r in c["runs"] if r["ok"]] if c else []
            ax_runs.scatter([x] * len(times), times, s=10, color=colors[p], alpha=0.6,
                            label=PATH_TITLE[p] if i == 0 else None)
            if s:
                ax_runs.hlines(s["mean"], x - width / 2.5, x + width / 2.5, color=colors[p])
            means.append(s["mean"] if s else float("nan"))
            deltas.append(s["mean"] - native_none if s and native_none is not None
                          else float("nan"))
            vars_.append(s["variance"] * 1e6 if s else float("nan"))
            ranges_.append(s["range"] * 1e3 if s else float("nan"))
        for ax, vals in ((ax_delta, deltas), (ax_var, vars_), (ax_range, ranges_)):
            ax.bar(xs, vals, width * 0.95, color=colors[p], label=PATH_TITLE[p])
    titles = [
        (ax_runs, "each run (dots) and the mean (line), s  [paper fig. 6]", "dd time, s"),
        (ax_delta, "mean - native's mean without load, s  [fig. 7]", "s"),
        (ax_var, "variance of the runs, ms²  [fig. 8]", "ms²"),
        (ax_range, "max - min of the runs, ms  [fig. 9]", "ms"),
    ]
    for ax, title, ylabel in titles:
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.set_xticks(range(len(args.loads)))
        ax.set_xticklabels(args.loads)
        ax.grid(axis="y", alpha=0.3)
    ax_delta.axhline(0, color="black", linewidth=0.8)
    ax_runs.set_ylim(bottom=0)
    ax_runs.legend(fontsize=8)
    fig.suptitle("dd if=DISK bs=128K count=%d iflag=direct (%d MiB), %d runs per cell, in the "
                 "rig (L1: 1 CPU)" % (args.count, args.mib, args.runs), fontsize=11)
    save_figure(fig, path, 110)
    return True


STAGE_TITLE = {"kick_to_dequeue": "kick→dequeue", "dequeue_to_submit": "dequeue→submit",
               "submit_to_complete": "submit→complete",
               "complete_to_interrupt": "complete→interrupt"}


def stage_split(rec):
    """A run's time as (device s, outside s, {stage: s})."""
    per = {st: rec["stages"][st]["ns"] / 1e9 for st in DISK_STAGES}
    device = sum(per.values())
    return device, rec["seconds"] - device, per


def stage_rows(cells):
    """The table of where the virtio cells' time went: per load, the mean
    µs per request in each stage, the device and outside seconds per run,
    and the slowest run's excess over the fastest split the same way."""
    rows = [["load", "runs", "requests/run"] + ["%s µs" % STAGE_TITLE[st] for st in DISK_STAGES]
            + ["device s/run", "outside s/run", "slowest - fastest s",
               "of which device stages (s)", "of which outside s"]]
    for cell in cells:
        runs = [r for r in cell["runs"] if r.get("ok") and r.get("stages")]
        if cell["path"] != "virtio" or not runs:
            continue
        requests = sum(r["stages"]["kick_to_dequeue"]["requests"] for r in runs)
        per_req = ["%.0f" % (sum(r["stages"][st]["ns"] for r in runs) / 1e3 / max(requests, 1))
                   for st in DISK_STAGES]
        splits = [stage_split(r) for r in runs]
        slow = max(range(len(runs)), key=lambda i: runs[i]["seconds"])
        fast = min(range(len(runs)), key=lambda i: runs[i]["seconds"])
        (_, out_s, per_s), (_, out_f, per_f) = splits[slow], splits[fast]
        excess = " / ".join("%+.3f" % (per_s[st] - per_f[st]) for st in DISK_STAGES)
        rows.append([LOAD_TITLE[cell["load"]], len(runs), "%.0f" % (requests / len(runs))]
                    + per_req
                    + ["%.3f" % (sum(d for d, _, _ in splits) / len(runs)),
                       "%.3f" % (sum(o for _, o, _ in splits) / len(runs)),
                       "%.3f" % (runs[slow]["seconds"] - runs[fast]["seconds"]),
                       excess, "%+.3f" % (out_s - out_f)])
    return rows


def disk_markdown(result, args, cells, native_none, table3):
    """The disk half's Markdown lines."""
    env = result["environment"]
    L = ["# PCI passthrough vs virtio-blk: a disk read under load (seed 004)", ""]
    L += md_context(env, IN_RIG)
    L.append("`%s`, %s (%.0f s, %.1f min). Seed 004 (Watanabe et al., \"Performance "
             "evaluation of PCI Passthrough of Xen\"), section 3.2: the time of `dd` reading a "
             "disk in a measured VM, its mean, variance and max - min over runs, per way of "
             "giving the VM the disk and per load, and the cost per device interrupt against "
             "native. Paper: %s." % (result["command"], env["date_utc"], result["total_s"],
                                     result["total_s"] / 60, PAPER["setup"]))
    L.append("")
    L.append("Here: %d MiB per read (`dd bs=128K count=%d`), %d runs per cell (the paper: "
             "1 GB, 50 runs; `--full`). L1 has **one CPU** (CPU 0): the measured VM's one "
             "vCPU is pinned there and so is the load VM's, and stress and the UDP sender "
             "run there too, where the paper's Xen host gave Domain-0 two cores and each "
             "Domain-U one of its own." % (args.mib, args.count, args.runs))
    L.append("")
    failed = [c for c in cells if not c["ok"]]
    if failed:
        L.append("**%d cell(s) failed** (below, and in passthrough.json):" % len(failed))
        L.append("")
        for c in failed:
            L.append("- %s / %s: %s" % (c["path"], c["load"], c["error"][:600]))
        L.append("")
    L.append("## The paper's figures beside ours")
    L.append("")
    L.append(md_table(paper_rows(args, cells, native_none, table3)))
    L.append("")
    L.append("The paper's per-interrupt figures (table 3) divide the time difference "
             "against native by native's interrupt count (table 2); ours divide by the "
             "path's own count, from the reader's /proc/interrupts, with native's count "
             "beside. The share is the overhead over the path's own time per interrupt "
             "(the paper's 0.54 %% = 6.68 / 1215.43). The percentages after times and "
             "ranges are of native's mean without load (the paper's: about 19.16 s, "
             "derived from tables 2 and 3 as 15854.8 x (1215.43 - 6.68) µs), so that a "
             "1 GB read on a disk and a %d MiB read in the rig can be set side by side."
             % args.mib)
    L.append("")
    L.append("## Each cell")
    L.append("")
    L.append("Times of `dd` in seconds, per path and load; variance of the runs (n - 1) in "
             "ms²; p50/p99 interpolated between runs (with %d runs p99 is close to the "
             "maximum); mean - native(none): the paper's figure 7, against native without "
             "load." % args.runs)
    L.append("")
    L.append(md_table(cell_rows(args, cells, native_none)))
    L.append("")
    if result["figure"]:
        L.append("![per-run times, mean - native, variance, max - min](passthrough.png)")
        L.append("")
    L.append("## Per interrupt (table 3), without load")
    L.append("")
    L.append(md_table(table3_rows(table3)))
    L.append("")
    L.append("Under each load (passthrough.json `per_interrupt`): %s." % "; ".join(
        "%s: %s" % (ld, ", ".join("%s %s µs" % (p, fmt(r.get("overhead_us"), "%+.1f"))
                                  for p, r in result["per_interrupt"][ld].items()))
        for ld in args.loads if result["per_interrupt"].get(ld)))
    L.append("")
    rows = stage_rows(cells)
    if len(rows) > 1:
        L.append("## Where the virtio rows' time went (per-request stages)")
        L.append("")
        L.append("hakoniwa stamps each virtio-blk request at the kick (its queue thread's "
                 "wake-up on the ioeventfd), the dequeue, the host submit, the host completion "
                 "and the interrupt (`vm.counters`, docs/devices.md), read before and after "
                 "each run. Per request: the mean time in each stage over the cell's runs. "
                 "*device* is the four stages' sum per run, *outside* the run's time less it "
                 "(the guest's own work, the exits and the interrupt's delivery); the last "
                 "columns split the slowest run's excess over the fastest the same way.")
        L.append("")
        L.append(md_table(rows))
        L.append("")
    L.append("## Loads")
    L.append("")
    rows = [["path", "load", "L1 load average (1/5/15 min)", "UDP sent", "load VM received",
             "notes"]]
    for c in cells:
        li = c.get("load_info") or {}
        udp = li.get("udp")
        rx = li.get("load_vm_rx") or {}
        rows.append([c["path"], c["load"], li.get("l1_loadavg") or "-",
                     "%d datagrams, %s/s, %s Mbit/s" % (udp["sent"], udp["pps"], udp["mbit_s"])
                     if udp else "-",
                     "%d packets (%d dropped, %d to no port)" % (
                         rx.get("rx_packets", 0), rx.get("rx_dropped", 0),
                         rx.get("udp_no_ports", 0)) if rx else "-",
                     "; ".join(li.get("errors", [])) or ""])
    L.append(md_table(rows))
    L.append("")
    for ld in args.loads:
        L.append("- **%s**: %s." % (ld, LOAD_TITLE[ld]))
    L.append("")
    L.append("## Isolation of the measured VM")
    L.append("")
    L.append("`hakoniwa ctl isolation --json` of the measured hakoniwa VM, once per load "
             "(the full reports are in passthrough.json, `isolation` of each cell): with "
             "one CPU in L1 it is never isolated.")
    L.append("")
    rows = [["path", "load", "verdict and problems"]]
    for c in cells:
        if c["path"] in ("virtio", "passthrough"):
            rows.append([c["path"], c["load"], isolation_summary(c.get("isolation")).replace(
                "|", "/")])
    L.append(md_table(rows))
    L.append("")
    L.append("## Not measured")
    L.append("")
    L.append("- The paper's network half (section 3.3, figure 12) is the second part of "
             "this file, below.")
    L.append("- Domain-0's own read (the paper's figure 6 (2)) has no counterpart: L1 "
             "reading natively is the native row.")
    L.append("")
    L.append("## Method")
    L.append("")
    L.append("- Paths: " + "; ".join("**%s**: %s" % (p, PATH_TITLE[p]) for p in args.paths)
             + ". virtio reads a raw image of exactly %d MiB in L1's /tmp (ext4) with "
             "hakoniwa's default cache (writeback: through L1's page cache, dropped before "
             "each run); passthrough uses `--device path=...,id=nvme0,irq_affinity=on` "
             "(with one CPU the steering has nothing to move); native unbinds the NVMe "
             "from vfio-pci, inserts L1's nvme modules and binds it (its IOMMU domain in "
             "L1: %s; DMA means its DMA goes through the emulated IOMMU's translation, as "
             "the passed-through device's does), and rebinds it to vfio-pci after its cells; QEMU is %s with "
             "`-device vfio-pci`, all its threads on CPU 0 (`taskset -c 0`)."
             % (args.mib, result["native_iommu_domain"] or "-", env.get("qemu_version")))
    L.append("- The image and the NVMe's first %d MiB hold the same random data (the NVMe's "
             "written through its backing file before any VM opened it); after each "
             "cell's runs the reader reads it once more into md5sum, which must give %s."
             % (args.mib, args.data_md5))
    L.append("- Each run: `sync; echo 3 > /proc/sys/vm/drop_caches` in L1, then the "
             "reader's commands below (native: the same commands with the guest's busybox "
             "sh and dd, run in L1). The time is the reader kernel's monotonic clock around "
             "dd, read from /proc/timer_list with the shell's own `read`; the interrupts are "
             "the deltas of the disk's vectors in /proc/interrupts.")
    L.append("- Loads start %g s before a cell's first run and stop after its data check. "
             "The cpu-vm, cpu-both and io loads share one load VM per path (booted before "
             "the path's first such load, `--memory %dM`), whose busy loop runs only under "
             "cpu-vm and cpu-both; under none and cpu-l1 no load VM exists. The UDP "
             "sender sends %d-byte datagrams to port %d of the load VM, where nothing "
             "listens (busybox has no UDP receiver; each datagram still crosses "
             "virtio-net, IP and UDP)."
             % (args.settle, args.load_memory_mib, args.udp_size, UDP_PORT))
    L.append("- Order: for each path, its cells in the order of the loads, the measured VM "
             "booted once per path (again if it died).")
    L.append("")
    L.append("```")
    L.append(read_snippet("dd", "DISK", args.count, "VECTORS", "/tmp").replace("; ", "\n"))
    L.append("```")
    L.append("")
    L.append("## Command lines")
    L.append("")
    L += md_command_lines(result["argv"])
    L.append("")
    L.append("## Environment")
    L.append("")
    L += md_environment(env)
    L.append("")
    L.append("## All runs")
    L.append("")
    rows = [["path", "load", "boot s", "dd times, s (interrupts)", "error"]]
    for c in cells:
        rows.append([c["path"], c["load"], fmt(c.get("boot_s"), "%.1f"),
                     " ".join("%.3f (%d)" % (r["seconds"], r["interrupts"]) if r["ok"] else
                              "**failed**" for r in c["runs"]) or "-",
                     (c.get("error") or "")[:300].replace("|", "/").replace("\n", " ")])
    L.append(md_table(rows))
    L.append("")
    return L


# ------------------------------------------------------ the network half --
#
# Seed 004's section 3.3 (figure 12): TCP throughput of the measured VM,
# sending and receiving, with the NIC passed through against Xen's virtual
# driver (vif), without load and under load. Every path ends at the same
# iperf3 server, in L0 (the machine the rig runs on), through the same
# emulated e1000e and the same QEMU user network (slirp), where 10.0.2.2
# is L0's loopback: the server listens on L0's 127.0.0.1 (scripts/
# bench-passthrough starts it and passes its port). Only the way from the
# measured iperf3 client to that e1000e differs:
#
#   passthrough  the guest's e1000e driver on the NIC passed through by
#                hakoniwa (VFIO, irq_affinity=on);
#   virtio       the guest's virtio-net, hakoniwa's device, a TAP in L1,
#                a bridge in L1 with the e1000e driven by L1's own e1000e
#                driver: Xen's vif and Domain-0's bridge;
#   qemu         the guest's e1000e driver on the NIC passed through by
#                QEMU's vfio-pci: the peer for passthrough;
#   native       iperf3 in L1 itself over L1's e1000e driver.
#
# The guests are the default guest with the host's iperf3 and its shared
# libraries appended to the initramfs (lib/initramfs.py): the Debian guest
# has iperf3 too, but boots from a disk through systemd, which takes
# minutes in the rig, needs a virtio-blk disk in every VM (a second
# device under the one CPU) and is not the guest the disk half measures.

NET_PATHS = ["passthrough", "virtio", "qemu", "native"]
NET_PATH_TITLE = {
    "passthrough": "e1000e passed through (hakoniwa)",
    "virtio": "virtio-net (hakoniwa, TAP + bridge in L1)",
    "qemu": "e1000e passed through (QEMU vfio-pci)",
    "native": "e1000e native in L1",
}
NET_LOADS = ["none", "cpu-l1", "cpu-vm", "io"]
DIRECTIONS = ["send", "receive"]
SERVER = "10.0.2.2"     # slirp's address of L0 (its loopback)
NET_IP = "10.0.2.15/24"  # slirp's first DHCP address, set statically
NET_MAC = "52:54:00:00:04:0b"
BRIDGE = "hkbr%d" % (os.getpid() % 10000)

# Seed 004, section 3.3: netperf (TCP) between the measured Domain-U and an
# outside machine, 5 runs per case averaged (figure 12, whose bars carry no
# numbers in the text); table 4 the NIC's interrupts per netperf run (10 s,
# netperf's default); the I/O load a UDP flood from an outside machine into
# the load Domain-U's vif.
PAPER_NET = {
    "setup": "Xen 3.4.1, Core i7 920; Domain-0, the load and the measured Domain-U one "
             "core each; the measured NIC an 82541GI (eth1), given by the vif (Domain-0's "
             "bridge) or passed through; netperf 2.4.4 TCP to and from an outside machine, "
             "5 runs per case (mean); the I/O load UDP from outside into the load "
             "Domain-U on the other NIC (eth0)",
    "runs": 5,
    "no_load": "passthrough faster than vif both ways, the gap larger receiving",
    "io_load_receive": "as without load: passthrough faster than vif",
    "io_load_send_drop_mbit_s": {"passthrough": 50, "virtio": 30},
    "interrupts_per_run": {"virtio": {"send": 75619.43, "receive": 64033.57},
                           "passthrough": {"send": 77545.71, "receive": 66519.43}},
}

IPERF_JSON_RE = re.compile(r"^hk-json\n(.*?)^hk-json-end", re.M | re.S)
IPERF_ST_RE = re.compile(r"^hk-st (\d+)", re.M)


def iperf_snippet(argv, irq_pattern, tmp):
    """The shell lines of one iperf3 run: the NIC's interrupt counts
    before and after, the exit status and the JSON report."""
    return (
        "grep -E '{irq}' /proc/interrupts > {tmp}/hk-i0; "
        "{cmd} > {tmp}/hk-j 2>&1; s=$?; "
        "grep -E '{irq}' /proc/interrupts > {tmp}/hk-i1; "
        "echo \"hk-st $s\"; sed 's/^/hk-i0 /' {tmp}/hk-i0; sed 's/^/hk-i1 /' {tmp}/hk-i1; "
        "echo hk-json; cat {tmp}/hk-j; echo; echo hk-json-end"
    ).format(irq=irq_pattern, tmp=tmp, cmd=" ".join(argv))


def parse_iperf_run(text):
    """One run's record from iperf_snippet's output (lib/iperf3.py's
    fields, and the interrupts); raises ValueError."""
    m = IPERF_JSON_RE.search(text)
    st = IPERF_ST_RE.search(text)
    if not m or not st:
        raise ValueError("no iperf3 report or exit status in %r" % text[-400:])
    rec = iperf3.parse_report(m.group(1))
    if st.group(1) != "0":
        raise ValueError("iperf3 exited with status %s: %r" % (st.group(1), text[-400:]))
    counts = {"i0": {}, "i1": {}}
    for i in IRQ_RE.finditer(text):
        name = i.group(4).split()[-1]
        counts[i.group(1)][name] = sum(int(x) for x in i.group(3).split())
    vectors = {k: v - counts["i0"].get(k, 0) for k, v in counts["i1"].items()}
    rec["interrupts"] = sum(vectors.values()) if vectors else None
    rec["vectors"] = vectors
    return rec


class L1Nic:
    """The rig's e1000e driven by L1's own e1000e driver (unbound from
    vfio-pci, rebound at close): NATIVE gives L1 the measured address on
    it; otherwise it is bridged with a TAP for the virtio path's VM."""

    def __init__(self, args, native):
        self.args, self.pci = args, args.e1000e_pci
        self.sysfs = "/sys/bus/pci/devices/%s" % self.pci
        self.tap = None
        try:
            self._bind()
            if native:
                sh("ip", "addr", "add", NET_IP, "dev", self.iface)
            else:
                self.tap = "hknet%d" % (os.getpid() % 10000)
                sh("ip", "tuntap", "add", "dev", self.tap, "mode", "tap")
                sh("ip", "link", "add", BRIDGE, "type", "bridge")
                for dev in (self.iface, self.tap):
                    sh("ip", "link", "set", dev, "master", BRIDGE)
                    sh("ip", "link", "set", dev, "up")
                sh("ip", "link", "set", BRIDGE, "up")
        except BaseException:
            self.close()
            raise

    def driver(self):
        link = os.path.join(self.sysfs, "driver")
        return os.path.basename(os.readlink(link)) if os.path.islink(link) else None

    def _bind(self):
        if self.driver():
            write(os.path.join(self.sysfs, "driver/unbind"), self.pci)
        write(os.path.join(self.sysfs, "driver_override"), "\n")
        if not os.path.isdir("/sys/module/e1000e"):
            mods = self.args.native_modules
            if not mods:
                sh("modprobe", "e1000e")
            else:
                with open(mods) as f:
                    for mod in f.read().split():
                        if os.path.basename(mod) == "e1000e.ko":
                            sh("insmod", mod)
        write("/sys/bus/pci/drivers_probe", self.pci)
        self.iface = None
        for _ in range(300):
            net = os.path.join(self.sysfs, "net")
            if os.path.isdir(net) and os.listdir(net):
                self.iface = os.listdir(net)[0]
                break
            time.sleep(0.1)
        if not self.iface:
            raise RuntimeError("%s: no interface after binding L1's e1000e driver (driver: "
                               "%s)" % (self.pci, self.driver()))
        sh("ip", "link", "set", self.iface, "up")
        for _ in range(100):
            if read("/sys/class/net/%s/carrier" % self.iface) == "1":
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("L1's %s (e1000e) has no link" % self.iface)

    def close(self):
        """Back to vfio-pci for the next cells."""
        for dev in (self.tap, BRIDGE):
            if dev:
                subprocess.run(["ip", "link", "del", dev], stderr=subprocess.DEVNULL)
        if self.driver():
            write(os.path.join(self.sysfs, "driver/unbind"), self.pci)
        write(os.path.join(self.sysfs, "driver_override"), "vfio-pci")
        write("/sys/bus/pci/drivers_probe", self.pci)
        if self.driver() != "vfio-pci":
            raise RuntimeError("%s did not go back to vfio-pci (driver: %s)"
                               % (self.pci, self.driver()))


def net_vm_argv(args, path, sock, tap="TAP"):
    """The measured VM's argv for the network PATH (passthrough, virtio or
    qemu): the default guest with iperf3."""
    kernel, initrd = args.work_kernel, args.net_initramfs
    if path == "qemu":
        return ["taskset", "-c", "0"] + qemu_argv(
            args.qemu, kernel, initrd, CMDLINE, args.memory_mib, cpus=1, machine="pc",
            accel="kvm", extra=["-device", "vfio-pci,host=%s" % args.e1000e_pci])
    argv = [args.hakoniwa, "run", "--kernel", kernel, "--initramfs", initrd, "--cmdline",
            CMDLINE, "--cpus", PIN, "--memory", "%dM" % args.memory_mib, "--api-socket", sock]
    if path == "virtio":
        return argv + ["--net", "tap=%s,mac=%s" % (tap, NET_MAC)]
    return argv + ["--device", "path=/sys/bus/pci/devices/%s,id=nic0,irq_affinity=on"
                   % args.e1000e_pci]


class NetClient:
    """Where the measured iperf3 client runs: a VM (hakoniwa or QEMU) with
    its shell on the console and the NIC configured, or L1 itself."""

    def __init__(self, args, path, work):
        self.args, self.path, self.work = args, path, work
        self.sock = os.path.join(work, "net-%s.sock" % path)
        self.vm = self.l1nic = None
        t0 = time.monotonic()
        try:
            if path in ("virtio", "native"):
                self.l1nic = L1Nic(args, native=(path == "native"))
            if path == "native":
                self.iface = self.l1nic.iface
                self.irq = " %s(-|$)" % self.iface
            else:
                self.argv = net_vm_argv(args, path, self.sock,
                                        self.l1nic.tap if self.l1nic else "TAP")
                self.vm = Proc(self.argv, path)
                self._configure_guest()
        except BaseException:
            self.close()
            raise
        self.boot_s = time.monotonic() - t0

    def _configure_guest(self):
        con, args = self.vm.con, self.args
        if not con.wait(PROMPT_RE, 0, args.boot_timeout):
            raise RuntimeError("no guest prompt within %d s: %s" % (args.boot_timeout,
                                                                    self.vm.tails()))
        out = shell(con, "for i in $(seq 300); do n=$(ls /sys/class/net | grep -v '^lo$') "
                    "&& [ -n \"$n\" ] && break; sleep 0.1; done; echo $n", 60)
        self.iface = out.strip()
        if not re.fullmatch(r"[\w.-]+", self.iface):
            raise RuntimeError("the guest has no NIC, or more than one: %r" % out)
        out = shell(con, "ip link set {i} up; for n in $(seq 300); do [ \"$(cat "
                    "/sys/class/net/{i}/carrier 2>/dev/null)\" = 1 ] && break; sleep 0.1; "
                    "done; ip addr add {ip} dev {i}; cat /sys/class/net/{i}/carrier; "
                    "basename $(readlink /sys/class/net/{i}/device/driver); "
                    "basename $(readlink /sys/class/net/{i}/device)"
                    .format(i=self.iface, ip=NET_IP), 60).split()
        if len(out) < 3 or out[0] != "1":
            raise RuntimeError("no link on the guest's %s: %r" % (self.iface, out))
        self.guest_driver = out[1]
        # e1000e names its MSI-X vectors IFACE-rx-0, IFACE-tx-0 and IFACE;
        # virtio-net virtioN-input.0, virtioN-output.0 and virtioN-config.
        self.irq = ("%s-(input|output)" % out[2] if self.path == "virtio"
                    else " %s(-|$)" % self.iface)

    def alive(self):
        return self.vm is None or self.vm.alive()

    def run(self, direction, seconds, timeout):
        argv = iperf3.client_argv(SERVER, self.args.iperf3_port, seconds,
                                  direction == "receive")
        if self.vm is None:
            snippet = iperf_snippet(argv, self.irq, self.work)
            out = subprocess.run(["sh", "-c", snippet], capture_output=True, text=True,
                                 timeout=timeout)
            return out.stdout + out.stderr
        return shell(self.vm.con, iperf_snippet(argv, self.irq, "/tmp"), timeout)

    def driver_messages(self):
        """The kernel's lines about the client's NIC driver and the
        network watchdog (a transmit hang, a reset), last 20."""
        cmd = "dmesg | grep -iE 'e1000e|virtio_net|watchdog|hang|reset' | tail -20"
        if self.vm is None:
            return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True,
                                  timeout=60).stdout
        return shell(self.vm.con, cmd, 60)

    def isolation(self):
        if self.path in ("passthrough", "virtio"):
            return hk_ctl(self.args.hakoniwa, self.sock, "isolation", "--json")
        return None

    def close(self):
        if self.vm is not None:
            if self.vm.alive():
                try:
                    self.vm.con.send("poweroff\n")
                    self.vm.proc.wait(30)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self.vm.stop(5)
        if self.l1nic is not None:
            nic, self.l1nic = self.l1nic, None
            nic.close()


def measure_net(args, client, cell):
    """A warm-up second (not counted), then the runs of one cell, each
    direction in turn, into CELL."""
    timeout = args.net_seconds + 90
    try:
        out = client.run("send", 1, timeout)
        cell["warmup"] = {k: v for k, v in parse_iperf_run(out).items()
                          if k in ("mbit_s", "retransmits", "interrupts")}
    except (RuntimeError, ValueError, subprocess.TimeoutExpired, OSError) as e:
        cell["error"] = "warm-up: %s" % str(e)[:1500]
        log("  warm-up FAILED: %s" % cell["error"][:400])
        return
    for i in range(args.net_runs):
        for d in DIRECTIONS:
            rec = {"run": i, "ok": False}
            cell["runs"][d].append(rec)
            if not client.alive():
                rec["error"] = "the client's VM had exited: %s" % client.vm.tails()
                return
            try:
                rec.update(parse_iperf_run(client.run(d, args.net_seconds, timeout)))
                rec["ok"] = True
            except (RuntimeError, ValueError, subprocess.TimeoutExpired, OSError) as e:
                rec["error"] = str(e)[:2000]
                log("    run %d %s FAILED: %s" % (i + 1, d, rec["error"][:300]))
                if isinstance(e, RuntimeError) and "did not" in str(e):
                    cell["client_stuck"] = True
                    return
                continue
            log("    run %d %-7s %7.1f Mbit/s, %s retransmits, %s interrupts" % (
                i + 1, d, rec["mbit_s"], rec["retransmits"], rec["interrupts"]))


def summarize_net_cell(args, cell):
    cell["summary"] = {d: iperf3.summarize(cell["runs"][d]) for d in DIRECTIONS}
    errors = [r["error"] for d in DIRECTIONS for r in cell["runs"][d] if not r["ok"]]
    n = min(len([r for r in cell["runs"][d] if r["ok"]]) for d in DIRECTIONS)
    if n < args.net_runs and not errors and not cell.get("error"):
        errors.append("%d of %d runs" % (n, args.net_runs))
    if errors and not cell.get("error"):
        cell["error"] = "; ".join(errors)[:2000]
    cell["ok"] = not cell.get("error")


def run_network(args, work):
    """The network half's cells; the same load VM and loads as the disk
    half."""
    cells = []
    for path in args.net_paths:
        client = loadvm = None
        for load in args.net_loads:
            cell = {"path": path, "load": load, "runs": {d: [] for d in DIRECTIONS},
                    "ok": False}
            cells.append(cell)
            log("net: %s, %s:" % (NET_PATH_TITLE[path], LOAD_TITLE[load]))
            ld = None
            try:
                if load in VM_LOADS and loadvm is None:
                    loadvm = LoadVm(args, work)
                    cell["load_vm_boot_s"] = round(loadvm.boot_s, 1)
                ld = Load(args, load, loadvm if load in VM_LOADS else None)
                ld.start()
                if client is None or not client.alive():
                    if client is not None:
                        cell["note"] = "the measured VM had exited: booted again"
                        client.close()
                    client = NetClient(args, path, work)
                    cell["boot_s"] = round(client.boot_s, 2)
                    cell["iface"] = client.iface
                    cell["driver"] = getattr(client, "guest_driver", "e1000e (L1)")
                if path in ("passthrough", "virtio"):
                    try:
                        cell["isolation"] = client.isolation()
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        cell["isolation"] = {"error": str(e)}
                measure_net(args, client, cell)
                if client.alive() and not cell.get("client_stuck"):
                    try:
                        cell["driver_messages"] = client.driver_messages()
                    except (RuntimeError, subprocess.SubprocessError) as e:
                        cell["driver_messages"] = "unreadable: %s" % e
                # L1's side of a passed-through NIC: IOMMU (DMAR) faults, VFIO.
                cell["l1_messages"] = subprocess.run(
                    ["sh", "-c", "dmesg | grep -iE 'dmar|vfio|iommu|e1000e' | tail -20"],
                    capture_output=True, text=True, timeout=60).stdout
                if cell.get("client_stuck"):
                    client.close()
                    client = None
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                cell["error"] = "%s" % e
                log("  FAILED: %s" % str(e)[:600])
            finally:
                if ld:
                    errs = ld.stop()
                    cell["load_info"] = ld.info
                    if errs:
                        cell["error"] = "; ".join(filter(None, [cell.get("error")]
                                                     + ["load: " + x for x in errs]))
            summarize_net_cell(args, cell)
            s = cell["summary"]
            log("  send %s Mbit/s, receive %s Mbit/s (means)%s" % (
                fmt(s["send"]["mbit_s"] and s["send"]["mbit_s"]["mean"], "%.1f"),
                fmt(s["receive"]["mbit_s"] and s["receive"]["mbit_s"]["mean"], "%.1f"),
                "" if cell["ok"] else "  (FAILED: %s)" % cell["error"][:300]))
        for what in (client, loadvm):
            if what is None:
                continue
            try:
                what.close()
            except (RuntimeError, OSError) as e:
                cells[-1]["error"] = "; ".join(filter(None, [cells[-1].get("error"),
                                                             "closing: %s" % e]))
                cells[-1]["ok"] = False
                log("  FAILED closing: %s" % e)
    return cells


def net_get(cells, path, load, direction, key="mbit_s"):
    for c in cells:
        if c["path"] == path and c["load"] == load:
            return c["summary"][direction].get(key)
    return None


def net_rows(cells, direction):
    rows = [["path", "load", "runs", "mean Mbit/s", "min", "max", "max-min", "p50", "p99",
             "per-second CV", "retransmits/run", "interrupts/run", "stalled runs", "ok"]]
    for c in cells:
        s = c["summary"][direction]
        m = s["mbit_s"]
        rows.append([c["path"], c["load"], "%d" % (m["n"] if m else 0),
                     fmt(m and m["mean"], "%.1f"), fmt(m and m["min"], "%.1f"),
                     fmt(m and m["max"], "%.1f"), fmt(m and m["range"], "%.1f"),
                     fmt(m and m["p50"], "%.1f"), fmt(m and m["p99"], "%.1f"),
                     fmt(s["interval_cv"], "%.2f"),
                     fmt(s["retransmits"] and s["retransmits"]["mean"], "%.1f"),
                     fmt(s["interrupts"] and s["interrupts"]["mean"], "%.0f"),
                     "%d" % s.get("stalled_runs", 0), "yes" if c["ok"] else "**no**"])
    return rows


def net_paper_rows(net):
    """Our network figures beside what seed 004's text says of figure 12
    and its table 4."""
    cells, p = net["cells"], PAPER_NET

    def mean(path, load, d):
        m = net_get(cells, path, load, d)
        return m["mean"] if m else None

    def ratio(d, load):
        a, b = mean("passthrough", load, d), mean("virtio", load, d)
        q = mean("qemu", load, d)
        return ("passthrough %s, virtio %s Mbit/s (%s); QEMU %s" % (
            fmt(a, "%.1f"), fmt(b, "%.1f"),
            "passthrough/virtio %.2f" % (a / b) if a and b else "-", fmt(q, "%.1f")))

    def drop(path, d, load="io"):
        a, b = mean(path, "none", d), mean(path, load, d)
        return fmt(b - a if a is not None and b is not None else None, "%+.1f Mbit/s")

    rows = [["figure", "paper (Xen, netperf, GbE, %d runs)" % p["runs"],
             "ours (iperf3 %d s x %d, rig)" % (net["parameters"]["net_seconds"],
                                               net["parameters"]["net_runs"])]]
    rows.append(["no load: send", p["no_load"], ratio("send", "none")])
    rows.append(["no load: receive", p["no_load"], ratio("receive", "none")])
    rows.append(["I/O load: receive", p["io_load_receive"], ratio("receive", "io")])
    for path, name in (("passthrough", "passthrough"), ("virtio", "vif / virtio")):
        rows.append(["I/O load - no load, send: %s" % name,
                     "about -%d Mbit/s" % p["io_load_send_drop_mbit_s"][path],
                     drop(path, "send")])
    rows.append(["I/O load - no load, send: QEMU passthrough", "-", drop("qemu", "send")])
    for path, name in (("passthrough", "passthrough"), ("virtio", "vif / virtio")):
        for d in DIRECTIONS:
            i = net_get(cells, path, "none", d, "interrupts")
            rows.append(["%s: interrupts per run, %s (table 4)" % (name, d),
                         "%.0f per 10 s" % p["interrupts_per_run"][path][d],
                         "%s per %d s" % (fmt(i and i["mean"], "%.0f"),
                                          net["parameters"]["net_seconds"])])
    return rows


def draw_net(path, net):
    """The paper's figure 12 for these runs: mean throughput per path and
    load, sending and receiving, the runs' min-max as error bars."""
    fig, axes = panels(1, 2, (13, 5))
    if fig is None:
        return False
    cells, prm = net["cells"], net["parameters"]
    colors = {"virtio": "tab:red", "passthrough": "tab:blue", "native": "tab:gray",
              "qemu": "tab:green"}
    paths = [p for p in NET_PATHS if p in prm["net_paths"]]
    loads = prm["net_loads"]
    width = 0.8 / max(1, len(paths))
    for ax, d in zip(axes, DIRECTIONS):
        for j, p in enumerate(paths):
            xs, ys, lo, hi = [], [], [], []
            for i, ld in enumerate(loads):
                m = net_get(cells, p, ld, d)
                xs.append(i + (j - (len(paths) - 1) / 2) * width)
                ys.append(m["mean"] if m else float("nan"))
                lo.append(m["mean"] - m["min"] if m else 0)
                hi.append(m["max"] - m["mean"] if m else 0)
            ax.bar(xs, ys, width * 0.95, color=colors[p], label=NET_PATH_TITLE[p],
                   yerr=[lo, hi], capsize=3)
        ax.set_title("%s (the measured VM %s L0's iperf3 server)" % (
            d, "to" if d == "send" else "from"), fontsize=10)
        ax.set_ylabel("Mbit/s (mean of the runs; bars: min-max)")
        ax.set_xticks(range(len(loads)))
        ax.set_xticklabels(loads)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("iperf3 TCP, %d s x %d runs per cell, in the rig (L1: 1 CPU)  [paper fig. 12]"
                 % (prm["net_seconds"], prm["net_runs"]), fontsize=11)
    save_figure(fig, path, 110)
    return True


def net_markdown(net):
    env, prm, cells = net["environment"], net["parameters"], net["cells"]
    L = ["# Network: the e1000e passed through vs virtio-net (seed 004, figure 12)", ""]
    L.append("`%s`, %s (%.0f s, %.1f min). Seed 004 section 3.3: TCP throughput of the "
             "measured VM sending and receiving, the NIC passed through against the virtual "
             "driver, without and with load. Paper: %s." % (
                 net["command"], env["date_utc"], net["total_s"], net["total_s"] / 60,
                 PAPER_NET["setup"]))
    L.append("")
    L.append("Here: iperf3 (TCP, one stream, `-t %d`), %d runs per cell and direction (the "
             "paper: netperf's 10 s, 5 runs; `--full` gives 10 s x 5), after a 1 s warm-up "
             "run that is not counted; the default is scaled to the rig. Loads: %s, from "
             "the disk half's set (the paper's network load was the I/O load only). L1 "
             "has one CPU: the measured VM, the load VM, stress and the UDP sender share "
             "it, where the paper gave each domain a core." % (
                 prm["net_seconds"], prm["net_runs"], ", ".join(prm["net_loads"])))
    L.append("")
    L.append("**Topology.** Every path ends at the same iperf3 server: `iperf3 -s` in L0 "
             "(the machine the rig runs on), on 127.0.0.1 port %d, which L1's QEMU user "
             "network (slirp) reaches as 10.0.2.2. Every path also leaves through the same "
             "emulated e1000e of the iommu profile and the same slirp, so that only the "
             "way from the measured iperf3 client to that NIC differs: the guest's own "
             "e1000e driver on the NIC passed through (hakoniwa, or QEMU's vfio-pci); the "
             "guest's virtio-net through hakoniwa, a TAP and a bridge in L1 to the NIC "
             "driven by L1's e1000e driver (Xen's vif and Domain-0's bridge); and L1's "
             "own driver (native). The client has %s." % (prm["iperf3_port"], NET_IP))
    L.append("")
    L.append("Send is the measured client sending (`iperf3 -c`), receive the server "
             "sending to it (`-R`); the throughput is what the receiver counted, the "
             "retransmits the sender's (iperf3 reports them on Linux), the per-second CV "
             "the coefficient of variation of the one-second samples over all runs of a "
             "cell (TCP has no jitter of its own in iperf3; this is the within-run "
             "jitter), interrupts the client's NIC vectors in /proc/interrupts per run, "
             "stalled runs those with a whole second in which not one byte arrived.")
    L.append("")
    L.append("**This machine was shared**: other helpers built and ran rigs on L0's two "
             "CPUs during the run (L0's load average before: %s; after: %s). L0's slirp "
             "and the iperf3 server run on those CPUs." % (
                 env.get("l0_loadavg_before") or "-", env.get("l0_loadavg_after") or "-"))
    L.append("")
    failed = [c for c in cells if not c["ok"]]
    if failed:
        L.append("**%d cell(s) failed** (below, and in passthrough.json):" % len(failed))
        L.append("")
        for c in failed:
            L.append("- %s / %s: %s" % (c["path"], c["load"], c["error"][:600]))
        L.append("")
    L.append("## The paper's figure 12 beside ours")
    L.append("")
    L.append(md_table(net_paper_rows(net)))
    L.append("")
    L.append("Figure 12's bars carry no numbers in the paper's text; what it says of them "
             "is quoted. ![figure 12 for this run](passthrough-net.png)")
    L.append("")
    for d in DIRECTIONS:
        L.append("## %s, Mbit/s" % d.capitalize())
        L.append("")
        L.append(md_table(net_rows(cells, d)))
        L.append("")
    L.append("## Paths and loads")
    L.append("")
    for p in prm["net_paths"]:
        L.append("- **%s**: %s" % (p, NET_PATH_TITLE[p]))
    for ld in prm["net_loads"]:
        L.append("- load **%s**: %s" % (ld, LOAD_TITLE[ld]))
    L.append("")
    L.append("```")
    L.append(iperf_snippet(iperf3.client_argv(SERVER, "PORT", prm["net_seconds"], False),
                           "VECTORS", "/tmp").replace("; ", "\n"))
    L.append("```")
    L.append("")
    L.append("## Network command lines")
    L.append("")
    L += md_command_lines(net["argv"])
    L.append("")
    L.append("## Network environment")
    L.append("")
    L += md_environment(env)
    L.append("")
    L.append("## Network: all runs")
    L.append("")
    rows = [["path", "load", "boot s", "send Mbit/s (retransmits)",
             "receive Mbit/s (retransmits)", "error"]]
    for c in cells:
        rows.append([c["path"], c["load"], fmt(c.get("boot_s"), "%.1f")] + [
            " ".join("%.1f (%s)" % (r["mbit_s"], r["retransmits"]) if r["ok"] else
                     "**failed**" for r in c["runs"][d]) or "-" for d in DIRECTIONS] + [
            (c.get("error") or "")[:300].replace("|", "/").replace("\n", " ")])
    L.append(md_table(rows))
    L.append("")
    return L


# ---------------------------------------------------------------- main ----


def l0_loadavg(path):
    """The newest line of the L0 load-average log scripts/bench-passthrough
    keeps (the project share is L0's tree), or None."""
    try:
        with open(path) as f:
            lines = [x.strip() for x in f if x.strip()]
        return lines[-1] if lines else None
    except (OSError, TypeError):
        return None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--half", choices=("both", "disk", "net"), default="both",
                   help="which half to measure (default both); the other half's results "
                        "are kept from the existing passthrough.json and written again")
    p.add_argument("--runs", type=int, default=None, help="runs per cell (default 10; "
                   "--full: 50)")
    p.add_argument("--mib", type=int, default=None, help="MiB per read, a multiple of 1/8 "
                   "(128 KiB blocks; default 64; --full: 1000, dd count=8000)")
    p.add_argument("--full", action="store_true",
                   help="the paper's sizes: 1000 MiB (count=8000) x 50 runs; iperf3 10 s x 5")
    p.add_argument("--paths", nargs="+", default=PATHS, choices=PATHS, metavar="PATH",
                   help="readers (default: %s)" % " ".join(PATHS))
    p.add_argument("--loads", nargs="+", default=LOADS, choices=LOADS, metavar="LOAD",
                   help="loads (default: %s)" % " ".join(LOADS))
    p.add_argument("--net-runs", type=int, default=None,
                   help="iperf3 runs per network cell and direction (default 3; --full: 5)")
    p.add_argument("--net-seconds", type=int, default=None,
                   help="seconds per iperf3 run (default 5; --full: 10)")
    p.add_argument("--net-paths", nargs="+", default=NET_PATHS, choices=NET_PATHS,
                   metavar="PATH", help="network paths (default: %s)" % " ".join(NET_PATHS))
    p.add_argument("--net-loads", nargs="+", default=NET_LOADS, choices=LOADS, metavar="LOAD",
                   help="network loads (default: %s)" % " ".join(NET_LOADS))
    p.add_argument("--iperf3-port", type=int, default=None,
                   help="port of the iperf3 server on L0's 127.0.0.1 (scripts/"
                        "bench-passthrough starts it)")
    p.add_argument("--l0-loadavg", default=None,
                   help="a file L0 appends its /proc/loadavg to (scripts/bench-passthrough)")
    p.add_argument("--memory-mib", type=int, default=512, help="measured VM's RAM (512)")
    p.add_argument("--load-memory-mib", type=int, default=256, help="load VM's RAM (256)")
    p.add_argument("--udp-size", type=int, default=1472,
                   help="UDP payload bytes of the I/O load (default 1472: one 1500-byte "
                        "frame)")
    p.add_argument("--settle", type=float, default=2,
                   help="seconds a load runs before a cell's first run (default 2)")
    p.add_argument("--boot-timeout", type=float, default=240)
    p.add_argument("--read-timeout", type=float, default=None,
                   help="seconds one read may take (default 120 + 1 s per MiB)")
    p.add_argument("--nvme-pci", default=os.environ.get("HK_RIG_NVME_PCI"),
                   help="the NVMe bound to vfio-pci (default $HK_RIG_NVME_PCI)")
    p.add_argument("--nvme-image", default=os.environ.get("HK_RIG_NVME_IMAGE"),
                   help="its backing file, where the data is written "
                        "(default $HK_RIG_NVME_IMAGE)")
    p.add_argument("--e1000e-pci", default=os.environ.get("HK_RIG_E1000E_PCI"),
                   help="the e1000e bound to vfio-pci (default $HK_RIG_E1000E_PCI)")
    p.add_argument("--native-modules", default=os.environ.get("HK_RIG_NATIVE_MODULES"),
                   help="L1's nvme and e1000e modules to insmod (default "
                        "$HK_RIG_NATIVE_MODULES; none: modprobe)")
    p.add_argument("--iperf3", default="/usr/bin/iperf3",
                   help="the iperf3 put into the guests and run in L1 (default /usr/bin/iperf3)")
    add_path_options(p, "kernel", "initramfs", "hakoniwa", "qemu")
    p.add_argument("--workdir", default="/tmp", help="for the image (default /tmp)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"),
                   help="directory for passthrough.json, .md and .png")
    args = p.parse_args()
    args.runs = args.runs or (50 if args.full else 10)
    args.mib = args.mib or (1000 if args.full else 64)
    args.count = args.mib * MIB // BS
    args.paths = [x for x in PATHS if x in args.paths]
    args.loads = [x for x in LOADS if x in args.loads]
    args.net_runs = args.net_runs or (5 if args.full else 3)
    args.net_seconds = args.net_seconds or (10 if args.full else 5)
    args.net_paths = [x for x in NET_PATHS if x in args.net_paths]
    args.net_loads = [x for x in LOADS if x in args.net_loads]
    args.read_timeout = args.read_timeout or 120 + args.mib
    args.disk = args.half in ("both", "disk")
    args.net = args.half in ("both", "net")
    return args


def check_args(args, prog):
    """Exits with one line where the run cannot work."""
    if args.runs < 1 or args.mib < 1 or args.net_runs < 1 or args.net_seconds < 1:
        sys.exit("%s: --runs, --mib, --net-runs and --net-seconds must be positive" % prog)
    if os.geteuid() != 0:
        sys.exit("%s: needs root (vfio, TAP devices, drop_caches)" % prog)
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        sys.exit("%s: /dev/kvm is not usable here" % prog)
    for path in (args.kernel, args.initramfs):
        if not os.path.isfile(path):
            sys.exit("%s: %s is missing (scripts/build-guest builds it)" % (prog, path))
    if not os.access(args.hakoniwa, os.X_OK):
        sys.exit("%s: %s is missing (cargo build --release)" % (prog, args.hakoniwa))
    qemu = (args.disk and "qemu" in args.paths) or (args.net and "qemu" in args.net_paths)
    if qemu and not shutil.which(args.qemu):
        sys.exit("%s: %s not found (apt-get install qemu-system-x86)" % (prog, args.qemu))
    loads = (args.loads if args.disk else []) + (args.net_loads if args.net else [])
    if any(x in loads for x in ("cpu-l1", "cpu-both")) and not shutil.which("stress"):
        sys.exit("%s: stress not found (apt-get install stress, on the host for the rig)"
                 % prog)
    nvme_paths = {"passthrough", "native", "qemu"} & set(args.paths) if args.disk else set()
    if nvme_paths:
        if not args.nvme_pci or not args.nvme_image:
            sys.exit("%s: no NVMe bound to vfio-pci (HK_RIG_NVME_PCI, HK_RIG_NVME_IMAGE): run "
                     "in the rig's IOMMU profile (scripts/bench-passthrough does)" % prog)
        drv = os.path.join("/sys/bus/pci/devices", args.nvme_pci, "driver")
        if not os.path.islink(drv) or os.path.basename(os.readlink(drv)) != "vfio-pci":
            sys.exit("%s: %s is not bound to vfio-pci" % (prog, args.nvme_pci))
        size = os.path.getsize(args.nvme_image)
        if size < args.mib * MIB:
            sys.exit("%s: the NVMe holds %d MiB, fewer than --mib %d (HK_RIG_NVME_MB)"
                     % (prog, size // MIB, args.mib))
    if args.net:
        if not args.e1000e_pci:
            sys.exit("%s: no e1000e bound to vfio-pci (HK_RIG_E1000E_PCI): run in the rig's "
                     "IOMMU profile (scripts/bench-passthrough does)" % prog)
        drv = os.path.join("/sys/bus/pci/devices", args.e1000e_pci, "driver")
        if not os.path.islink(drv) or os.path.basename(os.readlink(drv)) != "vfio-pci":
            sys.exit("%s: %s is not bound to vfio-pci" % (prog, args.e1000e_pci))
        if not args.iperf3_port:
            sys.exit("%s: no --iperf3-port: the iperf3 server runs in L0, started by "
                     "scripts/bench-passthrough" % prog)
        if not os.access(args.iperf3, os.X_OK):
            sys.exit("%s: %s is missing (apt-get install iperf3, on the host for the rig)"
                     % (prog, args.iperf3))
    return nvme_paths


def run_disk(args, work, nvme_paths):
    """The disk half: its result dict (the top level of passthrough.json)."""
    t_start = time.monotonic()
    cells = []
    native_iommu_domain = None
    # The data: the same random bytes in the image and on the NVMe.
    t = time.monotonic()
    data = os.urandom(args.mib * MIB)
    args.data_md5 = hashlib.md5(data).hexdigest()
    args.image = os.path.join(work, "disk.img")
    with open(args.image, "wb") as f:
        f.write(data)
    if nvme_paths:
        with open(args.nvme_image, "r+b") as f:
            f.write(data)
    del data
    os.sync()
    data_s = time.monotonic() - t

    env = vmm_environment(
        RIG_NOTE, "times", args.hakoniwa, args.qemu if "qemu" in args.paths else None,
        args.kernel, args.initramfs, CMDLINE, vcpus=1, memory_mib=args.memory_mib,
        relative_to=ROOT,
        machine={"memory_mib_l1": machine_memory_mib(),
                 "l1_cmdline": read("/proc/cmdline")},
        tools={"stress_version": first_line(["stress", "--version"])},
        run={"git": dict(zip(("commit", "uncommitted"), git_state(ROOT, 20))),
             "rig_settings": {k: v for k, v in sorted(os.environ.items())
                              if k.startswith("HK_RIG_")},
             "nvme": {"pci": args.nvme_pci, "image": args.nvme_image,
                      "vendor_device": "%s:%s" % (
                          read("/sys/bus/pci/devices/%s/vendor" % args.nvme_pci),
                          read("/sys/bus/pci/devices/%s/device" % args.nvme_pci))
                      if args.nvme_pci else None},
             "hakoniwa_binary": os.path.realpath(args.hakoniwa),
             "data_write_s": round(data_s, 1),
             "l0_loadavg_before": l0_loadavg(args.l0_loadavg)})
    log("passthrough benchmark: %s" % env["note"])
    log("%d MiB per read (dd bs=128K count=%d iflag=direct), %d runs per cell; paths %s; "
        "loads %s" % (args.mib, args.count, args.runs, " ".join(args.paths),
                      " ".join(args.loads)))

    for path in args.paths:
        reader = loadvm = None
        for load in args.loads:
            cell = {"path": path, "load": load, "runs": [], "runs_wanted": args.runs,
                    "ok": False}
            cells.append(cell)
            log("%s, %s:" % (PATH_TITLE[path], LOAD_TITLE[load]))
            ld = None
            try:
                if load in VM_LOADS and loadvm is None:
                    loadvm = LoadVm(args, work)
                    cell["load_vm_boot_s"] = round(loadvm.boot_s, 1)
                ld = Load(args, load, loadvm if load in VM_LOADS else None)
                ld.start()
                if reader is None or not reader.alive():
                    if reader is not None:
                        cell["note"] = "the measured VM had exited: booted again"
                        reader.close()
                    reader = (NativeReader(args, work) if path == "native"
                              else VmReader(args, path, work))
                    cell["boot_s"] = round(reader.boot_s, 2)
                    if path == "native":
                        native_iommu_domain = reader.iommu_domain
                if path in ("virtio", "passthrough"):
                    try:
                        cell["isolation"] = reader.isolation()
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        cell["isolation"] = {"error": str(e)}
                measure(args, reader, cell)
                if cell.get("reader_stuck"):
                    reader.close()
                    reader = None
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                cell["error"] = "%s" % e
                log("  FAILED: %s" % str(e)[:600])
            finally:
                if ld:
                    errs = ld.stop()
                    cell["load_info"] = ld.info
                    if errs:
                        cell["error"] = "; ".join(filter(None, [cell.get("error")]
                                                     + ["load: " + x for x in errs]))
            summarize_cell(cell)
            s = cell["seconds"]
            if s:
                log("  mean %.3f s, max-min %.0f ms, p99 %.3f s, %.0f interrupts/run%s" % (
                    s["mean"], s["range"] * 1e3, s["p99"], cell["interrupts"]["mean"],
                    "" if cell["ok"] else "  (FAILED: %s)" % cell["error"][:300]))
        for what in (reader, loadvm):
            if what is None:
                continue
            try:
                what.close()
            except (RuntimeError, OSError) as e:
                cells[-1]["error"] = "; ".join(filter(None, [cells[-1].get("error"),
                                                             "closing: %s" % e]))
                cells[-1]["ok"] = False
                log("  FAILED closing: %s" % e)
    env["l0_loadavg_after"] = l0_loadavg(args.l0_loadavg)

    native_none = next((c["seconds"]["mean"] for c in cells if c["path"] == "native"
                        and c["load"] == "none" and c.get("seconds")), None)
    per_interrupt = {ld: overheads(cells, ld) for ld in args.loads}
    argv_shown = {}
    for path in args.paths:
        if path != "native":
            argv_shown[path] = shown_argv(vm_argv(args, path, os.path.join(work, "SOCK")), work)
    if set(VM_LOADS) & set(args.loads):
        argv_shown["load VM"] = shown_argv(load_argv(args, "TAP"), work)
    return {
        "benchmark": "passthrough",
        "command": command_line(),
        "environment": env,
        "paper": PAPER,
        "parameters": {k: getattr(args, k) for k in (
            "runs", "mib", "count", "full", "paths", "loads", "memory_mib", "load_memory_mib",
            "udp_size", "settle", "boot_timeout", "read_timeout")},
        "block_size": BS,
        "data_md5": args.data_md5,
        "native_iommu_domain": native_iommu_domain,
        "argv": argv_shown,
        "guest_read": read_snippet("dd", "DISK", args.count, "VECTORS", "/tmp"),
        "native_mean_none_s": native_none,
        "per_interrupt": per_interrupt,
        "total_s": round(time.monotonic() - t_start, 1),
        "cells": cells,
    }


def run_net(args, work):
    """The network half: the "network" section of passthrough.json."""
    t_start = time.monotonic()
    args.net_initramfs = os.path.join(work, "initramfs-iperf3.cpio.gz")
    added = with_program(args.work_initramfs, args.iperf3, args.net_initramfs)
    env = vmm_environment(
        RIG_NOTE, "throughputs", args.hakoniwa,
        args.qemu if "qemu" in args.net_paths else None, args.kernel, args.initramfs,
        CMDLINE, vcpus=1, memory_mib=args.memory_mib, relative_to=ROOT,
        machine={"memory_mib_l1": machine_memory_mib(), "l1_cmdline": read("/proc/cmdline")},
        tools={"stress_version": first_line(["stress", "--version"]),
               "iperf3_version": first_line([args.iperf3, "--version"])},
        run={"git": dict(zip(("commit", "uncommitted"), git_state(ROOT, 20))),
             "rig_settings": {k: v for k, v in sorted(os.environ.items())
                              if k.startswith("HK_RIG_")},
             "e1000e": {"pci": args.e1000e_pci, "vendor_device": "%s:%s" % (
                 read("/sys/bus/pci/devices/%s/vendor" % args.e1000e_pci),
                 read("/sys/bus/pci/devices/%s/device" % args.e1000e_pci))},
             "guest_initramfs_added": "the host's %s and its libraries appended (%d files, "
                                      "%d KiB)" % (args.iperf3, len(added),
                                                   sum(added.values()) >> 10),
             "iperf3_server": "L0 127.0.0.1:%d (10.0.2.2 through slirp)" % args.iperf3_port,
             "hakoniwa_binary": os.path.realpath(args.hakoniwa),
             "l0_loadavg_before": l0_loadavg(args.l0_loadavg)})
    log("network: iperf3 %d s x %d runs per cell and direction; paths %s; loads %s" % (
        args.net_seconds, args.net_runs, " ".join(args.net_paths), " ".join(args.net_loads)))
    cells = run_network(args, work)
    env["l0_loadavg_after"] = l0_loadavg(args.l0_loadavg)
    argv_shown = {p: shown_argv(net_vm_argv(args, p, os.path.join(work, "SOCK")), work)
                  for p in args.net_paths if p != "native"}
    return {
        "command": command_line(),
        "environment": env,
        "paper": PAPER_NET,
        "parameters": {k: getattr(args, k) for k in (
            "net_runs", "net_seconds", "full", "net_paths", "net_loads", "memory_mib",
            "load_memory_mib", "udp_size", "settle", "boot_timeout", "iperf3_port")},
        "argv": argv_shown,
        "client_run": iperf_snippet(iperf3.client_argv(SERVER, "PORT", args.net_seconds,
                                                       False), "VECTORS", "/tmp"),
        "total_s": round(time.monotonic() - t_start, 1),
        "cells": cells,
    }


def command_line():
    """The command as the user gave it: without the two options
    scripts/bench-passthrough adds (--iperf3-port, --l0-loadavg)."""
    argv, shown = sys.argv[1:], []
    while argv:
        a = argv.pop(0)
        if a in ("--iperf3-port", "--l0-loadavg"):
            argv = argv[1:]
        elif not a.startswith(("--iperf3-port=", "--l0-loadavg=")):
            shown.append(a)
    return "scripts/bench-passthrough" + "".join(" " + a for a in shown)


def shown_argv(argv, work):
    return [("'%s'" % x) if " " in x else x for x in
            (os.path.relpath(x, ROOT) if x.startswith(ROOT + os.sep) else
             x.replace(work, "$WORK") for x in argv)]


def previous_results(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_results(args, result, measured):
    """Writes passthrough.json, .md and the figures of the halves in
    MEASURED ("disk", "net"): the disk half at the top level of RESULT,
    the network half under "network", each measured now or kept from the
    earlier file. Returns the number of failed cells measured now."""
    os.makedirs(args.out, exist_ok=True)
    failed = 0
    md = []
    if result.get("cells"):
        dargs = argparse.Namespace(**result["parameters"], data_md5=result["data_md5"])
        cells, native_none = result["cells"], result["native_mean_none_s"]
        table3 = result["per_interrupt"].get("none", {})
        if "disk" in measured:
            result["figure"] = draw(os.path.join(args.out, "passthrough.png"), dargs, cells,
                                    native_none)
            failed += sum(1 for c in cells if not c["ok"])
            log("")
            log("Context: %s." % result["environment"]["note"])
            log(text_table(cell_rows(dargs, cells, native_none)))
            log("")
            log("Beside the paper:")
            log(text_table(paper_rows(dargs, cells, native_none, table3)))
        md += disk_markdown(result, dargs, cells, native_none, table3)
    net = result.get("network")
    if net:
        if "net" in measured:
            net["figure"] = draw_net(os.path.join(args.out, "passthrough-net.png"), net)
            failed += sum(1 for c in net["cells"] if not c["ok"])
            for d in DIRECTIONS:
                log("")
                log("Network, %s:" % d)
                log(text_table(net_rows(net["cells"], d)))
            log("")
            log(text_table(net_paper_rows(net)))
        md += [""] + net_markdown(net)
    with open(os.path.join(args.out, "passthrough.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    write(os.path.join(args.out, "passthrough.md"), "\n".join(md))
    log("")
    log("wrote %s/passthrough.json and .md (measured now: %s)" % (
        os.path.relpath(args.out, ROOT), " and ".join(measured)))
    return failed


def main():
    args = parse_args()
    prog = "passthrough.py"
    nvme_paths = check_args(args, prog)
    json_path = os.path.join(args.out, "passthrough.json")
    result = previous_results(json_path) or {}
    if args.half != "both" and not result:
        log("no earlier %s: the other half stays empty" % json_path)
    files = extract_from_cpio(args.initramfs, {"bin/busybox", "etc/hk-modules-nvme"})
    if args.disk and "etc/hk-modules-nvme" not in files and nvme_paths - {"native"}:
        sys.exit("%s: the guest has no nvme driver (etc/hk-modules-nvme): rebuild it "
                 "(scripts/build-guest)" % prog)
    if "bin/busybox" not in files:
        sys.exit("%s: no bin/busybox in %s" % (prog, args.initramfs))

    work = tempfile.mkdtemp(prefix="hk-bench-passthrough.", dir=args.workdir)
    subprocess.run(["ip", "link", "set", "lo", "up"], stderr=subprocess.DEVNULL)
    failed, measured = 0, []
    try:
        args.work_kernel = shutil.copy(args.kernel, os.path.join(work, "vmlinuz"))
        args.work_initramfs = shutil.copy(args.initramfs, os.path.join(work,
                                                                       "initramfs.cpio.gz"))
        args.busybox = os.path.join(work, "busybox")
        with open(args.busybox, "wb") as f:
            f.write(files["bin/busybox"])
        os.chmod(args.busybox, 0o755)
        # The network half first, and the results written after each half:
        # a run stopped during the long disk half still leaves the network
        # half's results beside the earlier disk half's.
        if args.net:
            result["network"] = run_net(args, work)
            measured.append("net")
            failed += write_results(args, result, measured)
        if args.disk:
            network = result.get("network")
            result = run_disk(args, work, nvme_paths)
            if network:
                result["network"] = network
            measured.append("disk")
            failed = write_results(args, result, measured)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return exit_status(prog, failed, "cell(s)", "passthrough.json")


if __name__ == "__main__":
    sys.exit(main())
