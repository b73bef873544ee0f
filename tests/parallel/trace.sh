#!/usr/bin/env bash
# `epl run -np 2 --trace` of a 2-stage pipeline: one Chrome trace with both ranks' events,
# the transfers on the communication track, and the measured bubble in the summary.
# usage: trace.sh EPL WORKDIR SCRIPT
set -euo pipefail
epl=$1 work=$2 script=$(realpath "$3")
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$epl" run "$script" -np 2 --steps 3 --metrics m.jsonl --trace t.json > run.out 2>&1 ||
  { cat run.out; exit 1; }
grep -E "^bubble: measured [0-9.]+% over 3 steps \(schedule: [0-9.]+% in unit costs\)$" run.out
/usr/bin/python3 - <<'PY'
import json
t = json.load(open("t.json"))["traceEvents"]
meta = {(e["pid"], e["args"]["name"]) for e in t if e["name"] == "process_name"}
assert meta == {(0, "rank 0 (stage 0)"), (1, "rank 1 (stage 1)")}, meta
x = [e for e in t if e["ph"] == "X"]
for pid in (0, 1):
    mine = [e for e in x if e["pid"] == pid]
    assert {e["args"]["step"] for e in mine} == {1, 2, 3}, pid
    comm = [e for e in mine if e["name"].startswith(("send ", "recv "))]
    assert comm and all(e["tid"] == 1 for e in comm), pid
    assert any(e["tid"] == 0 and e["name"].startswith("fwd ") for e in mine), pid
PY
echo ok
