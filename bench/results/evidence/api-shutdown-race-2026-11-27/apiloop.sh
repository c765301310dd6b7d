#!/bin/sh
# The guest API test (which once lost its shutdown answer) N times in one rig boot.
n=$1; exe=$2
for i in $(seq 1 "$n"); do
  if "$exe" api_describes --ignored --test-threads=1 > /work/main/build/shutdown-race/api-"$3$i".log 2>&1; then echo "run $i pass"; else echo "run $i FAIL"; fi
done
