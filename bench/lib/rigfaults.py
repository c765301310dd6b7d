"""The test rig's own faults, told from a failing run's evidence.

The rig's L1 runs under QEMU's TCG emulation of nested SVM, and that
emulator now and then writes L1's own CPU state into the VMCB of the L2
guest it runs (docs/rig.md, "L1's state in L2"): the guest then goes on
with L1's CR3 (an L1 physical address, outside the guest's RAM), L1's RAX
(the VMCB's address) and RIP just after L1's VMRUN, or takes a
not-present instruction fetch on the very instruction after the one that
just exited, and triple-faults. Both show with QEMU as the VMM under test
as with hakoniwa, always right after an exit to the VMM (a serial port
write). No VMM can cause either: a VMM never sets the guest's CR3 while it
runs, and nothing runs between two guest instructions but L1's KVM.

L1's own kernel panics for a cousin of the same fault: an interrupt
taken right after VMRUN, where the global interrupt flag must hold it
back, runs L1's handler on the guest's GS base ("stack guard page was
hit").

`signature(files, memory_mib)` names the fault a run's evidence shows, or
None: the vCPU registers (hakoniwa's dumps, QEMU's `info registers`) and
KVM's trace events (`kvm-trace.txt`)."""

import os
import re

HK_CR3 = re.compile(r'"cr3": "0x([0-9a-f]+)"')
HK_RIP = re.compile(r'"rip": "0x([0-9a-f]+)"')
QEMU_CR3 = re.compile(r"\bCR3=([0-9a-f]+)")
QEMU_RIP = re.compile(r"\bRIP=([0-9a-f]+)")
TRACE_EXIT = re.compile(r"kvm_exit: vcpu \d+ reason (\w+) rip (0x[0-9a-f]+)"
                        r".*intr_info (0x[0-9a-f]+)")
TRACE_ENTRY = re.compile(r"kvm_entry: vcpu \d+, rip (0x[0-9a-f]+)")
TRACE_NPF = re.compile(r"reason npf rip (0x[0-9a-f]+) info1 \S+ info2 (0x[0-9a-f]+)")
# A #PF on an instruction fetch from a not-present page, as KVM reports
# the event it was delivering (valid, hardware exception, error code, 14).
NOT_PRESENT_FETCH = "0x80000b0e"

L1_STATE = "L1's state in L2"
L1_IRQ_AFTER_VMRUN = "L1 interrupted right after VMRUN"
LOST_TABLES = "page tables lost between two instructions"


def read_evidence(directory):
    """{file name: text} of an evidence directory."""
    files = {}
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        with open(os.path.join(directory, name), errors="replace") as f:
            files[name] = f.read()
    return files


def signature(files, memory_mib):
    """The rig fault FILES ({name: text}) show for a guest of MEMORY_MIB
    MiB, as one line starting with its name; None if none."""
    ram = memory_mib << 20
    console = files.get("l1-console.txt", "")
    if "stack guard page was hit" in console:
        # Its handler ran on the guest's GS base and faulted on itself.
        where = ("in __svm_vcpu_run, the instruction after VMRUN"
                 if re.search(r"RIP: 0010:__svm_vcpu_run\+", console) else
                 "in a vCPU thread (no call trace printed)")
        return ("%s: L1's kernel hit a stack guard page %s (l1-console.txt)" % (
            L1_IRQ_AFTER_VMRUN, where))
    for name, text in files.items():
        if name.startswith(("dump-", "ctl-dump-")):
            cr3s, rips = HK_CR3.findall(text), HK_RIP.findall(text)
        elif name.startswith("qemu-registers-"):
            cr3s, rips = QEMU_CR3.findall(text), QEMU_RIP.findall(text)
        else:
            continue
        for cr3, rip in zip(cr3s, rips):
            if int(cr3, 16) >= ram:
                return ("%s: the guest's CR3 %#x is outside its %d MiB of RAM, RIP %#x "
                        "(%s)" % (L1_STATE, int(cr3, 16), memory_mib, int(rip, 16), name))
    trace = files.get("kvm-trace.txt", "")
    for m in TRACE_NPF.finditer(trace):
        if int(m.group(2), 16) >= ram:
            return ("%s: the guest walks page tables at %s, outside its %d MiB of RAM, "
                    "RIP %s (kvm-trace.txt)" % (L1_STATE, m.group(2), memory_mib, m.group(1)))
    # The guest entered at RIP and shut down there: it could not fetch the
    # first instruction after an exit, from the page it had just run on.
    exits, entries = TRACE_EXIT.findall(trace), TRACE_ENTRY.findall(trace)
    if (len(exits) >= 2 and entries and exits[-1][0] == "shutdown"
            and exits[-1][2] == NOT_PRESENT_FETCH and entries[-1] == exits[-1][1]):
        return ("%s: a triple fault on fetching the instruction at %s, the first after "
                "an exit for %s (kvm-trace.txt)" % (LOST_TABLES, exits[-1][1], exits[-2][0]))
    return None
