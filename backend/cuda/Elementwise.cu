// TEMPORARY placeholder: replaced by the family's kernels before this lands.
#include "backend/cuda/Common.cuh"

#include <stdexcept>

namespace epl::backend::cuda {

void add(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("add: no CUDA kernel yet");
}

void sub(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("sub: no CUDA kernel yet");
}

void mul(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("mul: no CUDA kernel yet");
}

void scale(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("scale: no CUDA kernel yet");
}

void reshape(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("reshape: no CUDA kernel yet");
}

void transpose(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("transpose: no CUDA kernel yet");
}

void writeOrAdd(const Ctx& ctx, const GradOut& dst, const float* src, int64_t n) {
  throw std::runtime_error("writeOrAdd: no CUDA kernel yet");
}

} // namespace epl::backend::cuda
