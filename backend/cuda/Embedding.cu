// TEMPORARY placeholder: replaced by the family's kernels before this lands.
#include "backend/cuda/Common.cuh"

#include <stdexcept>

namespace epl::backend::cuda {

void embedding(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("embedding: no CUDA kernel yet");
}

void positions(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("positions: no CUDA kernel yet");
}

} // namespace epl::backend::cuda
