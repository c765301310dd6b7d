# shellcheck shell=bash
# Shared helpers for hakoniwa's shell scripts (sourced, not run).
#
# Everything the scripts need comes from Debian packages, because a fresh CI
# machine starts with nothing: missing tools are installed with apt-get, and
# the guest's kernel and busybox are fetched as .deb files and unpacked into
# build/ (never installed on the host).

HK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
HK_BUILD=$HK_ROOT/build
HK_PROG=${HK_PROG:-$(basename "$0")}

hk_log() { printf '%s: %s\n' "$HK_PROG" "$*" >&2; }
# Scripts whose own failures must be told apart from a command's (scripts/rig)
# set HK_DIE_STATUS.
hk_die() { hk_log "error: $*"; exit "${HK_DIE_STATUS:-1}"; }

export DEBIAN_FRONTEND=noninteractive

# hk_quiet CMD...  runs CMD and shows its output only if it fails (apt is
# chatty on stderr even with -qq).
hk_quiet() {
	local out
	out=$("$@" 2>&1) && return 0
	local rc=$?
	printf '%s\n' "$out" >&2
	return "$rc"
}

# hk_lock / hk_unlock: serialize the work on build/ (downloads, unpacking,
# image builds) between concurrent scripts, e.g. several rig runs.
hk_lock() {
	mkdir -p "$HK_BUILD"
	exec {_hk_lock_fd}>"$HK_BUILD/.lock"
	flock "$_hk_lock_fd"
}
hk_unlock() { exec {_hk_lock_fd}>&-; }

# apt-get update is slow-ish and needs the network, so run it at most once per
# script run, and only when something actually has to be fetched or installed.
_hk_apt_updated=
hk_apt_update() {
	[[ -n $_hk_apt_updated ]] && return 0
	hk_log "apt-get update"
	hk_quiet apt-get update -qq || hk_die "apt-get update failed"
	_hk_apt_updated=1
	_hk_apt_record=() # forget what the old lists said
}

# hk_need PKG:WHAT ...  installs Debian package PKG unless WHAT is present.
# WHAT is a command name, or an absolute path for things that are not commands
# (e.g. libc.a, which `gcc -static` needs).
hk_need() {
	local spec pkg what missing=()
	for spec; do
		pkg=${spec%%:*} what=${spec#*:}
		if [[ $what == /* ]]; then
			[[ -e $what ]] || missing+=("$pkg")
		else
			command -v "$what" >/dev/null || missing+=("$pkg")
		fi
	done
	((${#missing[@]})) || return 0
	hk_apt_update
	hk_log "installing ${missing[*]}"
	hk_quiet apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
		hk_die "apt-get install ${missing[*]} failed"
}

# hk_need_qemu  makes sure qemu-system-x86_64 is QEMU 10 or newer, which the
# rig (and the benchmarks' QEMU runs inside it) use. Debian bookworm's QEMU
# 7.2 emulates nested SVM about three times slower under TCG, and its L1 hung
# or panicked ("stack guard page was hit" in a vCPU thread) in about one full
# guest-test run in two; bookworm-backports has QEMU 10 (docs/rig.md).
# Backports get apt's low default priority, so nothing else changes source.
HK_QEMU_MIN_MAJOR=10
# _hk_qemu_major  prints the installed QEMU's major version, or nothing when
# there is no QEMU. It never fails: the rig runs with `set -eE` and an ERR
# trap, where a failing command substitution would end it without a word.
_hk_qemu_major() {
	{ qemu-system-x86_64 --version 2>/dev/null || true; } |
		sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p'
}
hk_need_qemu() {
	local version
	version=$(_hk_qemu_major)
	[[ -n $version && $version -ge $HK_QEMU_MIN_MAJOR ]] && return 0
	local suite
	suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
	if [[ $suite == bookworm ]]; then
		local list=/etc/apt/sources.list.d/hakoniwa-bookworm-backports.list
		if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
			hk_log "adding bookworm-backports to apt's sources (for QEMU $HK_QEMU_MIN_MAJOR)"
			echo "deb http://deb.debian.org/debian bookworm-backports main" >"$list"
			_hk_apt_updated=
		fi
		hk_apt_update
		hk_log "installing qemu-system-x86 from bookworm-backports"
		hk_quiet apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 ||
			hk_die "apt-get install -t bookworm-backports qemu-system-x86 failed"
	else
		hk_need qemu-system-x86:qemu-system-x86_64
	fi
	version=$(_hk_qemu_major)
	[[ -n $version && $version -ge $HK_QEMU_MIN_MAJOR ]] ||
		hk_die "need QEMU $HK_QEMU_MIN_MAJOR or newer for the rig, have ${version:-none}"
}

# hk_qemu_shadow  sets REPLY to a QEMU for rigs whose L2 guests run on shadow
# paging (HK_RIG_NPT=0): bookworm's QEMU 7.2, unpacked (not installed) into
# build/qemu-7.2 with a wrapper that finds its modules and firmware there.
# Under QEMU 10.0.2's TCG, L1's KVM with npt=0 never gets an L2 guest past
# its first moments: the vCPU halts after ~4400 exits (no output, even with
# earlyprintk) and stays halted; QEMU 7.2 boots the same guest in ~12 s
# (docs/rig.md). bookworm only; HK_RIG_QEMU=PATH overrides.
hk_qemu_shadow() {
	if [[ -n ${HK_RIG_QEMU:-} ]]; then
		REPLY=$HK_RIG_QEMU
		return 0
	fi
	local dir=$HK_BUILD/qemu-7.2
	REPLY=$dir/qemu
	[[ -x $REPLY && -f $dir/root/usr/bin/qemu-system-x86_64 ]] && return 0
	[[ $(. /etc/os-release && echo "${VERSION_CODENAME:-}") == bookworm ]] ||
		hk_die "no QEMU for shadow-paging rigs: QEMU 10 hangs L2 guests with npt=0, and QEMU 7.2 is taken from Debian bookworm (set HK_RIG_QEMU=PATH)"
	hk_apt_update
	rm -rf "$dir"
	mkdir -p "$dir/deb"
	local pkg version
	for pkg in qemu-system-x86 qemu-system-common qemu-system-data; do
		version=$(apt-cache madison "$pkg" | awk -F' [|] ' '$2 ~ /^1:7[.]2[+]/ {print $2; exit}')
		[[ -n $version ]] || hk_die "bookworm's $pkg 7.2 is not in apt's lists"
		(cd "$dir/deb" && hk_quiet apt-get download "$pkg=$version") ||
			hk_die "apt-get download $pkg=$version failed"
	done
	local deb
	for deb in "$dir"/deb/*.deb; do
		dpkg-deb -x "$deb" "$dir/root"
	done
	# QEMU 7.2 looks for SeaBIOS in its own data directory (Debian's
	# qemu-system-data 7.2 links it there; QEMU 10 finds /usr/share/seabios).
	local f
	for f in /usr/share/seabios/*; do
		[[ -e $dir/root/usr/share/qemu/${f##*/} ]] || ln -s "$f" "$dir/root/usr/share/qemu/"
	done
	cat >"$REPLY" <<'WRAPPER'
#!/bin/sh
d=$(dirname "$(readlink -f "$0")")
QEMU_MODULE_DIR=$d/root/usr/lib/x86_64-linux-gnu/qemu exec "$d/root/usr/bin/qemu-system-x86_64" -L "$d/root/usr/share/qemu" "$@"
WRAPPER
	chmod 0755 "$REPLY"
	"$REPLY" --version | grep -q '^QEMU emulator version 7[.]2' ||
		hk_die "the unpacked QEMU 7.2 in $dir does not run (missing shared libraries?)"
}

# hk_build_deps  installs what `cargo build` needs beyond the Rust toolchain:
# libclang for the bindgen run of userfaultfd-sys (the userfaultfd crate's
# kernel bindings, used by the display's write-protect tracker).
hk_build_deps() {
	compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null ||
		hk_need libclang-dev:/nonexistent/libclang
}

# Functions below that may run apt-get update return their result in REPLY
# rather than on stdout: a $(...) subshell would forget that the update ran.

# hk_apt_field PKG FIELD  sets REPLY to FIELD of PKG's candidate version, from
# the local apt lists (running apt-get update first if they do not know PKG).
# apt-cache is slow here (~0.8 s a call: the Docker-style apt config disables
# apt's binary cache), so each package is looked up once per run, against a
# private binary cache in build/apt that apt rebuilds when the lists change.
declare -A _hk_apt_record=()
hk_apt_field() {
	local pkg=$1
	if [[ -z ${_hk_apt_record[$pkg]:-} ]]; then
		mkdir -p "$HK_BUILD/apt"
		local cache=(-o "Dir::Cache::pkgcache=$HK_BUILD/apt/pkgcache.bin")
		_hk_apt_record[$pkg]=$(apt-cache "${cache[@]}" show --no-all-versions "$pkg" 2>/dev/null) || true
		if [[ -z ${_hk_apt_record[$pkg]} ]]; then
			hk_apt_update
			_hk_apt_record[$pkg]=$(apt-cache "${cache[@]}" show --no-all-versions "$pkg" 2>/dev/null) ||
				hk_die "no Debian package $pkg"
		fi
	fi
	REPLY=$(sed -n "s/^$2: //p" <<<"${_hk_apt_record[$pkg]}" | head -n1)
}

# hk_deb_path PKG DIR  sets REPLY to where PKG's candidate .deb is, or would
# be, in DIR: the name apt-get download gives it (an epoch "1:" becomes "1%3a").
hk_deb_path() {
	local pkg=$1 dir=$2 ver
	hk_apt_field "$pkg" Version; ver=$REPLY
	hk_apt_field "$pkg" Architecture
	REPLY=$dir/${pkg}_${ver//:/%3a}_${REPLY}.deb
}

# hk_fetch_deb PKG DIR  makes sure PKG's candidate .deb is in DIR, and sets
# REPLY to its path. Before downloading, the apt lists are refreshed (and the
# candidate looked up again), so a stale list never asks for a file the
# archive has dropped.
hk_fetch_deb() {
	local pkg=$1 dir=$2
	hk_deb_path "$pkg" "$dir"
	[[ -f $REPLY ]] && return 0
	hk_apt_update
	hk_deb_path "$pkg" "$dir"
	[[ -f $REPLY ]] && return 0
	local deb=$REPLY ver
	hk_apt_field "$pkg" Version; ver=$REPLY
	mkdir -p "$dir"
	hk_log "downloading $pkg $ver"
	# Sandbox::User=root: apt's _apt user may not write into build/.
	(cd "$dir" && hk_quiet apt-get download -qq -o APT::Sandbox::User=root "$pkg=$ver") ||
		hk_die "apt-get download $pkg=$ver failed"
	[[ -f $deb ]] || hk_die "apt-get download did not produce $deb"
	REPLY=$deb
}

# hk_unpack_deb DEB DIR  unpacks DEB into DIR (replacing DIR) unless DIR already
# holds exactly this DEB; a stamp file records which .deb DIR came from.
hk_unpack_deb() {
	local deb=$1 dir=$2
	[[ -f $dir/.hk-deb && $(<"$dir/.hk-deb") == "$(basename "$deb")" ]] && return 0
	rm -rf "$dir"
	mkdir -p "$dir"
	dpkg -x "$deb" "$dir"
	basename "$deb" >"$dir/.hk-deb"
}
