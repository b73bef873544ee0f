#!/usr/bin/env bash
# `epl data` on inputs that are not a text file: each is an error that names it, never a
# success with 0 tokens or an unbounded read.
# Usage: data_cli_test.sh EPL_BINARY
set -u
epl=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

# expect CODE PATTERN ARGS...: run `epl data ARGS`, check the exit code (`fails`: any but 0)
# and that the output contains PATTERN (a fixed string).
expect() {
  local code=$1 pattern=$2
  shift 2
  local out rc
  out=$("$epl" data "$@" 2>&1)
  rc=$?
  local codeOk=0
  if [ "$code" = fails ]; then [ "$rc" != 0 ] && codeOk=1; else [ "$rc" = "$code" ] && codeOk=1; fi
  if [ "$codeOk" != 1 ] || ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAIL: epl data $* -> exit $rc (want $code), output lacks: $pattern"
    echo "$out" | head -5
    failures=$((failures + 1))
  fi
}

printf 'hello' >"$dir/in.txt"
expect 0 "wrote $dir/out.bin (5 tokens)" "$dir/in.txt" "$dir/out.bin"
expect 1 "\`/dev/null\` is empty: there is no text to convert" /dev/null "$dir/null.bin"
expect 1 "\`/dev/zero\` did not end within 256 MiB" /dev/zero "$dir/zero.bin"
expect fails "$dir/missing.txt" "$dir/missing.txt" "$dir/x.bin"
expect fails "$dir" "$dir" "$dir/x.bin"
expect 1 "\`$dir\` is a folder" "$dir/in.txt" "$dir"
expect 1 "\`$dir/no/such/x.bin\`" "$dir/in.txt" "$dir/no/such/x.bin"
# A pipe is read until it ends.
expect 0 "(3 tokens)" <(printf 'abc') "$dir/pipe.bin"
for f in null zero x; do
  [ ! -e "$dir/$f.bin" ] || { echo "FAIL: $f.bin was written"; failures=$((failures + 1)); }
done
[ "$failures" = 0 ] && echo "all passed"
[ "$failures" = 0 ]
