#!/usr/bin/env bash
# `epl repl -c` sessions against their golden output: each tests/repl/NAME.cmd holds the
# arguments (`# ARGS: …`, paths from the source folder) and one command a line; NAME.out
# is what the session prints, standard output then standard error, the source folder
# written as $SRC. EPL_UPDATE_GOLDEN=1 rewrites the .out files from this build.
# Usage: repl_golden.sh EPL_BINARY SOURCE_DIR
set -u
epl=$1
src=$2
export EPL_STDLIB=$src/stdlib
failures=0
for cmd in "$src"/tests/repl/*.cmd; do
  args=$(sed -n 's/^# ARGS: //p' "$cmd")
  commands=$(grep -v '^#' "$cmd" | paste -sd ';')
  read -ra words <<<"$args"
  words[0]=$src/${words[0]}
  out=$(mktemp)
  err=$(mktemp)
  "$epl" repl "${words[@]}" -c "$commands" >"$out" 2>"$err"
  status=$?
  got=$( (cat "$out"; echo "--- standard error ---"; cat "$err"; echo "--- exit $status") |
    sed "s|$src|\$SRC|g")
  rm -f "$out" "$err"
  want=${cmd%.cmd}.out
  if [ "${EPL_UPDATE_GOLDEN:-}" = 1 ]; then
    printf '%s\n' "$got" >"$want"
  elif ! diff -u "$want" <(printf '%s\n' "$got"); then
    echo "FAIL: $cmd (EPL_UPDATE_GOLDEN=1 rewrites $want)"
    failures=$((failures + 1))
  fi
done
[ $failures -eq 0 ] && echo "every session matched"
exit $((failures > 0))
