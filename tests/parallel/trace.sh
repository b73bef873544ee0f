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
grep -F "trace picture: t.svg (the last traced step)" run.out
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
# The picture: the last traced step, a box per instruction of each rank, well-formed.
import xml.etree.ElementTree as ET
svg = ET.parse("t.svg").getroot()
titles = [r.find("{http://www.w3.org/2000/svg}title").text or "" for r in svg.iter("{http://www.w3.org/2000/svg}rect")
          if r.find("{http://www.w3.org/2000/svg}title") is not None]
for pid in (0, 1):
    assert any(t.startswith(f"rank {pid}: fwd ") for t in titles), pid
    assert any(t.startswith(f"rank {pid}: bwd ") for t in titles), pid
last = [e for e in x if e["args"]["step"] == 3 and e["pid"] == 0]
assert sum(t.startswith("rank 0: ") for t in titles) == len(last), (len(last), len(titles))
PY
echo ok
