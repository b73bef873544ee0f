// Optimizer updates with torch.optim's formulas and operation order (SGD with momentum,
// Adam, AdamW), plus the sum of squares and the in-place scale used for gradient clipping.
//
// Shape legend: n elements of one parameter.
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

#include <algorithm>
#include <cmath>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace epl::backend::cpu {

namespace {

// Subnormal floats read as zero and results that would be subnormal written as zero, for
// one thread's part of an update (x86's MXCSR: DAZ and FTZ), the previous mode restored
// after. A moment whose gradient stays zero (a pixel that is always black, an embedding
// row no batch reads) decays by beta each step into the subnormal range, where every
// multiply takes a microcode assist. Flushed, such a moment is zero: it moved its parameter
// by less than a subnormal, which rounding drops anyway. docs/architecture.md (the CPU
// backend: "Optimizer updates flush subnormals") has the figures; other architectures
// keep subnormals.
class FlushSubnormals {
public:
#if defined(__SSE__)
  FlushSubnormals() : saved_(_mm_getcsr()) {
    _mm_setcsr(saved_ | kDaz | kFtz);
  }
  ~FlushSubnormals() {
    _mm_setcsr(saved_);
  }

private:
  static constexpr unsigned kDaz = 1u << 6, kFtz = 1u << 15;
  unsigned saved_;
#else
  FlushSubnormals() = default;
#endif
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;
};

// What the gradient is multiplied by: gradScale, and the clip factor and the loss scale's
// inverse where the squared norm is read here.
float gradScale(const OptimizerCall& c) {
  return c.squaredNorm ? c.gradScale * updateFactor(*c.squaredNorm, c.maxNorm, c.lossScale)
                       : c.gradScale;
}

// torch.optim.SGD (dampening 0, no Nesterov): d = g + wd p; buf = d on the first step, else
// momentum * buf + d; p -= lr * buf.
void sgd(const OptimizerCall& c, int64_t n) {
  float *p = c.param.f32(), *buf = c.state1.f32();
  const float* g = c.grad.f32();
  float gs = gradScale(c), wd = c.weightDecay, mom = c.momentum, negLr = -c.lr;
  bool useBuf = mom != 0.f;
  EPL_ASSERT(!useBuf || buf, "sgd with momentum needs a momentum buffer");
  bool first = c.step <= 1;
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
    FlushSubnormals flush;
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      float d = g[i] * gs;
      if (wd != 0.f) d = d + wd * p[i];
      if (useBuf) {
        buf[i] = first ? d : buf[i] * mom + d;
        d = buf[i];
      }
      p[i] = p[i] + negLr * d;
    }
  });
}

// torch.optim.Adam / AdamW (no amsgrad): AdamW first decays p by (1 - lr wd); Adam adds wd p
// to the gradient. m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
void adam(const OptimizerCall& c, int64_t n, bool decoupled) {
  float *p = c.param.f32(), *m = c.state1.f32(), *v = c.state2.f32();
  EPL_ASSERT(m && v, "adam needs both moment buffers");
  const float* g = c.grad.f32();
  double t = static_cast<double>(c.step);
  double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), t);
  double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), t);
  float negStep = static_cast<float>(-(static_cast<double>(c.lr) / bc1));
  float bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  float b1 = c.beta1, b2 = c.beta2, a1 = static_cast<float>(1.0 - c.beta1),
        a2 = static_cast<float>(1.0 - c.beta2), eps = c.eps, gs = gradScale(c);
  float wd = decoupled ? 0.f : c.weightDecay;
  float decay = decoupled ? static_cast<float>(1.0 - double(c.lr) * c.weightDecay) : 1.f;
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
    FlushSubnormals flush;
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      float pi = p[i] * decay;
      float d = g[i] * gs;
      if (wd != 0.f) d = d + wd * pi;
      m[i] = m[i] * b1 + a1 * d;
      v[i] = v[i] * b2 + a2 * (d * d);
      float denom = std::sqrt(v[i]) / bc2Sqrt + eps;
      p[i] = pi + negStep * (m[i] / denom);
    }
  });
}

} // namespace

void optimizerStep(const OptimizerCall& c) {
  int64_t n = c.param.numel();
  EPL_ASSERT(c.grad.numel() == n, "optimizer gradient and parameter differ in size");
  if (c.squaredNorm && overflowed(*c.squaredNorm, c.lossScale)) return; // a skipped step
  switch (c.kind) {
  case OptimizerKind::Sgd:
    return sgd(c, n);
  case OptimizerKind::Adam:
    return adam(c, n, false);
  case OptimizerKind::AdamW:
    return adam(c, n, true);
  }
}

void sumSquares(const TensorView& x, float* result, bool accumulate) {
  constexpr int64_t kBlock = 4096;
  int64_t n = x.numel(), blocks = (n + kBlock - 1) / kBlock;
  const float* p = x.f32();
  double* part = reinterpret_cast<double*>(scratch(0, 2 * blocks));
  parallelFor(blocks, kParallelMin / kBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      double s = 0;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
        s += static_cast<double>(p[i]) * p[i];
      part[b] = s;
    }
  });
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b)
    total += part[b];
  *result = accumulate ? *result + static_cast<float>(total) : static_cast<float>(total);
}

void scaleInPlace(const TensorView& x, float factor) {
  int64_t n = x.numel();
  float* p = x.f32();
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i)
      p[i] *= factor;
  });
}

} // namespace epl::backend::cpu
