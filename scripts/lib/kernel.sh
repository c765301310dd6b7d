# shellcheck shell=bash
# The guest kernel and busybox, shared by scripts/build-guest (the default
# guest) and scripts/rig (the L1 Linux): both fetch the same Debian packages
# once into build/guest/dl and unpack them under build/guest. Sourced after
# common.sh.

HK_DL=$HK_BUILD/guest/dl

# hk_kernel  fetches and unpacks the stock Debian kernel, and sets:
#   HK_KPKG     package name, e.g. linux-image-6.1.0-56-amd64; it is what
#               linux-image-amd64 depends on now, or $HK_KERNEL_PKG if set
#   HK_KPKGVER  package version, e.g. 6.1.192-2
#   HK_KIMG     the unpacked package (build/guest/kimg)
#   HK_KREL     kernel release (its lib/modules directory), e.g. 6.1.0-56-amd64
#   HK_VMLINUZ  the bzImage
hk_kernel() {
	_hk_kernel_pkg
	hk_deb_path "$HK_KPKG" "$HK_DL"
	# Not cached: what linux-image-amd64 means may change with fresh lists.
	if [[ ! -f $REPLY ]]; then
		hk_apt_update
		_hk_kernel_pkg
	fi
	hk_fetch_deb "$HK_KPKG" "$HK_DL"
	hk_unpack_deb "$REPLY" "$HK_BUILD/guest/kimg"
	_hk_kernel_vars
}

# hk_kernel_unpacked  sets the same variables for the kernel build-guest last
# unpacked, without asking apt (fast), or runs hk_kernel if there is none yet.
hk_kernel_unpacked() {
	if [[ -f $HK_BUILD/guest/kimg/.hk-deb ]]; then
		_hk_kernel_vars
	else
		hk_kernel
	fi
}

_hk_kernel_vars() {
	HK_KIMG=$HK_BUILD/guest/kimg
	local deb
	deb=$(<"$HK_KIMG/.hk-deb") # PKG_VERSION_ARCH.deb
	HK_KPKG=${deb%%_*}
	HK_KPKGVER=${deb#*_}
	HK_KPKGVER=${HK_KPKGVER%_*}
	HK_KPKGVER=${HK_KPKGVER//%3a/:}
	local mods=("$HK_KIMG"/lib/modules/*)
	if ((${#mods[@]} != 1)) || [[ ! -d ${mods[0]} ]]; then
		hk_die "$HK_KPKG: expected one lib/modules/<release>"
	fi
	HK_KREL=${mods[0]##*/}
	HK_VMLINUZ=$HK_KIMG/boot/vmlinuz-$HK_KREL
	[[ -f $HK_VMLINUZ ]] || hk_die "$HK_KPKG has no boot/vmlinuz-$HK_KREL"
}

# _hk_kernel_pkg  sets HK_KPKG (see hk_kernel).
_hk_kernel_pkg() {
	if [[ -n ${HK_KERNEL_PKG:-} ]]; then
		HK_KPKG=$HK_KERNEL_PKG
		return
	fi
	hk_apt_field linux-image-amd64 Depends
	HK_KPKG=${REPLY%% *}
	[[ $HK_KPKG == linux-image-* ]] ||
		hk_die "cannot resolve linux-image-amd64 (Depends: $REPLY); set HK_KERNEL_PKG"
}

# hk_kernel_images  copies the bzImage to build/guest/vmlinuz and extracts the
# ELF kernel inside it to build/guest/vmlinux (HK_VMLINUX), unless they are
# current. The ELF boots through its PVH entry (Xen ELF note
# XEN_ELFNOTE_PHYS32_ENTRY): no decompression in the guest, which saves ~3 s
# under QEMU TCG. Extraction takes ~1 s, hence the check. xz, gzip, bzip2,
# LZMA, zstd and LZ4 payloads are understood (scripts/lib/extract-vmlinux.py).
hk_kernel_images() {
	local out=$HK_BUILD/guest
	HK_VMLINUX=$out/vmlinux
	if ! cmp -s "$HK_VMLINUZ" "$out/vmlinuz" || [[ ! -f $HK_VMLINUX ]]; then
		# The decompressors extract-vmlinux.py runs (Debian's cloud kernels
		# are LZ4-compressed; the others xz, which Python reads itself).
		hk_need lz4:lz4 zstd:zstd
		python3 "$HK_ROOT/scripts/lib/extract-vmlinux.py" "$HK_VMLINUZ" "$HK_VMLINUX.tmp.$$"
		mv "$HK_VMLINUX.tmp.$$" "$HK_VMLINUX"
		cp "$HK_VMLINUZ" "$out/vmlinuz.tmp.$$"
		mv "$out/vmlinuz.tmp.$$" "$out/vmlinuz"
	fi
}

# hk_busybox  fetches and unpacks Debian's busybox-static, and sets:
#   HK_BUSYBOX      its static /bin/busybox (not the host's, which may be absent
#                   or dynamically linked)
#   HK_BUSYBOX_VER  package version
hk_busybox() {
	hk_fetch_deb busybox-static "$HK_DL"
	hk_unpack_deb "$REPLY" "$HK_BUILD/guest/busybox-deb"
	_hk_busybox_vars
}

# hk_busybox_unpacked  is to hk_busybox what hk_kernel_unpacked is to hk_kernel.
hk_busybox_unpacked() {
	if [[ -f $HK_BUILD/guest/busybox-deb/.hk-deb ]]; then
		_hk_busybox_vars
	else
		hk_busybox
	fi
}

_hk_busybox_vars() {
	# shellcheck disable=SC2034 # read by initramfs.sh
	HK_BUSYBOX=$HK_BUILD/guest/busybox-deb/bin/busybox
	HK_BUSYBOX_VER=$(<"$HK_BUILD/guest/busybox-deb/.hk-deb")
	HK_BUSYBOX_VER=${HK_BUSYBOX_VER#*_}
	HK_BUSYBOX_VER=${HK_BUSYBOX_VER%_*}
	HK_BUSYBOX_VER=${HK_BUSYBOX_VER//%3a/:}
}
