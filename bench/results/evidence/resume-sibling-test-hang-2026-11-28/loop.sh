#!/bin/bash
# Runs the resume test N times in one L1; keeps every log, dmesg after each failure.
cd /work/main || exit 1
T=target/release/deps/guest_migration-b50d2d8321f66fdd
for i in $(seq 1 "${N:-10}"); do
  s=$(date +%s)
  "$T" a_postcopy_whose_connection_drops_is_resumed_over_a_new_one --ignored --test-threads=1 --nocapture > "build/resume-loop/run-$i.log" 2>&1
  rc=$?
  echo "run $i rc=$rc $(( $(date +%s) - s ))s" >> build/resume-loop/summary.txt
  if [ "$rc" != 0 ]; then dmesg | tail -80 > "build/resume-loop/run-$i.dmesg"; fi
done
