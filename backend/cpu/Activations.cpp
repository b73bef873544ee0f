// Activations: gelu (tanh approximation, or exact with erf), relu, silu, tanh, sigmoid, softmax
// over the last dim, and seeded dropout. Elementwise loops run in parallel over fixed chunks, so
// results do not depend on the thread count.
//
// Shape legend: n elements; N rows and C columns for softmax.
#include "backend/DropoutMask.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"
#include "backend/cpu/Lanes.h"

#include <algorithm>
#include <cmath>

namespace epl::backend::cpu {

namespace {

constexpr float kGeluC = 0.7978845608028654f; // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// The tanh form through the logistic function: with u = c (x + a x^3),
// 0.5 (1 + tanh u) = s = 1 / (1 + e^-2u), so gelu(x) = x s and gelu'(x) = s + 2 x s (1 - s) u'.
// One exponential, in the cheaper clamped form (a third less time than through tanhf32).
inline float geluS(float x) {
  return 1.f / (1.f + expf32Clamped(-2.f * kGeluC * (x + kGeluA * x * x * x)));
}

// gelu(x) and its derivative from s = geluS(x).
inline float geluFrom(float x, float s) {
  return x * s;
}
inline float geluGradFrom(float x, float s) {
  return s + 2.f * x * s * (1.f - s) * kGeluC * (1.f + 3.f * kGeluA * x * x);
}

inline float geluOf(float x) {
  return geluFrom(x, geluS(x));
}
inline float geluGrad(float x) {
  return geluGradFrom(x, geluS(x));
}

// The exact form: x Phi(x), Phi the standard normal's distribution function.
constexpr float kRsqrt2 = 0.7071067811865476f;   // 1 / sqrt(2)
constexpr float kRsqrt2Pi = 0.3989422804014327f; // 1 / sqrt(2 pi)

inline float geluExactOf(float x) {
  return 0.5f * x * (1.f + std::erf(x * kRsqrt2));
}

inline float geluExactGrad(float x) {
  return 0.5f * (1.f + std::erf(x * kRsqrt2)) + x * kRsqrt2Pi * std::exp(-0.5f * x * x);
}

inline float siluGrad(float x) {
  float s = sigmoidf32(x);
  return s * (1.f + x * (1.f - s));
}

// Forward: in = [x], out = [y]. Backward: in = [dy, x, y], out = [dx].
template <class F> void forwardMap(const KernelCall& c, F f) {
  const float* x = c.in[0].f32();
  float* y = c.out[0].f32();
  int64_t n = c.in[0].numel();
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i)
      y[i] = f(x[i]);
  });
}

// dx (+)= dy * f(v) where v is x or y, whichever the rule reads.
template <class F> void backwardMap(const KernelCall& c, const TensorView& v, F f) {
  GradOut dx = gradOut(c, 0);
  if (!dx) return;
  const float *dy = c.in[0].f32(), *vp = v.f32();
  int64_t n = c.in[0].numel();
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i)
      dx.put(i, dy[i] * f(vp[i]));
  });
}

// In loops that vectorise, summed in a fixed order (Lanes.h), as accurate for a long row (a
// vocabulary) as a double sum.
void softmaxRow(const float* x, float* y, int64_t cols) {
  float m = rowMaxOf(x, cols);
  double s = blockedSum(cols, [x, y, m](int64_t j) { return y[j] = expf32(x[j] - m); });
  float inv = static_cast<float>(1.0 / s);
#pragma omp simd
  for (int64_t j = 0; j < cols; ++j)
    y[j] *= inv;
}

// y = x * mask(i) (identity when not training); backward dx = dy * the same mask.
void dropoutApply(const KernelCall& c, const float* src, const GradOut& dst, int64_t n) {
  double p = attrFloat(c, "p");
  if (!c.training || p == 0) {
    writeOrAdd(dst, src, n);
    return;
  }
  DropoutMask mask(c.seed, p);
  int64_t at = c.elementOffset;
  if (c.cutPiece > 0) { // a piece of each row of a tensor cut over a split group
    parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        dst.put(i, src[i] * mask.factor(at + c.wholeIndex(i)));
    });
    return;
  }
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i)
      dst.put(i, src[i] * mask.factor(at + i));
  });
}

} // namespace

void actForward(Act a, const float* x, float* y, int64_t n) {
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
    if (a == Act::Gelu) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i)
        y[i] = geluOf(x[i]);
    } else if (a == Act::GeluExact) {
      for (int64_t i = lo; i < hi; ++i)
        y[i] = geluExactOf(x[i]);
    } else if (a == Act::Relu) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i)
        y[i] = std::max(x[i], 0.f);
    } else {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i)
        y[i] = x[i] * sigmoidf32(x[i]);
    }
  });
}

void actForwardAndGrad(Act a, const float* x, float* y, float* dydx, int64_t n) {
  if (a != Act::Gelu) {
    actForward(a, x, y, n);
    std::fill(dydx, dydx + n, 1.f);
    actBackwardInPlace(a, x, dydx, n);
    return;
  }
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      float s = geluS(x[i]);
      y[i] = geluFrom(x[i], s);
      dydx[i] = geluGradFrom(x[i], s);
    }
  });
}

void actBackwardInPlace(Act a, const float* x, float* g, int64_t n) {
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
    if (a == Act::Gelu) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i)
        g[i] *= geluGrad(x[i]);
    } else if (a == Act::GeluExact) {
      for (int64_t i = lo; i < hi; ++i)
        g[i] *= geluExactGrad(x[i]);
    } else if (a == Act::Relu) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i)
        g[i] = x[i] > 0.f ? g[i] : 0.f;
    } else {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i)
        g[i] *= siluGrad(x[i]);
    }
  });
}

void gelu(const KernelCall& c) {
  if (geluForm(c) == Act::GeluExact) {
    if (!c.backward) return forwardMap(c, [](float v) { return geluExactOf(v); });
    return backwardMap(c, c.in[1], [](float v) { return geluExactGrad(v); });
  }
  if (!c.backward) return forwardMap(c, [](float v) { return geluOf(v); });
  backwardMap(c, c.in[1], [](float v) { return geluGrad(v); });
}

void relu(const KernelCall& c) {
  if (!c.backward) return forwardMap(c, [](float v) { return std::max(v, 0.f); });
  backwardMap(c, c.in[2], [](float y) { return y > 0.f ? 1.f : 0.f; });
}

void silu(const KernelCall& c) {
  if (!c.backward) return forwardMap(c, [](float v) { return v * sigmoidf32(v); });
  backwardMap(c, c.in[1], [](float v) { return siluGrad(v); });
}

void tanh(const KernelCall& c) {
  if (!c.backward) return forwardMap(c, [](float v) { return tanhf32(v); });
  backwardMap(c, c.in[2], [](float y) { return 1.f - y * y; });
}

void sigmoid(const KernelCall& c) {
  if (!c.backward) return forwardMap(c, [](float v) { return sigmoidf32(v); });
  backwardMap(c, c.in[2], [](float y) { return y * (1.f - y); });
}

// Forward: in = [x [N, C]], out = [y]. Backward: in = [dy, x, y], out = [dx]; it reads y.
void softmax(const KernelCall& c) {
  int64_t cols = lastDim(c.in[0]), rows = rowsOf(c.in[0]);
  if (!c.backward) {
    const float* x = c.in[0].f32();
    float* y = c.out[0].f32();
    parallelFor(rows, rowGrain(cols), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r)
        softmaxRow(x + r * cols, y + r * cols, cols);
    });
    return;
  }
  GradOut dx = gradOut(c, 0);
  if (!dx) return;
  const float *dy = c.in[0].f32(), *y = c.in[2].f32();
  parallelFor(rows, rowGrain(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float *gr = dy + r * cols, *yr = y + r * cols;
      double dot = 0;
      for (int64_t j = 0; j < cols; ++j)
        dot += gr[j] * yr[j];
      for (int64_t j = 0; j < cols; ++j)
        dx.put(r * cols + j, yr[j] * (gr[j] - static_cast<float>(dot)));
    }
  });
}

// Forward: in = [x], out = [y]. Backward: in = [dy, x, y] (neither read), out = [dx].
void dropout(const KernelCall& c) {
  if (!c.backward) {
    dropoutApply(c, c.in[0].f32(), GradOut{c.out[0].f32(), false}, c.in[0].numel());
    return;
  }
  if (GradOut dx = gradOut(c, 0)) dropoutApply(c, c.in[0].f32(), dx, c.in[0].numel());
}

} // namespace epl::backend::cpu
