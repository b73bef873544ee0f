#!/usr/bin/env bash
# Compile time against depth: `epl check` of a model of k repeated blocks with a train
# block, for k up to the language's limit of 100000. Every pass should be near linear in
# k, so the time per block should stay about flat as k grows.
# Usage: bench/repeat_depth.sh [EPL_BINARY] [BLOCK]   (BLOCK: small | transformer)
set -euo pipefail
epl=${1:-build/epl}
block=${2:-small}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

script() { # script K: a model of K blocks, on stdout
  if [ "$block" = transformer ]; then
    cat <<EOS
import "std/nn.epl"
model m(tokens: i32[B, 8]) {
  x = embedding(tokens, 16, 8)
  x = repeat($1) transformer_block(x, 2)
  return cross_entropy(linear(layer_norm(x), 16), next(tokens))
}
EOS
  else
    cat <<EOS
def block(x: f32[B, 16]) -> f32[B, 16] {
  return x + relu(linear(x, 16))
}
model m(x: f32[B, 16], y: f32[B, 16]) {
  return mse(repeat($1) block(x), y)
}
EOS
  fi
  echo 'train m { data = synthetic(samples = 64)  batch = 4  optimizer = adamw(lr = 1e-3) }'
}

depths="1000 4000 10000 40000 100000"
# 100000 transformer blocks pass the limit of 2,000,000 ops.
[ "$block" = transformer ] && depths="1000 4000 10000 40000"
printf "%-8s %10s %14s\n" k seconds "us per block"
for k in $depths; do
  script "$k" >"$dir/m.epl"
  start=$(date +%s.%N)
  "$epl" check "$dir/m.epl"
  end=$(date +%s.%N)
  awk -v k="$k" -v s="$start" -v e="$end" \
    'BEGIN { printf "%-8d %10.2f %14.1f\n", k, e - s, (e - s) / k * 1e6 }'
done
