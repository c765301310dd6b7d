#!/bin/bash
# In L1: starts `BIN --version` N times, counting the runs that fail and how.
cd /work/main || exit 1
BIN=${BIN:-target/release/hakoniwa}; N=${N:-400}
ok=0; bad=0
for i in $(seq 1 "$N"); do
  out=$("$BIN" --version 2>&1); rc=$?
  if [ "$rc" = 0 ] && [[ $out == hakoniwa* ]]; then ok=$((ok+1)); else bad=$((bad+1)); echo "spawn $i rc=$rc out=${out:0:80}"; fi
done
echo "ok=$ok bad=$bad"
dmesg | grep -c "segfault" | sed 's/^/segfaults in dmesg: /'
dmesg | grep "segfault" | tail -5
