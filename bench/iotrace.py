#!/usr/bin/env python3
"""The I/O tracer's own cost per request (seed 002's "tracer overhead"),
measured on the host without a guest, where the noise is small enough to
see it: the rig's FFSB pairs (bench/iocache.py) wander by tens of percent
between two untraced cells, far above the goal of 1 %.

Runs `cargo run --release -p devices --example iotrace_overhead`: a real
virtio-blk device (its queue thread, its default engine: io_uring) on an
image file with cache=writeback in the host page cache, driven by one
reader offering a 16 KiB read at a time at random offsets of 32 MiB and
sleeping on the device's interrupt; rounds of --reads reads alternate
tracing off and on
(`DiskTracer::start`, with the mincore probe of the host page cache on
every read). Per pair (off, then on): reads per second and the device
threads' CPU per read; the summary is the median of the pairs' ratios.

This is the device alone, with every read served by the host page cache:
the cheapest request the tracer can be added to. In a guest each request
also costs a vCPU exit, an interrupt and the guest's own block layer, so
the tracer's share there is smaller (the "1 % of a core" is per request
rate: CPU per read times reads per second).

Writes bench/results/iotrace.json, iotrace.md and iotrace.png.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import ROOT  # noqa: E402
from lib.environment import cpu_model, git_state, machine_memory_mib, utc_now  # noqa: E402
from lib.plots import panels, save_figure  # noqa: E402
from lib.tables import md_environment, md_table, text_table  # noqa: E402


def run_example(rounds, reads, image_dir):
    """The example's rounds, as dicts, in order."""
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "devices",
                    "--example", "iotrace_overhead"], cwd=ROOT, check=True)
    exe = os.path.join(ROOT, "target/release/examples/iotrace_overhead")
    out = subprocess.run([exe, str(rounds), str(reads), image_dir], capture_output=True,
                         text=True)
    if out.returncode != 0:
        sys.exit("iotrace.py: the example failed: %s" % out.stderr.strip())
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def pairs_of(rounds):
    """(off, on) pairs of consecutive rounds."""
    return [(rounds[i], rounds[i + 1]) for i in range(0, len(rounds) - 1, 2)
            if not rounds[i]["traced"] and rounds[i + 1]["traced"]]


def summary(pairs):
    rate = [on["requests_per_s"] / off["requests_per_s"] for off, on in pairs]
    cpu_added = [on["device_cpu_ns_per_request"] - off["device_cpu_ns_per_request"]
                 for off, on in pairs]
    return {
        "pairs": len(pairs),
        "reads_per_s_off": statistics.median(p[0]["requests_per_s"] for p in pairs),
        "reads_per_s_on": statistics.median(p[1]["requests_per_s"] for p in pairs),
        "throughput_ratio_on_off": statistics.median(rate),
        "throughput_ratio_min_max": [min(rate), max(rate)],
        "device_cpu_ns_off": statistics.median(p[0]["device_cpu_ns_per_request"] for p in pairs),
        "device_cpu_ns_on": statistics.median(p[1]["device_cpu_ns_per_request"] for p in pairs),
        "cpu_ns_added_per_read": statistics.median(cpu_added),
        "cpu_ns_added_min_max": [min(cpu_added), max(cpu_added)],
    }


def draw(pairs, path):
    fig, axes = panels(1, 2, (10, 4))
    if fig is None:
        return False
    n = range(1, len(pairs) + 1)
    for ax, key, label in zip(axes, ["requests_per_s", "device_cpu_ns_per_request"],
                              ["reads/s", "device CPU per read, ns"]):
        ax.plot(n, [p[0][key] for p in pairs], "o-", label="tracing off")
        ax.plot(n, [p[1][key] for p in pairs], "s-", label="tracing on")
        ax.set_xlabel("pair (off, then on)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.suptitle("virtio-blk, 16 KiB reads from the host page cache, one at a time")
    save_figure(fig, path, 100)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=40, help="off/on pairs of rounds")
    p.add_argument("--reads", type=int, default=5000, help="reads per round")
    p.add_argument("--image-dir", default="/var/tmp",
                   help="where the 32 MiB image goes (its page cache is the host's)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    args = p.parse_args()
    if args.pairs < 1 or args.reads < 1:
        sys.exit("iotrace.py: --pairs and --reads must be at least 1")
    if not os.path.isdir(args.image_dir):
        sys.exit("iotrace.py: --image-dir %s is not a directory" % args.image_dir)
    rounds = run_example(2 * args.pairs, args.reads, args.image_dir)
    pairs = pairs_of(rounds)
    if not pairs:
        sys.exit("iotrace.py: the example gave no off/on pair")
    s = summary(pairs)
    commit, uncommitted = git_state(ROOT, 10)
    env = {"date_utc": utc_now(), "where": "host, no guest", "cpu_model": cpu_model(),
           "cpus": os.cpu_count(), "memory_mib": machine_memory_mib(),
           "kernel": os.uname().release, "commit": commit, "uncommitted": uncommitted,
           "image_dir": args.image_dir, "engine": rounds[0]["engine"]}
    rows = [["pair", "reads/s off", "reads/s on", "on/off", "CPU ns/read off",
             "CPU ns/read on", "added ns"]]
    for i, (off, on) in enumerate(pairs, 1):
        rows.append([i, "%.0f" % off["requests_per_s"], "%.0f" % on["requests_per_s"],
                     "%.3f" % (on["requests_per_s"] / off["requests_per_s"]),
                     "%.0f" % off["device_cpu_ns_per_request"],
                     "%.0f" % on["device_cpu_ns_per_request"],
                     "%.0f" % (on["device_cpu_ns_per_request"]
                               - off["device_cpu_ns_per_request"])])
    print(text_table(rows))
    line = ("median of %d pairs: tracing on keeps %.1f %% of the reads/s (%.1f-%.1f %%), "
            "and adds %.0f ns of the device's CPU per read (%.0f-%.0f)"
            % (s["pairs"], 100 * s["throughput_ratio_on_off"],
               100 * s["throughput_ratio_min_max"][0], 100 * s["throughput_ratio_min_max"][1],
               s["cpu_ns_added_per_read"], *s["cpu_ns_added_min_max"]))
    print(line)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "iotrace.json"), "w") as f:
        json.dump({"environment": env, "summary": s, "rounds": rounds}, f, indent=1)
    drawn = draw(pairs, os.path.join(args.out, "iotrace.png"))
    md = ["# The I/O tracer's cost per request (seed 002)", "",
          "Generated by `bench/iotrace.py --pairs %d --reads %d`: a virtio-blk device alone "
          "(no guest; engine %s), 16 KiB reads at random offsets of a 32 MiB image in the "
          "host page cache (cache=writeback), one at a time, rounds alternating tracing off "
          "and on (every traced read also probed with mincore)."
          % (args.pairs, args.reads, rounds[0]["engine"]), "",
          "**%s%s.**" % (line[0].upper(), line[1:]), "",
          md_table(rows), ""]
    if drawn:
        md += ["![iotrace](iotrace.png)", ""]
    md += ["## Environment", ""] + md_environment(env)
    with open(os.path.join(args.out, "iotrace.md"), "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
