// TEMPORARY placeholder: replaced by the family's kernels before this lands.
#include "backend/cuda/Common.cuh"

#include <stdexcept>

namespace epl::backend::cuda {

void maxPool(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("maxPool: no CUDA kernel yet");
}

void avgPool(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("avgPool: no CUDA kernel yet");
}

} // namespace epl::backend::cuda
