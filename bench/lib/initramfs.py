"""A guest initramfs (gzipped newc cpio) read and extended: files taken
out of it, and a copy with a host program and the shared libraries it
loads appended, so that the default guest runs a tool (iperf3) it was not
built with. Linux unpacks concatenated cpio archives in order, so the
appended members land beside the original ones."""

import gzip
import os
import re
import subprocess

TRAILER = "TRAILER!!!"


def extract_from_cpio(initramfs, names):
    """{name: bytes} of the regular files NAMES in a gzipped newc cpio."""
    with gzip.open(initramfs) as f:
        data = f.read()
    found, off = {}, 0
    while off + 110 <= len(data) and data[off:off + 6] in (b"070701", b"070702"):
        filesize = int(data[off + 54:off + 62], 16)
        namesize = int(data[off + 94:off + 102], 16)
        name = data[off + 110:off + 110 + namesize - 1].decode("utf-8", "replace")
        off = (off + 110 + namesize + 3) & ~3
        if name == TRAILER:
            break
        if name.lstrip("./") in names and filesize:
            found[name.lstrip("./")] = data[off:off + filesize]
        off = (off + filesize + 3) & ~3
    return found


def _member(ino, name, mode, data):
    """One newc member: header, NUL-terminated name and data, each padded
    to 4 bytes."""
    name_b = name.encode() + b"\0"
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name_b), 0]
    head = b"070701" + b"".join(b"%08X" % v for v in fields)
    out = head + name_b
    out += b"\0" * (-len(out) % 4)
    out += data
    out += b"\0" * (-len(out) % 4)
    return out


def newc_archive(files):
    """A newc cpio (bytes) of FILES, {path in the archive: (mode, bytes)},
    with the directories they need, ending in the trailer."""
    dirs = sorted({os.path.dirname(p)[:i] for p in files
                   for i in [m.end() for m in re.finditer(r"[^/]+", os.path.dirname(p))]})
    out, ino = b"", 0x4B000
    for d in dirs:
        ino += 1
        out += _member(ino, d, 0o40755, b"")
    for path in sorted(files):
        mode, data = files[path]
        ino += 1
        out += _member(ino, path, 0o100000 | mode, data)
    return out + _member(0, TRAILER, 0, b"")


def shared_libraries(program):
    """The host paths of the shared libraries PROGRAM loads (its ELF
    interpreter included), from ldd; raises RuntimeError if ldd cannot say."""
    out = subprocess.run(["ldd", program], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("ldd %s: %s" % (program, (out.stderr or out.stdout).strip()))
    libs = []
    for line in out.stdout.splitlines():
        if "not found" in line:
            raise RuntimeError("ldd %s: %s" % (program, line.strip()))
        m = re.search(r"(/\S+)", line.split("=>")[-1])
        if m:
            libs.append(m.group(1))
    return libs


def with_program(initramfs, program, out):
    """Writes to OUT a copy of the gzipped INITRAMFS with PROGRAM (a host
    path) as /usr/bin/NAME and its shared libraries at their host paths
    appended; returns {path in the guest: size in bytes} of what was added."""
    files = {}
    for path in [program] + shared_libraries(program):
        real = os.path.realpath(path)
        with open(real, "rb") as f:
            data = f.read()
        where = ("usr/bin/" + os.path.basename(program) if path == program
                 else path.lstrip("/"))
        files[where] = (0o755, data)
    with open(initramfs, "rb") as f:
        base = f.read()
    with open(out, "wb") as f:
        f.write(base)
        f.write(gzip.compress(newc_archive(files), 6))
    return {p: len(d) for p, (_, d) in files.items()}
