// TEMPORARY placeholder: replaced by the family's kernels before this lands.
#include "backend/cuda/Common.cuh"

#include <stdexcept>

namespace epl::backend::cuda {

void moe(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("moe: no CUDA kernel yet");
}

} // namespace epl::backend::cuda
