# shellcheck shell=bash
# Helpers of scripts/build-guest-debian (sourced after common.sh): the Debian
# mirror from the machine's own apt sources, and a reproducible ext4 image
# of a directory tree.

# hk_debian_mirror SUITE  sets REPLY to the archive URI apt on this machine
# uses for SUITE's main component: the first `deb` source, in apt's order
# (sources.list, then sources.list.d/*.list and *.sources by name), whose
# suites include SUITE exactly and whose components include main. Both the
# one-line format and deb822 (.sources, `Enabled: no` skipped) are read.
# $HK_DEBIAN_MIRROR, when set, is the answer instead; $HK_APT_ETC replaces
# /etc/apt (for tests). The repository names no host: the mirror is the
# machine's.
hk_debian_mirror() {
	local suite=$1
	if [[ -n ${HK_DEBIAN_MIRROR:-} ]]; then
		REPLY=${HK_DEBIAN_MIRROR%/}
		return 0
	fi
	local etc=${HK_APT_ETC:-/etc/apt} files=() f
	[[ -f $etc/sources.list ]] && files+=("$etc/sources.list")
	for f in "$etc"/sources.list.d/*; do
		[[ -f $f && ( $f == *.list || $f == *.sources ) ]] && files+=("$f")
	done
	REPLY=
	((${#files[@]})) && REPLY=$(awk -v suite="$suite" '
		function has(list, word,   n, i, w) {
			n = split(list, w, /[ \t]+/)
			for (i = 1; i <= n; i++) if (w[i] == word) return 1
			return 0
		}
		function pick(types, uris, suites, comps,   u) {
			if (!has(types, "deb") || !has(suites, suite) || !has(comps, "main")) return
			split(uris, u, /[ \t]+/)
			print u[1]
			found = 1
			exit
		}
		function stanza() {
			if (enabled != "no" && types != "") pick(types, uris, suites, comps)
			types = uris = suites = comps = enabled = ""; field = ""
		}
		FNR == 1 { if (deb822) stanza(); deb822 = (FILENAME ~ /\.sources$/) }
		!deb822 {
			line = $0
			sub(/#.*/, "", line)
			gsub(/\[[^]]*\]/, " ", line) # [arch=amd64 signed-by=...]
			n = split(line, w, /[ \t]+/)
			j = 0
			for (i = 1; i <= n; i++) if (w[i] != "") v[++j] = w[i]
			if (j < 3 || v[1] != "deb") next
			comps = ""
			for (i = 4; i <= j; i++) comps = comps " " v[i]
			pick("deb", v[2], v[3], comps)
			next
		}
		/^[ \t]*#/ { next }
		/^[ \t]*$/ { stanza(); next }
		/^[ \t]/ { next } # a continued value (a key block, say)
		{
			field = tolower($0); sub(/:.*/, "", field)
			value = $0; sub(/^[^:]*:[ \t]*/, "", value); sub(/[ \t]+$/, "", value)
			if (field == "types") types = value
			else if (field == "uris") uris = value
			else if (field == "suites") suites = value
			else if (field == "components") comps = value
			else if (field == "enabled") enabled = tolower(value)
		}
		END { if (!found && deb822) stanza() }
	' "${files[@]}")
	[[ -n $REPLY ]] ||
		hk_die "no 'deb' source for $suite main in $etc/sources.list or $etc/sources.list.d/ (set HK_DEBIAN_MIRROR=URI)"
	REPLY=${REPLY%/}
}

# hk_release_epoch MIRROR SUITE  sets REPLY to the Date of the suite's
# InRelease file as seconds since 1970: the build's SOURCE_DATE_EPOCH. It
# moves only when the archive publishes the suite anew (a point release).
hk_release_epoch() {
	local mirror=$1 suite=$2 release
	case $mirror in
	file:*) release=$(cat "${mirror#file:}/dists/$suite/InRelease" 2>/dev/null) || true ;;
	*) release=$(wget -q -O - "$mirror/dists/$suite/InRelease") || true ;;
	esac
	local date
	date=$(sed -n 's/^Date: //p' <<<"$release" | head -n1)
	[[ -n $date ]] || hk_die "cannot read the Date of $mirror/dists/$suite/InRelease"
	REPLY=$(date -u -d "$date" +%s) || hk_die "bad Date in $suite's InRelease: $date"
}

# hk_unmount_under DIR  unmounts whatever is mounted at or below DIR (what a
# failed debootstrap leaves behind: its proc and sys), deepest first, so
# that DIR can be removed.
hk_unmount_under() {
	local dir mnt
	dir=$(realpath -m "$1")
	awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts |
		sort -r | while read -r mnt; do
		umount -l "$mnt" || true
	done
}

# hk_ext4_image DIR IMG SIZE_MIB EPOCH UUID LABEL  writes DIR as an ext4 file
# system image IMG (sparse: unused blocks are holes), without mounting
# anything (mkfs.ext4 -d). The same tree, EPOCH and UUID give the same bytes:
#  - the UUID and the directory hash seed are UUID (not random);
#  - mke2fs's own clock is EPOCH (E2FSPROGS_FAKE_TIME: the superblock's
#    times, every inode's crtime, lost+found);
#  - mke2fs -d copies each file's atime, mtime and ctime from DIR. mtimes are
#    the caller's to set; a ctime cannot be set at all, and reading a file
#    moves its atime, so both are set to EPOCH in the image afterwards, with
#    debugfs, for every inode mke2fs filled from DIR (2, the root, and those
#    from 12 on: 11 is lost+found, the rest are reserved);
#  - inodes are created in the order mke2fs reads DIR (sorted by name in
#    e2fsprogs 1.47), not in the host's readdir order.
# Inode tables and the journal are zeroed now (lazy_itable_init=0), so that
# the guest's kernel has no background zeroing to do in a benchmark.
hk_ext4_image() {
	local dir=$1 img=$2 size=$3 epoch=$4 uuid=$5 label=$6
	rm -f "$img"
	truncate -s "${size}M" "$img"
	E2FSPROGS_FAKE_TIME=$epoch mkfs.ext4 -q -F -t ext4 -d "$dir" -U "$uuid" -L "$label" \
		-b 4096 -I 256 -m 0 \
		-E "hash_seed=$uuid,root_owner=0:0,lazy_itable_init=0,lazy_journal_init=0,nodiscard" \
		"$img" || hk_die "mkfs.ext4 -d $dir failed"
	# The used inodes: each group's range less its "Free inodes:" ranges.
	dumpe2fs "$img" 2>/dev/null | awk -v t="$epoch" '
		function stamp(ino) {
			if (ino == 2 || ino >= 12) {
				printf "set_inode_field <%d> ctime @%d\n", ino, t
				printf "set_inode_field <%d> atime @%d\n", ino, t
			}
		}
		/^Inodes per group:/ { ipg = $4 }
		/^Group [0-9]+:/ { group = $2 + 0 }
		/^  Free inodes:/ {
			free = $0
			sub(/^  Free inodes:[ \t]*/, "", free)
			gsub(/[ \t]/, "", free)
			next_ino = group * ipg + 1
			n = split(free, ranges, ",")
			for (i = 1; i <= n; i++) {
				if (ranges[i] == "") continue
				split(ranges[i], r, "-")
				last = (r[2] == "") ? r[1] : r[2]
				for (ino = next_ino; ino < r[1] + 0; ino++) stamp(ino)
				next_ino = last + 1
			}
			for (ino = next_ino; ino <= (group + 1) * ipg; ino++) stamp(ino)
		}
	' >"$img.debugfs"
	E2FSPROGS_FAKE_TIME=$epoch debugfs -w -f "$img.debugfs" "$img" >/dev/null 2>"$img.debugfs.err" ||
		hk_die "debugfs on $img failed: $(cat "$img.debugfs.err")"
	if grep -v '^debugfs [0-9.]* (' "$img.debugfs.err" | grep -q .; then
		hk_die "debugfs on $img: $(grep -v '^debugfs [0-9.]* (' "$img.debugfs.err" | head -n3)"
	fi
	rm -f "$img.debugfs" "$img.debugfs.err"
	e2fsck -fn "$img" >"$img.fsck" 2>&1 || hk_die "$img does not check clean: $(tail -n5 "$img.fsck")"
	rm -f "$img.fsck"
}

# hk_tree_digest DIR  prints one sha256 over DIR's tree: every path (sorted
# bytewise) with its type, mode, owner, size (not a directory's: that
# depends on the host file system), mtime and link target, then every
# regular file's content hash. It is what a reproducible build must
# reproduce, whatever the image's bytes do.
hk_tree_digest() {
	(
		cd "$1" || exit 1
		find . -printf '%P\t%y\t%m\t%U:%G\t%s\t%T@\t%l\n' |
			awk -F '\t' -v OFS='\t' '$2 == "d" { $5 = "-" } 1' | LC_ALL=C sort
		find . -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum
	) | sha256sum | cut -d' ' -f1
}
