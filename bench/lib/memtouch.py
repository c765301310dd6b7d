"""The lines the guest tool hk-memtouch (guest/tools/hk-memtouch.c)
prints on the console, as the harnesses find them. Each pattern takes
its line up to its end: the console arrives in pieces, and a match on a
line still arriving would cut its last number short.

Touch mode (`hk-memtouch -t THREADS -m MIB ...`): READY once the areas
are filled, then (after the go line) a THREAD line per thread, GUEST's
counters and DONE. Dirty mode (`hk-memtouch -d -m MIB -r RATE`):
DIRTY_READY, and DIRTY_DONE when it is stopped."""

import re

TOUCH_READY = re.compile(rb"hk-memtouch: ready threads=\d+ mib=\d+\r?\n")
TOUCH_THREAD = re.compile(rb"thread (\d+) seconds=([0-9.]+) start=([0-9.]+) check=(\w+) "
                          rb"marks=([0-9.,]+)\r?\n")
TOUCH_GUEST = re.compile(rb"hk-memtouch: guest ctxt=(-?\d+) hyp_irqs=(-?\d+) "
                         rb"timer_irqs=(-?\d+)\r?\n")
TOUCH_DONE = re.compile(rb"hk-memtouch: done threads=(\d+) mib=(\d+) stride=(\d+) "
                        rb"max=([0-9.]+) mean=([0-9.]+) check=(\w+)\r?\n")
DIRTY_READY = re.compile(rb"hk-memtouch: ready dirty mib=\d+\r?\n")
DIRTY_DONE = re.compile(rb"hk-memtouch: dirtied pages=(\d+) seconds=([0-9.]+) "
                        rb"pages_per_s=(\d+)\r?\n")
