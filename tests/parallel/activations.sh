#!/usr/bin/env bash
# The runtime's account of activations in flight on a 4-stage pipeline with 8 micro-batches:
# stage 0 holds at most p = 4 micro-batches under 1f1b and zb, all m = 8 under gpipe, and every
# stage's measured peak is the slots its plan gave it.
# usage: activations.sh EPL WORKDIR SCRIPT
set -euo pipefail
epl=$1 work=$2 script=$(realpath "$3")
rm -rf "$work" && mkdir -p "$work" && cd "$work"
for case in gpipe:8 1f1b:4 zb:4; do
  schedule=${case%%:*} want=${case##*:}
  "$epl" run "$script" -np 4 --steps 2 --set policy.schedule="$schedule" \
    --set policy.micro_batches=8 > "$schedule.out" 2>&1 || { cat "$schedule.out"; exit 1; }
  line=$(grep "^activations: " "$schedule.out") || { cat "$schedule.out"; exit 1; }
  echo "$schedule: $line"
  [[ $line == "activations: stage 0 measured $want micro-batches "* ]] ||
    { echo "FAIL: $schedule: stage 0 should hold $want micro-batches"; exit 1; }
  /usr/bin/python3 - "$line" <<'PY'
import re, sys
stages = re.findall(r"stage (\d) measured (\d+) micro-batch(?:es)? \(([^)]*)\), planned (\d+) \(([^)]*)\)",
                    sys.argv[1])
assert len(stages) == 4, stages
for s, measured, mbytes, planned, pbytes in stages:
    assert measured == planned and mbytes == pbytes, (s, measured, planned)
PY
done
echo ok
