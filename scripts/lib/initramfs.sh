# shellcheck shell=bash
# Building busybox initramfs images, shared by scripts/build-guest and
# scripts/rig. Sourced after common.sh and kernel.sh (uses HK_KIMG, HK_KREL,
# HK_BUSYBOX).

# hk_stage_busybox ROOT  puts the static busybox at ROOT/bin/busybox with a
# symlink for every applet (bin/sh, sbin/insmod, ...), as `busybox --install`
# would, but at build time.
hk_stage_busybox() {
	local root=$1 path
	mkdir -p "$root/bin"
	cp "$HK_BUSYBOX" "$root/bin/busybox"
	chmod 0755 "$root/bin/busybox"
	local -A dirs=()
	while read -r path; do
		[[ $path == bin/busybox ]] && continue
		[[ -n ${dirs[${path%/*}]:-} ]] || mkdir -p "$root/${path%/*}"
		dirs[${path%/*}]=1
		ln -sfn /bin/busybox "$root/$path"
	done < <("$HK_BUSYBOX" --list-full)
}

# hk_stage_modules ROOT LIST NAME...  copies the kernel modules NAME... and
# everything they depend on (per `modinfo -F depends`) from the unpacked kernel
# package to the same relative paths under ROOT/lib/modules/<release>/, and
# writes their absolute in-guest paths to ROOT/LIST, dependencies first, for
# a plain `insmod` loop at boot (no depmod, no modprobe). Compressed modules
# are decompressed here, because busybox insmod may not read them. Modules
# built into the kernel are skipped; unknown names are an error.
hk_stage_modules() {
	local root=$1 list=$2 name rel
	shift 2
	local moddir=$HK_KIMG/lib/modules/$HK_KREL
	# Module names use '-' and '_' interchangeably; index by the '_' form.
	local -A path_of=() is_builtin=() seen=()
	while read -r rel; do
		name=${rel##*/}
		name=${name%%.ko*}
		path_of[${name//-/_}]=$rel
	done < <(cd "$moddir" && find kernel -name '*.ko' -o -name '*.ko.*')
	while read -r rel; do
		name=${rel##*/}
		name=${name%.ko}
		is_builtin[${name//-/_}]=1
	done <"$moddir/modules.builtin"

	local order=()
	_hk_stage_module() {
		local key=${1//-/_} src dst dep deps
		[[ -n ${seen[$key]:-} ]] && return 0
		seen[$key]=1
		if [[ -z ${path_of[$key]:-} ]]; then
			[[ -n ${is_builtin[$key]:-} ]] && return 0
			hk_die "kernel $HK_KREL has no module $1"
		fi
		src=$moddir/${path_of[$key]}
		dst=$root/lib/modules/$HK_KREL/${path_of[$key]%.ko*}.ko
		mkdir -p "$(dirname "$dst")"
		case $src in
		*.ko) cp "$src" "$dst" ;;
		*.ko.xz) xz -dc "$src" >"$dst" ;;
		*.ko.zst) zstd -qdc "$src" >"$dst" ;;
		*.ko.gz) gzip -dc "$src" >"$dst" ;;
		*) hk_die "unknown module compression: $src" ;;
		esac
		chmod 0644 "$dst"
		deps=$(modinfo -F depends "$dst")
		for dep in ${deps//,/ }; do
			_hk_stage_module "$dep"
		done
		order+=("${dst#"$root"}")
	}
	for name; do
		_hk_stage_module "$name"
	done
	unset -f _hk_stage_module
	mkdir -p "$(dirname "$root/$list")"
	printf '%s\n' "${order[@]}" >"$root/$list"
}

# hk_pack_initramfs ROOT OUT  writes ROOT as a gzip'd newc cpio archive to OUT,
# byte-for-byte reproducibly: sorted names, mtimes 0 (SOURCE_DATE_EPOCH=0
# style), owner root, no inode numbers (cpio --reproducible), no gzip name or
# time stamp (gzip -n).
hk_pack_initramfs() {
	local root=$1 out=$2
	find "$root" -exec touch -h -d @0 {} +
	(cd "$root" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
		cpio --quiet --reproducible -o -H newc -R 0:0) | gzip -n -9 >"$out.tmp.$$"
	mv "$out.tmp.$$" "$out"
}
