// conv2d on the GPU (NCHW, square kernel, stride, zero padding) as backend/cpu/Conv.cpp
// computes it: im2col + one cuBLAS gemm per group of images, groups of a fixed size (from
// the shapes alone). col2im gathers each input element's entries in the CPU's order, so no
// atomics are needed.
//
// Forward, per group of G images:  col [CKK, G*P] = im2col(x);  tmp [Co, G*P] = W col;
//                                  y[b, co] = tmp[co, b] + bias[co].
// Backward:  db (+)= sums of dy over B and P, once;  then per group:
//            dY [Co, G*P] gathered from dy;  dW (+)= dY col^T;  dcol = W^T dY;
//            dx (+)= col2im(dcol).
//
// Shape legend: B batch, C input channels, Co output channels, H, W input height and
// width, K kernel, Ho, Wo output height and width, P = Ho*Wo, G images in a group,
// CKK = C*K*K.
#include "backend/KernelShapes.h"
#include "backend/cuda/Common.cuh"
#include "support/Assert.h"

namespace epl::backend::cuda {

namespace {

using Geometry = ConvGeometry;

// Device buffers carved out of one scratch block, each 256-byte aligned.
class Carver {
public:
  explicit Carver(const Ctx& ctx, int64_t totalBytes)
      : at_(static_cast<char*>(ctx.scratch->get(totalBytes))) {}
  static int64_t aligned(int64_t floats) { return (floats * 4 + 255) / 256 * 256; }
  float* take(int64_t floats) {
    float* p = reinterpret_cast<float*>(at_);
    at_ += aligned(floats);
    return p;
  }

private:
  char* at_;
};

// col[(c K + i) K + j, n P + oh Wo + ow] = x[b0 + n, c, oh s - pad + i, ow s - pad + j] or 0.
__global__ void im2col(Geometry g, const float* x, int64_t b0, int64_t nImg, float* col) {
  int64_t p = g.plane(), ld = nImg * p;
  EPL_GRID_STRIDE(idx, g.ckk() * ld) {
    int64_t r = idx / ld, n = idx % ld / p, e = idx % p;
    int64_t ch = r / (g.k * g.k), i = r / g.k % g.k, j = r % g.k;
    int64_t ih = e / g.wo * g.stride - g.pad + i, iw = e % g.wo * g.stride - g.pad + j;
    bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
    col[idx] = inside ? x[(((b0 + n) * g.c + ch) * g.h + ih) * g.w + iw] : 0.f;
  }
}

// dx[b0 + n, c, ih, iw] (+)= the dcol entries im2col took from it, kernel offsets (i, j) in
// ascending order as the CPU's scatter adds them.
__global__ void col2im(Geometry g, const float* dcol, int64_t b0, int64_t nImg, GradOut dx) {
  int64_t p = g.plane(), ld = nImg * p, hw = g.h * g.w;
  EPL_GRID_STRIDE(idx, nImg * g.c * hw) {
    int64_t n = idx / (g.c * hw), ch = idx / hw % g.c, ih = idx % hw / g.w, iw = idx % g.w;
    int64_t o = b0 * g.c * hw + idx;
    float v = dx.acc ? dx.p[o] : 0.f;
    for (int64_t i = 0; i < g.k; ++i) {
      int64_t th = ih + g.pad - i; // oh * stride
      if (th < 0 || th % g.stride != 0 || th / g.stride >= g.ho) continue;
      for (int64_t j = 0; j < g.k; ++j) {
        int64_t tw = iw + g.pad - j; // ow * stride
        if (tw < 0 || tw % g.stride != 0 || tw / g.stride >= g.wo) continue;
        v += dcol[((ch * g.k + i) * g.k + j) * ld + n * p + th / g.stride * g.wo + tw / g.stride];
      }
    }
    dx.p[o] = v;
  }
}

// y[b0 + n, co, e] = tmp[co, n P + e] + bias[co] (no bias: null).
__global__ void writeOutput(Geometry g, const float* tmp, const float* bias, int64_t b0,
                            int64_t nImg, float* y) {
  int64_t p = g.plane();
  EPL_GRID_STRIDE(idx, nImg * g.co * p) {
    int64_t n = idx / (g.co * p), co = idx / p % g.co, e = idx % p;
    y[b0 * g.co * p + idx] = tmp[co * nImg * p + n * p + e] + (bias ? bias[co] : 0.f);
  }
}

// dY[co, n P + e] = dy[b0 + n, co, e].
__global__ void gatherGrad(Geometry g, const float* dy, int64_t b0, int64_t nImg, float* dY) {
  int64_t p = g.plane();
  EPL_GRID_STRIDE(idx, g.co * nImg * p) {
    int64_t co = idx / (nImg * p), n = idx / p % nImg, e = idx % p;
    dY[idx] = dy[((b0 + n) * g.co + co) * p + e];
  }
}

// db[co] (+)= sum of dy[:, co, :], one block of kThreads per channel, in a fixed tree order.
__global__ void biasGrad(Geometry g, const float* dy, GradOut db) {
  __shared__ float part[kThreads];
  int64_t p = g.plane(), co = blockIdx.x;
  float s = 0;
  for (int64_t idx = threadIdx.x; idx < g.b * p; idx += kThreads)
    s += dy[(idx / p * g.co + co) * p + idx % p];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) db.p[co] = db.acc ? db.p[co] + part[0] : part[0];
}

// in = [x, W [Co, C, K, K], b [Co]?], out = [y [B, Co, Ho, Wo]].
void convForward(const KernelCall& c, const Ctx& ctx, bool hasBias) {
  const TensorView &x = c.in[0], &w = c.in[1];
  Geometry g = convGeometry(c, x, w);
  int64_t group = g.group(), p = g.plane();
  Carver carve(ctx, Carver::aligned(g.ckk() * group * p) + Carver::aligned(g.co * group * p));
  float *col = carve.take(g.ckk() * group * p), *tmp = carve.take(g.co * group * p);
  const float* bias = hasBias ? c.in[2].f32() : nullptr;
  for (int64_t b0 = 0; b0 < g.b; b0 += group) {
    int64_t n = std::min(group, g.b - b0), ld = n * p;
    im2col<<<blocksFor(g.ckk() * ld), kThreads, 0, ctx.stream>>>(g, x.f32(), b0, n, col);
    checkLaunch("conv2d forward im2col");
    gemm(ctx, false, false, g.co, ld, g.ckk(), 1.f, w.f32(), g.ckk(), col, ld, 0.f, tmp, ld);
    writeOutput<<<blocksFor(g.co * ld), kThreads, 0, ctx.stream>>>(g, tmp, bias, b0, n,
                                                                   c.out[0].f32());
    checkLaunch("conv2d forward output");
  }
}

// in = [dy, x, W, b?, y], out = [dx, dW, db?].
void convBackward(const KernelCall& c, const Ctx& ctx, bool hasBias) {
  const TensorView &dyv = c.in[0], &x = c.in[1], &w = c.in[2];
  Geometry g = convGeometry(c, x, w);
  GradOut dx = gradOut(c, 0), dw = gradOut(c, 1), db = hasBias ? gradOut(c, 2) : GradOut{};
  const float* dy = dyv.f32();
  if (db) {
    biasGrad<<<static_cast<unsigned>(g.co), kThreads, 0, ctx.stream>>>(g, dy, db);
    checkLaunch("conv2d backward bias");
  }
  if (!dx && !dw) return;
  int64_t group = g.group(), p = g.plane(), colFloats = g.ckk() * group * p;
  Carver carve(ctx, 2 * Carver::aligned(colFloats) + Carver::aligned(g.co * group * p));
  float *col = carve.take(colFloats), *dcol = carve.take(colFloats),
        *dY = carve.take(g.co * group * p);
  for (int64_t b0 = 0; b0 < g.b; b0 += group) {
    int64_t n = std::min(group, g.b - b0), ld = n * p;
    gatherGrad<<<blocksFor(g.co * ld), kThreads, 0, ctx.stream>>>(g, dy, b0, n, dY);
    checkLaunch("conv2d backward gather");
    if (dw) {
      im2col<<<blocksFor(g.ckk() * ld), kThreads, 0, ctx.stream>>>(g, x.f32(), b0, n, col);
      checkLaunch("conv2d backward im2col");
      float beta = b0 == 0 ? dw.beta() : 1.f;
      gemm(ctx, false, true, g.co, g.ckk(), ld, 1.f, dY, ld, col, ld, beta, dw.p, g.ckk());
    }
    if (dx) {
      gemm(ctx, true, false, g.ckk(), ld, g.co, 1.f, w.f32(), g.ckk(), dY, ld, 0.f, dcol, ld);
      col2im<<<blocksFor(n * g.c * g.h * g.w), kThreads, 0, ctx.stream>>>(g, dcol, b0, n, dx);
      checkLaunch("conv2d backward col2im");
    }
  }
}

} // namespace

void conv2d(const KernelCall& c, const Ctx& ctx) {
  bool hasBias = attrBool(c, "bias");
  if (!c.backward) return convForward(c, ctx, hasBias);
  convBackward(c, ctx, hasBias);
}

} // namespace epl::backend::cuda
