// mean over one dim, and select / narrow of a run of its indices, on the GPU (the CUDA twin
// of backend/cpu/Slicing.cpp). Each views x as [O, N, I] around the dim (KernelShapes.h's
// aroundDim). mean adds a column's N values in index order, then scales, as the CPU does,
// so the two give the same bits.
//
// Shape legend: O outer dims, N the dim's size, I inner dims, L the indices kept.
#include "backend/KernelShapes.h"
#include "backend/cuda/Common.cuh"

namespace epl::backend::cuda {

namespace {

// y[o, e] = (x[o, 0, e] + ... + x[o, N-1, e]) / N.
__global__ void meanKernel(const float* x, AroundDim a, float inv, float* y) {
  EPL_GRID_STRIDE(t, a.o * a.i) {
    int64_t o = t / a.i, e = t % a.i;
    float s = 0;
    for (int64_t k = 0; k < a.n; ++k)
      s += x[(o * a.n + k) * a.i + e];
    y[t] = s * inv;
  }
}

// dx[o, k, e] (+)= dy[o, e] / N.
__global__ void meanGradKernel(const float* dy, AroundDim a, float inv, GradOut dx) {
  EPL_GRID_STRIDE(t, a.o * a.n * a.i) {
    int64_t r = t / a.i, e = t % a.i; // r enumerates (o, k)
    dx.put(t, dy[(r / a.n) * a.i + e] * inv);
  }
}

// dx[o, start + l, e] (+)= dy[o, l, e]; the rest of dx is zero (set before, unless adding).
__global__ void keptRunGradKernel(const float* dy, AroundDim a, KeptRun run, GradOut dx) {
  int64_t row = run.len * a.i;
  EPL_GRID_STRIDE(t, a.o * row) {
    int64_t o = t / row;
    dx.put((o * a.n + run.start) * a.i + t % row, dy[t]);
  }
}

} // namespace

// Forward: in = [x], out = [y]. Backward: in = [dy, x, y], out = [dx]: dy / N in every
// index of the dim.
void mean(const KernelCall& c, const Ctx& ctx) {
  const TensorView& x = c.in[c.backward ? 1 : 0];
  AroundDim a = aroundDim(c, x.shape);
  float inv = 1.f / static_cast<float>(a.n);
  if (!c.backward) {
    if (a.o * a.i == 0) return;
    meanKernel<<<blocksFor(a.o * a.i), kThreads, 0, ctx.stream>>>(x.f32(), a, inv, c.out[0].f32());
    checkLaunch("mean");
    return;
  }
  GradOut dx = gradOut(c, 0);
  if (!dx || a.o * a.n * a.i == 0) return;
  meanGradKernel<<<blocksFor(a.o * a.n * a.i), kThreads, 0, ctx.stream>>>(c.in[0].f32(), a, inv,
                                                                          dx);
  checkLaunch("mean backward");
}

// select and narrow. Forward: in = [x], out = [y] (f32 or i32): rows of L I contiguous
// elements, one strided copy. Backward: in = [dy, x, y], out = [dx]: dy in the kept run,
// zeros elsewhere.
void keepRun(const KernelCall& c, const Ctx& ctx) {
  const TensorView& x = c.in[c.backward ? 1 : 0];
  AroundDim a = aroundDim(c, x.shape);
  KeptRun run = keptRun(c, a.n);
  int64_t row = run.len * a.i;
  if (!c.backward) {
    if (a.o * row == 0) return;
    size_t item = x.dtype == ir::DType::I32 ? sizeof(int32_t) : sizeof(float);
    const char* src = static_cast<const char*>(x.data) + run.start * a.i * item;
    check(cudaMemcpy2DAsync(c.out[0].data, row * item, src, a.n * a.i * item, row * item,
                            static_cast<size_t>(a.o), cudaMemcpyDeviceToDevice, ctx.stream),
          "select / narrow");
    return;
  }
  GradOut dx = gradOut(c, 0);
  if (!dx) return;
  if (!dx.acc)
    check(
        cudaMemsetAsync(dx.p, 0, sizeof(float) * static_cast<size_t>(a.o * a.n * a.i), ctx.stream),
        "select / narrow backward");
  if (a.o * row == 0) return;
  keptRunGradKernel<<<blocksFor(a.o * row), kThreads, 0, ctx.stream>>>(c.in[0].f32(), a, run, dx);
  checkLaunch("select / narrow backward");
}

} // namespace epl::backend::cuda
