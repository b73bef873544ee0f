#!/usr/bin/env bash
# Builds EPL and runs every test: the normal build, then the whole suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer, then each fuzz harness for a short while
# (docs/fuzzing.md). Installs missing Debian packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# The tests' runs compare no prediction with their step times: a calibration of this
# machine (`epl calibrate`) is not read; the tests of calibration set their own.
export EPL_CLUSTER_HERE=/nonexistent/epl-tests-here.json

bash tools/setup.sh build
(cd build && ctest --output-on-failure -j "$jobs")

if [ "${EPL_SKIP_SANITIZERS:-0}" != 1 ]; then
  # The CUDA device is built and tested by the normal build; the sanitizers see host code.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DEPL_SANITIZE=ON -DEPL_CUDA=OFF >/dev/null
  cmake --build build-asan
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j "$jobs")
fi

# Each libFuzzer harness for EPL_FUZZ_SECONDS (20) from its seeds and the corpus kept in
# build-fuzz/; a finding fails the run.
if [ "${EPL_SKIP_FUZZ:-0}" != 1 ]; then
  bash tools/fuzz.sh --time "${EPL_FUZZ_SECONDS:-20}" --jobs "$jobs"
fi
