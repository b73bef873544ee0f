// attention's scaled dot products on tensor cores, a tile at a time: the launches of the
// kernels in FlashTiles.cuh (which has the algorithm), and the choice of where they run.
#include "backend/cuda/FlashAttention.h"

#include "backend/cuda/Common.cuh"
#include "backend/cuda/FlashTiles.cuh"

#include <cstdlib>
#include <cstring>

namespace epl::backend::cuda {

namespace {

using namespace flash;

int64_t tilesOf(int64_t n, int64_t tile) {
  return (n + tile - 1) / tile;
}

Flash flashOf(const AttentionDims& s, const float* qkv, MaskRows mask) {
  Flash f;
  f.qkv = qkv;
  f.mask = mask;
  f.t = s.t;
  f.h = s.h;
  f.e = s.e;
  f.group = s.group();
  f.d = s.d;
  f.kvd = s.kvd;
  f.ld = s.ld;
  f.scale = s.scale;
  f.causal = s.causal;
  return f;
}

// Launches kernel over grid with `floats` of dynamic shared memory (above the 48 KiB a
// kernel gets without asking).
template <class Kernel>
void launch(const Ctx& ctx, Kernel kernel, dim3 grid, int threads, int64_t floats, const Flash& f,
            const char* what) {
  int bytes = static_cast<int>(4 * floats);
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
  kernel<<<grid, threads, static_cast<size_t>(bytes), ctx.stream>>>(f);
  checkLaunch(what);
}

// Whether the call's products are fp32's (three TF32 products each: policy `matmul = fp32`)
// or TF32's (`matmul = tf32`).
bool fp32Products(const Ctx& ctx) {
  return ctx.compute != CUBLAS_COMPUTE_32F_FAST_TF32;
}

template <int EP, bool Fp32>
void forwardAt(const Ctx& ctx, const AttentionDims& s, const Flash& f) {
  dim3 grid(static_cast<unsigned>(tilesOf(s.t, kQT)), static_cast<unsigned>(s.h),
            static_cast<unsigned>(s.b));
  launch(ctx, forwardKernel<EP, Fp32>, grid, 4 * kWarp, forwardFloats<EP>(), f, "tiled attention");
}

template <int EP, bool Fp32>
void backwardAt(const Ctx& ctx, const AttentionDims& s, const Flash& f) {
  dim3 keys(static_cast<unsigned>(tilesOf(s.t, kKT)), static_cast<unsigned>(s.kv),
            static_cast<unsigned>(s.b));
  launch(ctx, keysKernel<EP, Fp32>, keys, 8 * kWarp, keysFloats<EP>(), f,
         "tiled attention backward (dk, dv)");
  dim3 queries(static_cast<unsigned>(tilesOf(s.t, kQT)), static_cast<unsigned>(s.h),
               static_cast<unsigned>(s.b));
  launch(ctx, queriesKernel<EP, Fp32>, queries, 8 * kWarp, queriesFloats<EP>(), f,
         "tiled attention backward (dq)");
}

template <int EP> void forwardAt(const Ctx& ctx, const AttentionDims& s, const Flash& f) {
  return fp32Products(ctx) ? forwardAt<EP, true>(ctx, s, f) : forwardAt<EP, false>(ctx, s, f);
}

template <int EP> void backwardAt(const Ctx& ctx, const AttentionDims& s, const Flash& f) {
  return fp32Products(ctx) ? backwardAt<EP, true>(ctx, s, f) : backwardAt<EP, false>(ctx, s, f);
}

// The most shared memory any of the three kernels takes at head width EP, in bytes.
int64_t sharedBytes(int ep) {
  switch (ep) {
  case 32:
    return 4 * std::max({forwardFloats<32>(), keysFloats<32>(), queriesFloats<32>()});
  case 64:
    return 4 * std::max({forwardFloats<64>(), keysFloats<64>(), queriesFloats<64>()});
  default:
    return 4 * std::max({forwardFloats<128>(), keysFloats<128>(), queriesFloats<128>()});
  }
}

} // namespace

bool flashAttentionRuns(const AttentionDims& s) {
  const char* choice = std::getenv("EPL_GPU_ATTENTION");
  if (choice && std::strcmp(choice, "scores") == 0) return false;
  if (s.e < 1 || s.e > kMaxE || s.b > 65535 || s.h > 65535) return false;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return sharedBytes(paddedWidth(s.e)) <= optin;
}

void flashAttentionForward(const Ctx& ctx, const AttentionDims& s, const float* qkv, MaskRows mask,
                           float* ctxOut, float* lse) {
  if (s.b == 0 || s.t == 0) return;
  Flash f = flashOf(s, qkv, mask);
  f.ctx = ctxOut;
  f.lse = lse;
  switch (paddedWidth(s.e)) {
  case 32:
    return forwardAt<32>(ctx, s, f);
  case 64:
    return forwardAt<64>(ctx, s, f);
  default:
    return forwardAt<128>(ctx, s, f);
  }
}

void flashAttentionBackward(const Ctx& ctx, const AttentionDims& s, const float* qkv,
                            const float* lse, const float* dctx, const float* dvec, MaskRows mask,
                            float* dqkv) {
  if (s.b == 0 || s.t == 0) return;
  Flash f = flashOf(s, qkv, mask);
  f.lseIn = lse;
  f.dctx = dctx;
  f.dvec = dvec;
  f.dqkv = dqkv;
  switch (paddedWidth(s.e)) {
  case 32:
    return backwardAt<32>(ctx, s, f);
  case 64:
    return backwardAt<64>(ctx, s, f);
  default:
    return backwardAt<128>(ctx, s, f);
  }
}

} // namespace epl::backend::cuda
