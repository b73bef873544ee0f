#!/usr/bin/env bash
# `epl run --trace`: a Chrome trace of every step, and a path it cannot write refused before
# step 1. usage: trace.sh EPL WORKDIR
set -euo pipefail
epl=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
head -c 20000 /usr/share/games/fortunes/cookie > corpus.txt
"$epl" data corpus.txt corpus.bin > /dev/null
cat > lm.epl <<'EPL'
import "std/nn.epl"
model lm(tokens: i32[B, 16]) {
  x = embedding(tokens, 256, 16) + positions(16, 16)
  return cross_entropy(linear(layer_norm(x), 256), next(tokens))
}
train lm {
  data = tokens("corpus.bin", seq = 16)
  batch = 8
  optimizer = adamw(lr = 3e-3)
  steps = 100
}
EPL
"$epl" run lm.epl --steps 3 --metrics m.jsonl --trace t.json > run.out
grep -q "trace: t.json (" run.out
/usr/bin/python3 - <<'PY'
import json
t = json.load(open("t.json"))["traceEvents"]
meta = {(e["name"], e["tid"], e["args"]["name"]) for e in t if e["ph"] == "M"}
assert ("process_name", 0, "rank 0 (stage 0)") in meta, meta
assert ("thread_name", 0, "compute") in meta and ("thread_name", 1, "communication") in meta
x = [e for e in t if e["ph"] == "X"]
assert all({"name", "ts", "dur", "pid", "tid", "args"} <= e.keys() for e in x)
assert {e["args"]["step"] for e in x} == {1, 2, 3}, "events of every step"
names = {e["name"].split(" ")[0] for e in x}
assert {"read", "load", "fwd", "bwd", "optimizer"} <= names, names
# Each step reads its batch once, before its first instruction.
reads = [e for e in x if e["name"] == "read"]
assert sorted(e["args"]["step"] for e in reads) == [1, 2, 3], reads
for r in reads:
    first = min(e["ts"] for e in x if e["args"]["step"] == r["args"]["step"] and e is not r)
    assert r["ts"] + r["dur"] <= first + 1, (r, first)
assert all(e["dur"] >= 0 and e["tid"] == 0 for e in x)
# The six parameters lie end to end: one update a step covers them all.
updates = [e for e in x if e["name"] == "optimizer adamw"]
assert len(updates) == 3, f"{len(updates)} updates in 3 steps"
PY
# Under ZeRO stage 1 on two ranks: each rank's one update covers its slice of them all.
"$epl" run lm.epl -np 2 --steps 2 --set policy.zero=1 --trace z.json > zero.out 2>&1 ||
  { cat zero.out; exit 1; }
/usr/bin/python3 - <<'PY'
import json
x = [e for e in json.load(open("z.json"))["traceEvents"] if e["ph"] == "X"]
for pid in (0, 1):
    updates = [e for e in x if e["pid"] == pid and e["name"] == "optimizer adamw"]
    assert len(updates) == 2, f"rank {pid}: {len(updates)} updates in 2 steps"
PY
# A folder that does not exist: refused before the first step.
if "$epl" run lm.epl --steps 3 --metrics m.jsonl --trace nowhere/t.json > bad.out 2> bad.err; then
  echo "a trace into a missing folder was accepted" >&2
  exit 1
fi
grep -q "error: cannot write the trace file \`nowhere/t.json\`: no such file or directory" bad.err
grep -q "help: create its folder" bad.err
! grep -q "step 1" bad.out
echo ok
