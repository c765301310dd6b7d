#!/usr/bin/env python3
"""Why the balloon-shrunk guest stalled in bench-iocache's advisor part
(iocache-balloon-stall.md): one guest, the phases named on the command
line, in the rig:

  HK_RIG_MEM=2560 scripts/rig -- build/pyenv/bin/python \\
      bench/results/evidence/iocache-balloon-stall.py advised booted nosettle

advised   the bench's advisor part: 512 MiB, swap on, settle, a buffered
          cell traced, `ctl advise --apply`, swapoff, settle, the direct cell
booted    a guest booted at 128 MiB: settle, the direct cell
nosettle  512 MiB shrunk by 384 MiB of balloon at once: the direct cell
balloonsettle  512 MiB shrunk first, then settle and the direct cell
equiv     512 MiB: MemTotal with 377, 384 and 0 MiB of balloon

Every 5 s during a cell the guest prints a MON line of /proc/meminfo,
/proc/vmstat and /proc/pressure/memory on its console, and the host a HOST
line of the balloon (vm.balloon) and the VMM's threads (state, wchan)."""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import iocache as io  # noqa: E402
from lib.hakoniwa import api_get  # noqa: E402

T0 = time.monotonic()

MON = r"""#!/bin/sh
# mon.sh TAG: one line of the guest's memory every 5 s on the console
while :; do
  o=$(awk -v tag="$1" '
  FILENAME=="/proc/uptime" {o="MON " tag " up=" int($1)}
  FILENAME=="/proc/meminfo" && $1 ~ /^(MemTotal|MemFree|MemAvailable|Cached|SwapTotal|SwapFree|AnonPages|Shmem|Slab|SReclaimable|SUnreclaim|Dirty|Writeback):$/ {sub(":","",$1); o=o " " $1 "=" int($2/1024)}
  FILENAME=="/proc/vmstat" && $1 ~ /^(pgscan_direct|pgscan_kswapd|pgsteal_direct|pgsteal_kswapd|pgmajfault|workingset_refault_file|workingset_refault_anon|oom_kill|allocstall_dma32|allocstall_normal|allocstall_movable|pswpin|pswpout|compact_stall|balloon_inflate|balloon_deflate)$/ {o=o " " $1 "=" $2}
  FILENAME=="/proc/stat" && $1 ~ /^procs_(running|blocked)$/ {o=o " " $1 "=" $2}
  FILENAME=="/proc/pressure/memory" {o=o " psi_" $1 "_" $2}
  FILENAME=="/proc/sys/fs/dentry-state" {o=o " dentries=" $1}
  FILENAME=="/proc/sys/fs/inode-nr" {o=o " inodes=" $1}
  END {print o}' /proc/uptime /proc/meminfo /proc/vmstat /proc/stat /proc/pressure/memory /proc/sys/fs/dentry-state /proc/sys/fs/inode-nr 2>/dev/null)
  f=$(for p in $(pidof fio 2>/dev/null); do awk '/^(VmRSS|State):/{printf "%s%s ", $1, $2}' /proc/$p/status 2>/dev/null; done)
  echo "$o fio=[$f]"
  sleep 5
done
"""  # noqa: E501


def log(msg):
    print("[%6.0f] %s" % (time.monotonic() - T0, msg), flush=True)


def thread_states(pid):
    out = []
    base = "/proc/%d/task" % pid
    try:
        tids = sorted(os.listdir(base), key=int)
    except OSError:
        return "gone"
    for tid in tids:
        try:
            with open("%s/%s/stat" % (base, tid)) as f:
                s = f.read()
            comm = s[s.index("(") + 1:s.rindex(")")]
            rest = s[s.rindex(")") + 2:].split()
            state, cpu = rest[0], (int(rest[11]) + int(rest[12])) / 100
            with open("%s/%s/wchan" % (base, tid)) as f:
                wchan = f.read().strip() or "-"
        except (OSError, ValueError):
            continue
        out.append("%s:%s:%s:%.1f" % (comm, state, wchan, cpu))
    return " ".join(out)


class HostPoll:
    """Every 10 s: the balloon as the VMM sees it, and the VMM's threads."""

    def __init__(self, g, tag):
        self.g, self.tag, self.stop = g, tag, threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        n = 0
        while not self.stop.wait(10):
            b = api_get(self.g.sock, "vm.balloon", timeout=5)
            if b:
                st = b.get("stats", {})
                bs = ("actual=%s target=%s avail=%s free=%s caches=%s oom=%s stalls=%s dscan=%s "
                      "majflt=%s" % (
                    b.get("actual_mib"), b.get("target_mib"),
                    st.get("available_memory", 0) >> 20, st.get("free_memory", 0) >> 20,
                    st.get("disk_caches", 0) >> 20, st.get("oom_kills"), st.get("alloc_stalls"),
                    st.get("direct_scans"), st.get("major_faults")))
            else:
                bs = "balloon: no answer"
            log("HOST %s %s" % (self.tag, bs))
            if n % 3 == 0:
                log("HOST %s threads %s" % (self.tag, thread_states(self.g.vm.proc.pid)))
            n += 1

    def end(self):
        self.stop.set()
        self.t.join()


def sh_g(g, cmd, timeout):
    t = time.monotonic()
    out = g.wait(g.start(cmd), timeout)
    return out, time.monotonic() - t


def balloon_wait(g, target, timeout):
    t = time.monotonic()
    last = None
    while time.monotonic() - t < timeout:
        b = api_get(g.sock, "vm.balloon", timeout=5) or {}
        a = b.get("actual_mib")
        if a != last:
            log("  balloon actual=%s target=%s after %.0f s" % (a, b.get("target_mib"),
                                                              time.monotonic() - t))
            last = a
        if a is not None and abs(a - target) <= 4:
            return time.monotonic() - t
        time.sleep(2)
    log("  balloon did NOT reach %d MiB in %d s (actual %s)" % (target, timeout, last))
    return None


def mon_start(g, tag):
    g.vm.con.send("sh /data/mon.sh %s &\n" % tag)
    time.sleep(1)


def mon_stop(g):
    sh_g(g, "kill %1; wait", 30)


def cell(args, g, size, io_mode, tag, timeout):
    mon_start(g, tag)
    poll = HostPoll(g, tag)
    t = time.monotonic()
    ok = True
    try:
        out = g.wait(g.start(io.ffsb_command(size, io_mode, args.seconds, args.ramp)), timeout)
        r = io.ffsb_result(out)
        log("CELL %s %s: %s in %.0f s (%s)" % (
            tag, io_mode, "%.1f ops/s" % r["ops_s"] if r else "no report",
            time.monotonic() - t, "" if r else out[-300:]))
    except RuntimeError:
        ok = False
        log("CELL %s %s: did not finish in %.0f s" % (tag, io_mode, time.monotonic() - t))
        log("  console tail: %r" % g.vm.con.tail(3000)[-3000:])
    poll.end()
    if ok:
        mon_stop(g)
    return ok


def after_stall(g, tag):
    """Ctrl-C fio, then what the guest says."""
    log("after stall %s: ^C and dmesg" % tag)
    g.vm.con.send("\x03")
    time.sleep(2)
    try:
        out, dt = sh_g(g, "kill %1 2>/dev/null; dmesg | grep -iE 'oom|killed|hung|blocked|balloon' "
                       "| tail -20; grep -E 'Mem|Swap|Cached' /proc/meminfo", 300)
        log("  after ^C (%.0f s): %s" % (dt, out))
    except RuntimeError as e:
        log("  guest did not answer after ^C: %s" % str(e)[-500:])


def boot(args, mem, disk, work, tag):
    log("BOOT %s: %d MiB" % (tag, mem))
    g = io.Guest(args, 0, mem, disk, work)
    g.wait_ready(args.boot_timeout)
    out, _ = sh_g(g, "sysctl -qw vm.overcommit_memory=1 && mkdir -p /data && "
                  "mount -o noatime /dev/vdb /data && echo pid=$$; uname -r; "
                  "grep -E 'MemTotal|MemAvail' /proc/meminfo; "
                  "dmesg | grep -iE 'Memory:|hash table entries' | head -8", 120)
    log("  %s" % out.strip().replace("\n", " | "))
    m = re.search(r"pid=(\d+)", out)
    g.shell_pid = int(m.group(1)) if m else None
    return g


def stop(g):
    try:
        g.ctl("shutdown", timeout=10)
    except (RuntimeError, subprocess.TimeoutExpired):
        pass
    g.vm.stop(grace=20)


def settle(args, g, disk, size, tag):
    t = time.monotonic()
    io.settle([g], [disk], size, args.miss_delay_ms, 1800)
    out, _ = sh_g(g, "grep -E 'MemFree|MemAvail|^Cached|SwapFree' /proc/meminfo | tr -s ' \\n' ' '", 60)
    log("  settle %s %d MiB: %.0f s; %s" % (tag, size, time.monotonic() - t, out.strip()))


def phase_advised(args, disk, work, size):
    """The bench's advisor part: 512 MiB, swap on, settle, buffered cell
    traced, advise --apply, wait, swapoff, settle, direct cell."""
    g = boot(args, args.large_mib, disk, work, "advised")
    try:
        _, dt = sh_g(g, "swapon /dev/vdc", 60)
        settle(args, g, disk, size, "start")
        tracer = io.Tracer(args, g)
        tracer.start(g)
        t = time.monotonic()
        out = g.wait(g.start(io.ffsb_command(size, "buffered", args.seconds, args.ramp)), 600)
        r = io.ffsb_result(out)
        log("CELL start buffered swap on: %s in %.0f s" % (
            "%.1f ops/s" % r["ops_s"] if r else "no report", time.monotonic() - t))
        out, _ = sh_g(g, "grep -E 'MemFree|MemAvail|^Cached|SwapFree|SwapTotal' /proc/meminfo | "
                      "tr -s ' \\n' ' '", 60)
        log("  before advise: %s" % out.strip())
        a = g.ctl("advise", "--disk", "data", "--apply", "--json")
        tracer.stop(g)
        adv = a["advice"]
        log("ADVISE mem %s io %s swap %s applied %s" % (
            adv["guest_memory_bytes"]["recommended"] >> 20, adv["guest_io"]["recommended"],
            adv["guest_swap"]["recommended"], a.get("applied")))
        target = a.get("applied", {}).get("balloon_target_mib", 0)
        mon_start(g, "inflate")
        dt = balloon_wait(g, target, args.balloon_timeout)
        mon_stop(g)
        log("  balloon reached target in %s s" % (None if dt is None else "%.0f" % dt))
        _, dt = sh_g(g, "swapoff -a", 600)
        log("  swapoff: %.0f s" % dt)
        if not args.no_second_settle:
            settle(args, g, disk, size, "advised")
        if not cell(args, g, size, "direct", "advised", args.cell_timeout):
            after_stall(g, "advised")
    finally:
        stop(g)


def phase_nosettle(args, disk, work, size):
    """Control: the same 512 MiB guest shrunk by the balloon to 128 MiB at
    once after boot, no settle, no swap: the direct cell."""
    g = boot(args, args.large_mib, disk, work, "nosettle")
    try:
        target = args.large_mib - args.small_mib
        g.ctl("balloon", "--target", "%dM" % target)
        mon_start(g, "inflate")
        balloon_wait(g, target, args.balloon_timeout)
        mon_stop(g)
        if not cell(args, g, size, "direct", "nosettle", args.cell_timeout):
            after_stall(g, "nosettle")
    finally:
        stop(g)


def phase_booted(args, disk, work, size):
    """Control: a guest booted at 128 MiB, swap off, settle, direct cell."""
    g = boot(args, args.small_mib, disk, work, "booted")
    try:
        settle(args, g, disk, size, "booted")
        if not cell(args, g, size, "direct", "booted", args.cell_timeout):
            after_stall(g, "booted")
    finally:
        stop(g)


def phase_balloonsettle(args, disk, work, size):
    """The 512 MiB guest ballooned to 128 MiB first, then swap off, settle
    and the direct cell: the settle pass under the balloon."""
    g = boot(args, args.large_mib, disk, work, "balloonsettle")
    try:
        target = args.large_mib - args.small_mib
        g.ctl("balloon", "--target", "%dM" % target)
        balloon_wait(g, target, args.balloon_timeout)
        settle(args, g, disk, size, "balloonsettle")
        if not cell(args, g, size, "direct", "balloonsettle", args.cell_timeout):
            after_stall(g, "balloonsettle")
    finally:
        stop(g)


def phase_equiv(args, disk, work, size):
    """MemTotal of the 512 MiB guest with 377 and 384 MiB of balloon."""
    g = boot(args, args.large_mib, disk, work, "equiv")
    try:
        for target in (377, 384, 0):
            g.ctl("balloon", "--target", "%dM" % target if target else "0")
            balloon_wait(g, target, args.balloon_timeout)
            time.sleep(3)
            out, _ = sh_g(g, "grep -E 'MemTotal|MemAvail' /proc/meminfo | tr -s ' \\n' ' '", 60)
            log("EQUIV balloon %d MiB: %s" % (target, out.strip()))
    finally:
        stop(g)


PHASES = {"equiv": phase_equiv, "advised": phase_advised, "nosettle": phase_nosettle, "booted": phase_booted,
          "balloonsettle": phase_balloonsettle}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hakoniwa", default=os.path.join(ROOT, "target/release/hakoniwa"))
    p.add_argument("--kernel", default=os.path.join(ROOT, "build/guest/vmlinuz"))
    p.add_argument("--debian-image", default=os.path.join(ROOT, "build/guest/debian.img"))
    p.add_argument("--debian-initramfs",
                   default=os.path.join(ROOT, "build/guest/debian-initramfs.cpio.gz"))
    p.add_argument("--small-mib", type=int, default=128)
    p.add_argument("--large-mib", type=int, default=512)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--seconds", type=int, default=15)
    p.add_argument("--ramp", type=int, default=5)
    p.add_argument("--miss-delay-ms", type=int, default=40)
    p.add_argument("--swap-mib", type=int, default=512)
    p.add_argument("--boot-timeout", type=int, default=300)
    p.add_argument("--balloon-timeout", type=int, default=240)
    p.add_argument("--cell-timeout", type=int, default=380)
    p.add_argument("--no-second-settle", action="store_true")
    p.add_argument("phases", nargs="+", choices=sorted(PHASES))
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="hk-stall.", dir="/tmp")
    disk = None
    try:
        args.kernel = shutil.copy(args.kernel, os.path.join(work, "vmlinuz"))
        args.debian_initramfs = shutil.copy(args.debian_initramfs,
                                            os.path.join(work, "debian-initramfs.cpio.gz"))
        t = time.monotonic()
        tree = io.data_tree(work, [args.size])
        with open(os.path.join(tree, "mon.sh"), "w") as f:
            f.write(MON)
        disk = io.DataDisk(work, 0, args.size * 5 // 4 + 512, args.swap_mib, tree)
        shutil.rmtree(tree)
        with open("/proc/meminfo") as f:
            l1 = f.readline().strip()
        log("data disk %d MiB: %.0f s; L1 %s" % (args.size, time.monotonic() - t, l1))
        for ph in args.phases:
            try:
                PHASES[ph](args, disk, work, args.size)
            except (RuntimeError, subprocess.CalledProcessError, OSError, KeyError) as e:
                log("PHASE %s failed: %s" % (ph, str(e)[-1500:]))
    finally:
        if disk:
            disk.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
