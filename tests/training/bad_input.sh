#!/usr/bin/env bash
# Bad input to `epl run`: each gives a clear error naming the file (or the step) at the
# script's setting, exits non-zero, and leaves what was already written untouched.
# usage: bad_input.sh EPL WORKDIR
set -uo pipefail
epl=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
fail=0
# expect NAME RC PATTERN... -- ARGS: run epl, check the exit code and that stderr has each
# pattern (grep -E).
expect() {
  local name=$1 want=$2; shift 2
  local pats=()
  while [ "$1" != -- ]; do pats+=("$1"); shift; done
  shift
  "$epl" "$@" > out.txt 2> err.txt
  local rc=$?
  if [ "$rc" != "$want" ]; then echo "FAIL $name: exit $rc, want $want"; cat err.txt; fail=1; return; fi
  for p in "${pats[@]}"; do
    grep -Eq -- "$p" err.txt || { echo "FAIL $name: no /$p/ in:"; cat err.txt; fail=1; return; }
  done
  echo "ok   $name"
}
fashion=/usr/share/datasets/fashion-mnist
cat > idx.epl <<EPL
model net(images: f32[B, 1, 28, 28], labels: i32[B]) {
  return cross_entropy(linear(flatten(images), 10), labels)
}
train net {
  data = idx("$fashion/train-images-idx3-ubyte.gz", "$fashion/train-labels-idx1-ubyte.gz")
  batch = 32
  optimizer = sgd(lr = 0.1)
  steps = 3
  checkpoint = { dir = "ck", every = 1 }
}
EPL
expect missing-file 1 'error: `.*/nothing.gz` does not exist' 'idx.epl:5:3|--set' -- \
  run idx.epl --set 'train.data=idx("nothing.gz", "labels.gz")'
head -c 5000 $fashion/train-images-idx3-ubyte.gz > cut.gz
expect truncated-gzip 1 '`.*/cut.gz` is truncated' -- \
  run idx.epl --set "train.data=idx(\"cut.gz\", \"$fashion/train-labels-idx1-ubyte.gz\")"
[ ! -e ck ] || { echo "FAIL: a failed start created the checkpoint dir"; fail=1; }

cat > tok.epl <<'EPL'
model lm(tokens: i32[B, 8]) {
  return cross_entropy(linear(embedding(tokens, 256, 16), 256), next(tokens))
}
train lm { data = tokens("odd.bin", seq = 8) batch = 4 steps = 2 }
EPL
head -c 1001 /usr/share/games/fortunes/cookie > odd.bin
expect odd-token-file 1 '`.*/odd.bin`.*odd' 'tok.epl:4' -- run tok.epl

# A NaN loss stops the run naming the step; the checkpoint of step 1 stays as it was.
expect nan-loss 1 'the loss is NaN at step 2' 'no checkpoint was written after step 1' -- \
  run idx.epl --set 'train.optimizer=sgd(lr = 1e38)'
ls ck | grep -qx step-00000001 && [ "$(ls ck | wc -l)" = 1 ] || { echo "FAIL: ck holds $(ls ck)"; fail=1; }
sum=$(md5sum ck/step-00000001/model.safetensors)
# A fresh run into a dir that holds checkpoints refuses, and overwrites nothing.
expect existing-checkpoints 1 '`.*ck` already holds checkpoints' 'pass --resume' -- run idx.epl
[ "$(md5sum ck/step-00000001/model.safetensors)" = "$sum" ] || { echo "FAIL: checkpoint changed"; fail=1; }
# Resuming with a model whose shapes differ names the file and the tensor.
sed 's/linear(flatten(images), 10)/linear(flatten(images), 12)/' idx.epl > wide.epl
expect checkpoint-shape 1 'model.safetensors`: tensor `linear.weight` is F32\[10, 784\], but the model.s is F32\[12, 784\]' -- \
  run wide.epl --resume
# A corrupt safetensors header.
cp -r ck ck-good
printf '\xff\xff\xff\xff\xff\xff\x00\x00' | dd of=ck/step-00000001/model.safetensors bs=1 seek=0 conv=notrunc 2>/dev/null
expect corrupt-header 1 'model.safetensors`' 'idx.epl:9:3' -- run idx.epl --resume
exit $fail
