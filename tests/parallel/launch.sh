#!/usr/bin/env bash
# How multi-rank runs start and end: `epl run -np N` through mpirun, `mpirun -np N epl run`
# by hand, --log-all, --mca passed through, plans that do not run data-parallel or do not
# fit the machine refused before any rank allocates, and a checkpoint written with one -np
# resumed with another.
# usage: launch.sh EPL WORKDIR SCRIPT EXAMPLES
set -euo pipefail
epl=$1 work=$2 script=$(realpath "$3") examples=$(realpath "$4")
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "FAIL: $*"; exit 1; }

# By hand: the job's size is the rank count; an -np that disagrees is a usage error.
mpirun -np 2 "$epl" run "$script" --steps 3 --metrics hand.jsonl > hand.out 2>&1 ||
  { cat hand.out; fail "mpirun -np 2 epl run"; }
grep -q "on 2 data-parallel ranks" hand.out || { cat hand.out; fail "not 2 ranks"; }
[ "$(grep -c '"step_seconds"' hand.jsonl)" = 3 ] || fail "hand.jsonl"
rc=0
mpirun -np 2 "$epl" run "$script" -np 4 --steps 3 > np.out 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "a disagreeing -np was accepted"
grep -q -- "-np 4 was given, but this MPI job has 2 ranks" np.out || { cat np.out; fail "message"; }

# By hand, ranks that mpirun bound to fewer cores than their share (one rank bound to one
# core of two or more): a note says so, and how to run unbound; `epl run -np` does not bind.
if [ "$(nproc)" -ge 2 ]; then
  mpirun -np 1 --bind-to core "$epl" run "$script" --steps 1 > bound.out 2>&1 ||
    { cat bound.out; fail "mpirun -np 1 --bind-to core epl run"; }
  grep -q "note: mpirun bound each rank to 1 of this machine's" bound.out ||
    { cat bound.out; fail "no note of the binding"; }
fi

# By hand, a plan too big for the machine: the ranks agree to stop, and one says why.
rc=0
mpirun -np 2 "$epl" run "$(dirname "$examples")/tests/huge_model.epl" > huge.out 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "a plan too big for the machine ran"
[ "$(grep -c "2 ranks on this machine need 32.0 TB of memory" huge.out)" = 1 ] ||
  { cat huge.out; fail "the memory error, once"; }

# Rank 0 alone speaks, unless --log-all; --mca reaches mpirun.
"$epl" run "$script" -np 2 --steps 3 --metrics quiet.jsonl > quiet.out 2>&1
if grep -q "^rank 1: " quiet.out; then fail "rank 1 printed without --log-all"; fi
if grep -q "note: mpirun bound" quiet.out; then fail "epl run -np 2 bound its ranks"; fi
"$epl" run "$script" -np 2 --steps 3 --log-all --mca btl self,vader --metrics all.jsonl \
  > all.out 2>&1 || { cat all.out; fail "--log-all --mca"; }
grep -q "^rank 1: step 3/3" all.out || { cat all.out; fail "rank 1's log"; }
[ "$(grep -c "^trained 3 steps" all.out)" = 1 ] || fail "rank 0's summary"
rc=0
"$epl" run "$script" -np 2 --steps 3 --mca btl no_such_transport > badmca.out 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { cat badmca.out; fail "--mca was not passed to mpirun"; }

# A plan that does not run yet (interleaved model chunks of split widths 2 and 1 on the
# same devices): refused with a reason, before mpirun starts.
rc=0
"$epl" run "$(dirname "$examples")/tests/parallel/chunk_widths.epl" -np 4 > pipe.out 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat pipe.out; fail "chunk_widths.epl -np 4 exited $rc"; }
grep -q "this plan has .*model chunks of split widths 2 (stage 0) and 1" pipe.out ||
  { cat pipe.out; fail "reason"; }
if grep -qi "mpirun" pipe.out; then fail "mpirun was started"; fi

# A checkpoint written by 2 ranks (once, by rank 0) resumes on 4 and on 1, and the losses
# continue as in a run that never stopped; with ZeRO stage 1 on 2 ranks and stage 2 on 4
# (rank 0 gathers the optimizer states' slices, and hands them out again: on 4 ranks, into
# files in a folder of --offload-dir).
sed 's|^  seed = 3|  seed = 3\n  checkpoint = { dir = "ck", every = 5 }|' "$script" > ck.epl
"$epl" run ck.epl -np 1 --metrics whole.jsonl > whole.out 2>&1
rm -rf ck
"$epl" run ck.epl -np 2 --set policy.zero=1 --stop-after 10 --metrics half.jsonl > half.out 2>&1
ls ck | grep -qx step-00000010 || fail "no checkpoint at step 10"
if grep -q "is not applied" half.out; then cat half.out; fail "zero = 1 was not applied"; fi
grep -q "optimizer states: each rank holds 1/2 (ZeRO stage 1)" half.out || { cat half.out; fail "ZeRO"; }
cp -r ck ck1
mkdir -p states
"$epl" run ck.epl -np 4 --set policy.zero=2 --set policy.offload=optimizer \
  --set policy.offload_to=disk --offload-dir states --resume --metrics rest4.jsonl > rest4.out 2>&1 ||
  { cat rest4.out; fail "resume on 4 ranks"; }
grep -q "optimizer states and gradients: each rank holds 1/4 (ZeRO stage 2)" rest4.out ||
  { cat rest4.out; fail "ZeRO stage 2"; }
grep -q "optimizer states: in a file in states" rest4.out || { cat rest4.out; fail "offload"; }
[ -z "$(ls states)" ] || fail "the offloaded states' files were left in their folder"
# A folder that is not there: refused before the first step, naming it.
rc=0
"$epl" run ck.epl -np 2 --set policy.offload=optimizer --set policy.offload_to=disk \
  --offload-dir missing --steps 1 > missing.out 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat missing.out; fail "a missing --offload-dir exited $rc"; }
grep -q "cannot create a file for the offloaded optimizer states in missing" missing.out ||
  { cat missing.out; fail "the missing folder's error"; }
rm -rf ck && mv ck1 ck
"$epl" run ck.epl -np 1 --resume --metrics rest1.jsonl > rest1.out 2>&1 ||
  { cat rest1.out; fail "resume on 1 rank"; }
/usr/bin/python3 - <<'PY'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "step_seconds" in r}
whole = losses("whole.jsonl")
worst = 0
for name in ("half.jsonl", "rest4.jsonl", "rest1.jsonl"):
    for step, loss in losses(name).items():
        worst = max(worst, abs(loss - whole[step]) / abs(whole[step]))
steps = sorted(losses("rest4.jsonl"))
print(f"resumed steps {steps[0]}..{steps[-1]}; worst relative difference {worst:.2e}")
sys.exit(0 if worst <= 1e-5 and steps[0] == 11 else 1)
PY
echo PASS
