// Helpers for the CUDA kernel files: launch geometry and grid-stride loops.
#pragma once
#include "backend/cuda/Kernels.h"

#include <algorithm>
#include <cstdint>

namespace epl::backend::cuda {

constexpr int kThreads = 256;

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
