// TEMPORARY placeholder: replaced by the family's kernels before this lands.
#include "backend/cuda/Common.cuh"

#include <stdexcept>

namespace epl::backend::cuda {

void conv2d(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("conv2d: no CUDA kernel yet");
}

} // namespace epl::backend::cuda
