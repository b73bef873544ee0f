#!/usr/bin/env bash
# A GPU machine's checks and benchmarks in one call, most needed first, within a budget of
# seconds (default 480: under the 600 s a call of the device machine may run, and its
# start, out of a session's 15 minutes, leaving time to look at the results): every part
# of tools/gpu_check.sh (kernel families, communicators, unit tests on the devices, the
# training comparisons), then bench/gpu/gpt2.py (GPT-2 124M against PyTorch), then
# a traced GPT-2 step under amp (bench/gpu/trace_ops.py: where the step goes), then
# bench/gpu/small.py (the char GPT and the MLP), then the attention family again under
# compute-sanitizer's memcheck. Each part runs with what is left of the budget and is cut
# there (what it printed so far is kept); a part left less than a minute is skipped, and
# the summary says so. Writes DIR (default gpu-session/): check/ and memcheck/
# (gpu_check.sh's folders), gpt2.txt, trace.txt, small.txt, and summary.txt, a line a part.
# Usage: tools/gpu_session.sh [DIR] [BUDGET_SECONDS]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-session}
budget=${2:-480}
mkdir -p "$out"
out=$(cd "$out" && pwd)
: >"$out/summary.txt"
[ -d .gpu ] || tar xJf .gpu.tar.xz || echo "no GPU bundle (.gpu.tar.xz): tools/gpu_bundle.sh makes it" >>"$out/summary.txt"

part() { # the part's name, then its command, run with what is left of the budget
  local name=$1
  shift
  local left=$((budget - SECONDS))
  if [ "$left" -lt 60 ]; then
    echo "$name: skipped, ${left} s of the budget left" | tee -a "$out/summary.txt"
    return
  fi
  timeout --kill-after=10 "$left" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  local how="exit $rc"
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && how="cut at the budget's end"
  echo "$name: $how, ${SECONDS} s from the start" | tee -a "$out/summary.txt"
}

part check bash tools/gpu_check.sh "$out/check"
# The benchmarks find cuBLAS, NCCL and the bundle's libraries as gpu_check.sh does.
part gpt2 bash -c 'source tools/gpu_env.sh && python3 bench/gpu/gpt2.py .gpu/bin/epl'
# GPT-2 at batch 8 under amp with TF32 products, each instruction timed on the device, summed
# by op (the records' breakdown of 2026-11-29 is of the same run).
part trace bash -c 'source tools/gpu_env.sh && .gpu/bin/epl run bench/gpu/gpt2_124m.epl \
  --device cuda --steps 4 --set train.batch=8 --set policy.amp=bf16 --set policy.matmul=tf32 \
  --trace "$0/trace.json" && python3 bench/gpu/trace_ops.py "$0/trace.json"' "$out"
part small bash -c 'source tools/gpu_env.sh && python3 bench/gpu/small.py .gpu/bin/epl'
part memcheck env EPL_GPU_MEMCHECK=1 EPL_GPU_FAMILIES_ONLY=1 \
  bash tools/gpu_check.sh "$out/memcheck" attention
