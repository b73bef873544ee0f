#!/usr/bin/env bash
# A run stopped after step 7 and resumed must give the same loss, bit for bit, at every
# step as a run that was never stopped; and a resumed run must refuse a checkpoint whose
# shapes do not match the model. usage: resume.sh EPL WORKDIR
set -euo pipefail
epl=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
head -c 20000 /usr/share/games/fortunes/cookie > corpus.txt
cat > gpt.epl <<'EPL'
import "std/nn.epl"
model gpt(tokens: i32[B, 32]) {
  x = embedding(tokens, 256, 32) + positions(32, 32)
  x = transformer_block(dropout(x, p = 0.1), 4)
  return cross_entropy(linear(layer_norm(x), 256), next(tokens))
}
policy { micro_batches = 2 }
train gpt {
  data = text("corpus.txt", seq = 32)
  batch = 16
  optimizer = adamw(lr = 3e-3)
  lr_schedule = cosine(warmup = 2)
  steps = 15
  clip_grad_norm = 1.0
  checkpoint = { dir = "ckpt", every = 5, keep = 2 }
  seed = 9
}
EPL
losses() { grep -o '"loss":[^,]*' "$1"; }
"$epl" run gpt.epl --metrics straight.jsonl > /dev/null
mv ckpt ckpt-straight
"$epl" run gpt.epl --stop-after 7 --metrics resumed.jsonl > /dev/null
"$epl" run gpt.epl --resume --metrics resumed.jsonl > resumed.out
grep -q "resumed from .*step-00000007 (step 7)" resumed.out
[ "$(grep -c '^{"run":' resumed.jsonl)" = 2 ] # a header per run, the second marks where
grep -q '"resumed_at_step":7' resumed.jsonl
if ! diff <(losses straight.jsonl) <(losses resumed.jsonl); then
  echo "FAIL: the resumed run's losses differ from the straight run's"; exit 1
fi
ls ckpt | tr '\n' ' ' | grep -qx "step-00000010 step-00000015 " || { echo "FAIL: keep = 2 left $(ls ckpt)"; exit 1; }
# The final weights are the same bytes too.
cmp ckpt/step-00000015/model.safetensors ckpt-straight/step-00000015/model.safetensors
echo "resume: 15 steps, losses and final weights identical"

# A pipeline whose second stage has batch_norm: its running statistics have no optimizer
# states in the checkpoint, and rank 0, which reads it, does not hold them (a resume
# stopped on an internal error there). Resumed at -np 2, the same losses.
cat > bn_pipeline.epl <<'EPL'
model net(x: f32[B, 1, 8, 8], y: i32[B]) {
  replicate { h = relu(conv2d(x, 4, 3, padding = 1)) }
  replicate {
    h = relu(batch_norm(conv2d(h, 4, 3, padding = 1, bias = false)))
    loss = cross_entropy(linear(flatten(h), 8), y)
  }
  return loss
}
policy { micro_batches = 2 }
train net {
  data = synthetic(samples = 64, classes = 8)
  batch = 16
  optimizer = adamw(lr = 1e-2)
  steps = 6
  checkpoint = { dir = "ckpt-bn", every = 3 }
}
EPL
"$epl" run bn_pipeline.epl -np 2 --metrics bn-straight.jsonl > /dev/null
rm -rf ckpt-bn
"$epl" run bn_pipeline.epl -np 2 --stop-after 3 --metrics bn-resumed.jsonl > /dev/null
"$epl" run bn_pipeline.epl -np 2 --resume --metrics bn-resumed.jsonl > bn-resumed.out
grep -q "resumed from .*step-00000003 (step 3)" bn-resumed.out
if ! diff <(losses bn-straight.jsonl) <(losses bn-resumed.jsonl); then
  echo "FAIL: the resumed pipeline's losses differ from the straight run's"; exit 1
fi
echo "resume: a pipeline with batch_norm in its second stage at -np 2, losses identical"
