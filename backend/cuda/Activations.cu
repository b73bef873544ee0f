// TEMPORARY placeholder: replaced by the family's kernels before this lands.
#include "backend/cuda/Common.cuh"

#include <stdexcept>

namespace epl::backend::cuda {

void gelu(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("gelu: no CUDA kernel yet");
}

void relu(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("relu: no CUDA kernel yet");
}

void silu(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("silu: no CUDA kernel yet");
}

void tanh(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("tanh: no CUDA kernel yet");
}

void sigmoid(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("sigmoid: no CUDA kernel yet");
}

void softmax(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("softmax: no CUDA kernel yet");
}

void dropout(const KernelCall& c, const Ctx& ctx) {
  throw std::runtime_error("dropout: no CUDA kernel yet");
}

Act parseAct(const std::string& word) {
  throw std::runtime_error("parseAct: no CUDA kernel yet");
  return Act::Relu;
}

void actForward(const Ctx& ctx, Act a, const float* x, float* y, int64_t n) {
  throw std::runtime_error("actForward: no CUDA kernel yet");
}

void actBackwardInPlace(const Ctx& ctx, Act a, const float* x, float* g, int64_t n) {
  throw std::runtime_error("actBackwardInPlace: no CUDA kernel yet");
}

void softmaxRows(const Ctx& ctx, const float* x, float* y, int64_t rows, int64_t cols) {
  throw std::runtime_error("softmaxRows: no CUDA kernel yet");
}

} // namespace epl::backend::cuda
