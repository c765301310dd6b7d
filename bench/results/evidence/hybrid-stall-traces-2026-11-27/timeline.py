"""KVM events per vCPU thread, per time bucket, from L1's trace.

Usage: timeline.py TRACE [SECONDS_PER_BUCKET]
"""
import collections
import re
import sys

LINE = re.compile(r'^\s*(\S+)-(\d+)\s+\[\d+\]\s+\S+\s+([\d.]+): (\w+): (.*)$')


def timeline(path, bucket):
    rows = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
    threads = collections.Counter()
    t0 = None
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            comm, pid, ts, event, rest = m.groups()
            ts = float(ts)
            t0 = ts if t0 is None else t0
            key = '%s-%s' % (comm, pid)
            threads[key] += 1
            counts = rows[key][int((ts - t0) / bucket)]
            if event == 'kvm_exit':
                counts['x_' + re.search(r'reason (\S+)', rest).group(1)] += 1
            elif event == 'kvm_inj_virq':
                counts['irq_' + rest.split()[-1]] += 1
            elif event == 'kvm_msr':
                counts['msr_%s_%s' % re.search(r'msr_(\w+) (\w+)', rest).groups()] += 1
            else:
                counts[event] += 1
    for key, _ in threads.most_common():
        if not key.startswith('vcpu'):
            continue
        print('==', key)
        for b in sorted(rows[key]):
            by_count = sorted(rows[key][b].items(), key=lambda kv: -kv[1])
            print('%6.1f %s' % (b * bucket, ' '.join('%s=%d' % kv for kv in by_count)))


if __name__ == '__main__':
    timeline(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1.0)
