#!/usr/bin/env python3
"""extract-vmlinux.py BZIMAGE OUT: write the ELF vmlinux inside an x86 bzImage.

Like the kernel's scripts/extract-vmlinux, but it finds the compressed payload
through the boot protocol header (payload_offset/payload_length, protocol
2.08+) instead of scanning for magic numbers, then picks the decompressor
from the payload's magic. Debian's kernels use xz, its cloud kernels
(linux-image-*-cloud-amd64) LZ4. Python's standard library covers gzip, xz,
lzma and bzip2; zstd and LZ4 go through the `zstd` and `lz4` commands.
"""
import bz2
import lzma
import subprocess
import sys
import zlib


def main():
    src, out = sys.argv[1:3]
    data = open(src, "rb").read()
    if data[0x202:0x206] != b"HdrS":
        sys.exit(f"{src}: not a bzImage (no HdrS boot header)")
    setup_sects = data[0x1F1] or 4  # 0 means 4, per the boot protocol
    payload_offset = int.from_bytes(data[0x248:0x24C], "little")
    payload_length = int.from_bytes(data[0x24C:0x250], "little")
    start = (setup_sects + 1) * 512 + payload_offset
    payload = data[start:start + payload_length]

    # The payload ends with the 4-byte uncompressed size the kernel's own
    # decompressor uses; the decompressors below stop at the end of the stream.
    if payload.startswith(b"\xfd7zXZ\x00"):
        vmlinux = lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(payload)
    elif payload.startswith(b"\x28\xb5\x2f\xfd"):
        vmlinux = subprocess.run(["zstd", "-qdc"], input=payload,
                                 stdout=subprocess.PIPE, check=True).stdout
    elif payload.startswith(b"\x02\x21\x4c\x18"):
        # LZ4's legacy frame (`lz4 -l`), which has no end mark: lz4 would
        # take the trailing size for one more block's header and fail after
        # writing everything, so it gets the stream without those 4 bytes.
        vmlinux = subprocess.run(["lz4", "-qdc"], input=payload[:-4],
                                 stdout=subprocess.PIPE, check=True).stdout
    elif payload.startswith(b"\x1f\x8b"):
        vmlinux = zlib.decompressobj(wbits=31).decompress(payload)  # 31: gzip
    elif payload.startswith(b"\x5d\x00\x00"):
        vmlinux = lzma.LZMADecompressor(lzma.FORMAT_ALONE).decompress(payload)
    elif payload.startswith(b"BZh"):
        vmlinux = bz2.BZ2Decompressor().decompress(payload)
    else:
        sys.exit(f"{src}: unsupported payload compression (magic {payload[:6].hex()})")

    if len(vmlinux) != int.from_bytes(payload[-4:], "little"):
        sys.exit(f"{src}: decompressed {len(vmlinux)} bytes, the payload says "
                 f"{int.from_bytes(payload[-4:], 'little')}")
    if not vmlinux.startswith(b"\x7fELF"):
        sys.exit(f"{src}: decompressed payload is not an ELF file")
    with open(out, "wb") as f:
        f.write(vmlinux)


if __name__ == "__main__":
    main()
