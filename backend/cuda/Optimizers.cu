// TEMPORARY placeholder: replaced by the family's kernels before this lands.
#include "backend/cuda/Common.cuh"

#include <stdexcept>

namespace epl::backend::cuda {

void optimizerStep(const OptimizerCall& c, const Ctx& ctx) {
  throw std::runtime_error("optimizerStep: no CUDA kernel yet");
}

void sumSquares(const Ctx& ctx, const TensorView& x, float* result, bool accumulate) {
  throw std::runtime_error("sumSquares: no CUDA kernel yet");
}

void scaleInPlace(const Ctx& ctx, const TensorView& x, float factor) {
  throw std::runtime_error("scaleInPlace: no CUDA kernel yet");
}

} // namespace epl::backend::cuda
