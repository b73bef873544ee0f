#!/usr/bin/env bash
# Checkpoints of split stages are whole tensors: each rank's pieces of the sharded
# parameters and optimizer states are gathered before rank 0 writes them (from another
# pipeline stage too), and cut again on load, and training goes on after a save with every
# piece in place. A run saved at -np N resumes on 1 device and at -np N, and one saved on
# 1 device resumes at -np N, with the losses of a run that never stopped (bit-identical
# when resumed at the -np that stopped). With W, the script's split(2) also becomes
# split(W) at -np W: a run saved at split 2 resumes at split W, and the other way. The
# save at -np N and its resumption at -np N keep the optimizer states on disk. SETTINGS
# (`--set` arguments, such as a ZeRO stage) apply to every run.
# usage: split_checkpoint.sh EPL WORKDIR SCRIPT N [W] [SETTINGS]
set -euo pipefail
epl=$1 work=$2 script=$(realpath "$3") np=$4 wide=${5:-} settings=${6:-}
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
sed 's|^  seed = 3|  seed = 3\n  checkpoint = { dir = "ck", every = 5 }|' "$script" > ck.epl
grep -q 'dir = "ck"' ck.epl || fail "no checkpoint setting added"
model=ck.epl
run() { # NAME ARGS...: a run of $model into ck, its metrics in NAME.jsonl
  local name=$1; shift
  # shellcheck disable=SC2086 # SETTINGS is a list of arguments
  "$epl" run "$model" "$@" $settings --steps 16 --metrics "$name.jsonl" > "$name.out" 2>&1 ||
    { cat "$name.out"; fail "$name: epl run $*"; }
}
run whole1 -np 1 && rm -rf ck
run whole2 -np "$np" && rm -rf ck
# The optimizer states of these two in a file each rank streams them from (offload_to = disk):
# gathered from it for the save, and written to it on load.
offload="--set policy.offload=optimizer --set policy.offload_to=disk"
run half2 -np "$np" --stop-after 10 $offload
grep -q "optimizer states: in a file in" half2.out || { cat half2.out; fail "offload"; }
ls ck | grep -qx step-00000010 || fail "no checkpoint at step 10"
cp -r ck ck2
run rest1 -np 1 --resume
rm -rf ck && mv ck2 ck
run rest2 -np "$np" --resume $offload
rm -rf ck
run half1 -np 1 --stop-after 10
run rest1to2 -np "$np" --resume
names="whole2 half2 rest1 rest2 half1 rest1to2"
if [ -n "$wide" ]; then
  sed "s/split(2)/split($wide)/" ck.epl > wide.epl
  grep -q "split($wide)" wide.epl || fail "no split($wide)"
  rm -rf ck
  run half2w -np "$np" --stop-after 10
  model=wide.epl run rest2tow -np "$wide" --resume
  rm -rf ck
  model=wide.epl run halfw -np "$wide" --stop-after 10
  run restwto2 -np "$np" --resume
  names="$names half2w rest2tow halfw restwto2"
fi
NAMES="$names" /usr/bin/python3 - <<'PY'
import json, os, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "step_seconds" in r}
whole1, whole2 = losses("whole1.jsonl"), losses("whole2.jsonl")
worst = 0
for name in os.environ["NAMES"].split():
    for step, loss in losses(name + ".jsonl").items():
        worst = max(worst, abs(loss - whole1[step]) / abs(whole1[step]))
rest2 = losses("rest2.jsonl")
print(f"resumed steps {min(rest2)}..{max(rest2)}; worst relative difference {worst:.2e}")
if min(rest2) != 11 or worst > 1e-5:
    sys.exit(1)
if any(rest2[s] != whole2[s] for s in rest2):
    sys.exit("FAIL: -np N resumed on -np N is not bit-identical to -np N that never stopped")
PY
echo PASS
