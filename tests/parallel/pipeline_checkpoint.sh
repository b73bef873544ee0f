#!/usr/bin/env bash
# Pipeline checkpoints are whole-model: a run saved by 2 pipeline stages resumes on 1
# device and on 2 stages, one saved on 1 device resumes on 2 stages, and one saved by two
# data-parallel copies of the pipeline (-np 4) resumes on 1 device and on 2 stages, with
# the losses of a run that never stopped (bit-identical when the resumed run has the
# stopped one's -np: each stage's optimizer states reached the checkpoint). The copies
# save and resume with ZeRO stage 1 (each stage's states in two slices) and stage 3 (its
# parameters as well). Stage groups of
# 1 + 2 devices (-np 3) save and resume the same way.
# usage: pipeline_checkpoint.sh EPL WORKDIR SCRIPT
set -euo pipefail
epl=$1 work=$2 script=$(realpath "$3")
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
sed 's|^  seed = 3|  seed = 3\n  checkpoint = { dir = "ck", every = 5 }|' "$script" > ck.epl
grep -q 'dir = "ck"' ck.epl || fail "no checkpoint setting added"
sed '0,/replicate {/s//replicate(1) {/; 0,/  replicate {/s//  replicate(2) {/' ck.epl > groups.epl
grep -q 'replicate(2) {' groups.epl || fail "no stage group of 2 devices"
model=ck.epl
run() { # NAME ARGS...: a run of $model into ck, its metrics in NAME.jsonl
  local name=$1; shift
  "$epl" run "$model" "$@" --metrics "$name.jsonl" > "$name.out" 2>&1 ||
    { cat "$name.out"; fail "$name: epl run $*"; }
}
run whole1 -np 1 && rm -rf ck
run whole2 -np 2 && rm -rf ck
run whole4 -np 4 && rm -rf ck
run half2 -np 2 --stop-after 10
ls ck | grep -qx step-00000010 || fail "no checkpoint at step 10"
cp -r ck ck2
run rest1 -np 1 --resume
rm -rf ck && mv ck2 ck
run rest2 -np 2 --resume
rm -rf ck
run half1 -np 1 --stop-after 10
run rest1to2 -np 2 --resume
rm -rf ck
# ZeRO stage 1 with the slices on disk: each stage's first rank gathers them from the files.
run half4 -np 4 --set policy.zero=1 --set policy.offload=optimizer --set policy.offload_to=disk \
  --stop-after 10
grep -q "each rank holds 1/2 (ZeRO stage 1)" half4.out || { cat half4.out; fail "ZeRO"; }
grep -q "optimizer states: in a file in" half4.out || { cat half4.out; fail "offload"; }
cp -r ck ck4 && cp -r ck ck4b
run rest4to1 -np 1 --resume
rm -rf ck && mv ck4 ck
run rest4to2 -np 2 --resume
rm -rf ck && mv ck4b ck
run rest4 -np 4 --set policy.zero=1 --resume
rm -rf ck
# ZeRO stage 3: each stage's parameters in two slices too, gathered whole for the file;
# saved with the slices and states offloaded to disk, resumed in memory.
run whole4z3 -np 4 --set policy.zero=3 && rm -rf ck
run half4z3 -np 4 --set policy.zero=3 --set policy.offload=params --set policy.offload_to=disk \
  --stop-after 10
grep -q "each rank holds 1/2 (ZeRO stage 3)" half4z3.out || { cat half4z3.out; fail "ZeRO 3"; }
grep -q "the parameters' ZeRO slice and the optimizer states" half4z3.out ||
  { cat half4z3.out; fail "offload = params"; }
cp -r ck ck4z3
run rest4z3to1 -np 1 --resume
rm -rf ck && mv ck4z3 ck
run rest4z3 -np 4 --set policy.zero=3 --resume
rm -rf ck
model=groups.epl
run half3 -np 3 --stop-after 10
cp -r ck ck3
run rest3to1 -np 1 --resume
rm -rf ck && mv ck3 ck
run rest3 -np 3 --resume
rm -rf ck
run half1g -np 1 --stop-after 10
run rest1to3 -np 3 --resume
/usr/bin/python3 - <<'PY'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "step_seconds" in r}
whole1, whole2, whole4 = losses("whole1.jsonl"), losses("whole2.jsonl"), losses("whole4.jsonl")
worst = 0
for name in ("half2", "rest1", "rest2", "half1", "rest1to2", "whole4", "half4", "rest4to1",
             "rest4to2", "rest4", "whole4z3", "half4z3", "rest4z3to1", "rest4z3", "half3", "rest3to1", "rest3", "half1g", "rest1to3"):
    for step, loss in losses(name + ".jsonl").items():
        worst = max(worst, abs(loss - whole1[step]) / abs(whole1[step]))
rest2 = losses("rest2.jsonl")
print(f"resumed steps {min(rest2)}..{max(rest2)}; worst relative difference {worst:.2e}")
if min(rest2) != 11 or worst > 1e-5:
    sys.exit(1)
if any(rest2[s] != whole2[s] for s in rest2):
    sys.exit("FAIL: -np 2 resumed on -np 2 is not bit-identical to -np 2 that never stopped")
rest4 = losses("rest4.jsonl")
if min(rest4) != 11 or any(rest4[s] != whole4[s] for s in rest4):
    sys.exit("FAIL: -np 4 resumed on -np 4 is not bit-identical to -np 4 that never stopped")
rest4z3, whole4z3 = losses("rest4z3.jsonl"), losses("whole4z3.jsonl")
if min(rest4z3) != 11 or any(rest4z3[s] != whole4z3[s] for s in rest4z3):
    sys.exit("FAIL: ZeRO-3 -np 4 resumed on -np 4 is not bit-identical to one that never stopped")
PY
echo PASS
