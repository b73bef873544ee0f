// TEMPORARY placeholder: replaced by the family's kernels before this lands.
#include "backend/cuda/Common.cuh"

#include <stdexcept>

namespace epl::backend::cuda {

void gemm(const Ctx& ctx, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  throw std::runtime_error("gemm: no CUDA kernel yet");
}

void gemmBatched(const Ctx& ctx, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, int64_t strideA, const float* b,
                 int64_t ldb, int64_t strideB, float beta, float* c, int64_t ldc,
                 int64_t strideC, int64_t batch) {
  throw std::runtime_error("gemmBatched: no CUDA kernel yet");
}

void columnSum(const Ctx& ctx, const float* x, int64_t rows, int64_t cols, GradOut out) {
  throw std::runtime_error("columnSum: no CUDA kernel yet");
}

void broadcastRows(const Ctx& ctx, float* y, const float* b, int64_t rows, int64_t cols) {
  throw std::runtime_error("broadcastRows: no CUDA kernel yet");
}

} // namespace epl::backend::cuda
