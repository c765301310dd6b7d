"""The command line the benchmarks share: the options for which
hakoniwa, guest kernel and initramfs (the tree's builds unless said
otherwise) and which QEMU, and the exit status."""

import os
import sys

from . import ROOT

PATHS = {
    "kernel": os.path.join(ROOT, "build/guest/vmlinuz"),
    "initramfs": os.path.join(ROOT, "build/guest/initramfs.cpio.gz"),
    "hakoniwa": os.path.join(ROOT, "target/release/hakoniwa"),
    "qemu": "qemu-system-x86_64",
}


def add_path_options(parser, *names):
    """--NAME for each of NAMES (keys of PATHS), in that order, each
    defaulting to its PATHS value."""
    for name in names:
        parser.add_argument("--" + name, default=PATHS[name])


def exit_status(prog, failed, what, results):
    """A benchmark's exit status: 1 when FAILED (a count of WHAT, "run(s)"
    or "row(s)") is not 0, said on stderr with where to look (RESULTS, its
    JSON), and 0 otherwise."""
    if failed:
        print("%s: %d %s failed (see above and %s)" % (prog, failed, what, results),
              file=sys.stderr)
        return 1
    return 0
