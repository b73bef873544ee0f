#!/usr/bin/env bash
# The thread count changes no bit: a GPT (layer_norm, attention, gelu's mlp, cross-entropy;
# a width of 72, so the kernels' vector loops have tails) trains on 1 and on 2 threads to
# the same loss at every step and to the same parameters and optimizer states, byte for
# byte in the step-4 checkpoint (a loss printed in f32 hides a difference in the last bits
# of a gradient). The kernels cut their work by the shapes alone, never by the threads
# (docs/architecture.md). usage: threads.sh EPL WORKDIR
set -euo pipefail
epl=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
head -c 20000 /usr/share/games/fortunes/cookie > corpus.txt
cat > gpt.epl <<'EPL'
import "std/nn.epl"
model gpt(tokens: i32[B, 40]) {
  x = embedding(tokens, 256, 72) + positions(40, 72)
  x = repeat(2) transformer_block(x, 4)
  return cross_entropy(linear(layer_norm(x), 256), next(tokens))
}
train gpt {
  data = text("corpus.txt", seq = 40)
  batch = 24
  optimizer = adamw(lr = 3e-3)
  steps = 4
  clip_grad_norm = 1.0
  eval = none
  checkpoint = { dir = "ckpt", every = 4 }
  seed = 5
}
EPL
for t in 1 2; do
  rm -rf ckpt
  "$epl" run gpt.epl --threads $t --metrics threads$t.jsonl > threads$t.out
  grep -o '"loss":[^,]*' threads$t.jsonl > losses$t.txt
  cp ckpt/step-00000004/model.safetensors states$t.safetensors
done
if [ "$(wc -l < losses1.txt)" -ne 4 ]; then
  echo "FAIL: expected 4 steps' losses, got:"; cat losses1.txt; exit 1
fi
if ! cmp -s losses1.txt losses2.txt; then
  echo "FAIL: the losses on 1 and 2 threads differ"; paste losses1.txt losses2.txt; exit 1
fi
if ! cmp -s states1.safetensors states2.safetensors; then
  echo "FAIL: the parameters or optimizer states after 4 steps differ on 1 and 2 threads"
  exit 1
fi
echo "1 and 2 threads: the same losses at each of 4 steps, and the same bytes of every"
echo "parameter and optimizer state after them"
