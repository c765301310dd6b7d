"""Per traced hybrid hop: the source's run, the gap until the destination's
vCPU ran, and the destination's exits until the counter moved.

Usage: summary.py TRACE...  (L1's tracefs `trace` files)
"""
import collections
import os
import re
import sys

LINE = re.compile(r'^\s*(\S+)-(\d+)\s+\[\d+\]\s+\S+\s+([\d.]+): (\w+): (.*)$')


def summarize(path):
    first, last = {}, {}
    counts = collections.defaultdict(collections.Counter)
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m or not m.group(1).startswith('vcpu'):
                continue
            pid, ts, event = m.group(2), float(m.group(3)), m.group(4)
            first.setdefault(pid, ts)
            last[pid] = ts
            if event == 'kvm_exit':
                counts[pid][re.search(r'reason (\S+)', m.group(5)).group(1)] += 1
    pids = sorted(first, key=first.get)
    src, dst = pids[0], pids[-1]
    ran = last[dst] - first[dst]
    c = counts[dst]
    return ('%s src %.1f s, gap %.2f s, dst %.2f s: npf %d (%.0f/s) io %d interrupt %d msr %d hlt %d'
            % (os.path.basename(path), last[src] - first[src], first[dst] - last[src], ran,
               c['npf'], c['npf'] / ran, c['io'], c['interrupt'], c['msr'], c['hlt']))


if __name__ == '__main__':
    for trace in sys.argv[1:]:
        print(summarize(trace))
