// max_pool's CPU forward against a plain reading of its contract (backend/cpu/Pooling.cpp):
// each output is its window's first largest value, or its last NaN, in the window's
// row-major order, and the argmax is that element's index in the H x W plane. Windows of 2
// and 3 (the kernel's blocks of lanes, a table of corners) and of 4 (its loop by rows);
// strides 1 to 3; planes whose outputs fill a block of lanes, and ones that leave part of
// it; values with ties and NaNs. 2 x 2 at stride 2 (with AVX-512 or AVX2, rows read whole
// and split into even and odd columns) on rows of 1 to 35 outputs, odd and even widths and
// heights.
#include "backend/Device.h"
#include "backend/cpu/Kernels.h"
#include "ir/Ops.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using epl::backend::KernelCall;
using epl::ir::DType;

// Values in a few levels (ties in most windows), a NaN at every 13th place.
std::vector<float> values(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] =
        i % 13 == 5 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>((i * 7) % 5);
  return x;
}

bool sameFloat(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

} // namespace

TEST_CASE("max_pool's forward: the first largest, or the last NaN, of each window") {
  struct Case {
    int64_t b, c, h, w, k, stride;
  };
  for (Case t : {Case{2, 3, 28, 28, 2, 2}, Case{2, 2, 14, 14, 2, 2}, Case{1, 3, 7, 9, 2, 0},
                 Case{2, 2, 9, 9, 3, 2}, Case{1, 3, 8, 8, 3, 1}, Case{2, 4, 6, 5, 2, 3},
                 Case{1, 2, 11, 10, 4, 1}, Case{3, 1, 64, 64, 2, 2}, Case{1, 2, 9, 11, 2, 2},
                 Case{2, 1, 4, 40, 2, 2}, Case{1, 1, 6, 70, 2, 2}, Case{2, 3, 3, 2, 2, 0}}) {
    INFO("[" << t.b << ", " << t.c << ", " << t.h << ", " << t.w << "], k " << t.k << ", stride "
             << t.stride);
    int64_t s = t.stride ? t.stride : t.k;
    int64_t ho = (t.h - t.k) / s + 1, wo = (t.w - t.k) / s + 1, planes = t.b * t.c;
    std::vector<float> x = values(planes * t.h * t.w), y(static_cast<size_t>(planes * ho * wo));
    std::vector<int32_t> arg(y.size(), -1);
    epl::ir::Attrs attrs{{"kernel", t.k}, {"stride", t.stride}};
    KernelCall c;
    c.kind = epl::ir::OpKind::MaxPool;
    c.attrs = &attrs;
    c.in = {{x.data(), DType::F32, {t.b, t.c, t.h, t.w}}};
    c.out = {{y.data(), DType::F32, {t.b, t.c, ho, wo}},
             {arg.data(), DType::I32, {t.b, t.c, ho, wo}}};
    epl::backend::cpu::maxPool(c);
    int wrong = 0;
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t oh = 0; oh < ho; ++oh)
        for (int64_t ow = 0; ow < wo; ++ow) {
          const float* plane = x.data() + p * t.h * t.w;
          int64_t best = oh * s * t.w + ow * s;
          for (int64_t i = 0; i < t.k; ++i)
            for (int64_t j = 0; j < t.k; ++j) {
              int64_t at = (oh * s + i) * t.w + ow * s + j;
              if (plane[at] > plane[best] || std::isnan(plane[at])) best = at;
            }
          size_t o = static_cast<size_t>((p * ho + oh) * wo + ow);
          wrong += !sameFloat(y[o], plane[best]) || arg[o] != best;
        }
    CHECK(wrong == 0);
  }
}
