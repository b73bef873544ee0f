// Optimizer updates on the GPU with torch.optim's formulas and operation order (SGD with
// momentum, Adam, AdamW), as backend/cpu/Optimizers.cpp computes them: one elementwise kernel
// a call (a parameter, or several end to end: docs/architecture.md, "One update for adjacent
// parameters"), its scalars (bias corrections in double) worked out on the host, the clip
// factor and a loss scale (whose overflow skips the update) read on the device where the call
// says so. Plus the
// sum of squares, in two fixed-order passes, and the in-place scale used for clipping.
//
// Shape legend: n elements of the call's parameters.
#include "backend/cuda/Common.cuh"
#include "support/Assert.h"

#include <cmath>

namespace epl::backend::cuda {

namespace {

// torch.optim.SGD (dampening 0, no Nesterov).
struct SgdScalars {
  float gradScale, weightDecay, momentum, negLr;
  bool useBuf, first;
  const float* squaredNorm; // clipping and a loss scale read on the device (OptimizerCall)
  double maxNorm, lossScale;
};

// gradScale, times updateFactor where the squared norm is on the device.
__device__ float gradScale(float scale, const float* squaredNorm, double maxNorm,
                           double lossScale) {
  return squaredNorm ? scale * updateFactor(*squaredNorm, maxNorm, lossScale) : scale;
}

// Whether a loss scale's overflow skips the update: every thread reads it alike.
__device__ bool skipped(const float* squaredNorm, double lossScale) {
  return squaredNorm && overflowed(*squaredNorm, lossScale);
}

// d = g + wd p; buf = d on the first step, else momentum * buf + d; p -= lr * buf.
__global__ void sgdStep(float* p, const float* g, float* buf, int64_t n, SgdScalars s) {
  if (skipped(s.squaredNorm, s.lossScale)) return;
  float gs = gradScale(s.gradScale, s.squaredNorm, s.maxNorm, s.lossScale);
  EPL_GRID_STRIDE(i, n) {
    float d = g[i] * gs;
    if (s.weightDecay != 0.f) d = d + s.weightDecay * p[i];
    if (s.useBuf) {
      buf[i] = s.first ? d : buf[i] * s.momentum + d;
      d = buf[i];
    }
    p[i] = p[i] + s.negLr * d;
  }
}

// torch.optim.Adam / AdamW (no amsgrad), the bias corrections folded in on the host.
struct AdamScalars {
  float negStep, bc2Sqrt, b1, b2, a1, a2, eps, gradScale, weightDecay, decay;
  const float* squaredNorm;
  double maxNorm, lossScale;
};

// AdamW first decays p by (1 - lr wd); Adam adds wd p to the gradient.
// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
__global__ void adamStep(float* p, const float* g, float* m, float* v, int64_t n, AdamScalars s) {
  if (skipped(s.squaredNorm, s.lossScale)) return;
  float gs = gradScale(s.gradScale, s.squaredNorm, s.maxNorm, s.lossScale);
  EPL_GRID_STRIDE(i, n) {
    float pi = p[i] * s.decay;
    float d = g[i] * gs;
    if (s.weightDecay != 0.f) d = d + s.weightDecay * pi;
    m[i] = m[i] * s.b1 + s.a1 * d;
    v[i] = v[i] * s.b2 + s.a2 * (d * d);
    float denom = sqrtf(v[i]) / s.bc2Sqrt + s.eps;
    p[i] = pi + s.negStep * (m[i] / denom);
  }
}

void sgd(const OptimizerCall& c, const Ctx& ctx, int64_t n) {
  SgdScalars s{c.gradScale, c.weightDecay, c.momentum, -c.lr,      c.momentum != 0.f,
               c.step <= 1, c.squaredNorm, c.maxNorm,  c.lossScale};
  EPL_ASSERT(!s.useBuf || c.state1.data, "sgd with momentum needs a momentum buffer");
  sgdStep<<<blocksFor(n), kThreads, 0, ctx.stream>>>(c.param.f32(), c.grad.f32(), c.state1.f32(), n,
                                                     s);
  checkLaunch("sgd step");
}

void adam(const OptimizerCall& c, const Ctx& ctx, int64_t n, bool decoupled) {
  EPL_ASSERT(c.state1.data && c.state2.data, "adam needs both moment buffers");
  double t = static_cast<double>(c.step);
  double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), t);
  double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), t);
  AdamScalars s{static_cast<float>(-(static_cast<double>(c.lr) / bc1)),
                static_cast<float>(std::sqrt(bc2)),
                c.beta1,
                c.beta2,
                static_cast<float>(1.0 - c.beta1),
                static_cast<float>(1.0 - c.beta2),
                c.eps,
                c.gradScale,
                decoupled ? 0.f : c.weightDecay,
                decoupled ? static_cast<float>(1.0 - double(c.lr) * c.weightDecay) : 1.f,
                c.squaredNorm,
                c.maxNorm,
                c.lossScale};
  adamStep<<<blocksFor(n), kThreads, 0, ctx.stream>>>(c.param.f32(), c.grad.f32(), c.state1.f32(),
                                                      c.state2.f32(), n, s);
  checkLaunch(decoupled ? "adamw step" : "adam step");
}

// Sums one double per thread of a kThreads block in a fixed tree order; thread 0 gets it.
__device__ double blockSum(double v) {
  __shared__ double part[kThreads];
  part[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  return part[0];
}

// part[block] = sum of x^2 over the block's elements, in double.
__global__ void squareParts(const float* x, int64_t n, double* part) {
  double s = 0;
  EPL_GRID_STRIDE(i, n) {
    s += static_cast<double>(x[i]) * x[i];
  }
  s = blockSum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// *result (+)= the sum of part[0, parts), one block.
__global__ void sumParts(const double* part, int64_t parts, float* result, bool accumulate) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < parts; i += kThreads)
    s += part[i];
  s = blockSum(s);
  if (threadIdx.x == 0)
    *result = accumulate ? *result + static_cast<float>(s) : static_cast<float>(s);
}

__global__ void scaleKernel(float* x, int64_t n, float factor) {
  EPL_GRID_STRIDE(i, n) {
    x[i] *= factor;
  }
}

} // namespace

void optimizerStep(const OptimizerCall& c, const Ctx& ctx) {
  int64_t n = c.param.numel();
  EPL_ASSERT(c.grad.numel() == n, "optimizer gradient and parameter differ in size");
  if (n == 0) return;
  switch (c.kind) {
  case OptimizerKind::Sgd:
    return sgd(c, ctx, n);
  case OptimizerKind::Adam:
    return adam(c, ctx, n, false);
  case OptimizerKind::AdamW:
    return adam(c, ctx, n, true);
  }
}

void sumSquares(const Ctx& ctx, const TensorView& x, float* result, bool accumulate) {
  int64_t n = x.numel();
  unsigned parts = reductionParts(n);
  double* part = static_cast<double*>(ctx.scratch->get(int64_t{8} * parts));
  squareParts<<<parts, kThreads, 0, ctx.stream>>>(x.f32(), n, part);
  checkLaunch("sumSquares parts");
  sumParts<<<1, kThreads, 0, ctx.stream>>>(part, parts, result, accumulate);
  checkLaunch("sumSquares total");
}

void scaleInPlace(const Ctx& ctx, const TensorView& x, float factor) {
  int64_t n = x.numel();
  if (n == 0) return;
  scaleKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(x.f32(), n, factor);
  checkLaunch("scale in place");
}

} // namespace epl::backend::cuda
