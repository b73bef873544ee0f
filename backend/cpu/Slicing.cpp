// mean over one dim, and select / narrow of a run of its indices. Each views x as
// [O, N, I] around the dim (O the dims before it, N its size, I the dims after it:
// KernelShapes.h's aroundDim).
//
// Shape legend: O outer dims, N the dim's size, I inner dims, L the indices kept.
#include "backend/KernelShapes.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

#include <cstring>

namespace epl::backend::cpu {

namespace {

// y[o, :, :] = x[o, start : start + L, :], rows of L I contiguous elements.
template <class T> void copyRun(const T* x, T* y, const AroundDim& a, int64_t start, int64_t len) {
  int64_t row = len * a.i;
  parallelFor(a.o, rowGrain(row), [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o)
      std::memcpy(y + o * row, x + (o * a.n + start) * a.i, static_cast<size_t>(row) * sizeof(T));
  });
}

} // namespace

// Forward: in = [x], out = [y]. Backward: in = [dy, x, y], out = [dx]: dy / N in every
// index of the dim. The sum runs over the dim in order, so it does not depend on threads.
void mean(const KernelCall& c) {
  if (!c.backward) {
    AroundDim a = aroundDim(c, c.in[0].shape);
    const float* x = c.in[0].f32();
    float* y = c.out[0].f32();
    float inv = 1.f / static_cast<float>(a.n);
    parallelFor(a.o, rowGrain(a.n * a.i), [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        float* yo = y + o * a.i;
        std::fill(yo, yo + a.i, 0.f);
        for (int64_t k = 0; k < a.n; ++k) {
          const float* xk = x + (o * a.n + k) * a.i;
          for (int64_t e = 0; e < a.i; ++e)
            yo[e] += xk[e];
        }
        for (int64_t e = 0; e < a.i; ++e)
          yo[e] *= inv;
      }
    });
    return;
  }
  GradOut dx = gradOut(c, 0);
  if (!dx) return;
  AroundDim a = aroundDim(c, c.in[1].shape);
  const float* dy = c.in[0].f32();
  float inv = 1.f / static_cast<float>(a.n);
  parallelFor(a.o * a.n, rowGrain(a.i), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) { // r enumerates (o, k)
      const float* dyo = dy + (r / a.n) * a.i;
      for (int64_t e = 0; e < a.i; ++e)
        dx.put(r * a.i + e, dyo[e] * inv);
    }
  });
}

// select and narrow. Forward: in = [x], out = [y] (f32 or i32). Backward: in = [dy, x, y],
// out = [dx]: dy in the kept run, zeros elsewhere.
void keepRun(const KernelCall& c) {
  const TensorView& x = c.in[c.backward ? 1 : 0];
  AroundDim a = aroundDim(c, x.shape);
  KeptRun run = keptRun(c, a.n);
  int64_t start = run.start, len = run.len;
  if (!c.backward) {
    if (x.dtype == ir::DType::I32) return copyRun(x.i32(), c.out[0].i32(), a, start, len);
    EPL_ASSERT(x.dtype == ir::DType::F32, "select and narrow take f32 or i32");
    return copyRun(x.f32(), c.out[0].f32(), a, start, len);
  }
  GradOut dx = gradOut(c, 0);
  if (!dx) return;
  zeroUnlessAcc(dx, a.o * a.n * a.i);
  const float* dy = c.in[0].f32();
  int64_t row = len * a.i;
  parallelFor(a.o, rowGrain(row), [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) {
      GradOut at{dx.p + (o * a.n + start) * a.i, dx.acc};
      for (int64_t e = 0; e < row; ++e)
        at.put(e, dy[o * row + e]);
    }
  });
}

} // namespace epl::backend::cpu
