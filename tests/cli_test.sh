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
expect 2 "error: -np must be at least 1, got \`0\`" -- plan "$src/examples/gpt_char.epl" -np 0
expect 2 "not in {shape-inference" -- plan "$src/examples/gpt_char.epl" --print-after nosuch
expect 0 "on 8 devices" -- plan "$src/examples/gpt_char.epl" -np 8
expect 0 "on 8 devices" -- plan "$src/examples/gpt_char.epl" -np=8
expect 0 "on 8 devices" -- plan "$src/examples/gpt_char.epl" --np 8
expect 0 "pass timing:" -- plan "$src/examples/gpt_char.epl" -np 8 --time-passes
expect 0 "// ----- IR after stage-partition -----" -- plan "$src/examples/gpt_char.epl" --print-after stage-partition
expect 0 "module @gpt" -- plan "$src/examples/gpt_char.epl" -np 4 --ir
expect 0 '"schema": 1,' -- plan "$src/examples/gpt_char.epl" -np 8 --json
expect 0 '"kernel_workspace": 2097152,' -- plan "$src/examples/gpt_char.epl" -np 8 --json
expect 2 "--rank excludes --json" -- plan "$src/examples/gpt_char.epl" --json --rank 0
expect 2 "--ir excludes --json" -- plan "$src/examples/gpt_char.epl" --json --ir
expect 0 "predicted on dgx-h100 (H100-SXM5-80GB" -- plan "$src/examples/gpt_char.epl" -np 8 --cluster dgx-h100
expect 0 "compute per rank (matrix-product FLOPs a step" -- plan "$src/examples/gpt_char.epl" -np 8
# A mixed cluster (device groups): its kinds named, a plan past its devices refused.
expect 0 "predicted on a100+v100 (8 x A100-SXM4-40GB + 8 x V100-SXM2-32GB;" -- plan "$src/examples/gpt_char.epl" -np 16 --cluster "$src/examples/clusters/a100_v100.json"
expect 2 "error: --cluster: the plan needs 32 devices and cluster \`a100+v100\` has 16 (8 x A100-SXM4-40GB + 8 x V100-SXM2-32GB)" -- plan "$src/examples/gpt_char.epl" -np 32 --cluster "$src/examples/clusters/a100_v100.json"
expect 2 "error: --cluster: no cluster \`dgx-a1000\`: not a built-in one (dgx-a100, dgx-h100, dgx-h200)" -- plan "$src/examples/gpt_char.epl" --cluster dgx-a1000
# --search: the winner's diff applies with patch, plans to the step the search printed,
# and a search of the patched script keeps its settings.
expect 2 "--search requires --cluster" -- plan "$src/examples/gpt_char.epl" --search
searched=$(mktemp -d)
cp "$src/examples/gpt_char.epl" "$searched/"
found=$(cd "$searched" && "$epl" plan gpt_char.epl -np 8 --cluster dgx-a100 --search)
best=$(grep -o '^  1\. step [^,]*' <<<"$found" | sed 's/^  1\. step //')
# The layout is searched too: the layers dealt over the two stages (the repeat counts,
# written `layers / 2`) and the head's split width.
if ! grep -q "20 layouts of transformer_block repeat (line 10) x transformer_block repeat (line 13) x split width (line 14)" <<<"$found"; then
  echo "FAIL: epl plan --search did not try the split widths:"
  echo "$found" | head -5
  failures=$((failures + 1))
fi
if (cd "$searched" && sed -n '/^--- /,$p' <<<"$found" | patch -s -p0) && [ -n "$best" ]; then
  passed=$((passed + 1))
  expect 0 "step $best:" -- plan "$searched/gpt_char.epl" -np 8 --cluster dgx-a100
  expect 0 "the script's settings are the fastest." -- plan "$searched/gpt_char.epl" -np 8 --cluster dgx-a100 --search
else
  echo "FAIL: epl plan --search: no best step, or its diff does not apply:"
  echo "$found" | head -30
  failures=$((failures + 1))
fi
rm -rf "$searched"
# split(auto) is searched too: the planner's width and the powers of two, the winner's
# written in the auto's place.
searched=$(mktemp -d)
sed '14s/split(2)/split(auto)/' "$src/examples/gpt_char.epl" >"$searched/gpt_char.epl"
found=$(cd "$searched" && "$epl" plan gpt_char.epl -np 8 --cluster dgx-a100 --search)
if grep -q "25 layouts of .* x split width (line 14)" <<<"$found" &&
  grep -q "^-    split(auto) {" <<<"$found" && grep -q "^+    split([0-9]*) {" <<<"$found"; then
  passed=$((passed + 1))
else
  echo "FAIL: epl plan --search did not search split(auto):"
  echo "$found" | head -20
  failures=$((failures + 1))
fi
rm -rf "$searched"
# On a cluster of two kinds of device the search deals a def's layers over the stages:
# more to stage 0 (the A100s) than to stage 1 (the V100s); the dealt script then plans to
# the step the search printed.
searched=$(mktemp -d)
cp "$src/tests/search/two_stages.epl" "$searched/"
mixed="$src/examples/clusters/a100_v100.json"
found=$(cd "$searched" && "$epl" plan two_stages.epl -np 16 --cluster "$mixed" --search)
best=$(grep -o '^  1\. step [^,]*' <<<"$found" | sed 's/^  1\. step //')
first=$(grep -o '^+    h = repeat([0-9]*) layer' <<<"$found" | head -1 | grep -o '[0-9][0-9]*')
if grep -q "layouts of replicate width (line 9) x layer repeat (line 11) x replicate width (line 13) x layer repeat (line 14)" <<<"$found" &&
  [ -n "$first" ] && [ "$first" -gt 4 ] && [ -n "$best" ] &&
  (cd "$searched" && sed -n '/^--- /,$p' <<<"$found" | patch -s -p0); then
  passed=$((passed + 1))
  expect 0 "step $best:" -- plan "$searched/two_stages.epl" -np 16 --cluster "$mixed"
else
  echo "FAIL: epl plan --search did not deal the layers toward the faster devices:"
  echo "$found" | head -20
  failures=$((failures + 1))
fi
rm -rf "$searched"
# The search prints the script's own plan's warnings, as `epl plan` does.
expect 0 "do not reach the loss" -- plan "$src/tests/parallel/unused_layer.epl" -np 2 --cluster dgx-a100 --search
# An auto whose twins with none and every leave a stage over device_memory is left out.
expect 0 "with recompute = auto not planned: a stage fits the device_memory neither with none nor with every" -- plan "$src/examples/gpt_char.epl" -np 8 --cluster dgx-a100 --search --set policy.recompute=none --set policy.device_memory=40MB
# `epl calibrate` measures this machine (two ranks under mpirun for the link) and
# `--cluster here` predicts with what it wrote.
here=$(mktemp -d)
export EPL_CLUSTER_HERE=$here/here.json
expect 2 "this machine is not calibrated: \`epl calibrate\` measures it" -- plan "$src/examples/mlp_fashion.epl" --cluster here
# A run says so too, beside its step time.
expect 0 "(median of steps 2 to 4); this machine is not calibrated: \`epl calibrate\` measures it" -- run "$src/examples/mlp_fashion.epl" --steps 4 --set train.eval=none --set train.checkpoint=none --metrics "$here/m.jsonl"
# Under the sanitizers, the calibration's MPI ranks run with exact malloc stacks, which the
# leak suppressions of Open MPI need (tests/CMakeLists.txt sets EPL_MPI_ASAN_OPTIONS).
calibrate() { ASAN_OPTIONS=${EPL_MPI_ASAN_OPTIONS:-${ASAN_OPTIONS:-}} expect "$@"; }
# One round (a third of the default's time); the file is the one `--cluster here` reads.
calibrate 0 "wrote $here/here.json" -- calibrate --rounds 1
if ! grep -q '"AtB"' "$here/here.json"; then
  echo "FAIL: epl calibrate timed no A^T B products"
  failures=$((failures + 1))
fi
if ! grep -q '"bandwidth_by_size"' "$here/here.json"; then
  echo "FAIL: epl calibrate measured no bandwidth by working set"
  failures=$((failures + 1))
fi
if ! grep -q '"gemm_side_by_side"' "$here/here.json"; then
  echo "FAIL: epl calibrate measured no GEMM of ranks side by side"
  failures=$((failures + 1))
fi
# A build with oneDNN runs conv2d through its direct convolution, which the calibration
# times by shape.
if ldd "$epl" | grep -q libdnnl && ! grep -q '"conv_by_shape"' "$here/here.json"; then
  echo "FAIL: epl calibrate timed no conv2d by shape"
  failures=$((failures + 1))
fi
if ! grep -q '"disk_bandwidth"' "$here/here.json"; then
  echo "FAIL: epl calibrate measured no disk bandwidth for offloaded states"
  failures=$((failures + 1))
fi
expect 0 "predicted on here (cpu (" -- plan "$src/examples/mlp_fashion.epl" -np 2 --cluster here
# States on disk: their traffic a step is a part of the prediction.
expect 0 "offload traffic 4.31 MB a rank (" -- plan "$src/examples/mlp_fashion.epl" --cluster here --set policy.offload=optimizer --set policy.offload_to=disk
expect 0 "predicted on here" -- plan "$src/examples/mlp_fashion.epl" --cluster "$here/here.json"
expect 0 "(median of steps 2 to 4), predicted" -- run "$src/examples/mlp_fashion.epl" --steps 4 --set train.eval=none --set train.checkpoint=none --metrics "$here/m.jsonl"
# `--cluster` names the cluster the step is compared with; one that does not load stops the
# run before it starts.
expect 0 "s on dgx-a100: predicted / measured" -- run "$src/examples/mlp_fashion.epl" --steps 4 --cluster dgx-a100 --set train.eval=none --set train.checkpoint=none --metrics "$here/m.jsonl"
expect 2 "error: --cluster: no cluster \`$here/none.json\`" -- run "$src/examples/mlp_fashion.epl" --cluster "$here/none.json" --metrics "$here/m.jsonl"
unset EPL_CLUSTER_HERE
rm -rf "$here"
expect 1 "error: -np 6 is not a multiple of the 4 devices" -- check "$src/examples/gpt_char.epl" -np 6
expect 1 "--> $src/tests/diagnostics/unknown_name.epl:8:22" -- check "$src/tests/diagnostics/unknown_name.epl"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A model far bigger than any machine is an error at `batch`, before anything is allocated.
huge=$src/tests/huge_model.epl
expect 1 "error: the plan needs 16.0 TB of memory, and this machine has" -- run "$huge"
expect 1 "--> $huge:8:3" -- run "$huge"
expect 1 "error: the plan's 2 ranks on this machine need 32.0 TB of memory" -- run "$huge" -np 2

# Numeric options name the bound they cross, and reject what is not a number of their kind.
mlp="$src/examples/mlp_fashion.epl"
expect 2 "error: --steps must be at least 1, got \`0\`" -- run "$mlp" --steps 0
expect 2 "error: --steps must be a whole number, got \`1e3\`" -- run "$mlp" --steps 1e3
expect 2 "error: --steps must be at most 1000000000000, got \`99999999999999999999\`" -- \
  run "$mlp" --steps 99999999999999999999
expect 2 "error: --stop-after must be at least 1, got \`-1\`" -- run "$mlp" --stop-after -1
expect 2 "error: --threads must be at most 1024, got \`100000\`" -- run "$mlp" --threads 100000
expect 2 "error: --threads must be at least 1, got \`0\`" -- run "$mlp" --threads 0
expect 2 "error: --rank must be at least 0, got \`-1\`" -- plan "$mlp" --rank -1
expect 0 "(one of its 4 ranks, each reading its copy's 6 samples a micro-batch)" -- plan "$src/tests/golden/into_split_only_stage.epl" -np 6 --rank 2
expect 0 "rank 3: one step, 2 micro-batches, split rank 3 of 4" -- plan "$src/examples/moe.epl" -np 4 --rank 3
expect 0 "rank 3: one step, 8 micro-batches, pipeline stage 1 of 2" -- plan "$src/examples/gpt_char.epl" -np 4 --rank 3
expect 0 "rank 1: one step, 4 micro-batches, pipeline stage 1 of 2" -- plan "$src/tests/parallel/gpt_pipeline.epl" -np 2 --rank 1
expect 2 "error: -np must be at most 16777216, got \`99999999999\`" -- check "$mlp" -np=99999999999
for t in nan inf -inf -1 0 abc; do
  expect 2 "error: --temperature must be a positive, finite number, got \`$t\`" -- \
    sample "$mlp" --temperature "$t"
done
expect 2 "error: --seed must be at least 0, got \`-1\`" -- sample "$mlp" --seed -1
expect 2 "error: --length must be at most 1048576, got \`2000000\`" -- sample "$mlp" --length 2000000

# Threads the system will not start are an error that says so (a limit on address space
# leaves no room for 1000 thread stacks). Sanitizers reserve terabytes of address space,
# so there the limit stops the process before it starts: skipped, visibly.
if (ulimit -v 4000000 && "$epl" --version) >/dev/null 2>&1; then
  out=$(ulimit -v 4000000 && "$epl" run "$mlp" --threads 1000 --steps 1 2>&1)
  if ! grep -q "error: cannot start 1000 CPU threads (the system allowed [0-9]*): " <<<"$out"; then
    echo "FAIL: thread start failure: $out"
    failures=$((failures + 1))
  else
    passed=$((passed + 1))
  fi
else
  echo "skipped: the thread-start check (epl does not run under ulimit -v here)"
fi

# `epl plan --svg DIR` writes well-formed pictures of the plan, and names each.
expect 0 "wrote $tmp/svg/schedule.svg" -- plan "$src/examples/gpt_char.epl" -np 8 --svg "$tmp/svg"
if python3 -c 'import sys, xml.etree.ElementTree as E
for f in ("mesh", "memory", "schedule"): E.parse(sys.argv[1] + "/" + f + ".svg")' "$tmp/svg"; then
  passed=$((passed + 1))
else
  echo "FAIL: epl plan --svg wrote SVG that does not parse"
  failures=$((failures + 1))
fi
expect 1 "error: cannot write \`/proc/epl/memory.svg\`: No such file or directory" -- plan "$mlp" --svg /proc/epl

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
