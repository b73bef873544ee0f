#!/usr/bin/env bash
# Runs the GPU tests on a machine with an NVIDIA GPU from the bundle tools/gpu_bundle.sh
# made (.gpu/): every kernel family against the CPU's and PyTorch (the tests labelled `gpu`
# in CTest), the communicators (NCCL on one rank; two ranks sharing the GPU), the unit
# tests that run on every device, then 20 training steps on the GPU against the CPU of a char
# GPT (fp32, TF32 products, amp in bf16 and fp16, states offloaded) and of more models on
# one, two and four ranks sharing the GPU (data parallel, pipelines, split regions, experts,
# batch_norm, grouped-query and rotary attention, a padding mask), as tests/gpu/CMakeLists.txt
# runs them. Needs python3 with torch, and CUDA's cuBLAS 13 and NCCL 2 (found in python3's
# nvidia packages if not on the library path). Writes each part's output into DIR
# (default: gpu-check/), and prints each part's result with the seconds since the start. A
# session's device time is short, so every part starts at once, side by side (an H200 has
# memory for all their contexts, its machine 16 cores for the CPU's runs), and the results
# are read in order as they end.
# With EPL_GPU_MEMCHECK=1 the kernel families' GPU cases run under compute-sanitizer's
# memcheck (an out-of-bounds access fails the case; the reports are DIR/memcheck.*.log).
# With EPL_GPU_FAMILIES_ONLY=1 only the kernel families run (no communicators, unit tests or
# training runs): with EPL_GPU_MEMCHECK=1, a sanitizer pass over some families.
# Usage: [EPL_GPU_MEMCHECK=1] [EPL_GPU_FAMILIES_ONLY=1] tools/gpu_check.sh [DIR] [FAMILY...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-check}
shift || true
mkdir -p "$out"
out=$(cd "$out" && pwd) # the training runs write there from folders of their own
[ -d .gpu ] || tar xJf .gpu.tar.xz
source tools/gpu_env.sh
probe=$root/.gpu/bin/epl_kernel_probe
if [ -n "${EPL_GPU_MEMCHECK:-}" ]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  { # the probe's GPU runs (their case files name the device) under the sanitizer
    echo '#!/bin/bash'
    echo "if grep -q '\"device\": \"cuda\"' \"\$1\"; then"
    echo "  exec $sanitizer --tool memcheck --error-exitcode 9 --log-file $out/memcheck.%p.log $probe \"\$@\""
    echo 'fi'
    echo "exec $probe \"\$@\""
  } >"$out/memcheck_probe.sh"
  chmod +x "$out/memcheck_probe.sh"
  probe=$out/memcheck_probe.sh
fi

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  .gpu/bin/epl --version
} | tee "$out/machine.txt"

families=("$@")
pids=()
[ ${#families[@]} -gt 0 ] || families=(linear embedding norms attention mlp moe conv pooling
                                       activations elementwise losses optimizers dropout slicing)
# Each part is started in the background; names[i] and lines[i] say how to report it.
names=()
lines=()
start() { # the part's name, how its result line is made from its output file, the command
  local name=$1 summary=$2
  shift 2
  "$@" >"$out/$name.txt" 2>&1 &
  pids+=($!)
  names+=("$name")
  lines+=("$summary")
}
# The families (each case is one probe process, most of its time the CUDA context's start).
for f in "${families[@]}"; do
  start "oracle_$f" "grep -E 'failure|max error of' | head -2" \
    python3 tests/oracle/test_ops.py "$probe" "$f" --device cuda
done
# Attention again on cuBLAS's products over scores (the others run tiled: FlashTiles.cuh).
if [[ " ${families[*]} " == *" attention "* ]]; then
  start oracle_attention_scores "grep -E 'failure|max error of' | head -2" \
    env EPL_GPU_ATTENTION=scores python3 tests/oracle/test_ops.py "$probe" attention --device cuda
fi
others() { # the communicators, the unit tests on each device and the training runs
  # The communicators: NCCL on one rank, two ranks sharing the GPU staged through the host.
  start communicators "tail -1" .gpu/bin/epl_gpu_comm_test
  # The unit tests that run on each device, the GPU among them, against the CPU's: the
  # updates reading their clip factor and fp16's loss scale on the device (an overflow skips
  # them), the vocabulary-parallel loss's combine, the device choice.
  start unit_devices "tail -2" \
    .gpu/bin/epl_unit_tests -# "[#OptimizerClipTest],[#VocabSliceTest],[#DeviceChoiceTest]"

  # The training text and images where the scripts expect them.
  mkdir -p /usr/share/games/fortunes
  [ -f /usr/share/games/fortunes/cookie ] || cp .gpu/data/cookie /usr/share/games/fortunes/cookie
  mkdir -p /usr/share/datasets
  [ -d /usr/share/datasets/fashion-mnist ] || cp -r .gpu/data/fashion-mnist /usr/share/datasets/
  # 20 training steps on the GPU against the CPU, as the `gpu` tests of tests/gpu/CMakeLists.txt
  # run them (the same tolerances): amp in bf16 and fp16, fp32, an ignored class, TF32
  # products, optimizer states offloaded.
  train() { # the run's name, its script in tests/parallel, then device_equivalence.py's options
    local name=$1 script=$2
    shift 2
    start "$name" "grep -m2 -E 'worst relative|^FAIL|^(internal )?error:|^skipped'" \
      python3 tests/gpu/device_equivalence.py "$root/.gpu/bin/epl" \
      "$out/$name" "tests/parallel/$script" "$@"
  }
  train train_gpt_amp_bf16 gpt_dp.epl --tol 1e-3 --set policy.amp=bf16
  train train_gpt_amp_fp16 gpt_dp.epl --tol 1e-3 --set policy.amp=fp16
  train train_gpt gpt_dp.epl
  train train_gpt_ignore gpt_ignore.epl
  train train_gpt_tf32 gpt_dp.epl --tol 1e-3 --set policy.matmul=tf32
  # TF32 products: attention's dot products tiled, with grouped-query rotary heads and a mask.
  train train_llama_tf32 llama_split.epl --tol 1e-3 --set policy.matmul=tf32
  train train_encoder_mask_tf32 encoder_mask.epl --tol 1e-3 --set policy.matmul=tf32
  # Optimizer states offloaded: to page-locked host memory and to disk, each chunk copied to
  # the GPU for its update and back (the CPU run keeps them in place: the same arithmetic).
  train train_gpt_offload_cpu gpt_dp.epl --set policy.offload=optimizer --set policy.offload_to=cpu
  train train_gpt_offload_disk gpt_dp.epl --set policy.offload=optimizer --set policy.offload_to=disk
  # Two ranks on the one GPU (the bundle's mpirun; NCCL refuses ranks sharing a GPU, so the
  # collectives go through MPI staged by the host): data parallel, a 2-stage pipeline, split
  # regions, a vocabulary-parallel head and loss; as tests/gpu/CMakeLists.txt runs them.
  train train_gpt_np2 gpt_dp.epl --np 2
  train train_pipeline_np2 gpt_pipeline.epl --np 2
  train train_split_np2 gpt_split.epl --np 2
  train train_vocab_np2 cnn_vocab_head.epl --np 2
  # More of the plans on several ranks, as tests/gpu/CMakeLists.txt runs them: experts split,
  # a split convolution, batch_norm's statistics over the ranks, split regions under amp, a
  # pipeline of split stages and interleaved chunks of them (4 ranks), a tied head across stages.
  train train_moe_np2 moe_split.epl --np 2
  train train_cnn_split_np2 cnn_split.epl --np 2
  train train_cnn_bn_np2 cnn_bn.epl --np 2
  train train_cnn_bn_split_np2 cnn_bn_split.epl --np 2
  train train_cnn_bn_pipeline_np2 cnn_bn_pipeline.epl --np 2
  train train_split_amp_np2 gpt_split.epl --np 2 --tol 1e-3 --set policy.amp=bf16
  train train_pipeline_split_np4 gpt_pipeline_split.epl --np 4
  train train_interleaved_split_np4 gpt_interleaved_split.epl --np 4
  train train_pipeline_tied_np2 gpt_pipeline_tied.epl --np 2
  # Attention with k/v heads shared and rotary embeddings, with a padding mask, and mean,
  # select and narrow (their CUDA kernels not yet run on a GPU when these were added).
  train train_llama llama_split.epl
  train train_llama_split_np2 llama_split.epl --np 2
  train train_encoder_mask encoder_mask.epl
  train train_bert_np2 bert_cls.epl --np 2
}
[ -n "${EPL_GPU_FAMILIES_ONLY:-}" ] || others

failed=0
for i in "${!names[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  echo "${names[$i]}: exit $rc (${SECONDS}s); $(eval "${lines[$i]}" <"$out/${names[$i]}.txt" | tr '\n' ' ')"
  [ $rc = 0 ] || failed=1
done
exit $failed
