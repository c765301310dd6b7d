"""fio in the Debian guest (scripts/build-guest-debian): a guest script
that runs fio jobs as phases on one disk, each framed by the markers
lib.procstat samples the VMM at, and the figures read back from the
console. fio writes its JSON report to a file in the guest during the
phase and the script prints it (one line per phase, `hk-fio NAME {...}`)
after all phases, so the console's own cost stays out of every phase."""

import base64
import gzip
import json
import re

FIO_RE = re.compile(r"^hk-fio (\S+) (\{.*\})\r?$", re.M)
FLUSH_RE = re.compile(r"^hk-flush (\S+) ns=(\d+)\r?$", re.M)
DISK_RE = re.compile(r"^hk-disk (\S+) queues=(\d+)\r?$", re.M)

# Shell functions of the guest script. `phase` frames a command with the
# markers and waits half a second after each, so the host's sample lands
# before the work starts and after it ended; `job` runs fio on the disk
# with O_DIRECT (libaio, the engine most fio profiles use), without its
# progress line (which would cost console output during the phase and
# run into the end marker); `flush` times
# one virtio-blk FLUSH: dd's fsync of the block device (blkdev_fsync
# issues a cache flush even with no data written).
PRELUDE = r"""set -e
dev=
for d in /sys/block/vd*; do
  if [ "$(cat $d/size)" = "%(sectors)d" ]; then dev=/dev/${d##*/}; fi
done
if [ -z "$dev" ]; then echo "hk-bench: no disk of %(sectors)d sectors"; exit 3; fi
echo "hk-disk $dev queues=$(ls /sys/block/${dev#/dev/}/mq | wc -l)"
phase() { p=$1; shift; echo "hk-phase begin $p"; sleep 0.5; "$@"; echo "hk-phase end $p"; sleep 0.5; }
job() {
  j=$1; shift
  fio --output-format=json --output=/tmp/$j.json --eta=never --name=$j \
    --filename=$dev --direct=1 --ioengine=libaio "$@"
}
flush() {
  t0=$(date +%%s%%N)
  dd if=/dev/null of=$dev conv=fsync,notrunc status=none
  echo "hk-flush $1 ns=$(( $(date +%%s%%N) - t0 ))"
}"""


class Phase:
    """One fio job: NAME, its fio options, the direction it measures
    (read or write), and whether a FLUSH follows it inside the phase."""

    def __init__(self, name, kind, options, flush=False):
        self.name, self.kind, self.options, self.flush = name, kind, options, flush

    def shell(self):
        job = "job %s %s" % (self.name, " ".join(self.options))
        if not self.flush:
            return "phase %s %s" % (self.name, job)
        # A function, so that the flush falls inside the phase's markers.
        return "run_%s() { %s; flush %s; }\nphase %s run_%s" % (
            self.name.replace("-", "_"), job, self.name, self.name, self.name.replace("-", "_"))


def script(phases, disk_bytes, tail=()):
    """The guest script: find the disk of DISK_BYTES, run PHASES, print
    their reports, then the TAIL lines."""
    lines = [PRELUDE % {"sectors": disk_bytes // 512}]
    lines += [p.shell() for p in phases]
    lines.append('for n in %s; do echo "hk-fio $n $(tr -d \'\\n\' < /tmp/$n.json)"; done'
                 % " ".join(p.name for p in phases))
    lines += list(tail)
    return "\n".join(lines)


def packed(script_text):
    """SCRIPT_TEXT as a short command that unpacks and runs it (gzip and
    base64 are in the Debian guest): the kernel's command line holds 2047
    bytes, and hk.cmd= carries the command in base64."""
    gz = gzip.compress(script_text.encode(), compresslevel=9, mtime=0)
    return "echo %s | base64 -d | gunzip | sh" % base64.b64encode(gz).decode()


def figures(text, phases):
    """{phase name: {...}} from the console TEXT: per phase the bytes,
    seconds, IOPS, MB/s (10^6 bytes/s), mean and p99 completion latency
    (us) of its direction, and for a phase with a flush the flush's
    seconds and the MB/s including it; phases without a report are
    missing. A report that is not JSON raises ValueError."""
    reports = {m.group(1): json.loads(m.group(2)) for m in FIO_RE.finditer(text)}
    flushes = {m.group(1): int(m.group(2)) / 1e9 for m in FLUSH_RE.finditer(text)}
    out = {}
    for p in phases:
        rep = reports.get(p.name)
        if not rep or not rep.get("jobs"):
            continue
        d = rep["jobs"][0][p.kind]
        seconds = d["runtime"] / 1000.0
        pct = d.get("clat_ns", {}).get("percentile", {})
        fig = {"bytes": d["io_bytes"], "seconds": seconds, "iops": d["iops"],
               "mbps": d["bw_bytes"] / 1e6, "lat_mean_us": d["clat_ns"]["mean"] / 1000.0,
               "lat_p99_us": pct.get("99.000000", 0) / 1000.0}
        if p.flush:
            if p.name not in flushes:
                continue
            fig["flush_s"] = flushes[p.name]
            fig["mbps_with_flush"] = d["io_bytes"] / 1e6 / (seconds + flushes[p.name])
        out[p.name] = fig
    return out


def disk_seen(text):
    """(device, hardware queues) the guest found, or None."""
    m = DISK_RE.search(text)
    return (m.group(1), int(m.group(2))) if m else None
