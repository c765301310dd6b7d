"""QEMU beside hakoniwa: the argv that boots the same kernel and initramfs
with KVM, and its QMP control socket."""

import json
import socket
import time


def qemu_argv(qemu, kernel, initrd, cmdline, memory_mib, cpus=1, machine="pc", accel=None,
              qmp=None, incoming=False, extra=()):
    """QEMU booting KERNEL and INITRD with the serial console on stdio.
    -nodefaults: no VGA, NIC, floppy, CD-ROM or monitor (hakoniwa has none
    of them either); the serial console is the only device asked for.
    ACCEL: QEMU's -accel argument (default -enable-kvm); QMP: a Unix socket
    path for QMP; INCOMING: wait for `migrate-incoming`."""
    accel = ["-accel", accel] if accel else ["-enable-kvm"]
    argv = [qemu, "-M", machine] + accel + [
        "-cpu", "host", "-smp", str(cpus), "-m", "%dM" % memory_mib, "-nodefaults",
        "-no-user-config", "-display", "none", "-serial", "stdio", "-kernel", kernel,
        "-initrd", initrd, "-append", cmdline]
    if qmp:
        argv += ["-qmp", "unix:%s,server=on,wait=off" % qmp]
    if incoming:
        argv += ["-incoming", "defer"]
    return argv + list(extra)


class Qmp:
    """A QMP connection: `cmd` returns a command's answer; events that
    arrive meanwhile are kept in `events`."""

    def __init__(self, path, timeout=60, alive=None):
        """ALIVE, if given, says whether QEMU still runs: a QEMU that
        exited before it made the socket is said at once, not after
        TIMEOUT seconds."""
        t0 = time.monotonic()
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(path)
                break
            except OSError:
                self.sock.close()
                if alive and not alive():
                    raise RuntimeError("no QMP socket at %s: QEMU exited" % path) from None
                if time.monotonic() - t0 > timeout:
                    raise RuntimeError("no QMP socket at %s after %.0f s" % (
                        path, time.monotonic() - t0)) from None
                time.sleep(0.1)
        self.sock.settimeout(timeout)
        self.file = self.sock.makefile("rb")
        self.events = []
        json.loads(self.file.readline())  # greeting
        self.cmd("qmp_capabilities")

    def cmd(self, name, **arguments):
        msg = {"execute": name}
        if arguments:
            msg["arguments"] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            line = self.file.readline()
            if not line:
                raise RuntimeError("QMP closed during %s" % name)
            r = json.loads(line)
            if "event" in r:
                self.events.append(r)
                continue
            if "error" in r:
                raise RuntimeError("QMP %s: %s" % (name, r["error"].get("desc")))
            return r.get("return")

    def drain(self):
        """Reads what QEMU sent after the last answer, up to the socket's
        end, into `events`: for a QEMU that has exited (its SHUTDOWN event
        says why). Never raises."""
        try:
            self.sock.settimeout(2)
            for line in self.file:
                r = json.loads(line)
                if "event" in r:
                    self.events.append(r)
        except (OSError, ValueError):
            pass

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
