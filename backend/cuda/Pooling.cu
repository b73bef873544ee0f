// max_pool and avg_pool on the GPU over square windows of an NCHW tensor, as
// backend/cpu/Pooling.cpp computes them: no padding, stride 0 means the kernel size, output
// size floored. Forward: one thread per output. Backward: one thread per input element
// gathers the outputs whose windows cover it, in the CPU's ascending order, so overlapping
// windows add in a fixed order without atomics.
//
// Shape legend: B batch, C channels, H, W input height and width, K window, Ho, Wo output
// height and width.
#include "backend/KernelShapes.h"
#include "backend/cuda/Common.cuh"
#include "support/Assert.h"

namespace epl::backend::cuda {

namespace {

using Window = PoolWindow;

// The outputs [lo, hi] along one axis whose windows cover input position `at`.
struct Span {
  int64_t lo, hi;
};
__device__ Span covering(int64_t at, int64_t k, int64_t stride, int64_t outLen) {
  int64_t lo = at < k ? 0 : (at - k + stride) / stride; // ceil((at - k + 1) / stride)
  return {lo, min(at / stride, outLen - 1)};
}

// y = the window's max, argmax = its flat index into the H x W plane: the first max in
// row-major order, or the last NaN.
__global__ void maxForward(Window g, const float* x, float* y, int32_t* arg) {
  EPL_GRID_STRIDE(o, g.planes * g.ho * g.wo) {
    int64_t pl = o / (g.ho * g.wo), oh = o / g.wo % g.ho, ow = o % g.wo;
    const float* src = x + pl * g.h * g.w;
    int64_t best = oh * g.stride * g.w + ow * g.stride;
    for (int64_t i = 0; i < g.k; ++i)
      for (int64_t j = 0; j < g.k; ++j) {
        int64_t at = (oh * g.stride + i) * g.w + ow * g.stride + j;
        if (src[at] > src[best] || isnan(src[at])) best = at;
      }
    y[o] = src[best];
    arg[o] = static_cast<int32_t>(best);
  }
}

// y = the window's sum, in row-major order, times 1/K^2.
__global__ void avgForward(Window g, const float* x, float* y, float inv) {
  EPL_GRID_STRIDE(o, g.planes * g.ho * g.wo) {
    int64_t pl = o / (g.ho * g.wo), oh = o / g.wo % g.ho, ow = o % g.wo;
    const float* src = x + pl * g.h * g.w;
    float s = 0;
    for (int64_t i = 0; i < g.k; ++i)
      for (int64_t j = 0; j < g.k; ++j)
        s += src[(oh * g.stride + i) * g.w + ow * g.stride + j];
    y[o] = s * inv;
  }
}

// What output o of a max_pool gives back to plane element `at`: its dy when `at` was its
// argmax.
struct MaxShare {
  const float* dy;
  const int32_t* arg;
  __device__ bool gives(int64_t o, int64_t at) const { return arg[o] == at; }
  __device__ float value(int64_t o) const { return dy[o]; }
};

// What output o of an avg_pool gives back to every element of its window: dy / K^2.
struct AvgShare {
  const float* dy;
  float inv;
  __device__ bool gives(int64_t, int64_t) const { return true; }
  __device__ float value(int64_t o) const { return dy[o] * inv; }
};

// dx (+)= what each output whose window covers this element gives it, outputs in
// ascending order (the CPU's order): one writer per element, no atomics.
template <class Share> __global__ void poolBackward(Window g, Share share, GradOut dx) {
  EPL_GRID_STRIDE(e, g.planes * g.h * g.w) {
    int64_t pl = e / (g.h * g.w), at = e % (g.h * g.w);
    Span rows = covering(at / g.w, g.k, g.stride, g.ho),
         cols = covering(at % g.w, g.k, g.stride, g.wo);
    float v = dx.acc ? dx.p[e] : 0.f;
    for (int64_t oh = rows.lo; oh <= rows.hi; ++oh)
      for (int64_t ow = cols.lo; ow <= cols.hi; ++ow) {
        int64_t o = (pl * g.ho + oh) * g.wo + ow;
        if (share.gives(o, at)) v += share.value(o);
      }
    dx.p[e] = v;
  }
}

float inverseArea(const Window& g) {
  return 1.f / static_cast<float>(g.k * g.k);
}

} // namespace

// Forward: in = [x], out = [y, argmax i32 (flat index into the H x W plane)].
// Backward: in = [dy, x, y, argmax], out = [dx].
void maxPool(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) {
    Window g = poolWindow(c, c.in[0]);
    maxForward<<<blocksFor(g.planes * g.ho * g.wo), kThreads, 0, ctx.stream>>>(
        g, c.in[0].f32(), c.out[0].f32(), c.out[1].i32());
    return checkLaunch("max_pool forward");
  }
  GradOut dx = gradOut(c, 0);
  if (!dx) return;
  Window g = poolWindow(c, c.in[1]);
  poolBackward<<<blocksFor(g.planes * g.h * g.w), kThreads, 0, ctx.stream>>>(
      g, MaxShare{c.in[0].f32(), c.in[3].i32()}, dx);
  checkLaunch("max_pool backward");
}

// Forward: in = [x], out = [y]. Backward: in = [dy, x, y], out = [dx].
void avgPool(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) {
    Window g = poolWindow(c, c.in[0]);
    avgForward<<<blocksFor(g.planes * g.ho * g.wo), kThreads, 0, ctx.stream>>>(
        g, c.in[0].f32(), c.out[0].f32(), inverseArea(g));
    return checkLaunch("avg_pool forward");
  }
  GradOut dx = gradOut(c, 0);
  if (!dx) return;
  Window g = poolWindow(c, c.in[1]);
  poolBackward<<<blocksFor(g.planes * g.h * g.w), kThreads, 0, ctx.stream>>>(
      g, AvgShare{c.in[0].f32(), inverseArea(g)}, dx);
  checkLaunch("avg_pool backward");
}

} // namespace epl::backend::cuda
