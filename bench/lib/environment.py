"""What the results' environment sections record: versions, hashes, the
CPU, and whether the figures come from the rig, a host with hardware KVM
or something slower; `vmm_environment` is the whole section of a
benchmark that boots one guest under hakoniwa and QEMU."""

import datetime
import hashlib
import os
import platform
import struct
import subprocess


def utc_now():
    """Now, as the results' `date_utc` fields write it."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def machine_memory_mib():
    """This machine's memory (in the rig, L1's), MiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20


def git_state(root, limit):
    """(commit, uncommitted) of the tree at ROOT: HEAD, short, and up to
    LIMIT lines of `git status --porcelain` for the files git tracks. The
    tree is shared: they say what the binary was built with beyond HEAD."""
    commit = first_line(["git", "-C", root, "rev-parse", "--short", "HEAD"])
    uncommitted = subprocess.run(
        ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True).stdout.splitlines()[:limit]
    return commit, uncommitted


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


def vmm_environment(rig_note, measures, hakoniwa, qemu, kernel, initramfs, cmdline, *,
                    vcpus, memory_mib, relative_to=None, initramfs_sha256=True,
                    machine=None, tools=None, run=None):
    """The environment section of a benchmark that boots one guest under
    hakoniwa and under QEMU, in the order the results list it: when and
    where (`placement`), the machine (MACHINE: more of its keys, after its
    CPUs), Python, the VMMs (QEMU: None when there is none; TOOLS: more
    versions), the guest (its files' paths relative to RELATIVE_TO, or as
    given; INITRAMFS_SHA256: the initramfs's hash too; CMDLINE: its command
    line as shown), RUN: more keys, then the guest's vCPUs and memory."""
    manifest = guest_manifest(kernel)
    _, kind, where, note = placement(rig_note, measures)

    def shown(path):
        return os.path.relpath(path, relative_to) if relative_to else path

    env = {
        "date_utc": utc_now(),
        "where": where,
        "note": note,
        "kvm": kind,
        "host_kernel": platform.release(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        **(machine or {}),
        "python": platform.python_version(),
        "hakoniwa_version": first_line([hakoniwa, "--version"]),
        "hakoniwa_binary_sha256": sha256_file(hakoniwa),
        "qemu_version": first_line([qemu, "--version"]) if qemu else None,
        **(tools or {}),
        "guest_kernel": shown(kernel),
        "guest_kernel_version": bzimage_version(kernel),
        "guest_kernel_package": manifest.get("kernel-package"),
        "guest_initramfs": shown(initramfs),
    }
    if initramfs_sha256:
        env["guest_initramfs_sha256"] = sha256_file(initramfs)
    env.update({
        "guest_busybox": manifest.get("busybox-static"),
        "guest_cmdline": cmdline,
        **(run or {}),
        "vcpus": vcpus,
        "memory_mib": memory_mib,
    })
    return env
