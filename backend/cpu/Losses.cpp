// Losses: cross-entropy fused with log-softmax, and mean squared error. Both reduce to an
// f32 scalar through a fixed-order double sum, so the loss does not depend on threads.
// Under amp, cross-entropy reads its half-precision logits and writes their gradient as
// stored, a row at a time through f32 (f32Run, outRun): the same bits as on widened copies.
//
// Shape legend: N rows (every dim of the logits but the last), V classes, n elements.
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"
#include "backend/cpu/Lanes.h"
#include "ir/Ops.h"

#include <algorithm>
#include <cmath>

namespace epl::backend::cpu {

namespace {

// Log-sum-exp of one row of logits, in loops that vectorise (Lanes.h: one order for a
// row's length, whatever the threads). A NaN anywhere in the row gives NaN, as does an
// infinite logit.
float rowLse(const float* x, int64_t v) {
  float m = rowMaxOf(x, v);
  double s = blockedSum(v, [x, m](int64_t j) { return expf32(x[j] - m); });
  return m + static_cast<float>(std::log(s));
}

int32_t checkedTarget(const int32_t* t, int64_t r, int64_t v) {
  int32_t k = t[r];
  EPL_ASSERT(k >= 0 && k < v, "cross_entropy target out of range of the classes");
  return k;
}

// The target's column in a call's logits: over a vocabulary split (KernelCall::vocabSlice)
// the call holds columns [vocabFirst, vocabFirst + V), and -1 says the target is elsewhere.
int64_t targetColumn(const KernelCall& c, const int32_t* t, int64_t r, int64_t v) {
  if (!c.vocabSlice) return checkedTarget(t, r, v);
  int64_t k = t[r] - c.vocabFirst;
  return k >= 0 && k < v ? k : -1;
}

// in = [logits [N, V], targets i32 [N]], out = [loss f32[], lse [N]]. The loss is the mean
// over the rows whose target is not `ignore_index`; 0 when there are none (PyTorch: NaN).
// Over a vocabulary split, lse is the slice's, and out[0] the mean over the kept rows of
// the target's logit where the slice holds it (0 elsewhere): the executor combines the
// slices' (Executor::vocabCrossEntropy).
void crossEntropyForward(const KernelCall& c) {
  const TensorView& logits = c.in[0];
  int64_t v = lastDim(logits), n = rowsOf(logits);
  const int32_t* t = c.in[1].i32();
  int64_t ignored = ir::ignoredClass(c.attrs);
  float* lse = c.out[1].f32();
  float* rowLoss = scratch(0, n);
  parallelFor(n, rowGrain(v), [&](int64_t lo, int64_t hi) {
    float* tmp = logits.dtype == ir::DType::F32 ? nullptr : scratch(11, v);
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = f32Run(logits, r * v, v, tmp);
      lse[r] = rowLse(xr, v);
      int64_t k = t[r] == ignored ? -1 : targetColumn(c, t, r, v);
      if (c.vocabSlice)
        rowLoss[r] = k < 0 ? 0.f : xr[k];
      else
        rowLoss[r] = k < 0 ? 0.f : lse[r] - xr[k];
    }
  });
  int64_t kept = ir::keptTargets(t, n, ignored);
  c.out[0].f32()[0] =
      kept == 0 ? 0.f : static_cast<float>(sumDouble(rowLoss, n) / static_cast<double>(kept));
}

// in = [dloss f32[], logits, targets, loss, lse], out = [dlogits, dtargets (never)].
// dlogits = dloss / kept * (softmax(logits) - onehot(target)), zero on ignored rows. Over a
// vocabulary split, lse is the whole row's and the one-hot is where the slice holds it.
void crossEntropyBackward(const KernelCall& c) {
  const TensorView& dxv = c.out[0];
  if (!dxv.data) return;
  bool acc = accumulates(c, 0);
  const TensorView& logits = c.in[1];
  int64_t v = lastDim(logits), n = rowsOf(logits);
  const float* lse = c.in[4].f32();
  const int32_t* t = c.in[2].i32();
  int64_t ignored = ir::ignoredClass(c.attrs);
  float g =
      c.in[0].f32()[0] / static_cast<float>(std::max<int64_t>(ir::keptTargets(t, n, ignored), 1));
  parallelFor(n, rowGrain(v), [&](int64_t lo, int64_t hi) {
    float* tx = logits.dtype == ir::DType::F32 ? nullptr : scratch(11, v);
    float* to = dxv.dtype == ir::DType::F32 ? nullptr : scratch(12, v);
    for (int64_t r = lo; r < hi; ++r) {
      GradOut dx = outRun(dxv, acc, r * v, v, to);
      if (t[r] == ignored) {
        for (int64_t j = 0; j < v; ++j)
          dx.put(j, 0.f);
      } else {
        const float* xr = f32Run(logits, r * v, v, tx);
        float l = lse[r];
        float* out = dx.p; // each element read and written at one index: vectorises
        if (dx.acc) {
#pragma omp simd
          for (int64_t j = 0; j < v; ++j)
            out[j] += g * expf32(xr[j] - l);
        } else {
#pragma omp simd
          for (int64_t j = 0; j < v; ++j)
            out[j] = g * expf32(xr[j] - l);
        }
        int64_t k = targetColumn(c, t, r, v);
        if (k >= 0) dx.p[k] -= g;
      }
      storeRun(dxv, r * v, v, dx);
    }
  });
}

// KernelCall::vocabSlices: the slices' log-sum-exps and mean target logits combined. Each
// row's in double from its slices' maximum; the loss a double sum in row order.
void crossEntropyCombine(const KernelCall& c) {
  int w = c.vocabSlices;
  const float* all = c.in[0].f32();
  const int32_t* t = c.in[1].i32();
  int64_t rows = c.in[1].numel(), ignored = ir::ignoredClass(c.attrs);
  EPL_ASSERT(c.in[0].numel() == w * (rows + 1), "each slice's lse of every row and its mean");
  float* lse = c.out[1].f32();
  double total = 0, targetMean = 0;
  for (int64_t r = 0; r < rows; ++r) {
    float top = all[r];
    for (int k = 1; k < w; ++k)
      top = std::max(top, all[k * (rows + 1) + r]);
    double sum = 0;
    for (int k = 0; k < w; ++k)
      sum += std::exp(static_cast<double>(all[k * (rows + 1) + r] - top));
    lse[r] = top + static_cast<float>(std::log(sum));
    if (t[r] != ignored) total += static_cast<double>(lse[r]);
  }
  for (int k = 0; k < w; ++k)
    targetMean += static_cast<double>(all[k * (rows + 1) + rows]);
  int64_t kept = ir::keptTargets(t, rows, ignored);
  c.out[0].f32()[0] =
      kept == 0 ? 0.f : static_cast<float>(total / static_cast<double>(kept) - targetMean);
}

} // namespace

void crossEntropy(const KernelCall& c) {
  if (c.vocabSlices > 0) return crossEntropyCombine(c);
  if (!c.backward) return crossEntropyForward(c);
  crossEntropyBackward(c);
}

// Forward: in = [pred, target], out = [loss f32[]] = mean((pred - target)^2).
// Backward: in = [dloss, pred, target, loss], out = [dpred, dtarget].
void mse(const KernelCall& c) {
  if (!c.backward) {
    int64_t n = c.in[0].numel();
    const float *p = c.in[0].f32(), *t = c.in[1].f32();
    float* sq = scratch(0, n);
    parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i)
        sq[i] = (p[i] - t[i]) * (p[i] - t[i]);
    });
    c.out[0].f32()[0] = static_cast<float>(sumDouble(sq, n) / static_cast<double>(n));
    return;
  }
  int64_t n = c.in[1].numel();
  const float *p = c.in[1].f32(), *t = c.in[2].f32();
  float g = 2.f * c.in[0].f32()[0] / static_cast<float>(n);
  GradOut dp = gradOut(c, 0), dt = gradOut(c, 1);
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float d = g * (p[i] - t[i]);
      if (dp) dp.put(i, d);
      if (dt) dt.put(i, -d);
    }
  });
}

} // namespace epl::backend::cpu
