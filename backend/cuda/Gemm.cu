// The GEMM entry points of the CUDA kernels (cuBLAS; fp32 storage, the products exact or on
// tensor cores as Ctx::compute says) and the two row helpers that go with them: a
// deterministic column sum (bias gradients) and a row broadcast (bias init).
//
// cuBLAS is column-major and our tensors are row-major: a row-major X [R, C] with leading
// dim ld is the column-major X^T with the same ld. So row-major C = op(A) op(B) is queued
// as column-major C^T = op(B)^T op(A)^T: the operands swap places, and so do M and N.
//
// Shape legend: M, N, K as in C[M, N] = op(A)[M, K] op(B)[K, N]; R rows, C columns.
#include "backend/cuda/Common.cuh"
#include "backend/cuda/Cublas.h"
#include "support/Assert.h"

namespace epl::backend::cuda {

namespace {

cublasOperation_t opOf(bool trans) {
  return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

cudaDataType_t typeOf(ir::DType t) {
  switch (t) {
  case ir::DType::BF16:
    return CUDA_R_16BF;
  case ir::DType::F16:
    return CUDA_R_16F;
  default:
    return CUDA_R_32F;
  }
}

// Column sums: one block per strip of kStrip columns; row lane ly of the block sums rows
// ly, ly + kLanes, ... of its column, then lane 0 adds the kLanes partials in lane order.
// The order depends on the shape only, so the result is the same on every run.
constexpr int kStrip = 32, kLanes = 8;

__global__ void columnSumKernel(const void* x, ir::DType type, int64_t rows, int64_t cols,
                                float* out, bool acc) {
  __shared__ float part[kLanes][kStrip];
  int64_t col = static_cast<int64_t>(blockIdx.x) * kStrip + threadIdx.x;
  float s = 0;
  if (col < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kLanes)
      s += loadAs(x, r * cols + col, type);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  float total = 0;
  for (int lane = 0; lane < kLanes; ++lane)
    total += part[lane][threadIdx.x];
  out[col] = acc ? out[col] + total : total;
}

__global__ void broadcastRowsKernel(float* y, const float* b, int64_t rows, int64_t cols) {
  EPL_GRID_STRIDE(i, rows * cols) {
    y[i] = b[i % cols];
  }
}

} // namespace

void gemm(const Ctx& ctx, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
          Operand a, int64_t lda, Operand b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  EPL_ASSERT(a.type == b.type, "a product's operands have one type");
  // Half operands: their products are exact in f32 and tensor cores sum in f32, which is
  // what amp's products are (the pedantic type would only slow them down).
  cublasComputeType_t compute = a.type == ir::DType::F32 ? ctx.compute : CUBLAS_COMPUTE_32F;
  check(cublas().gemmEx(ctx.blas, opOf(transB), opOf(transA), n, m, k, &alpha, b.p, typeOf(b.type),
                        ldb, a.p, typeOf(a.type), lda, &beta, c, CUDA_R_32F, ldc, compute,
                        CUBLAS_GEMM_DEFAULT),
        "gemm");
}

void gemmBatched(const Ctx& ctx, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, int64_t strideA, const float* b,
                 int64_t ldb, int64_t strideB, float beta, float* c, int64_t ldc, int64_t strideC,
                 int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  check(cublas().gemmStridedBatchedEx(ctx.blas, opOf(transB), opOf(transA), n, m, k, &alpha, b,
                                      CUDA_R_32F, ldb, strideB, a, CUDA_R_32F, lda, strideA, &beta,
                                      c, CUDA_R_32F, ldc, strideC, batch, ctx.compute,
                                      CUBLAS_GEMM_DEFAULT),
        "gemmBatched");
}

void columnSum(const Ctx& ctx, Operand x, int64_t rows, int64_t cols, GradOut out) {
  if (cols == 0) return;
  unsigned strips = static_cast<unsigned>((cols + kStrip - 1) / kStrip);
  columnSumKernel<<<strips, dim3(kStrip, kLanes), 0, ctx.stream>>>(x.p, x.type, rows, cols, out.p,
                                                                   out.acc);
  checkLaunch("columnSum");
}

void broadcastRows(const Ctx& ctx, float* y, const float* b, int64_t rows, int64_t cols) {
  if (rows * cols == 0) return;
  broadcastRowsKernel<<<blocksFor(rows * cols), kThreads, 0, ctx.stream>>>(y, b, rows, cols);
  checkLaunch("broadcastRows");
}

} // namespace epl::backend::cuda
