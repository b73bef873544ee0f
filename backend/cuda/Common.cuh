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

#define EPL_GRID_STRIDE(i, n)                                                                    \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);         \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

} // namespace epl::backend::cuda
