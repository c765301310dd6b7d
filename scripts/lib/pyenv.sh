# shellcheck shell=bash
# hakoniwa's Python environment (sourced after common.sh, or run directly).
#
# hk_pyenv  makes sure build/pyenv is a virtual environment of Debian's
# python3 holding exactly scripts/python-requirements.txt (matplotlib for
# the benchmarks' figures, vncdotool for the display tests), and sets
# HK_PYTHON to its interpreter. The first call creates it (python3 -m venv;
# python3-venv is installed with apt-get if venv or ensurepip is missing)
# and pip-installs the pinned packages from PyPI; later calls only compare a
# stamp (the hash of the requirements and of the base interpreter) and
# return at once. Concurrent callers wait for each other.
#
# The venv works in the test rig too: L1 sees the host's root read-only and
# the project read-write at the same paths, so build/pyenv/bin/python finds
# the same base interpreter and site-packages there. Create it on the host
# side (before scripts/rig): L1 cannot write the host's system or reach PyPI
# through apt.
#
# Run directly (bash scripts/lib/pyenv.sh), it prepares the venv and prints
# the interpreter's path.

if [[ -z ${HK_BUILD:-} ]]; then
	. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
fi
HK_PYENV=$HK_BUILD/pyenv
HK_PYTHON=$HK_PYENV/bin/python
# Debian's interpreter, not whatever python3 comes first in PATH: the
# project installs what it needs from Debian packages (common.sh).
HK_PYENV_BASE=/usr/bin/python3

# _hk_pyenv_key: what the venv was built from (requirements, base Python,
# and how this file builds it: bump the layout when that changes).
_hk_pyenv_key() {
	{
		echo "layout 2"
		cat "$HK_ROOT/scripts/python-requirements.txt"
		"$HK_PYENV_BASE" -c 'import sys; print(sys.version)'
	} | sha256sum | cut -d' ' -f1
}

hk_pyenv() {
	local stamp=$HK_PYENV/.hk-requirements key
	hk_need python3:"$HK_PYENV_BASE"
	key=$(_hk_pyenv_key)
	if [[ -x $HK_PYTHON && -f $stamp && $(<"$stamp") == "$key" ]]; then
		return 0
	fi
	# Its own lock, not hk_lock: a caller may hold that one.
	local fd
	mkdir -p "$HK_BUILD"
	exec {fd}>"$HK_BUILD/.pyenv.lock"
	flock "$fd"
	if [[ -x $HK_PYTHON && -f $stamp && $(<"$stamp") == "$key" ]]; then
		exec {fd}>&-
		return 0
	fi
	local stdlib
	stdlib=$("$HK_PYENV_BASE" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
	# Debian ships venv's pip bootstrap (ensurepip) in python3-venv.
	if ! "$HK_PYENV_BASE" -c 'import venv, ensurepip' 2>/dev/null; then
		hk_need "python3-venv:$stdlib/ensurepip/__init__.py"
		"$HK_PYENV_BASE" -c 'import venv, ensurepip' 2>/dev/null ||
			hk_die "python3 -m venv does not work even with python3-venv installed"
	fi
	hk_log "creating the Python environment $HK_PYENV (scripts/python-requirements.txt)"
	rm -rf "$HK_PYENV"
	hk_quiet "$HK_PYENV_BASE" -m venv "$HK_PYENV" || hk_die "python3 -m venv $HK_PYENV failed"
	hk_quiet "$HK_PYTHON" -m pip install --quiet --disable-pip-version-check --no-input \
		--require-virtualenv -r "$HK_ROOT/scripts/python-requirements.txt" ||
		hk_die "pip install -r scripts/python-requirements.txt failed"
	# matplotlib's font cache, built once here: its default place (~/.config)
	# is read-only in the rig, and building it there under TCG takes minutes.
	# Users set MPLCONFIGDIR=build/pyenv/mplconfig (bench/spt.py does).
	MPLCONFIGDIR=$HK_PYENV/mplconfig hk_quiet "$HK_PYTHON" -c 'import matplotlib.pyplot' ||
		hk_die "matplotlib does not import in $HK_PYENV"
	echo "$key" >"$stamp"
	exec {fd}>&-
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	set -euo pipefail
	hk_pyenv
	echo "$HK_PYTHON"
fi
