#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz, clang, in build-san/: the sanitizer build,
# whose tests tools/test.sh runs) and runs each on its corpus, then prints, per harness,
# the executions, executions a second and what it found.
# Usage: tools/fuzz.sh [--time SECONDS | --runs N] [--jobs J] [HARNESS...]
#        tools/fuzz.sh --configure   only configure build-san/
#   --time S   run each harness for S seconds (default 60)
#   --runs N   run each harness for N inputs instead
#   --jobs J   run J harnesses at once (default 1)
#   HARNESS    script, safetensors, manifest, data, lsp (default: all)
# The working corpus is build-san/corpus/<harness>, seeded from tests/fuzz/corpus/<harness>
# (the seeds are never written to); a crash, hang or memory blow-up is saved under
# tests/fuzz/findings/<harness>/ (ignored by git) and makes the script exit 1.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=(-max_total_time=60)
jobs=1
harnesses=()
configure_only=0
while [ $# -gt 0 ]; do
  case $1 in
  --time) limit=(-max_total_time="$2"); shift 2 ;;
  --runs) limit=(-runs="$2"); shift 2 ;;
  --jobs) jobs=$2; shift 2 ;;
  --configure) configure_only=1; shift ;;
  -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
  *) harnesses+=("$1"); shift ;;
  esac
done
[ ${#harnesses[@]} -gt 0 ] || harnesses=(script safetensors manifest data lsp)

# Per harness: the longest input worth mutating. Scripts and sessions need room for a model;
# a checkpoint header or a manifest, much less.
max_len() {
  case $1 in
  script | lsp) echo 4096 ;;
  data) echo 8192 ;;
  *) echo 2048 ;;
  esac
}

# -O1 without NDEBUG: fast enough to fuzz and to run the tests under the sanitizers, with
# every assertion on; line tables are all a sanitizer's report needs of the debug
# information, and a sixth of the compile time less than full -g. A unity build (16 sources
# a compile) builds it in about 60% of the time; docs/fuzzing.md says what it asks of the
# sources.
CC=clang CXX=clang++ cmake -S . -B build-san -G Ninja -DEPL_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 >/dev/null
[ "$configure_only" = 1 ] && exit 0
cmake --build build-san --target epl_fuzzers

# run HARNESS: fuzzes it, its log in build-san/logs/HARNESS.log.
run() {
  local h=$1 dict=()
  mkdir -p "build-san/corpus/$h" "tests/fuzz/findings/$h" build-san/logs
  [ -f "tests/fuzz/$h.dict" ] && dict=(-dict="tests/fuzz/$h.dict")
  # Freed memory stays with the allocator: returning it (madvise) can stall for seconds in
  # a virtual machine and trip the hang timeout.
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ASAN_OPTIONS=detect_leaks=1:allocator_release_to_os_interval_ms=-1 \
    "build-san/fuzz/fuzz_$h" "build-san/corpus/$h" "tests/fuzz/corpus/$h" "${limit[@]}" \
    -max_len="$(max_len "$h")" -timeout=60 -rss_limit_mb=2048 -print_final_stats=1 \
    "${dict[@]}" -artifact_prefix="tests/fuzz/findings/$h/" >"build-san/logs/$h.log" 2>&1
}

# summary HARNESS STATUS: one line from the final stats of its log.
summary() {
  local h=$1 status=$2 log="build-san/logs/$1.log"
  local execs secs rate
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  if [ "$status" = 0 ]; then
    printf '%-12s %12s executions  %8s exec/s  %5s s  no findings\n' "$h" "${execs:-?}" \
      "${rate:-?}" "${secs:-?}"
  else
    printf '%-12s FOUND something (exit %s); see %s and tests/fuzz/findings/%s/\n' "$h" \
      "$status" "$log" "$h"
    grep -m1 -E 'ERROR|SUMMARY|terminate|internal error' "$log" || true
  fi
}

pids=() names=() failed=0
for h in "${harnesses[@]}"; do
  [ -x "build-san/fuzz/fuzz_$h" ] || { echo "unknown harness: $h" >&2; exit 2; }
  run "$h" &
  pids+=($!) names+=("$h")
  # Wait for the oldest run once J are under way.
  if [ ${#pids[@]} -ge "$jobs" ]; then
    status=0
    wait "${pids[0]}" || status=$?
    summary "${names[0]}" "$status"
    [ "$status" = 0 ] || failed=1
    pids=("${pids[@]:1}") names=("${names[@]:1}")
  fi
done
for i in "${!pids[@]}"; do
  status=0
  wait "${pids[$i]}" || status=$?
  summary "${names[$i]}" "$status"
  [ "$status" = 0 ] || failed=1
done
exit "$failed"
