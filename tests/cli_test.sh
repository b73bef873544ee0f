#!/usr/bin/env bash
# The `epl` command line as a user meets it: exit codes, help, version, -np spelling.
# Usage: cli_test.sh EPL_BINARY SOURCE_DIR
set -u
epl=$1
src=$2
failures=0
passed=0

# expect CODE PATTERN -- ARGS...: run epl ARGS, check the exit code and that the combined
# output contains PATTERN (a fixed string).
expect() {
  local code=$1 pattern=$2
  shift 3
  local out rc
  out=$("$epl" "$@" 2>&1)
  rc=$?
  if [ "$rc" != "$code" ] || ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAIL: epl $* -> exit $rc (want $code), output lacks: $pattern"
    echo "$out" | head -20
    failures=$((failures + 1))
  else
    passed=$((passed + 1))
  fi
}

expect 0 "Usage: epl [OPTIONS] SUBCOMMAND" -- --help
expect 0 "Usage: epl plan [OPTIONS] script" -- plan --help
expect 0 "--print-after" -- check --help
expect 0 "epl 0.1.0" -- --version
expect 2 "unknown command \`frob\`" -- frob
expect 2 "A subcommand is required" --
expect 2 "File does not exist" -- check "$src/no/such.epl"
expect 2 "Value 0 not in range" -- plan "$src/examples/gpt_char.epl" -np 0
expect 2 "not in {shape-inference" -- plan "$src/examples/gpt_char.epl" --print-after nosuch
expect 0 "on 8 devices" -- plan "$src/examples/gpt_char.epl" -np 8
expect 0 "on 8 devices" -- plan "$src/examples/gpt_char.epl" -np=8
expect 0 "on 8 devices" -- plan "$src/examples/gpt_char.epl" --np 8
expect 0 "pass timing:" -- plan "$src/examples/gpt_char.epl" -np 8 --time-passes
expect 0 "// ----- IR after stage-partition -----" -- plan "$src/examples/gpt_char.epl" --print-after stage-partition
expect 0 "module @gpt" -- plan "$src/examples/gpt_char.epl" -np 4 --ir
expect 1 "error: -np 6 is not a multiple of the 4 devices" -- check "$src/examples/gpt_char.epl" -np 6
expect 1 "--> $src/tests/diagnostics/unknown_name.epl:8:22" -- check "$src/tests/diagnostics/unknown_name.epl"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A model far bigger than any machine is an error at `batch`, before anything is allocated.
cat >"$tmp/huge.epl" <<'EOF'
model big(x: f32[B, 1000000], y: f32[B, 1000000]) {
  return mse(linear(x, 1000000), y)
}
train big {
  data = synthetic(samples = 64)
  batch = 8
  optimizer = adam(lr = 1e-3)
}
EOF
expect 1 "error: the plan needs 16.0 TB of memory, and this machine has" -- run "$tmp/huge.epl"
expect 1 "--> $tmp/huge.epl:6:3" -- run "$tmp/huge.epl"
expect 1 "error: the plan's 2 ranks on this machine need 32.0 TB of memory" -- run "$tmp/huge.epl" -np 2

# `epl check` on a good script prints nothing at all.
out=$("$epl" check "$src/examples/gpt_char.epl" 2>&1)
if [ -n "$out" ]; then
  echo "FAIL: epl check on a good script printed: $out"
  failures=$((failures + 1))
else
  passed=$((passed + 1))
fi

echo "$passed passed, $failures failed"
[ "$failures" = 0 ]
