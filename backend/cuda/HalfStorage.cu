// amp on the CUDA device, as on the CPU (backend/cpu/HalfStorage.cpp): tensors stored in
// bf16 or IEEE half, computed by the f32 kernels. A call that reads or writes a half view
// runs its f32 kernel on widened copies, and its half outputs are rounded back to nearest
// even; a call that casts its weights (KernelCall::castParams) reads them rounded to the
// half type. The copies go where the memory plan put them (the first stagingFloats of the
// call's workspace), or, for a call without a plan, into the device's staging scratch. The
// roundings are the CPU's bit for bit (backend/comm/Wire.cpp), so the devices differ only
// by the f32 kernels' order of additions.
#include "backend/HalfStaging.h"
#include "backend/cuda/Common.cuh"

#include <cuda_fp16.h>

namespace epl::backend::cuda {

namespace {

__global__ void widenKernel(const uint16_t* h, float* f, int64_t n, bool bf16) {
  EPL_GRID_STRIDE(i, n) {
    f[i] = bf16 ? fromBf16(h[i]) : fromF16(h[i]);
  }
}

__global__ void narrowKernel(const float* f, uint16_t* h, int64_t n, bool bf16) {
  EPL_GRID_STRIDE(i, n) {
    h[i] = bf16 ? toBf16(f[i]) : toF16(f[i]);
  }
}

__global__ void roundKernel(const float* src, float* dst, int64_t n, bool bf16) {
  EPL_GRID_STRIDE(i, n) {
    dst[i] = bf16 ? fromBf16(toBf16(src[i])) : fromF16(toF16(src[i]));
  }
}

void widen(const Ctx& ctx, ir::DType t, const void* src, float* dst, int64_t n) {
  if (n == 0) return;
  widenKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(static_cast<const uint16_t*>(src), dst, n,
                                                         t == ir::DType::BF16);
  checkLaunch("amp: widening a half-precision tensor");
}

void narrow(const Ctx& ctx, ir::DType t, const float* src, void* dst, int64_t n) {
  if (n == 0) return;
  narrowKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(src, static_cast<uint16_t*>(dst), n,
                                                          t == ir::DType::BF16);
  checkLaunch("amp: rounding a result to half precision");
}

void round(const Ctx& ctx, ir::DType t, const float* src, float* dst, int64_t n) {
  if (n == 0) return;
  roundKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(src, dst, n, t == ir::DType::BF16);
  checkLaunch("amp: rounding weights to half precision");
}

__global__ void wireEncodeKernel(const float* f, uint16_t* h, int64_t n, bool bf16, float scale) {
  EPL_GRID_STRIDE(i, n) {
    h[i] = bf16 ? toBf16(f[i] * scale) : toF16(f[i] * scale);
  }
}

__global__ void wireDecodeKernel(const uint16_t* h, float* f, int64_t n, bool bf16, float scale) {
  EPL_GRID_STRIDE(i, n) {
    f[i] = (bf16 ? fromBf16(h[i]) : fromF16(h[i])) / scale;
  }
}

} // namespace

void wireEncode(cudaStream_t stream, bool bf16, const float* src, uint16_t* dst, int64_t n,
                float scale) {
  if (n == 0) return;
  wireEncodeKernel<<<blocksFor(n), kThreads, 0, stream>>>(src, dst, n, bf16, scale);
  checkLaunch("rounding a reduction's values to its wire type");
}

void wireDecode(cudaStream_t stream, bool bf16, const uint16_t* src, float* dst, int64_t n,
                float scale) {
  if (n == 0) return;
  wireDecodeKernel<<<blocksFor(n), kThreads, 0, stream>>>(src, dst, n, bf16, scale);
  checkLaunch("widening a reduction's result from its wire type");
}

void roundInPlace(const Ctx& ctx, ir::DType t, float* x, int64_t n) {
  round(ctx, t, x, x, n);
}

void narrowTo(const Ctx& ctx, ir::DType t, const float* src, void* dst, int64_t n) {
  narrow(ctx, t, src, dst, n);
}

Operand roundedOperand(const Ctx& ctx, ir::DType t, bool asIs, float* x, int64_t n, void* half) {
  if (!asIs) {
    round(ctx, t, x, x, n);
    return x;
  }
  narrow(ctx, t, x, half, n);
  return {half, t};
}

void launchStaged(const KernelCall& c, const Ctx& ctx, Scratch& staging,
                  void (*run)(const KernelCall&, const Ctx&)) {
  int64_t floats = stagingFloats(c);
  float* at = plannedStaging(c, floats)
                  ? c.workspace
                  : static_cast<float*>(staging.get(4 * std::max<int64_t>(floats, 1)));
  auto widenOn = [&](ir::DType t, const void* src, float* dst, int64_t n) {
    widen(ctx, t, src, dst, n);
  };
  auto roundOn = [&](ir::DType t, const float* src, float* dst, int64_t n) {
    round(ctx, t, src, dst, n);
  };
  auto narrowOn = [&](ir::DType t, const float* src, void* dst, int64_t n) {
    narrow(ctx, t, src, dst, n);
  };
  // cuBLAS multiplies bf16 and IEEE half as they are: the inputs of linear, mlp and
  // attention that only feed products skip the f32 copies.
  uint64_t direct = directInputs(c);
  KernelCall f = stagedCall(c, at, widenOn, roundOn, narrowOn, direct);
  run(f, ctx);
  narrowOutputs(c, f, [&](ir::DType t, const float* src, void* dst, int64_t n) {
    narrow(ctx, t, src, dst, n);
  });
}

} // namespace epl::backend::cuda
