// attention's scaled dot products on tensor cores, a tile at a time: the launches of the
// kernels in FlashTiles.cuh (which has the algorithm), and the choice of where they run.
#include "backend/cuda/FlashAttention.h"

#include "backend/cuda/Common.cuh"
#include "backend/cuda/FlashTiles.cuh"

#include <cstdlib>
#include <cstring>
#include <type_traits>

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
// kernel gets without asking; the attribute is the current device's, so set at each launch).
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

// run(std::integral_constant<int, EP>) for the width heads of E columns are padded to.
template <class Run> auto atPaddedWidth(int64_t e, Run run) {
  switch (paddedWidth(e)) {
  case 32:
    return run(std::integral_constant<int, 32>{});
  case 64:
    return run(std::integral_constant<int, 64>{});
  default:
    return run(std::integral_constant<int, 128>{});
  }
}

// The most shared memory any of the three kernels takes at E's padded width, in bytes.
int64_t sharedBytes(int64_t e) {
  return atPaddedWidth(e, [](auto ep) {
    constexpr int w = decltype(ep)::value;
    return 4 * std::max({forwardFloats<w>(), keysFloats<w>(), queriesFloats<w>()});
  });
}

// EPL_GPU_ATTENTION=scores: the process's choice, read once.
bool scoresChosen() {
  static const bool scores = [] {
    const char* choice = std::getenv("EPL_GPU_ATTENTION");
    return choice && std::strcmp(choice, "scores") == 0;
  }();
  return scores;
}

// The shared memory a block of the current GPU may opt in to; 0 where it cannot be read.
int sharedOptIn() {
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return optin;
}

} // namespace

bool flashAttentionRuns(const AttentionDims& s) {
  if (scoresChosen()) return false;
  if (s.e < 1 || s.e > kMaxE || s.b > 65535 || s.h > 65535) return false;
  return sharedBytes(s.e) <= sharedOptIn();
}

int64_t flashAttentionWidest() {
  if (scoresChosen()) return 0;
  int optin = sharedOptIn();
  for (int64_t e = kMaxE; e >= 32; e /= 2)
    if (sharedBytes(e) <= optin) return e;
  return 0;
}

void flashAttentionForward(const Ctx& ctx, const AttentionDims& s, const float* qkv, bool qkvTf32,
                           MaskRows mask, float* ctxOut, float* lse) {
  if (s.b == 0 || s.t == 0) return;
  Flash f = flashOf(s, qkv, mask);
  f.qkvTf32 = qkvTf32;
  f.ctx = ctxOut;
  f.lse = lse;
  atPaddedWidth(s.e, [&](auto ep) {
    constexpr int w = decltype(ep)::value;
    fp32Products(ctx) ? forwardAt<w, true>(ctx, s, f) : forwardAt<w, false>(ctx, s, f);
  });
}

void flashAttentionBackward(const Ctx& ctx, const AttentionDims& s, const float* qkv, bool qkvTf32,
                            const float* lse, const float* dctx, const float* dvec, MaskRows mask,
                            float* dqkv) {
  if (s.b == 0 || s.t == 0) return;
  Flash f = flashOf(s, qkv, mask);
  f.qkvTf32 = qkvTf32;
  f.lseIn = lse;
  f.dctx = dctx;
  f.dvec = dvec;
  f.dqkv = dqkv;
  atPaddedWidth(s.e, [&](auto ep) {
    constexpr int w = decltype(ep)::value;
    fp32Products(ctx) ? backwardAt<w, true>(ctx, s, f) : backwardAt<w, false>(ctx, s, f);
  });
}

} // namespace epl::backend::cuda
