"""The host's pool of 2 MiB huge pages, for rows that boot a guest with
`--memory size=..,hugepages=on`: reserved for the run by writing
/proc/sys/vm/nr_hugepages (as root), and given back afterwards.

    with HugePages(256) as pool:
        if pool.ok: ...      # 256 huge pages are free for our mappings
        else: pool.note      # why not, for the results table

A pool that cannot be reserved (not root, memory too fragmented, no
hugetlbfs) is not an error: `ok` is false and `note` says why, so the
rows that need it say so instead of failing."""

import os

NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"
SYSFS = "/sys/kernel/mm/hugepages/hugepages-2048kB"
HUGE_PAGE_MIB = 2


def read_pool():
    """{"total", "free", "reserved", "available"} of the 2 MiB pool, or None
    when the kernel has none."""
    def read(name):
        with open(os.path.join(SYSFS, name)) as f:
            return int(f.read().strip())
    try:
        total, free, reserved = read("nr_hugepages"), read("free_hugepages"), \
            read("resv_hugepages")
    except (OSError, ValueError):
        return None
    return {"total": total, "free": free, "reserved": reserved,
            "available": max(0, free - reserved)}


def pages_for(mib):
    """Huge pages that back MIB of guest RAM."""
    return -(-mib // HUGE_PAGE_MIB)


class HugePages:
    """Makes sure PAGES huge pages are available while the block runs
    (growing the pool as root when they are not), and puts the pool's size
    back afterwards. `record()` is what the environment section keeps."""

    def __init__(self, pages):
        self.pages = pages
        self.before = None   # nr_hugepages before, when we changed it
        self.ok = False
        self.note = None
        self.pool = None

    def __enter__(self):
        pool = read_pool()
        if pool is None:
            self.note = "the kernel has no 2 MiB huge pages (%s is missing)" % SYSFS
            return self
        if pool["available"] < self.pages:
            want = pool["total"] + self.pages - pool["available"]
            if os.geteuid() != 0:
                self.note = ("%d huge pages needed, %d free, and not root: cannot "
                             "write %s" % (self.pages, pool["available"], NR_HUGEPAGES))
                return self
            try:
                with open(NR_HUGEPAGES, "w") as f:
                    f.write("%d\n" % want)
                self.before = pool["total"]
            except OSError as e:
                self.note = "cannot write %d to %s: %s" % (want, NR_HUGEPAGES, e)
                return self
            pool = read_pool() or pool
        self.pool = pool
        if pool["available"] < self.pages:
            self.note = ("only %d of %d huge pages could be reserved (%s; host memory "
                         "too fragmented?)" % (pool["available"], self.pages, NR_HUGEPAGES))
            self.restore()
            return self
        self.ok = True
        return self

    def restore(self):
        if self.before is not None:
            try:
                with open(NR_HUGEPAGES, "w") as f:
                    f.write("%d\n" % self.before)
            except OSError:
                pass
            self.before = None

    def __exit__(self, *exc):
        self.restore()
        return False

    def record(self):
        return {"pages_needed": self.pages, "reserved": self.ok, "note": self.note,
                "pool_during_run": self.pool}
