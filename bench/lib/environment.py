"""What the results' environment sections record: versions, hashes, the
CPU, and whether the figures come from the rig, a host with hardware KVM
or something slower."""

import hashlib
import os
import struct
import subprocess


def first_line(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True,
                              timeout=30).stdout.splitlines()[0].strip()
    except (OSError, IndexError, subprocess.SubprocessError):
        return None


def bzimage_version(path):
    """The version string a bzImage carries (boot protocol header)."""
    try:
        with open(path, "rb") as f:
            data = f.read(64 * 1024)
        if data[0x202:0x206] != b"HdrS":
            return None
        off = struct.unpack_from("<H", data, 0x20E)[0] + 0x200
        return data[off:data.index(b"\0", off)].decode("ascii", "replace")
    except (OSError, ValueError, struct.error):
        return None


def sha256_file(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def in_rig():
    try:
        with open("/proc/cmdline") as f:
            return " hk.run=" in " " + f.read()
    except OSError:
        return False


def kvm_kind():
    if os.path.exists("/sys/module/kvm_pvm"):
        return "pvm"
    try:
        with open("/proc/cpuinfo") as f:
            flags = set()
            for line in f:
                if line.startswith("flags"):
                    flags.update(line.split(":", 1)[1].split())
    except OSError:
        return "unknown"
    if "vmx" in flags or "svm" in flags:
        return "hardware" if not in_rig() else "nested (emulated SVM)"
    return "not hardware-assisted"


def guest_manifest(kernel):
    """build/guest/MANIFEST (beside the kernel) as a dict, {} if absent."""
    manifest = {}
    mpath = os.path.join(os.path.dirname(kernel), "MANIFEST")
    if os.path.exists(mpath):
        with open(mpath) as f:
            for line in f:
                key, sep, val = line.partition(": ")
                if sep and not key.startswith(" "):
                    manifest[key.strip()] = val.strip()
    return manifest


def placement(rig_note, measures):
    """(rig?, KVM kind, where, note) for the results' environment section;
    `measures` names what the benchmark reports ("times", "figures")."""
    rig = in_rig()
    kind = kvm_kind()
    if rig:
        where, note = "rig", rig_note
    elif kind == "hardware":
        where, note = "host", "host with hardware KVM"
    else:
        where, note = "host", ("host KVM is %s, not hardware KVM: absolute %s mean "
                               "little, compare ratios" % (kind, measures))
    return rig, kind, where, note
