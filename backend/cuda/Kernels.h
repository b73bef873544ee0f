// Entry points of the CUDA kernel families, one family per file, mirroring the CPU device's
// (backend/cpu/Kernels.h): CudaDevice.cpp dispatches each KernelCall to one of these. Each
// queues the forward or, when `call.backward`, the backward on ctx.stream, with the
// argument layout of backend/Device.h; TensorView data are device pointers.
//
// Rules every family keeps:
//   - the same results as the CPU kernels within fp32 rounding (the CPU device is the
//     oracle: tests/oracle/test_ops.py --device cuda);
//   - deterministic: no floating-point atomics, so a run and its resume give the same bits;
//   - no host synchronisation, no allocation: scratch memory comes from ctx.scratch.
#pragma once
#include "backend/Device.h"
#include "backend/KernelArgs.h"
#include "backend/KernelShapes.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace epl::backend::cuda {

// Device scratch memory that grows on demand and is reused by every call on one stream
// (a call may use it until the next call on that stream).
class Scratch {
public:
  // At least `bytes` of device memory, 256-byte aligned. Growing synchronises the stream.
  void* get(int64_t bytes);
  int64_t size() const { return size_; }
  ~Scratch();
  cudaStream_t stream = nullptr;

private:
  void* p_ = nullptr;
  int64_t size_ = 0;
};

struct Ctx {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr; // bound to `stream`
  // fp32 products: exact (PEDANTIC), or on tensor cores with TF32 operands.
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F_PEDANTIC;
  Scratch* scratch = nullptr;
};

// Throws std::runtime_error naming `what` when `e` is an error.
void check(cudaError_t e, const char* what);
void check(cublasStatus_t s, const char* what);
// The error of the last kernel launch, if any.
void checkLaunch(const char* what);

// HalfStorage.cu (amp; backend/HalfStaging.h says which calls): `run` on f32 copies (in
// the call's staging workspace, else in `staging`), its half outputs rounded back.
void launchStaged(const KernelCall& c, const Ctx& ctx, Scratch& staging,
                  void (*run)(const KernelCall&, const Ctx&));
// x rounded to the half type t and kept in f32 (amp: a kernel's own f32 operand before a
// product that reads the half type).
void roundInPlace(const Ctx& ctx, ir::DType t, float* x, int64_t n);
// dst = src rounded to the half type t (n values): a half output a kernel writes itself.
void narrowTo(const Ctx& ctx, ir::DType t, const float* src, void* dst, int64_t n);

// The n f32 values x a kernel computed, as the operand of products that read the half type
// t: rounded into `half` (room for n values of t, device memory) where the products read t
// as it is (`asIs`), else rounded in place.
Operand roundedOperand(const Ctx& ctx, ir::DType t, bool asIs, float* x, int64_t n, void* half);
// HalfStorage.cu, for the NCCL communicator: Wire.cpp's encode and decode of a reduction's
// bf16 (bf16 true) or f16 values, the same bits; f16 multiplies by `scale` first and
// divides after.
void wireEncode(cudaStream_t stream, bool bf16, const float* src, uint16_t* dst, int64_t n,
                float scale);
void wireDecode(cudaStream_t stream, bool bf16, const uint16_t* src, float* dst, int64_t n,
                float scale);

// Gemm.cu: row-major C[M, N] = alpha op(A)[M, K] op(B)[K, N] + beta C, fp32 accumulate. Both
// operands of one type: f32 products as ctx.compute says, half ones on tensor cores (their
// products exact, f32 sums).
void gemm(const Ctx& ctx, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
          Operand a, int64_t lda, Operand b, int64_t ldb, float beta, float* c, int64_t ldc);
// Strided batched form: `batch` products, each operand advancing by its stride.
void gemmBatched(const Ctx& ctx, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, int64_t strideA, const float* b,
                 int64_t ldb, int64_t strideB, float beta, float* c, int64_t ldc, int64_t strideC,
                 int64_t batch);
// out[c] (+)= sum over rows of x[r, c] (f32 or half), in a fixed order.
void columnSum(const Ctx& ctx, Operand x, int64_t rows, int64_t cols, GradOut out);
// y[r, :] = b for every row.
void broadcastRows(const Ctx& ctx, float* y, const float* b, int64_t rows, int64_t cols);

// Linear.cu, Mlp.cu, Attention.cu, Moe.cu
void linear(const KernelCall& c, const Ctx& ctx);
void mlp(const KernelCall& c, const Ctx& ctx);
void attention(const KernelCall& c, const Ctx& ctx);
// FlashAttention.cu: the widest head its tiled kernels take on the current GPU (0: none, as
// under EPL_GPU_ATTENTION=scores), for the cost model's comparison with a run
// (ir::ClusterDevice::tilesUpTo).
int64_t flashAttentionWidest();
// moe_router, moe_dispatch, moe_experts and moe_combine, by c.kind. moe_experts reads its
// experts' row counts on the host (it waits for the stream): the one exception to the rule
// of no host synchronisation.
void moe(const KernelCall& c, const Ctx& ctx);

// Activations.cu
void gelu(const KernelCall& c, const Ctx& ctx);
void relu(const KernelCall& c, const Ctx& ctx);
void silu(const KernelCall& c, const Ctx& ctx);
void tanh(const KernelCall& c, const Ctx& ctx);
void sigmoid(const KernelCall& c, const Ctx& ctx);
void softmax(const KernelCall& c, const Ctx& ctx);
void dropout(const KernelCall& c, const Ctx& ctx);
// Activation forms used by mlp and moe: "gelu" (tanh form), "relu", "silu".
void actForward(const Ctx& ctx, Act a, const float* x, float* y, int64_t n);
// g *= act'(x), n elements (g holds dL/dy on entry, dL/dx on exit).
void actBackwardInPlace(const Ctx& ctx, Act a, const float* x, float* g, int64_t n);
// Rows of `cols` softmaxed in place-or-not: y = softmax(x) over the last dim.
void softmaxRows(const Ctx& ctx, const float* x, float* y, int64_t rows, int64_t cols);

// Slicing.cu: mean over a dim; select and narrow (keepRun) of a run of its indices.
void mean(const KernelCall& c, const Ctx& ctx);
void keepRun(const KernelCall& c, const Ctx& ctx);
// Elementwise.cu
void add(const KernelCall& c, const Ctx& ctx);
void sub(const KernelCall& c, const Ctx& ctx);
void mul(const KernelCall& c, const Ctx& ctx);
void scale(const KernelCall& c, const Ctx& ctx);
void reshape(const KernelCall& c, const Ctx& ctx); // flatten and reshape: a copy
void transpose(const KernelCall& c, const Ctx& ctx);
// dst (+)= src, n elements.
void writeOrAdd(const Ctx& ctx, const GradOut& dst, const float* src, int64_t n);

// Norms.cu, Embedding.cu
void layerNorm(const KernelCall& c, const Ctx& ctx);
void rmsNorm(const KernelCall& c, const Ctx& ctx);
// batch_norm: where ranks share the micro-batch (KernelCall::sumOverReaders) its channels'
// sums go through the host, which waits for the stream (as moe_experts does).
void batchNorm(const KernelCall& c, const Ctx& ctx);
void embedding(const KernelCall& c, const Ctx& ctx);
void positions(const KernelCall& c, const Ctx& ctx);

// Losses.cu, Pooling.cu, Conv.cu
void crossEntropy(const KernelCall& c, const Ctx& ctx);
void mse(const KernelCall& c, const Ctx& ctx);
void maxPool(const KernelCall& c, const Ctx& ctx);
void avgPool(const KernelCall& c, const Ctx& ctx);
void conv2d(const KernelCall& c, const Ctx& ctx);

// Optimizers.cu
void optimizerStep(const OptimizerCall& c, const Ctx& ctx);
void sumSquares(const Ctx& ctx, const TensorView& x, float* result, bool accumulate);
void scaleInPlace(const Ctx& ctx, const TensorView& x, float factor);

} // namespace epl::backend::cuda
