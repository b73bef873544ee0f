#!/usr/bin/env bash
# `epl data`, `epl run` (overrides, metrics, log lines), `epl sample` and `epl plan --rank`
# end to end on a tiny char model. usage: run_cli.sh EPL WORKDIR
set -euo pipefail
epl=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
head -c 30000 /usr/share/games/fortunes/cookie > corpus.txt
"$epl" data corpus.txt corpus.bin | grep -q "wrote corpus.bin (30000 tokens)"
[ "$(stat -c %s corpus.bin)" = 60000 ]
cat > lm.epl <<'EPL'
import "std/nn.epl"
model lm(tokens: i32[B, 32]) {
  x = embedding(tokens, 256, 32) + positions(32, 32)
  x = transformer_block(x, 2)
  return cross_entropy(linear(layer_norm(x), 256), next(tokens))
}
train lm {
  data = tokens("corpus.bin", seq = 32)
  batch = 16
  optimizer = adamw(lr = 3e-3)
  steps = 1000
  log_every = 5
  eval = { every = 10, batches = 2 }
  checkpoint = { dir = "ck", every = 10 }
}
EPL
"$epl" run lm.epl --steps 20 --metrics m.jsonl > run.out
grep -q "step 5/20" run.out
grep -q "step 10: validation loss" run.out
grep -q "validation (" run.out
[ "$(grep -c '"step_seconds"' m.jsonl)" = 20 ]
grep -q '"eval_loss"' m.jsonl
grep -q '"eval_final":false' m.jsonl
# The run's header, then steps with their wall-clock time and tokens/s (token data).
head -1 m.jsonl | grep -q '^{"run":{"epl":'
head -1 m.jsonl | grep -q '"script":"lm.epl","script_fnv1a":"[0-9a-f]\{16\}"'
grep -q '"time":[0-9.]*,"tokens_per_s":' m.jsonl
grep -q '"eval_final":true' m.jsonl
grep -q "validation: evaluating .* samples (the whole split" run.out
# The final evaluation: n batches of the global micro-batch, or none.
"$epl" run lm.epl --steps 3 --metrics f2.jsonl --set train.checkpoint=none \
  --set 'train.eval={final = 2}' > f2.out
grep -q "validation: evaluating 32 samples$" f2.out
grep -q "validation (32 samples)" f2.out
if grep -q "step .*: validation" f2.out; then exit 1; fi # `final` alone: no periodic ones
"$epl" run lm.epl --steps 10 --metrics f0.jsonl --set train.checkpoint=none \
  --set 'train.eval={every = 10, final = false}' > f0.out
grep -q "step 10: validation" f0.out
if grep -q "validation (" f0.out; then exit 1; fi
if grep -q '"eval_final":true' f0.jsonl; then exit 1; fi
"$epl" run lm.epl --steps 2 --metrics n.jsonl --set train.checkpoint=none --set train.eval=none \
  > n.out
if grep -q "validation (\|validation:" n.out || grep -q "eval_loss" n.jsonl; then exit 1; fi
ls ck | grep -qx step-00000020
# Synthetic data draws each integer input from what its readers accept: a segment
# embedding of 2 and a 4-class loss train beside a 256-word embedding.
cat > seg.epl <<'EPL'
model m(tokens: i32[B, 8], segments: i32[B, 8], labels: i32[B, 8]) {
  x = embedding(tokens, 256, 16) + embedding(segments, 2, 16)
  return cross_entropy(linear(x, 4), labels)
}
train m { data = synthetic(samples = 64) batch = 8 steps = 2 }
EPL
"$epl" run seg.epl --metrics seg.jsonl > seg.out
grep -q '`segments` below 2, `labels` below 4' seg.out
# ... also through the ops that pick out elements: a [CLS] classifier whose segment ids
# reach their 2-wide embedding through `narrow` and its labels through `select`, beside a
# 256-word embedding, for a few steps (each loss finite).
cat > cls.epl <<'EPL'
model m(tokens: i32[B, 8], segments: i32[B, 9], labels: i32[B, 2]) {
  x = embedding(tokens, 256, 16) + embedding(narrow(segments, 1, 1, 8), 2, 16)
  h = attention(x, 2)
  return cross_entropy(linear(select(h, 1, 0) + mean(h, 1), 3), select(labels, -1, 1))
}
train m { data = synthetic(samples = 64, classes = 256) batch = 8 steps = 4 }
EPL
"$epl" run cls.epl --metrics cls.jsonl > cls.out
grep -q '`segments` below 2, `labels` below 3' cls.out
[ "$(grep -c '"loss":[0-9]' cls.jsonl)" = 4 ]
# Sampling: the prompt, then exactly --length bytes.
"$epl" sample lm.epl --prompt "Hello" --length 40 --seed 1 > s1.txt
[ "$(head -c 5 s1.txt)" = Hello ]
[ "$(($(stat -c %s s1.txt)))" = 46 ] # 5 + 40 + newline
"$epl" sample lm.epl --prompt "Hello" --length 40 --seed 1 | cmp - s1.txt
# A bad override points into its own text; a bad key is named with a suggestion.
if "$epl" run lm.epl --set policy.micro_batchs=2 2> err.txt; then exit 1; fi
grep -q 'unknown policy key `micro_batchs`' err.txt
grep -q -- '--> --set policy.micro_batchs=2:1:10' err.txt
grep -q 'did you mean `micro_batches`' err.txt
# A dotted key sets one argument of a call-shaped setting, keeping the others.
"$epl" run lm.epl --steps 1 --metrics o.jsonl --set train.checkpoint=none \
  --set train.optimizer.weight_decay=0.5 > /dev/null
head -1 o.jsonl | grep -q '"optimizer":{"kind":"adamw","lr":0.003,"weight_decay":0.5}'
if "$epl" check lm.epl --set train.optimizer.lrr=0.1 2> err.txt; then exit 1; fi
grep -q '`adamw` has no argument `lrr`' err.txt
if "$epl" check lm.epl --set train.steps=-3 2> err.txt; then exit 1; fi
grep -q '`steps` must be at least 1, got -3' err.txt
if "$epl" check lm.epl --set steps=3 2> err.txt; then exit 1; fi
grep -q 'cannot read the setting `steps=3`' err.txt
# The instruction stream and memory plan of rank 0.
"$epl" plan lm.epl -np 1 --rank 0 > plan.txt
grep -q "rank 0: one step, 1 micro-batch" plan.txt
grep -q "seed-grad %cross_entropy.grad" plan.txt
grep -q "memory plan:" plan.txt
if "$epl" plan lm.epl -np 1 --rank 3 2> err.txt; then exit 1; fi
grep -q "rank 3 is not in this plan" err.txt
echo "run cli: data, run, sample, overrides and plan --rank behave"
