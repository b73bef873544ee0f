#!/usr/bin/env bash
# A multi-rank job never hangs: a rank killed with SIGKILL mid-run, and a rank that stops
# answering (SIGSTOP, so its collectives time out), each end the whole job within 10 s with
# a non-zero exit and a message naming the rank. An error every rank meets is reported once.
# Pipelines alike: a killed rank of a stage group, a stopped stage.
# usage: failures.sh EPL WORKDIR SCRIPT PIPELINE_SCRIPT
set -euo pipefail
epl=$1 work=$2 script=$(realpath "$3") pipeline=$(realpath "$4")
rm -rf "$work" && mkdir -p "$work" && cd "$work"

# The pid of rank R of the job whose metrics file is $1 (found by its environment).
rank_pid() {
  for p in $(pgrep -f "epl run $script" || true); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
      echo "$p"
      return
    fi
  done
}

# Starts a long run of $2 ranks and waits until it has trained a few steps.
start_job() {
  local name=$1 np=$2
  shift 2
  "$epl" run "$script" -np "$np" --steps 100000 --metrics "$name.jsonl" "$@" > "$name.out" 2>&1 &
  job=$!
  for _ in $(seq 600); do
    [ -f "$name.jsonl" ] && [ "$(wc -l < "$name.jsonl")" -ge 3 ] && return
    sleep 0.1
  done
  echo "FAIL: the job did not start training"; cat "$name.out"; exit 1
}

# Waits for the job; checks it ended within 10 s of the fault, non-zero, and printed $1.
expect_end() {
  local name=$1 pattern=$2 began=$3
  local rc=0
  wait "$job" || rc=$?
  local took=$(( $(date +%s%N) / 1000000 - began ))
  echo "$name: exit $rc after ${took} ms"
  [ "$rc" -ne 0 ] || { echo "FAIL: $name: exit 0"; cat "$name.out"; exit 1; }
  [ "$took" -lt 10000 ] || { echo "FAIL: $name: took ${took} ms"; cat "$name.out"; exit 1; }
  grep -qE "$pattern" "$name.out" || { echo "FAIL: $name: no /$pattern/"; cat "$name.out"; exit 1; }
  grep -E "$pattern" "$name.out" | head -3
  # No rank may outlive the job.
  sleep 0.5
  if pgrep -f "epl run $script" > /dev/null; then echo "FAIL: $name: ranks left"; exit 1; fi
}

# Sends SIGNAL to rank RANK of the running job NAME, then expects its end with PATTERN.
fault() {
  local name=$1 rank=$2 signal=$3 pattern=$4
  local victim
  victim=$(rank_pid "$rank")
  [ -n "$victim" ] || { echo "FAIL: $name: rank $rank not found"; exit 1; }
  local began=$(( $(date +%s%N) / 1000000 ))
  kill "-$signal" "$victim"
  expect_end "$name" "$pattern" "$began"
  kill -KILL "$victim" 2>/dev/null || true
}

# 1. SIGKILL rank 2 of 4.
start_job killed 4
fault killed 2 KILL "rank 2.*(killed|signal 9|Killed)"

# 2. SIGSTOP rank 1 of 2: rank 0's collectives time out after comm_timeout seconds.
start_job stopped 2 --set policy.comm_timeout=2
fault stopped 1 STOP "rank 0: .*did not finish within 2 s"

# 3. A missing data file: every rank meets it, rank 0 alone reports it, once.
sed 's|/usr/share/games/fortunes/cookie|missing.txt|' "$script" > missing.epl
rc=0
"$epl" run missing.epl -np 2 > missing.out 2>&1 || rc=$?
[ "$rc" = 1 ] || { echo "FAIL: missing data: exit $rc"; cat missing.out; exit 1; }
[ "$(grep -c "missing.txt" missing.out)" -ge 1 ] || { cat missing.out; exit 1; }
[ "$(grep -c "^error" missing.out)" = 1 ] || { echo "FAIL: not reported once"; cat missing.out; exit 1; }
grep -q -- "--> missing.epl:" missing.out || { echo "FAIL: no location"; cat missing.out; exit 1; }
echo "missing data: one error, exit 1"

# 3b. A refusal every rank meets at the start (batch_norm under ZeRO stage 3 with its
# parameters on disk): rank 0 alone reports it, at the layer, with the setting's place.
rc=0
"$epl" run "$(dirname "$0")/cnn_bn.epl" -np 2 --steps 1 --set policy.zero=3 \
  --set policy.offload=params --set policy.offload_to=disk > bn.out 2>&1 || rc=$?
[ "$rc" = 1 ] || { echo "FAIL: batch_norm offloaded: exit $rc"; cat bn.out; exit 1; }
[ "$(grep -c "^error" bn.out)" = 1 ] || { echo "FAIL: not reported once"; cat bn.out; exit 1; }
grep -q 'with `offload = params` does not keep yet' bn.out &&
  grep -q -- "--> .*cnn_bn.epl:16:23" bn.out && grep -q "note: offloaded here" bn.out ||
  { echo "FAIL: batch_norm offloaded: no such error"; cat bn.out; exit 1; }
echo "batch_norm offloaded: one error, exit 1"

# 4. A pipeline of stage groups 1 + 2 (-np 3): SIGKILL rank 2, one of stage 1's two ranks.
sed '0,/replicate {/s//replicate(1) {/; 0,/  replicate {/s//  replicate(2) {/' "$pipeline" \
  > groups.epl
script=$(realpath groups.epl)
start_job pipeline_killed 3
fault pipeline_killed 2 KILL "rank 2.*(killed|signal 9|Killed)"

# 5. SIGSTOP stage 1 of a 2-stage pipeline: stage 0's transfers time out.
script=$pipeline
start_job pipeline_stopped 2 --set policy.comm_timeout=2
fault pipeline_stopped 1 STOP "rank 0: .*did not finish within 2 s"
echo PASS
