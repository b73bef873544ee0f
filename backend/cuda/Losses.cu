// Losses on the GPU: cross-entropy fused with log-softmax, and mean squared error, as the CPU
// device computes them (backend/cpu/Losses.cpp). Both reduce to an f32 scalar in two
// fixed-order passes (partials, then one block summing them in double), so the loss has the
// same bits on every run. Under amp, cross-entropy reads its logits and writes their
// gradient as stored (Common.cuh's Stored), as on the CPU.
//
// Shape legend: N rows (every dim of the logits but the last), V classes, n elements.
#include "backend/cuda/Common.cuh"
#include "ir/Ops.h"
#include "support/Assert.h"

#include <cmath>
#include <cstdio>

namespace epl::backend::cuda {

namespace {

// Combines one value per thread of a kThreads block in a fixed tree order; every thread gets
// the result.
template <typename T, typename Op> __device__ T blockReduce(T v, Op op) {
  __shared__ T part[kThreads];
  __syncthreads(); // a previous call's readers are done with part[0]
  part[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half)
      part[threadIdx.x] = op(part[threadIdx.x], part[threadIdx.x + half]);
    __syncthreads();
  }
  return part[0];
}

// A broken invariant, as the CPU's EPL_ASSERT: the kernel stops and synchronize() reports it.
__device__ int32_t checkedTarget(const int32_t* t, int64_t r, int64_t v) {
  int32_t k = t[r];
  if (k < 0 || k >= v) {
    printf("internal error: cross_entropy target %d out of range of %lld classes\n", k,
           static_cast<long long>(v));
    __trap();
  }
  return k;
}

// The target's column in the logits, as the CPU's targetColumn: over a vocabulary split
// (`first` >= 0) the logits hold columns [first, first + v), and -1 says the target is
// elsewhere.
__device__ int64_t targetColumn(const int32_t* t, int64_t r, int64_t v, int64_t first) {
  if (first < 0) return checkedTarget(t, r, v);
  int64_t k = t[r] - first;
  return k >= 0 && k < v ? k : -1;
}

// *out = (sum of part[0, parts)) / divisor, one block of kThreads.
template <typename T>
__global__ void meanOf(const T* part, int64_t parts, double divisor, float* out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < parts; i += kThreads)
    s += static_cast<double>(part[i]);
  s = blockReduce(s, Sum{});
  if (threadIdx.x == 0) *out = static_cast<float>(s / divisor);
}

// *kept = how many of target[0, n) are not `ignored`, one block of kThreads.
__global__ void countKept(const int32_t* target, int64_t n, int64_t ignored, double* kept) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    s += target[i] != ignored ? 1.0 : 0.0;
  s = blockReduce(s, Sum{});
  if (threadIdx.x == 0) *kept = s;
}

// *out = (sum of rowLoss[0, n)) / *kept, 0 when nothing was kept; one block of kThreads.
__global__ void meanOfKept(const float* rowLoss, int64_t n, const double* kept, float* out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    s += static_cast<double>(rowLoss[i]);
  s = blockReduce(s, Sum{});
  if (threadIdx.x == 0) *out = *kept == 0 ? 0.f : static_cast<float>(s / *kept);
}

// One block per row: lse[r] = log-sum-exp of the row (its exp sum in double, as the CPU's),
// rowLoss[r] = lse[r] - x[r, target[r]], 0 where the target is `ignored`. Over a vocabulary
// split (first >= 0): rowLoss[r] = x[r, target[r] - first] where the slice holds it, else 0.
// The logits as stored (f32, or half precision under amp).
__global__ void crossEntropyRows(Stored x, const int32_t* target, int64_t n, int64_t v,
                                 int64_t ignored, int64_t first, float* lse, float* rowLoss) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    int64_t row = r * v;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < v; j += kThreads)
      m = fmaxf(m, x[row + j]);
    m = blockReduce(m, Max{});
    double s = 0;
    for (int64_t j = threadIdx.x; j < v; j += kThreads)
      s += expf(x[row + j] - m);
    s = blockReduce(s, Sum{});
    if (threadIdx.x == 0) {
      float l = m + static_cast<float>(log(s));
      lse[r] = l;
      int64_t k = target[r] == ignored ? -1 : targetColumn(target, r, v, first);
      rowLoss[r] = k < 0 ? 0.f : first >= 0 ? x[row + k] : l - x[row + k];
    }
  }
}

// dx (+)= dloss / kept * (softmax(x) - onehot(target)), the one-hot subtracted after the add
// as on the CPU; zero on the rows whose target is `ignored`. x and dx as stored.
__global__ void crossEntropyGrad(const float* dloss, Stored x, const int32_t* target,
                                 const float* lse, int64_t n, int64_t v, int64_t ignored,
                                 int64_t first, const double* kept, StoredGrad dx) {
  float g = dloss[0] / static_cast<float>(*kept > 0 ? *kept : 1.0);
  EPL_GRID_STRIDE(i, n * v) {
    int64_t r = i / v;
    if (target[r] == ignored) {
      dx.put(i, 0.f);
      continue;
    }
    float d = g * expf(x[i] - lse[r]);
    float out = dx.acc ? dx.x[i] + d : d;
    if (i - r * v == targetColumn(target, r, v, first)) out -= g;
    dx.x.set(i, out);
  }
}

// part[block] = sum over the block's elements of (p - t)^2, each square in f32, summed in double.
__global__ void squaredErrorParts(const float* p, const float* t, int64_t n, double* part) {
  double s = 0;
  EPL_GRID_STRIDE(i, n) {
    float d = p[i] - t[i];
    s += static_cast<double>(d * d);
  }
  s = blockReduce(s, Sum{});
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// dp (+)= 2 dloss / n * (p - t), dt (+)= its negation.
__global__ void squaredErrorGrad(const float* dloss, const float* p, const float* t, int64_t n,
                                 GradOut dp, GradOut dt) {
  float g = 2.f * dloss[0] / static_cast<float>(n);
  EPL_GRID_STRIDE(i, n) {
    float d = g * (p[i] - t[i]);
    if (dp.p) dp.put(i, d);
    if (dt.p) dt.put(i, -d);
  }
}

// in = [logits [N, V], targets i32 [N]], out = [loss f32[], lse [N]]; over a vocabulary
// split, the slice's lse and the mean target logit where it holds it (the CPU's contract).
void crossEntropyForward(const KernelCall& c, const Ctx& ctx) {
  const TensorView& logits = c.in[0];
  int64_t v = lastDim(logits), n = rowsOf(logits);
  int64_t ignored = ir::ignoredClass(c.attrs);
  // The kept count (a double, 8-aligned) after the rows' losses.
  int64_t at = (std::max<int64_t>(n, 1) * 4 + 7) / 8 * 8;
  auto* work = static_cast<unsigned char*>(ctx.scratch->get(at + 8));
  auto* rowLoss = reinterpret_cast<float*>(work);
  auto* kept = reinterpret_cast<double*>(work + at);
  crossEntropyRows<<<blocksFor(n, 1), kThreads, 0, ctx.stream>>>(
      storedOf(logits), c.in[1].i32(), n, v, ignored, c.vocabSlice ? c.vocabFirst : -1,
      c.out[1].f32(), rowLoss);
  checkLaunch("cross_entropy forward rows");
  countKept<<<1, kThreads, 0, ctx.stream>>>(c.in[1].i32(), n, ignored, kept);
  checkLaunch("cross_entropy forward count");
  meanOfKept<<<1, kThreads, 0, ctx.stream>>>(rowLoss, n, kept, c.out[0].f32());
  checkLaunch("cross_entropy forward mean");
}

// in = [dloss f32[], logits, targets, loss, lse], out = [dlogits, dtargets (never)].
void crossEntropyBackward(const KernelCall& c, const Ctx& ctx) {
  StoredGrad dx = storedGrad(c, 0);
  if (!dx) return;
  const TensorView& logits = c.in[1];
  int64_t v = lastDim(logits), n = rowsOf(logits);
  int64_t ignored = ir::ignoredClass(c.attrs);
  auto* kept = static_cast<double*>(ctx.scratch->get(8));
  countKept<<<1, kThreads, 0, ctx.stream>>>(c.in[2].i32(), n, ignored, kept);
  checkLaunch("cross_entropy backward count");
  crossEntropyGrad<<<blocksFor(n * v), kThreads, 0, ctx.stream>>>(
      c.in[0].f32(), storedOf(logits), c.in[2].i32(), c.in[4].f32(), n, v, ignored,
      c.vocabSlice ? c.vocabFirst : -1, kept, dx);
  checkLaunch("cross_entropy backward");
}

// in = [pred, target], out = [loss f32[]] = mean((pred - target)^2).
void mseForward(const KernelCall& c, const Ctx& ctx) {
  int64_t n = c.in[0].numel();
  unsigned parts = reductionParts(n);
  double* part = static_cast<double*>(ctx.scratch->get(int64_t{8} * parts));
  squaredErrorParts<<<parts, kThreads, 0, ctx.stream>>>(c.in[0].f32(), c.in[1].f32(), n, part);
  checkLaunch("mse forward parts");
  meanOf<<<1, kThreads, 0, ctx.stream>>>(part, parts, static_cast<double>(n), c.out[0].f32());
  checkLaunch("mse forward mean");
}

// in = [dloss, pred, target, loss], out = [dpred, dtarget].
void mseBackward(const KernelCall& c, const Ctx& ctx) {
  GradOut dp = gradOut(c, 0), dt = gradOut(c, 1);
  if (!dp && !dt) return;
  int64_t n = c.in[1].numel();
  squaredErrorGrad<<<blocksFor(n), kThreads, 0, ctx.stream>>>(c.in[0].f32(), c.in[1].f32(),
                                                              c.in[2].f32(), n, dp, dt);
  checkLaunch("mse backward");
}

} // namespace

// KernelCall::vocabSlices: the slices' log-sum-exps and mean target logits combined (the
// CPU's contract; backend/cpu/Losses.cpp). Then the loss: one block.
__global__ void combineSliceLse(const float* all, int w, int64_t n, float* lse) {
  EPL_GRID_STRIDE(r, n) {
    float top = all[r];
    for (int k = 1; k < w; ++k)
      top = fmaxf(top, all[k * (n + 1) + r]);
    double sum = 0;
    for (int k = 0; k < w; ++k)
      sum += exp(static_cast<double>(all[k * (n + 1) + r] - top));
    lse[r] = top + static_cast<float>(log(sum));
  }
}

__global__ void combinedLoss(const float* all, int w, const float* lse, const int32_t* target,
                             int64_t n, int64_t ignored, const double* kept, float* out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    s += target[i] != ignored ? static_cast<double>(lse[i]) : 0.0;
  s = blockReduce(s, Sum{});
  if (threadIdx.x != 0) return;
  double targetMean = 0;
  for (int k = 0; k < w; ++k)
    targetMean += static_cast<double>(all[k * (n + 1) + n]);
  *out = *kept == 0 ? 0.f : static_cast<float>(s / *kept - targetMean);
}

void crossEntropyCombine(const KernelCall& c, const Ctx& ctx) {
  int w = c.vocabSlices;
  int64_t n = c.in[1].numel(), ignored = ir::ignoredClass(c.attrs);
  EPL_ASSERT(c.in[0].numel() == w * (n + 1), "each slice's lse of every row and its mean");
  combineSliceLse<<<blocksFor(n), kThreads, 0, ctx.stream>>>(c.in[0].f32(), w, n, c.out[1].f32());
  checkLaunch("cross_entropy's slices combined");
  auto* kept = static_cast<double*>(ctx.scratch->get(8));
  countKept<<<1, kThreads, 0, ctx.stream>>>(c.in[1].i32(), n, ignored, kept);
  checkLaunch("cross_entropy's slices: the kept count");
  combinedLoss<<<1, kThreads, 0, ctx.stream>>>(c.in[0].f32(), w, c.out[1].f32(), c.in[1].i32(), n,
                                               ignored, kept, c.out[0].f32());
  checkLaunch("cross_entropy's slices: the loss");
}

void crossEntropy(const KernelCall& c, const Ctx& ctx) {
  if (c.vocabSlices > 0) return crossEntropyCombine(c, ctx);
  if (!c.backward) return crossEntropyForward(c, ctx);
  crossEntropyBackward(c, ctx);
}

void mse(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) return mseForward(c, ctx);
  mseBackward(c, ctx);
}

} // namespace epl::backend::cuda
