"""The command-line options the benchmarks share: which hakoniwa, guest
kernel and initramfs (the tree's builds unless said otherwise) and which
QEMU."""

import os

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
