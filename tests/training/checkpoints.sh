#!/usr/bin/env bash
# A checkpoint folder in use: `keep` removes only checkpoints EPL wrote, oldest step first
# (by number, past step 99,999,999 too); what is loaded is verified (tensor checksums, each
# manifest field against the script and the folder's name); `--set train.checkpoint`
# replaces the whole record; a checkpoint past `steps`, a checkpoint folder or a metrics
# file that cannot be written, and a folder another run holds are errors before the first
# step; a metrics file that fails mid-run is reported. usage: checkpoints.sh EPL WORKDIR
set -uo pipefail
epl=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
fail=0
# expect NAME RC PATTERN... -- ARGS: run epl, check the exit code and that its output
# (stdout and stderr) has each pattern (grep -E). A pattern `!P` must not be there.
expect() {
  local name=$1 want=$2; shift 2
  local pats=()
  while [ "$1" != -- ]; do pats+=("$1"); shift; done
  shift
  timeout 120 "$epl" "$@" > out.txt 2> err.txt
  local rc=$?
  cat out.txt err.txt > all.txt
  if [ "$rc" != "$want" ]; then echo "FAIL $name: exit $rc, want $want"; cat all.txt; fail=1; return; fi
  for p in "${pats[@]}"; do
    if [ "${p:0:1}" = '!' ]; then
      ! grep -Eq -- "${p:1}" all.txt || { echo "FAIL $name: /${p:1}/ in:"; cat all.txt; fail=1; return; }
    else
      grep -Eq -- "$p" all.txt || { echo "FAIL $name: no /$p/ in:"; cat all.txt; fail=1; return; }
    fi
  done
  echo "ok   $name"
}
# holds NAME DIR ENTRIES: DIR holds exactly these entries (EPL's lock file aside).
holds() {
  local got
  got=$(ls -A "$2" 2>/dev/null | grep -v '^\.epl-lock$' | tr '\n' ' ')
  if [ "$got" = "$3 " ]; then echo "ok   $1"; else echo "FAIL $1: $2 holds: $got"; fail=1; fi
}

# edit_manifest FOLDER STATEMENTS: runs the Python statements on `m`, the manifest.
edit_manifest() {
  python3 - "$1" "$2" <<'PY'
import json, sys
path = sys.argv[1] + "/manifest.json"
m = json.load(open(path))
exec(sys.argv[2])
json.dump(m, open(path, "w"), indent=2)
PY
}
# relabel FOLDER STEP: the checkpoint as if written after STEP, moved to STEP's folder.
relabel() {
  python3 - "$1" "$2" <<'PY'
import json, os, struct, sys
folder, step = sys.argv[1], int(sys.argv[2])
m = json.load(open(folder + "/manifest.json"))
m["step"] = m["rng"]["step"] = m["data"]["next_step"] = step
json.dump(m, open(folder + "/manifest.json", "w"), indent=2)
path = folder + "/model.safetensors"
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
header["__metadata__"]["step"] = str(step)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
os.rename(folder, os.path.join(os.path.dirname(folder), "step-%08d" % step))
PY
}
# zero_tensors FILE: every tensor byte of a safetensors file set to 0, the header kept.
zero_tensors() {
  python3 - "$1" <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", data[:8])[0]
data[8 + n:] = bytes(len(data) - 8 - n)
open(sys.argv[1], "wb").write(data)
PY
}

head -c 20000 /usr/share/games/fortunes/cookie > corpus.txt
cat > lm.epl <<'EPL'
model lm(tokens: i32[B, 8]) {
  return cross_entropy(linear(embedding(tokens, 256, 16), 256), next(tokens))
}
train lm {
  data = text("corpus.txt", seq = 8)
  batch = 4
  optimizer = adamw(lr = 1e-2)
  steps = 12
  checkpoint = { dir = "kp", every = 4, keep = 1 }
  seed = 3
}
EPL

# 1. `keep` prunes only what EPL wrote: not a user's `step-best`, `step-00000005.bak`, or a
# `step-00000001` folder without a manifest.
mkdir -p kp/step-best && echo mine > kp/step-best/notes.txt
expect keep-1-spares-step-best 0 'checkpoint: .*kp/step-00000012' -- run lm.epl
holds keep-1-left kp "step-00000012 step-best"
mkdir -p kp2/step-00000005.bak kp2/step-00000001 && touch kp2/step-00000005.bak/a kp2/step-00000001/b
expect keep-2-spares-user-folders 0 -- run lm.epl --set 'train.checkpoint={dir="kp2", every=4, keep=2}'
holds keep-2-left kp2 "step-00000001 step-00000005.bak step-00000008 step-00000012"

# 2. Past step 99,999,999 the names grow a digit: pruning and --resume order by number.
expect steps-1-2 0 -- run lm.epl --steps 2 --set 'train.checkpoint={dir="kp3", every=1, keep=2}'
relabel kp3/step-00000002 99999999
expect past-99999999 0 'resumed from .*kp3/step-99999999 \(step 99999999\)' -- \
  run lm.epl --resume --steps 100000001 --set 'train.checkpoint={dir="kp3", every=1, keep=2}'
holds past-99999999-kept kp3 "step-100000000 step-100000001"
expect resume-newest-by-number 0 'resumed from .*kp3/step-100000001 \(step 100000001\)' -- \
  run lm.epl --resume --steps 100000002 --set 'train.checkpoint={dir="kp3", every=1, keep=2}'

# 3. What is loaded is verified. A good checkpoint of step 12 to spoil, copy by copy, in the
# folder of bad.epl (errors point at its `checkpoint` key, line 9).
good=kp/step-00000012
sed 's/dir = "kp", every = 4, keep = 1/dir = "bad", every = 4/' lm.epl > bad.epl
spoil() { rm -rf bad && mkdir bad && cp -r "$good" bad/; }
at='bad.epl:9:3'
spoil && zero_tensors bad/step-00000012/model.safetensors
expect zeroed-tensors 1 'tensor `embedding.weight` of `.*model.safetensors` fails its checksum' "$at" \
  'move `step-00000012` out of' -- run bad.epl --resume --steps 14
spoil && edit_manifest bad/step-00000012 'm["step"] = m["rng"]["step"] = m["data"]["next_step"] = 10'
expect step-not-folder 1 'manifest.json` says `step` 10, but its folder is `step-00000012`' "$at" -- \
  run bad.epl --resume --steps 14
spoil && edit_manifest bad/step-00000012 'm["step"] = -3'
expect negative-step 1 '`step` is -3' "$at" -- run bad.epl --resume --steps 14
spoil && edit_manifest bad/step-00000012 'm["version"] = 4'
expect newer-version 1 'format version 4' 'newer EPL' -- run bad.epl --resume --steps 14
sed 's/lm/other/g' bad.epl > other.epl
spoil
expect other-model 1 'checkpoint of model `lm`, and this script trains `other`' 'other.epl:9:3' -- \
  run other.epl --resume --steps 14
spoil
expect other-optimizer 1 'written with optimizer `adamw`, and the script says `adam`' 'optimizer=adam' -- \
  run bad.epl --resume --steps 14 --set 'train.optimizer=adam(lr = 1e-2)'
spoil
expect other-seed-warns 0 'warning: .*written with `seed = 3`, and the script says `seed = 4`' -- \
  run bad.epl --resume --steps 14 --set train.seed=4
# A checkpoint of the first format (no checksums) still loads, saying it is not verified.
spoil && edit_manifest bad/step-00000012 'm["version"] = 1; del m["crc32"]; del m["steps"]'
expect version-1-loads 0 'warning: .*format version 1.*not verified' 'resumed from' -- \
  run bad.epl --resume --steps 14
# A schedule over another number of steps is said: the checkpoint's run had 12; a constant
# rate has nothing to stretch.
spoil
expect other-steps-cosine 0 'warning: .*written by a run of 12 steps, and this run has 14' \
  'cosine. learning-rate schedule now spans 14 steps: from step 13' 'pass --steps 12' -- \
  run bad.epl --resume --steps 14 --set 'train.lr_schedule=cosine(warmup = 2)'
spoil
expect other-steps-constant 0 '!written by a run of' 'resumed from' -- run bad.epl --resume --steps 14
spoil
expect same-steps-cosine 0 '!written by a run of' 'nothing to train' -- \
  run bad.epl --resume --set 'train.lr_schedule=cosine(warmup = 2)'

# 4. An override replaces the whole `checkpoint` record: the script's `keep = 1` is gone.
expect override-record 0 -- run lm.epl --set 'train.checkpoint={dir="kp4", every=4}'
holds override-keeps-all kp4 "step-00000004 step-00000008 step-00000012"

# 5. A checkpoint past `steps` is an error; one at `steps` has nothing left to train.
expect past-steps 1 'step 12, past `steps` \(10\)' 'raise `--steps`' '!trained' -- \
  run lm.epl --resume --steps 10
expect at-steps 0 'nothing to train: .*step-00000012 is at step 12 of 12' '!trained' -- \
  run lm.epl --resume

# 6. The metrics file: checked before the first step, a write failure reported.
expect metrics-missing-folder 1 'cannot write the metrics file `nowhere/m.jsonl`' '!step 1/' -- \
  run lm.epl --set 'train.checkpoint={dir="kp6", every=4}' --metrics nowhere/m.jsonl
mkdir -p afolder
expect metrics-onto-folder 1 'cannot write the metrics file `afolder`: it is a folder' '!step 1/' -- \
  run lm.epl --set 'train.checkpoint={dir="kp6", every=4}' --metrics afolder
[ ! -e kp6 ] && echo "ok   metrics-failed-start-wrote-nothing" ||
  { echo "FAIL: a failed start created kp6"; fail=1; }
expect metrics-disk-full 0 'warning: cannot write the metrics file `/dev/full`: no space left' -- \
  run lm.epl --set 'train.checkpoint={dir="kp6c", every=4}' --metrics /dev/full

# 8. A checkpoint folder in use is refused to a second run, naming the first; the lock goes
# with the first run however it ends (here by SIGKILL).
"$epl" run lm.epl --steps 1000000 --metrics first.jsonl \
  --set 'train.checkpoint={dir="kp8", every=1000000}' > first.out 2>&1 &
first=$!
for _ in $(seq 600); do [ -s first.jsonl ] && break; sleep 0.1; done
expect folder-in-use 1 "\`.*kp8\` is in use by another run \\(pid $first on $(hostname)\\)" \
  '--> --set train.checkpoint' 'wait for that run to end' -- \
  run lm.epl --resume --steps 2 --set 'train.checkpoint={dir="kp8", every=1}'
kill -KILL "$first"
wait "$first" 2>/dev/null
expect lock-goes-with-the-run 0 'no checkpoint in .*kp8 yet' -- \
  run lm.epl --resume --steps 2 --set 'train.checkpoint={dir="kp8", every=1}'

# 9. A checkpoint folder that cannot be written is an error before the first step.
expect checkpoint-unwritable 1 'cannot write checkpoints into `.*corpus.txt/ck`' '--> --set train.checkpoint' \
  '!step 1/' -- \
  run lm.epl --set 'train.checkpoint={dir="corpus.txt/ck", every=4}'
if [ "$(id -u)" != 0 ]; then # root writes anywhere
  mkdir -p ro && chmod 555 ro
  expect checkpoint-read-only 1 'cannot write checkpoints into `.*ro/ck`' '!step 1/' -- \
    run lm.epl --set 'train.checkpoint={dir="ro/ck", every=4}'
fi
[ $fail = 0 ] && echo "checkpoints: pruning, verification, overrides and start checks behave"
exit $fail
