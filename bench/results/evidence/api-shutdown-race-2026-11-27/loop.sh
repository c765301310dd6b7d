#!/bin/bash
# Boots a guest with --api-socket, asks `ctl shutdown`, and records whether
# the answer came, N times per seccomp mode, in one rig boot.
# usage: loop.sh BINARY TAG N
bin=$1; tag=$2; n=$3
out=/work/main/build/shutdown-race/$tag; mkdir -p "$out"
for mode in on off; do
  ok=0; bad=0
  for i in $(seq 1 "$n"); do
    s=/tmp/race-$i.sock; rm -f "$s"
    (tail -f /dev/null | "$bin" run --cpus boot=2 --memory 384M --seccomp $mode --api-socket "$s" > "$out/$mode-$i.out" 2> "$out/$mode-$i.err"; echo "exit $?" >> "$out/$mode-$i.err") &
    for _ in $(seq 1 600); do grep -q 'hakoniwa:/# ' "$out/$mode-$i.out" 2>/dev/null && break; sleep 0.2; done
    if "$bin" ctl --api-socket "$s" shutdown > "$out/$mode-$i.ctl" 2>&1; then ok=$((ok+1)); r=answered; else bad=$((bad+1)); r=UNANSWERED; fi
    for _ in $(seq 1 300); do grep -q '^exit' "$out/$mode-$i.err" && break; sleep 0.1; done
    pkill -f "tail -f /dev/null" 2>/dev/null
    echo "$mode $i $r $(tail -1 "$out/$mode-$i.err") ctl: $(cat "$out/$mode-$i.ctl")"
  done
  echo "SUMMARY $tag seccomp=$mode answered=$ok unanswered=$bad of $n"
done
