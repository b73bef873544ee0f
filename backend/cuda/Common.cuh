// Helpers for the CUDA kernel files: launch geometry and grid-stride loops.
#pragma once
#include "backend/cuda/Kernels.h"

#include <algorithm>
#include <cstdint>
#include <cuda_fp16.h>

namespace epl::backend::cuda {

constexpr int kThreads = 256;

// Element i of an operand (f32, bf16 or IEEE half), in f32.
__device__ inline float loadAs(const void* x, int64_t i, ir::DType t) {
  if (t == ir::DType::F32) return static_cast<const float*>(x)[i];
  uint16_t h = static_cast<const uint16_t*>(x)[i];
  if (t == ir::DType::BF16) return __uint_as_float(static_cast<uint32_t>(h) << 16);
  return __half2float(__ushort_as_half(h));
}

// Blocks for a grid-stride loop over n elements (at most 65,535 x 16; the loop covers the rest).
inline unsigned blocksFor(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, int64_t{65535} * 16));
}

// Blocks of the first pass of a reduction over n elements: from n alone, so the order of the
// additions does not depend on the GPU.
inline unsigned reductionParts(int64_t n) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((n + 16 * kThreads - 1) / (16 * kThreads), 1, 1024));
}

// Pieces of one scratch buffer start at multiples of this.
constexpr int64_t kScratchAlign = 256;
inline int64_t alignUp(int64_t bytes) {
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

// Combining operations for reductions.
struct Sum {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

#define EPL_GRID_STRIDE(i, n)                                                                      \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);           \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

} // namespace epl::backend::cuda
