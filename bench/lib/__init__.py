"""Shared pieces of the benchmark harnesses in bench/ (standard library
only, but for matplotlib in plots): the guest console and shell, and
console lines timestamped as they arrive (console), VMM processes and a
run to its end (vmm), hakoniwa's control API and a source/destination
pair (hakoniwa), QEMU's argv and QMP (qemu), KVM's trace events and where
a stuck VM is (kvmtrace), the rig's known faults in a failed run's
evidence (rigfaults), the host's huge page pool (hugepages), the guest
tool hk-memtouch's lines (memtouch), an RFB client that timestamps
updates (rfb_probe), a guest initramfs read and a host program with its
libraries appended to it (initramfs), iperf3's command line and JSON
reports (iperf3), fio jobs as phases in the Debian guest (fio), a VMM's
CPU time by thread kind and memory sampled at those phases (procstat),
a migration's TLS credentials made with openssl (tlscreds), the
results' environment section (environment),
tables and their cells (tables), figures (plots), and the options and
defaults for the tree's binaries and guest (options; here the tree's
ROOT and the guest's CMDLINE).

The scripts put bench/ on sys.path and import `lib.console` and so on;
no script imports another."""

import os

# The tree's root: bench/lib/ is two levels below it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The guest kernel's command line under both VMMs: the serial console,
# no port 0x80 delays, and a panic reboots at once, which ends the VM
# (boot.py, virtio.py and soak.py add words of their own).
CMDLINE = "console=ttyS0 quiet io_delay=none panic=-1"
