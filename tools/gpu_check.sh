#!/usr/bin/env bash
# Runs the GPU tests on a machine with an NVIDIA GPU from the bundle tools/gpu_bundle.sh
# made (.gpu/): every kernel family against the CPU's and PyTorch (the tests labelled `gpu`
# in CTest), then 20 training steps of a char GPT on the GPU against the CPU. Needs
# python3 with torch and CUDA's cuBLAS 13 (found in python3's nvidia packages if not on
# the library path). Writes each part's output into DIR (default: gpu-check/).
# Usage: tools/gpu_check.sh [DIR] [FAMILY...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-check}
shift || true
mkdir -p "$out"
[ -d .gpu ] || tar xJf .gpu.tar.xz
source tools/gpu_env.sh

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  .gpu/bin/epl --version
} | tee "$out/machine.txt"

families=("$@")
pids=()
[ ${#families[@]} -gt 0 ] || families=(linear embedding norms attention mlp moe conv pooling
                                       activations elementwise losses optimizers dropout)
# The families run side by side (each case is one probe process, most of its time the
# CUDA context's start), then their results are read in order.
for f in "${families[@]}"; do
  python3 tests/oracle/test_ops.py .gpu/bin/epl_kernel_probe "$f" --device cuda \
    >"$out/oracle_$f.txt" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!families[@]}"; do
  f=${families[$i]}
  wait "${pids[$i]}"
  rc=$?
  echo "oracle $f: exit $rc; $(grep -E 'failure|max error of' "$out/oracle_$f.txt" | head -2 | tr '\n' ' ')"
  [ $rc = 0 ] || failed=1
done

# The training text where the script expects it.
mkdir -p /usr/share/games/fortunes
[ -f /usr/share/games/fortunes/cookie ] || cp .gpu/data/cookie /usr/share/games/fortunes/cookie
python3 tests/gpu/device_equivalence.py "$root/.gpu/bin/epl" "$out/train_gpt" tests/parallel/gpt_dp.epl \
  >"$out/train_gpt.txt" 2>&1
rc=$?
echo "train_gpt: exit $rc; $(tail -1 "$out/train_gpt.txt")"
[ $rc = 0 ] || failed=1
# Matrix products on tensor cores, at the tolerance of tests/gpu/CMakeLists.txt.
python3 tests/gpu/device_equivalence.py "$root/.gpu/bin/epl" "$out/train_gpt_tf32" \
  tests/parallel/gpt_dp.epl --tol 1e-3 --set policy.matmul=tf32 >"$out/train_gpt_tf32.txt" 2>&1
rc=$?
echo "train_gpt matmul=tf32: exit $rc; $(tail -1 "$out/train_gpt_tf32.txt")"
[ $rc = 0 ] || failed=1
# amp: half-precision storage, at the tolerance of tests/gpu/CMakeLists.txt.
for amp in bf16 fp16; do
  python3 tests/gpu/device_equivalence.py "$root/.gpu/bin/epl" "$out/train_gpt_amp_$amp" \
    tests/parallel/gpt_dp.epl --tol 1e-3 --set policy.amp=$amp >"$out/train_gpt_amp_$amp.txt" 2>&1
  rc=$?
  echo "train_gpt amp=$amp: exit $rc; $(tail -1 "$out/train_gpt_amp_$amp.txt")"
  [ $rc = 0 ] || failed=1
done
exit $failed
