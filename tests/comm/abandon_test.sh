#!/usr/bin/env bash
# A rank frees the buffer of an all-reduce whose wait timed out while the other rank joins
# it late: no crash, and the job ends through that rank's abort with its code (3).
# Usage: abandon_test.sh MPIEXEC TEST_PROGRAM
set -uo pipefail
mpiexec=$1 program=$2
output=$(timeout 30 "$mpiexec" -np 2 --oversubscribe "$program" --abandon 2>&1)
code=$?
echo "$output"
if grep -qiE "signal 11|segmentation fault|signal 6" <<<"$output"; then
  echo "FAIL: a rank crashed"
  exit 1
fi
grep -q "rank 0 outlived the abandoned all-reduce (0 failed checks)" <<<"$output" ||
  { echo "FAIL: rank 0 did not get through its checks"; exit 1; }
[ "$code" = 3 ] || { echo "FAIL: mpirun exited with $code, not rank 0's abort code 3"; exit 1; }
echo "PASS"
