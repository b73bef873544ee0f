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
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

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
// branch. The table runs on to whole blocks, repeating the last output's corner: those
// lanes are not stored. (With each lane clamping its index the compiler gathered the
// table's reads too; this form took 0.6 of that one's time on the CNN's first pool, measured
// alone.)
template <int K> void maxForwardWindows(const Window& g, const float* x, float* y, int32_t* arg) {
  int64_t outputs = g.ho * g.wo, w = g.w;
  int64_t blocks = (outputs + kLanes - 1) / kLanes;
  std::vector<int32_t> table(static_cast<size_t>(blocks * kLanes));
  for (int64_t o = 0; o < blocks * kLanes; ++o) {
    int64_t last = std::min(o, outputs - 1);
    table[static_cast<size_t>(o)] =
        static_cast<int32_t>(last / g.wo * g.stride * w + last % g.wo * g.stride);
  }
  const int32_t* corner = table.data();
  parallelFor(g.planes, rowGrain(g.h * g.w), [&](int64_t lo, int64_t hi) {
    for (int64_t pl = lo; pl < hi; ++pl) {
      const float* src = x + pl * g.h * w;
      for (int64_t o0 = 0; o0 < outputs; o0 += kLanes) {
        float value[kLanes];
        int32_t best[kLanes];
#pragma omp simd
        for (int u = 0; u < kLanes; ++u) {
          int32_t at = corner[o0 + u];
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

#ifdef __AVX512F__
// v replaced where `next` replaces it (replaces(), lane by lane), and the argmax with it.
inline void replaceWhere(__m512 next, __m512i at, __m512& v, __m512i& best) {
  __mmask16 take =
      _mm512_cmp_ps_mask(next, v, _CMP_GT_OQ) | _mm512_cmp_ps_mask(next, next, _CMP_UNORD_Q);
  v = _mm512_mask_blend_ps(take, v, next);
  best = _mm512_mask_blend_epi32(take, best, at);
}

// max_pool's forward for 2 x 2 windows at stride 2, the usual pooling, with AVX-512: an
// output row's windows from its two input rows, each read whole (masked past the row's
// end) and split into even and odd columns, 16 outputs at a time. The windows' elements
// are compared in the same order as maxForwardWindows does, so the results are its bits;
// it gathered every element, and took 3.7 to 4.8 times as long (the CNN's two pools).
void maxForward2x2(const Window& g, const float* x, float* y, int32_t* arg) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const int64_t w = g.w, outputs = g.ho * g.wo;
  parallelFor(g.planes, rowGrain(g.h * g.w), [&](int64_t lo, int64_t hi) {
    for (int64_t pl = lo; pl < hi; ++pl)
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        const float* top = x + pl * g.h * w + 2 * oh * w;
        float* yRow = y + pl * outputs + oh * g.wo;
        int32_t* argRow = arg + pl * outputs + oh * g.wo;
        for (int64_t ow = 0; ow < g.wo; ow += kLanes) {
          int64_t n = std::min<int64_t>(kLanes, g.wo - ow), floats = 2 * n;
          auto mask = [](int64_t bits) {
            return static_cast<__mmask16>(bits >= kLanes ? 0xFFFF : (1u << bits) - 1);
          };
          __mmask16 first = mask(floats), second = mask(std::max<int64_t>(floats - kLanes, 0));
          const float *r0 = top + 2 * ow, *r1 = r0 + w;
          __m512 lo0 = _mm512_maskz_loadu_ps(first, r0),
                 hi0 = _mm512_maskz_loadu_ps(second, r0 + kLanes);
          __m512 lo1 = _mm512_maskz_loadu_ps(first, r1),
                 hi1 = _mm512_maskz_loadu_ps(second, r1 + kLanes);
          // Lane u's window: its corner (2 oh, 2 (ow + u)) as an index into the plane.
          __m512i corner =
              _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(2 * oh * w + 2 * ow)), even);
          __m512i below = _mm512_add_epi32(corner, _mm512_set1_epi32(static_cast<int32_t>(w)));
          __m512i one = _mm512_set1_epi32(1);
          __m512 v = _mm512_permutex2var_ps(lo0, even, hi0);
          __m512i best = corner;
          replaceWhere(_mm512_permutex2var_ps(lo0, odd, hi0), _mm512_add_epi32(corner, one), v,
                       best);
          replaceWhere(_mm512_permutex2var_ps(lo1, even, hi1), below, v, best);
          replaceWhere(_mm512_permutex2var_ps(lo1, odd, hi1), _mm512_add_epi32(below, one), v,
                       best);
          __mmask16 out = mask(n);
          _mm512_mask_storeu_ps(yRow + ow, out, v);
          _mm512_mask_storeu_epi32(argRow + ow, out, best);
        }
      }
  });
}
#elif defined(__AVX2__)
// AVX2's 8 lanes (no AVX-512: AMD's Zen 2 and 3, older Intel): as above, v replaced where
// `next` replaces it, and the argmax with it.
inline void replaceWhere(__m256 next, __m256i at, __m256& v, __m256i& best) {
  __m256 take = _mm256_or_ps(_mm256_cmp_ps(next, v, _CMP_GT_OQ),
                             _mm256_cmp_ps(next, next, _CMP_UNORD_Q));
  v = _mm256_blendv_ps(v, next, take);
  best = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(best), _mm256_castsi256_ps(at), take));
}

// The even (Odd = 0) or odd elements of the 16 floats lo, hi, in order: shuffle_ps takes
// them within each 128-bit half (lo's two, then hi's), then the halves' pairs are put in order.
template <int Odd> inline __m256 columns(__m256 lo, __m256 hi) {
  __m256 s = _mm256_shuffle_ps(lo, hi, Odd ? _MM_SHUFFLE(3, 1, 3, 1) : _MM_SHUFFLE(2, 0, 2, 0));
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
}

// max_pool's forward for 2 x 2 windows at stride 2 with AVX2, as the AVX-512 one: an output
// row's windows from its two input rows, read whole (masked past the row's end) and split
// into even and odd columns, 8 outputs at a time, compared in maxForwardWindows' order (its
// bits). On a 2-core Zen 3 VM the CNN's two pools' forward took 1.9 to 2.4 ms a step where
// maxForwardWindows' took 2.6 (traced, A/B): what is left is reading x from memory.
void maxForward2x2(const Window& g, const float* x, float* y, int32_t* arg) {
  constexpr int kWide = 8;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i one = _mm256_set1_epi32(1);
  const int64_t w = g.w, outputs = g.ho * g.wo;
  auto mask = [&](int64_t count) { // the lanes below count
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(count)), lane);
  };
  parallelFor(g.planes, rowGrain(g.h * g.w), [&](int64_t lo, int64_t hi) {
    for (int64_t pl = lo; pl < hi; ++pl)
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        const float* top = x + pl * g.h * w + 2 * oh * w;
        float* yRow = y + pl * outputs + oh * g.wo;
        int32_t* argRow = arg + pl * outputs + oh * g.wo;
        for (int64_t ow = 0; ow < g.wo; ow += kWide) {
          int64_t n = std::min<int64_t>(kWide, g.wo - ow), floats = 2 * n;
          __m256i first = mask(floats), second = mask(floats - kWide);
          const float *r0 = top + 2 * ow, *r1 = r0 + w;
          __m256 lo0 = _mm256_maskload_ps(r0, first), hi0 = _mm256_maskload_ps(r0 + kWide, second);
          __m256 lo1 = _mm256_maskload_ps(r1, first), hi1 = _mm256_maskload_ps(r1 + kWide, second);
          // Lane u's window: its corner (2 oh, 2 (ow + u)) as an index into the plane.
          __m256i corner =
              _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(2 * oh * w + 2 * ow)), even);
          __m256i below = _mm256_add_epi32(corner, _mm256_set1_epi32(static_cast<int32_t>(w)));
          __m256 v = columns<0>(lo0, hi0);
          __m256i best = corner;
          replaceWhere(columns<1>(lo0, hi0), _mm256_add_epi32(corner, one), v, best);
          replaceWhere(columns<0>(lo1, hi1), below, v, best);
          replaceWhere(columns<1>(lo1, hi1), _mm256_add_epi32(below, one), v, best);
          __m256i out = mask(n);
          _mm256_maskstore_ps(yRow + ow, out, v);
          _mm256_maskstore_epi32(argRow + ow, out, best);
        }
      }
  });
}
#endif

// in = [x], out = [y, argmax i32 (flat index into the H x W plane)].
void maxForward(const KernelCall& c) {
  Window g = poolWindow(c, c.in[0]);
  const float* x = c.in[0].f32();
  float* y = c.out[0].f32();
  int32_t* arg = c.out[1].i32();
#if defined(__AVX512F__) || defined(__AVX2__)
  if (g.k == 2 && g.stride == 2) return maxForward2x2(g, x, y, arg);
#endif
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
