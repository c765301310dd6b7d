"""Shared pieces of the benchmark harnesses in bench/ (standard library
only): the guest console and shell (console), VMM processes (vmm),
hakoniwa's control API and a source/destination pair (hakoniwa), QEMU's
argv and QMP (qemu), KVM's trace events and where a stuck VM is
(kvmtrace), the host's huge page pool (hugepages), the results'
environment section (environment) and tables (tables).

The scripts put bench/ on sys.path and import `lib.console` and so on."""

import os

# The tree's root: bench/lib/ is two levels below it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The guest kernel's command line under both VMMs: the serial console,
# no port 0x80 delays, and a panic reboots at once, which ends the VM
# (boot.py, virtio.py and soak.py add words of their own).
CMDLINE = "console=ttyS0 quiet io_delay=none panic=-1"
