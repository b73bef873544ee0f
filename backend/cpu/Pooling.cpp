// max_pool and avg_pool over square windows of an NCHW tensor: no padding, stride 0 means
// the kernel size, output size floored. One thread per (image, channel) plane, so the
// backward's overlapping windows add in a fixed order.
//
// Shape legend: B batch, C channels, H, W input height and width, K window, Ho, Wo output
// height and width.
#include "backend/KernelShapes.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"
#include "backend/cpu/Lanes.h"

#include <algorithm>
#include <vector>

namespace epl::backend::cpu {

namespace {

using Window = PoolWindow;

// Whether v replaces the window's best so far: the first largest value, or the last NaN
// (in the window's row-major order). A select, not a branch: the data is random.
inline bool replaces(float v, float best) {
  return v > best || v != v;
}

// max_pool's forward for K x K windows (K known when compiled): each plane's outputs in
// blocks of kLanes, one lane an output, its window's corner from a table (`corner`, the
// plane's outputs in order). A plane's rows are short (7 or 14 outputs in a small network),
// so a loop over a row spent its time in its scalar remainder, where `replaces` was a
// branch; a block's lanes past the plane's end take its last output again and are not
// stored.
template <int K> void maxForwardWindows(const Window& g, const float* x, float* y, int32_t* arg) {
  int64_t outputs = g.ho * g.wo, w = g.w;
  std::vector<int32_t> corner(static_cast<size_t>(outputs));
  for (int64_t o = 0; o < outputs; ++o)
    corner[static_cast<size_t>(o)] =
        static_cast<int32_t>(o / g.wo * g.stride * w + o % g.wo * g.stride);
  parallelFor(g.planes, rowGrain(g.h * g.w), [&](int64_t lo, int64_t hi) {
    for (int64_t pl = lo; pl < hi; ++pl) {
      const float* src = x + pl * g.h * w;
      for (int64_t o0 = 0; o0 < outputs; o0 += kLanes) {
        float value[kLanes];
        int32_t best[kLanes];
#pragma omp simd
        for (int u = 0; u < kLanes; ++u) {
          int32_t at = corner[static_cast<size_t>(std::min<int64_t>(o0 + u, outputs - 1))];
          float v = src[at];
          int32_t b = at;
          for (int i = 0; i < K; ++i)
            for (int j = i == 0 ? 1 : 0; j < K; ++j) {
              int32_t q = at + static_cast<int32_t>(i * w) + j;
              float next = src[q];
              bool take = replaces(next, v);
              v = take ? next : v;
              b = take ? q : b;
            }
          value[u] = v;
          best[u] = b;
        }
        int64_t n = std::min<int64_t>(kLanes, outputs - o0);
        std::copy(value, value + n, y + pl * outputs + o0);
        std::copy(best, best + n, arg + pl * outputs + o0);
      }
    }
  });
}

// in = [x], out = [y, argmax i32 (flat index into the H x W plane)].
void maxForward(const KernelCall& c) {
  Window g = poolWindow(c, c.in[0]);
  const float* x = c.in[0].f32();
  float* y = c.out[0].f32();
  int32_t* arg = c.out[1].i32();
  if (g.k == 2) return maxForwardWindows<2>(g, x, y, arg);
  if (g.k == 3) return maxForwardWindows<3>(g, x, y, arg);
  parallelFor(g.planes, rowGrain(g.h * g.w), [&](int64_t lo, int64_t hi) {
    for (int64_t pl = lo; pl < hi; ++pl) {
      const float* src = x + pl * g.h * g.w;
      float* yp = y + pl * g.ho * g.wo;
      int32_t* ap = arg + pl * g.ho * g.wo;
      for (int64_t oh = 0; oh < g.ho; ++oh)
#pragma omp simd
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          int64_t corner = oh * g.stride * g.w + ow * g.stride, best = corner;
          float value = src[corner];
          for (int64_t i = 0; i < g.k; ++i)
            for (int64_t j = 0; j < g.k; ++j) {
              int64_t at = corner + i * g.w + j;
              float v = src[at];
              bool take = replaces(v, value);
              value = take ? v : value;
              best = take ? at : best;
            }
          yp[oh * g.wo + ow] = value;
          ap[oh * g.wo + ow] = static_cast<int32_t>(best);
        }
    }
  });
}

// in = [dy, x, y, argmax], out = [dx]: each output's gradient goes to its argmax.
void maxBackward(const KernelCall& c) {
  GradOut dx = gradOut(c, 0);
  if (!dx) return;
  Window g = poolWindow(c, c.in[1]);
  const float* dy = c.in[0].f32();
  const int32_t* arg = c.in[3].i32();
  parallelFor(g.planes, rowGrain(g.h * g.w), [&](int64_t lo, int64_t hi) {
    for (int64_t pl = lo; pl < hi; ++pl) {
      float* dst = dx.p + pl * g.h * g.w;
      if (!dx.acc) std::fill(dst, dst + g.h * g.w, 0.f);
      for (int64_t o = pl * g.ho * g.wo; o < (pl + 1) * g.ho * g.wo; ++o)
        dst[arg[o]] += dy[o];
    }
  });
}

// in = [x], out = [y].
void avgForward(const KernelCall& c) {
  Window g = poolWindow(c, c.in[0]);
  const float* x = c.in[0].f32();
  float* y = c.out[0].f32();
  float inv = 1.f / static_cast<float>(g.k * g.k);
  parallelFor(g.planes, rowGrain(g.h * g.w), [&](int64_t lo, int64_t hi) {
    for (int64_t pl = lo; pl < hi; ++pl) {
      const float* src = x + pl * g.h * g.w;
      for (int64_t oh = 0; oh < g.ho; ++oh)
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          float s = 0;
          for (int64_t i = 0; i < g.k; ++i)
            for (int64_t j = 0; j < g.k; ++j)
              s += src[(oh * g.stride + i) * g.w + ow * g.stride + j];
          y[pl * g.ho * g.wo + oh * g.wo + ow] = s * inv;
        }
    }
  });
}

// in = [dy, x, y], out = [dx]: each output spreads dy / K^2 over its window.
void avgBackward(const KernelCall& c) {
  GradOut dx = gradOut(c, 0);
  if (!dx) return;
  Window g = poolWindow(c, c.in[1]);
  const float* dy = c.in[0].f32();
  float inv = 1.f / static_cast<float>(g.k * g.k);
  parallelFor(g.planes, rowGrain(g.h * g.w), [&](int64_t lo, int64_t hi) {
    for (int64_t pl = lo; pl < hi; ++pl) {
      float* dst = dx.p + pl * g.h * g.w;
      if (!dx.acc) std::fill(dst, dst + g.h * g.w, 0.f);
      for (int64_t oh = 0; oh < g.ho; ++oh)
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          float v = dy[pl * g.ho * g.wo + oh * g.wo + ow] * inv;
          for (int64_t i = 0; i < g.k; ++i)
            for (int64_t j = 0; j < g.k; ++j)
              dst[(oh * g.stride + i) * g.w + ow * g.stride + j] += v;
        }
    }
  });
}

} // namespace

void maxPool(const KernelCall& c) {
  if (!c.backward) return maxForward(c);
  maxBackward(c);
}

void avgPool(const KernelCall& c) {
  if (!c.backward) return avgForward(c);
  avgBackward(c);
}

} // namespace epl::backend::cpu
