// TEMPORARY placeholder: replaced by the family's kernels before this lands.
#include "backend/cuda/Common.cuh"

#include <stdexcept>

namespace epl::backend::cuda {

void layerNorm(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("layerNorm: no CUDA kernel yet");
}

void rmsNorm(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("rmsNorm: no CUDA kernel yet");
}

} // namespace epl::backend::cuda
