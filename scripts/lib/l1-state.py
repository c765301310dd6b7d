#!/usr/bin/env python3
"""scripts/lib/l1-state.py [--wait S --label TEXT] MONITOR OUT

Asks a running L1 (scripts/rig's QEMU, over its HMP monitor socket) where
its vCPUs are, writes the answers to OUT and prints a one-line summary:
each vCPU's state (halted or running), RIP, and the vectors pending in its
local APIC. A halted vCPU with a vector pending that its interrupt flag
allows is a wedge of the emulator: real hardware wakes it (docs/rig.md).

scripts/rig runs this with --wait (S seconds first) so that it asks just
before the rig's timeout stops L1: a timed-out run then says whether L1 was
still working or stuck, and where; with --label, the summary goes to
stderr as "TEXT: SUMMARY (all of it: OUT)".
"""
import argparse
import os
import re
import socket
import sys
import time

# "info status" first: a paused L1 (QEMU stops it on a host I/O error the
# drive is not set to report, or on ENOSPC) is not a wedged one.
COMMANDS = ["info status", "info cpus", "info registers -a", "info pic", "info irq"]


def ask(path, commands, timeout=3.0):
    """Each command's output from the HMP monitor at path (the prompt and
    the echoed command line stripped)."""
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(timeout)
    sock.connect(path)

    def read_until_prompt():
        data = b""
        deadline = time.monotonic() + timeout
        while not data.endswith(b"(qemu) ") and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
        # The monitor draws its line editor with escape sequences.
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", data.decode(errors="replace"))
        return text.replace("\r", "").removesuffix("(qemu) ")

    read_until_prompt()  # the banner
    answers = {}
    for command in commands:
        sock.sendall(command.encode() + b"\n")
        text = read_until_prompt()
        # The first line is the command, echoed as typed.
        answers[command] = text.split("\n", 1)[1] if "\n" in text else ""
    sock.close()
    return answers


def lapic_pending(lapic_text):
    """The vectors in a local APIC's IRR: 'info lapic' prints 'IRR'
    followed by the vector numbers."""
    match = re.search(r"^IRR\s*(.*)$", lapic_text, re.M)
    vectors = match.group(1).split() if match else []
    return [v for v in vectors if v.isdigit()]


def summary(answers):
    registers = answers.get("info registers -a", "")
    rips = re.findall(r"RIP=([0-9a-f]+)", registers)
    flags = re.findall(r"RFL=([0-9a-f]+)", registers)
    halted = re.findall(r"HLT=(\d)", registers)
    parts = []
    status = answers.get("info status", "").strip()
    if status and status != "VM status: running":
        parts.append(status)
    for i, rip in enumerate(rips):
        part = "vCPU %d %s at %s" % (i, "halted" if i < len(halted) and halted[i] == "1"
                                      else "running", rip)
        if i < len(flags):
            part += " IF=%d" % ((int(flags[i], 16) >> 9) & 1)
        pending = lapic_pending(answers.get("info lapic %d" % i, ""))
        part += ", APIC IRR %s" % (" ".join(pending) if pending else "empty")
        parts.append(part)
    return "; ".join(parts)


def main():
    parser = argparse.ArgumentParser(
        prog="l1-state.py", description="Where a running L1's vCPUs are.")
    parser.add_argument("--wait", type=int, default=0, metavar="S",
                        help="sleep S seconds before asking")
    parser.add_argument("--label", metavar="TEXT",
                        help="summary to stderr as 'TEXT: SUMMARY'; quiet if L1 is gone")
    parser.add_argument("monitor", metavar="MONITOR", help="L1's HMP monitor socket")
    parser.add_argument("out", metavar="OUT", help="file for the monitor's answers")
    args = parser.parse_args()
    time.sleep(args.wait)
    label, monitor, out = args.label, args.monitor, args.out
    if label and not os.path.exists(monitor):
        return 0  # L1 is gone, and its run directory with it
    try:
        answers = ask(monitor, COMMANDS)
        cpus = len(re.findall(r"CPU #\d+", answers["info cpus"]))
        answers.update(ask(monitor, ["info lapic %d" % i for i in range(cpus)]))
    except OSError as err:
        print("%scannot ask L1's monitor %s: %s" % (label + ": " if label else "", monitor, err),
              file=sys.stderr if label else sys.stdout)
        return 1
    # The summary is printed even when OUT cannot be written (a full disk
    # is one reason an L1 stops): it is what a timed-out run leaves.
    where = "all of it: %s" % out
    try:
        with open(out, "w") as f:
            for command, text in answers.items():
                f.write("(qemu) %s\n%s\n" % (command, text))
    except OSError as err:
        where = "cannot write %s: %s" % (out, err.strerror)
    if label:
        print("%s: %s (%s)" % (label, summary(answers), where), file=sys.stderr)
    else:
        print(summary(answers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
