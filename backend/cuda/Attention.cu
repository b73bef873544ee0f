// TEMPORARY placeholder: replaced by the family's kernels before this lands.
#include "backend/cuda/Common.cuh"

#include <stdexcept>

namespace epl::backend::cuda {

void attention(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("attention: no CUDA kernel yet");
}

} // namespace epl::backend::cuda
