// TEMPORARY placeholder: replaced by the family's kernels before this lands.
#include "backend/cuda/Common.cuh"

#include <stdexcept>

namespace epl::backend::cuda {

void crossEntropy(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("crossEntropy: no CUDA kernel yet");
}

void mse(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("mse: no CUDA kernel yet");
}

} // namespace epl::backend::cuda
