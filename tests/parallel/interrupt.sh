#!/usr/bin/env bash
# Stopping `epl run -np 2` with a signal: sent to the launcher (which mpirun does not
# forward as such) or to one rank, every rank stops after the same step, rank 0 writes a
# checkpoint of it, and the job exits 128 + the signal with how to resume. No rank outlives
# the job. usage: interrupt.sh EPL WORKDIR
set -uo pipefail
set -m # background jobs keep SIGINT (without job control, bash starts them ignoring it)
epl=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
fail=0
head -c 200000 /usr/share/games/fortunes/cookie > corpus.txt
cp "$here/../training/endless_lm.epl" lm.epl

# The pid of rank R of the running job (found by its environment).
rank_pid() {
  for p in $(pgrep -f "epl run lm.epl" || true); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
      echo "$p"
      return
    fi
  done
}
# run_and_signal NAME RC TARGET SIGNAL: starts a 2-rank job into ck-NAME, sends SIGNAL to
# TARGET (`launcher` or a rank number) once 3 steps are trained, and checks the end.
run_and_signal() {
  local name=$1 want=$2 target=$3 sig=$4 rc=0 pid
  "$epl" run lm.epl -np 2 --metrics "$name.jsonl" \
    --set "train.checkpoint={dir=\"ck-$name\", every=1000000}" > "$name.out" 2>&1 &
  local job=$!
  for _ in $(seq 900); do
    [ "$(cat "$name.jsonl" 2>/dev/null | grep -c step_seconds)" -ge 3 ] && break
    sleep 0.1
  done
  pid=$job
  [ "$target" = launcher ] || pid=$(rank_pid "$target")
  [ -n "$pid" ] || { echo "FAIL $name: no rank $target"; cat "$name.out"; fail=1; return; }
  kill -"$sig" "$pid"
  (sleep 60 && kill -KILL "$job" $(rank_pid 0) $(rank_pid 1)) 2>/dev/null &
  local dog=$!
  disown "$dog"
  wait "$job" || rc=$?
  kill -- -"$dog" 2>/dev/null
  local n folder
  n=$(grep -o '"step":[0-9]*,"step_seconds"' "$name.jsonl" | tail -1 | tr -dc 0-9)
  folder=$(printf "ck-%s/step-%08d" "$name" "$n")
  if [ "$rc" != "$want" ]; then
    echo "FAIL $name: exit $rc, want $want"; cat "$name.out"; fail=1
  elif ! grep -Eq "after step $n of 1000000" "$name.out" ||
    ! grep -q "epl run lm.epl -np 2 --resume" "$name.out"; then
    echo "FAIL $name: no stop after step $n, or no resume command"; cat "$name.out"; fail=1
  elif [ ! -f "$folder/manifest.json" ]; then
    echo "FAIL $name: no $folder; ck-$name holds $(ls "ck-$name")"; cat "$name.out"; fail=1
  else
    echo "ok   $name: exit $rc, $folder"
  fi
  sleep 0.5
  if pgrep -f "epl run lm.epl" > /dev/null; then echo "FAIL $name: processes left"; fail=1; fi
}

run_and_signal launcher-int 130 launcher INT
run_and_signal launcher-hup 129 launcher HUP
run_and_signal rank1-term 143 1 TERM
# The checkpoint of the 2-rank job resumes (on one rank here, to be quick).
n=$(grep -o '"step":[0-9]*,"step_seconds"' launcher-int.jsonl | tail -1 | tr -dc 0-9)
"$epl" run lm.epl --resume --steps $((n + 1)) \
  --set 'train.checkpoint={dir="ck-launcher-int", every=1000000}' > resumed.out 2>&1 &&
  grep -Eq "resumed from .*step-0*$n \(step $n\)" resumed.out && echo "ok   resumed at step $n" ||
  { echo "FAIL resume"; cat resumed.out; fail=1; }
[ $fail = 0 ] && echo "interrupt -np 2: every rank stops at one step with a checkpoint"
exit $fail
