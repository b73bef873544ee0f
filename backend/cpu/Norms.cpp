// layer_norm and rms_norm over the last dim. Rows run in parallel; the weight and bias
// gradients sum fixed blocks of rows into partials, then add the partials in block order,
// so they do not depend on the thread count. batch_norm: channels run in parallel, each
// summed in one fixed order (in double). Under amp, layer_norm reads and writes its
// half-precision tensors as they are stored, a row at a time through f32 (f32Run,
// outRun): the same bits as on widened copies.
//
// Shape legend: N rows (every dim but the last), D width, P row blocks.
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"
#include "backend/cpu/Lanes.h"

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
  const float *w = c.in[1].f32(), *b = c.in[2].f32();
  const TensorView& y = c.out[0];
  parallelFor(rows, rowGrain(d), [&](int64_t lo, int64_t hi) {
    float *tx = scratch(11, d), *ty = scratch(12, d);
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = f32Run(x, r * d, d, tx);
      float m = laneSum(d, [xr](int64_t j) { return xr[j]; }) / static_cast<float>(d);
      float v = laneSum(d, [xr, m](int64_t j) { return (xr[j] - m) * (xr[j] - m); });
      float rs = 1.f / std::sqrt(v / static_cast<float>(d) + eps);
      storeAt(c.out[1], r, m);
      storeAt(c.out[2], r, rs);
      GradOut row = outRun(y, false, r * d, d, ty);
      float* yr = row.p;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j)
        yr[j] = (xr[j] - m) * rs * w[j] + b[j];
      storeRun(y, r * d, d, row);
    }
  });
}

// in = [dy, x, w, b, y, mean, rstd], out = [dx, dw, db].
// xhat = (x - mean) rstd, g = dy w: dx = rstd (g - mean(g) - xhat mean(g xhat)),
// dw = sum over rows of dy xhat, db = sum over rows of dy.
void layerNormBackward(const KernelCall& c) {
  const TensorView& x = c.in[1];
  int64_t d = lastDim(x), rows = rowsOf(x);
  const float* w = c.in[2].f32();
  const TensorView &dy = c.in[0], &dx = c.out[0];
  bool acc = accumulates(c, 0);
  GradOut outs[2] = {gradOut(c, 1), gradOut(c, 2)};
  auto body = [&](int64_t r0, int64_t r1, float* part) {
    float *pw = part, *pb = part + d;
    float *tx = scratch(11, d), *tg = scratch(12, d), *to = scratch(13, d);
    std::fill(part, part + 2 * d, 0.f);
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = f32Run(x, r * d, d, tx), *gr = f32Run(dy, r * d, d, tg);
      float m = f32At(c.in[5], r), rs = f32At(c.in[6], r);
      // The row's two sums in lanes (KernelUtil.h's order), the weight's and bias's partials
      // in the same pass.
      float lg[kLanes] = {}, lgx[kLanes] = {};
      inLanes(d, [&](int64_t j, int u) {
        float xh = (xr[j] - m) * rs, g = gr[j] * w[j];
        lg[u] += g;
        lgx[u] += g * xh;
        pw[j] += gr[j] * xh;
        pb[j] += gr[j];
      });
      if (!dx.data) continue;
      float mg = foldLanes(lg) / static_cast<float>(d),
            mgx = foldLanes(lgx) / static_cast<float>(d);
      GradOut row = outRun(dx, acc, r * d, d, to);
      for (int64_t j = 0; j < d; ++j) {
        float xh = (xr[j] - m) * rs;
        row.put(j, rs * (gr[j] * w[j] - mg - xh * mgx));
      }
      storeRun(dx, r * d, d, row);
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
      float s = laneSum(d, [xr](int64_t j) { return xr[j] * xr[j]; });
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
      float rs = rstd[r];
      float lgx[kLanes] = {};
      inLanes(d, [&](int64_t j, int u) {
        float xh = xr[j] * rs;
        lgx[u] += gr[j] * w[j] * xh;
        pw[j] += gr[j] * xh;
      });
      if (!dx) continue;
      float mgx = foldLanes(lgx) / static_cast<float>(d);
      for (int64_t j = 0; j < d; ++j)
        dx.put(r * d + j, rs * (gr[j] * w[j] - xr[j] * rs * mgx));
    }
  };
  rowBlocks(rows, d, d, body, outs, 1);
}

// batch_norm's view of x [B, C, S...]: B samples, C channels, S elements of a channel in
// a sample (the product of the dims after C).
struct Channels {
  int64_t b, c, s;
  explicit Channels(const TensorView& x)
      : b(x.shape[0]), c(x.shape[1]), s(x.numel() / std::max<int64_t>(x.shape[0] * x.shape[1], 1)) {
  }
  // Channels a thread takes at least: kParallelMin elements' work.
  int64_t grain() const { return std::max<int64_t>(1, kParallelMin / std::max<int64_t>(b * s, 1)); }
  // f(k, j) for every element j of channel k, in one fixed order.
  template <class F> void each(int64_t k, F f) const {
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = (i * c + k) * s, end = j + s; j < end; ++j)
        f(j);
  }
};

// in = [x [B, C, ...], w [C], b [C], running_mean [C], running_var [C]],
// out = [y, mean [C], rstd [C]]. Training: the batch's statistics (over every rank sharing
// the micro-batch, c.sumOverReaders), which the running ones then move towards by
// `momentum` (the variance unbiased, as PyTorch); evaluation: the running ones.
void batchNormForward(const KernelCall& c) {
  const TensorView& x = c.in[0];
  Channels ch(x);
  const float *xp = x.f32(), *w = c.in[1].f32(), *bias = c.in[2].f32();
  float *runMean = c.in[3].f32(), *runVar = c.in[4].f32();
  float *y = c.out[0].f32(), *mean = c.out[1].f32(), *rstd = c.out[2].f32();
  double eps = attrFloat(c, "eps"), momentum = attrFloat(c, "momentum");
  if (c.training) {
    // Per channel: the sum and the sum of squares; then the count.
    std::vector<double> sums(static_cast<size_t>(2 * ch.c + 1));
    parallelFor(ch.c, ch.grain(), [&](int64_t lo, int64_t hi) {
      for (int64_t k = lo; k < hi; ++k) {
        double s1 = 0, s2 = 0;
        ch.each(k, [&](int64_t j) {
          s1 += xp[j];
          s2 += static_cast<double>(xp[j]) * xp[j];
        });
        sums[2 * k] = s1;
        sums[2 * k + 1] = s2;
      }
    });
    sums.back() = static_cast<double>(ch.b * ch.s);
    if (c.sumOverReaders) c.sumOverReaders(sums.data(), static_cast<int64_t>(sums.size()));
    double n = sums.back();
    for (int64_t k = 0; k < ch.c; ++k) {
      double m = sums[2 * k] / n, var = std::max(sums[2 * k + 1] / n - m * m, 0.0);
      mean[k] = static_cast<float>(m);
      rstd[k] = static_cast<float>(1 / std::sqrt(var + eps));
      runMean[k] = static_cast<float>((1 - momentum) * runMean[k] + momentum * m);
      double unbiased = n > 1 ? var * n / (n - 1) : var;
      runVar[k] = static_cast<float>((1 - momentum) * runVar[k] + momentum * unbiased);
    }
  } else {
    for (int64_t k = 0; k < ch.c; ++k) {
      mean[k] = runMean[k];
      rstd[k] = static_cast<float>(1 / std::sqrt(static_cast<double>(runVar[k]) + eps));
    }
  }
  parallelFor(ch.c, ch.grain(), [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      float m = mean[k], scale = rstd[k] * w[k], shift = bias[k];
      ch.each(k, [&](int64_t j) { y[j] = (xp[j] - m) * scale + shift; });
    }
  });
}

// in = [dy, x, w, b, running_mean, running_var, y, mean, rstd],
// out = [dx, dw, db, d running_mean, d running_var (zero)].
// dx = w rstd (dy - sum(dy) / n - xhat sum(dy xhat) / n), the sums over the whole
// micro-batch; dw = sum(dy xhat) and db = sum(dy) over this rank's share (the gradients'
// reduction adds the ranks').
void batchNormBackward(const KernelCall& c) {
  const TensorView& x = c.in[1];
  Channels ch(x);
  const float *dy = c.in[0].f32(), *xp = x.f32(), *w = c.in[2].f32();
  const float *mean = c.in[7].f32(), *rstd = c.in[8].f32();
  GradOut dx = gradOut(c, 0), dw = gradOut(c, 1), db = gradOut(c, 2);
  std::vector<double> sums(static_cast<size_t>(2 * ch.c + 1));
  parallelFor(ch.c, ch.grain(), [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      double g1 = 0, g2 = 0;
      float m = mean[k], r = rstd[k];
      ch.each(k, [&](int64_t j) {
        g1 += dy[j];
        g2 += static_cast<double>(dy[j]) * ((xp[j] - m) * r);
      });
      sums[2 * k] = g1;
      sums[2 * k + 1] = g2;
    }
  });
  for (int64_t k = 0; k < ch.c; ++k) {
    if (dw) dw.put(k, static_cast<float>(sums[2 * k + 1]));
    if (db) db.put(k, static_cast<float>(sums[2 * k]));
  }
  for (int o = 3; o < 5; ++o)
    if (GradOut state = gradOut(c, o)) zeroUnlessAcc(state, ch.c);
  if (!dx) return;
  sums.back() = static_cast<double>(ch.b * ch.s);
  if (c.sumOverReaders) c.sumOverReaders(sums.data(), static_cast<int64_t>(sums.size()));
  double n = sums.back();
  parallelFor(ch.c, ch.grain(), [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      float m = mean[k], r = rstd[k], scale = w[k] * r;
      float mean1 = static_cast<float>(sums[2 * k] / n),
            mean2 = static_cast<float>(sums[2 * k + 1] / n);
      ch.each(k, [&](int64_t j) { dx.put(j, scale * (dy[j] - mean1 - (xp[j] - m) * r * mean2)); });
    }
  });
}

} // namespace

void batchNorm(const KernelCall& c) {
  if (!c.backward) return batchNormForward(c);
  batchNormBackward(c);
}

void layerNorm(const KernelCall& c) {
  if (!c.backward) return layerNormForward(c);
  layerNormBackward(c);
}

void rmsNorm(const KernelCall& c) {
  if (!c.backward) return rmsNormForward(c);
  rmsNormBackward(c);
}

} // namespace epl::backend::cpu
