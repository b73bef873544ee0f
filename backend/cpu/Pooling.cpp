// max_pool and avg_pool over square windows of an NCHW tensor: no padding, stride 0 means
// the kernel size, output size floored. One thread per (image, channel) plane, so the
// backward's overlapping windows add in a fixed order.
//
// Shape legend: B batch, C channels, H, W input height and width, K window, Ho, Wo output
// height and width.
#include "backend/KernelShapes.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

#include <algorithm>

namespace epl::backend::cpu {

namespace {

using Window = PoolWindow;

// Whether v replaces the window's best so far: the first largest value, or the last NaN
// (in the window's row-major order). A select, not a branch: the data is random.
inline bool replaces(float v, float best) {
  return v > best || v != v;
}

// in = [x], out = [y, argmax i32 (flat index into the H x W plane)].
void maxForward(const KernelCall& c) {
  Window g = poolWindow(c, c.in[0]);
  const float* x = c.in[0].f32();
  float* y = c.out[0].f32();
  int32_t* arg = c.out[1].i32();
  parallelFor(g.planes, rowGrain(g.h * g.w), [&](int64_t lo, int64_t hi) {
    for (int64_t pl = lo; pl < hi; ++pl) {
      const float* src = x + pl * g.h * g.w;
      float* yp = y + pl * g.ho * g.wo;
      int32_t* ap = arg + pl * g.ho * g.wo;
      // The best so far in registers (`replaces`).
      if (g.k == 2 && g.stride == 2) { // unrolled, so the loop over the outputs vectorises
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          int32_t top = static_cast<int32_t>(oh * 2 * g.w), w = static_cast<int32_t>(g.w);
          constexpr int32_t stride = 2;
          const float *r0 = src + top, *r1 = r0 + w;
#pragma omp simd
          for (int32_t ow = 0; ow < static_cast<int32_t>(g.wo); ++ow) {
            int32_t c = ow * stride, best = c;
            float value = r0[c];
            auto visit = [&](float v, int32_t at) {
              bool take = replaces(v, value);
              value = take ? v : value;
              best = take ? at : best;
            };
            visit(r0[c + 1], c + 1);
            visit(r1[c], w + c);
            visit(r1[c + 1], w + c + 1);
            yp[oh * g.wo + ow] = value;
            ap[oh * g.wo + ow] = top + best;
          }
        }
        continue;
      }
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
