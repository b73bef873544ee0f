#!/usr/bin/env bash
# Comm::abort ends the whole MPI job: rank 1 aborts while the others are blocked in a wait;
# mpirun must end soon, with a non-zero code, and no rank may get past its wait.
# Usage: abort_test.sh MPIEXEC NP TEST_PROGRAM
set -uo pipefail
mpiexec=$1 np=$2 program=$3
output=$(timeout 30 "$mpiexec" -np "$np" --oversubscribe "$program" --abort 2>&1)
code=$?
echo "$output"
if [ "$code" = 0 ] || [ "$code" = 124 ]; then
  echo "FAIL: mpirun exited with $code (expected a non-zero code before the 30 s limit)"
  exit 1
fi
grep -q "rank 1 aborts the job" <<<"$output" || { echo "FAIL: rank 1 did not reach its abort"; exit 1; }
if grep -q "was not stopped" <<<"$output"; then echo "FAIL: a rank outlived the abort"; exit 1; fi
echo "PASS: mpirun exited with $code"
