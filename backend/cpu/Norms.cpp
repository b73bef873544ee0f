// layer_norm and rms_norm over the last dim. Rows run in parallel; the weight and bias
// gradients sum fixed blocks of rows into partials, then add the partials in block order,
// so they do not depend on the thread count.
//
// Shape legend: N rows (every dim but the last), D width, P row blocks.
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

#include <algorithm>

namespace epl::backend::cpu {

namespace {

constexpr int64_t kBlockRows = 32;

// Runs body(r0, r1, partial) over row blocks in parallel, each block writing `width` floats of
// partial sums; then out[j] (+)= sum over blocks of partial[j], in block order.
template <class Body>
void rowBlocks(int64_t rows, int64_t d, int64_t width, Body body, const GradOut* outs, int nOuts) {
  int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  float* part = scratch(0, std::max<int64_t>(blocks, 1) * width);
  parallelFor(blocks, std::max<int64_t>(1, rowGrain(d) / kBlockRows), [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b)
      body(b * kBlockRows, std::min(rows, (b + 1) * kBlockRows), part + b * width);
  });
  for (int k = 0; k < nOuts; ++k) {
    if (!outs[k]) continue;
    parallelFor(d, kParallelMin / std::max<int64_t>(blocks, 1), [&](int64_t lo, int64_t hi) {
      for (int64_t j = lo; j < hi; ++j) {
        float s = 0;
        for (int64_t b = 0; b < blocks; ++b)
          s += part[b * width + k * d + j];
        outs[k].put(j, s);
      }
    });
  }
}

// in = [x [N, D], w [D], b [D]], out = [y, mean [N], rstd [N]].
void layerNormForward(const KernelCall& c) {
  const TensorView& x = c.in[0];
  int64_t d = lastDim(x), rows = rowsOf(x);
  float eps = static_cast<float>(attrFloat(c, "eps"));
  const float *xp = x.f32(), *w = c.in[1].f32(), *b = c.in[2].f32();
  float *y = c.out[0].f32(), *mean = c.out[1].f32(), *rstd = c.out[2].f32();
  parallelFor(rows, rowGrain(d), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = xp + r * d;
      float s = 0, v = 0;
      for (int64_t j = 0; j < d; ++j)
        s += xr[j];
      float m = s / static_cast<float>(d);
      for (int64_t j = 0; j < d; ++j)
        v += (xr[j] - m) * (xr[j] - m);
      float rs = 1.f / std::sqrt(v / static_cast<float>(d) + eps);
      mean[r] = m;
      rstd[r] = rs;
      for (int64_t j = 0; j < d; ++j)
        y[r * d + j] = (xr[j] - m) * rs * w[j] + b[j];
    }
  });
}

// in = [dy, x, w, b, y, mean, rstd], out = [dx, dw, db].
// xhat = (x - mean) rstd, g = dy w: dx = rstd (g - mean(g) - xhat mean(g xhat)),
// dw = sum over rows of dy xhat, db = sum over rows of dy.
void layerNormBackward(const KernelCall& c) {
  const TensorView& x = c.in[1];
  int64_t d = lastDim(x), rows = rowsOf(x);
  const float *dy = c.in[0].f32(), *xp = x.f32(), *w = c.in[2].f32();
  const float *mean = c.in[5].f32(), *rstd = c.in[6].f32();
  GradOut dx = gradOut(c, 0), outs[2] = {gradOut(c, 1), gradOut(c, 2)};
  auto body = [&](int64_t r0, int64_t r1, float* part) {
    float *pw = part, *pb = part + d;
    std::fill(part, part + 2 * d, 0.f);
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = xp + r * d, *gr = dy + r * d;
      float m = mean[r], rs = rstd[r], sg = 0, sgx = 0;
      for (int64_t j = 0; j < d; ++j) {
        float xh = (xr[j] - m) * rs, g = gr[j] * w[j];
        sg += g;
        sgx += g * xh;
        pw[j] += gr[j] * xh;
        pb[j] += gr[j];
      }
      if (!dx) continue;
      float mg = sg / static_cast<float>(d), mgx = sgx / static_cast<float>(d);
      for (int64_t j = 0; j < d; ++j) {
        float xh = (xr[j] - m) * rs;
        dx.put(r * d + j, rs * (gr[j] * w[j] - mg - xh * mgx));
      }
    }
  };
  rowBlocks(rows, d, 2 * d, body, outs, 2);
}

// in = [x [N, D], w [D]], out = [y, rstd [N]].
void rmsNormForward(const KernelCall& c) {
  const TensorView& x = c.in[0];
  int64_t d = lastDim(x), rows = rowsOf(x);
  float eps = static_cast<float>(attrFloat(c, "eps"));
  const float *xp = x.f32(), *w = c.in[1].f32();
  float *y = c.out[0].f32(), *rstd = c.out[1].f32();
  parallelFor(rows, rowGrain(d), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = xp + r * d;
      float s = 0;
      for (int64_t j = 0; j < d; ++j)
        s += xr[j] * xr[j];
      float rs = 1.f / std::sqrt(s / static_cast<float>(d) + eps);
      rstd[r] = rs;
      for (int64_t j = 0; j < d; ++j)
        y[r * d + j] = xr[j] * rs * w[j];
    }
  });
}

// in = [dy, x, w, y, rstd], out = [dx, dw].
// xhat = x rstd, g = dy w: dx = rstd (g - xhat mean(g xhat)), dw = sum over rows of dy xhat.
void rmsNormBackward(const KernelCall& c) {
  const TensorView& x = c.in[1];
  int64_t d = lastDim(x), rows = rowsOf(x);
  const float *dy = c.in[0].f32(), *xp = x.f32(), *w = c.in[2].f32(), *rstd = c.in[4].f32();
  GradOut dx = gradOut(c, 0), outs[1] = {gradOut(c, 1)};
  auto body = [&](int64_t r0, int64_t r1, float* pw) {
    std::fill(pw, pw + d, 0.f);
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = xp + r * d, *gr = dy + r * d;
      float rs = rstd[r], sgx = 0;
      for (int64_t j = 0; j < d; ++j) {
        float xh = xr[j] * rs;
        sgx += gr[j] * w[j] * xh;
        pw[j] += gr[j] * xh;
      }
      if (!dx) continue;
      float mgx = sgx / static_cast<float>(d);
      for (int64_t j = 0; j < d; ++j)
        dx.put(r * d + j, rs * (gr[j] * w[j] - xr[j] * rs * mgx));
    }
  };
  rowBlocks(rows, d, d, body, outs, 1);
}

} // namespace

void layerNorm(const KernelCall& c) {
  if (!c.backward) return layerNormForward(c);
  layerNormBackward(c);
}

void rmsNorm(const KernelCall& c) {
  if (!c.backward) return rmsNormForward(c);
  rmsNormBackward(c);
}

} // namespace epl::backend::cpu
