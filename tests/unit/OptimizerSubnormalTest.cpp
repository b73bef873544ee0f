// The CPU optimizers flush subnormal moments to zero (backend/cpu/Optimizers.cpp,
// FlushSubnormals): a moment whose gradient stays zero decays into the subnormal range,
// where x86 multiplies take a microcode assist each. Flushed, it is zero, and the update
// is otherwise the formula's; the caller's floating-point mode is left as it was.
#include "backend/Device.h"

#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using epl::backend::OptimizerCall;
using epl::backend::OptimizerKind;
using epl::backend::TensorView;

TensorView viewOf(std::vector<float>& v) {
  TensorView t;
  t.data = v.data();
  t.shape = {static_cast<int64_t>(v.size())};
  t.dtype = epl::ir::DType::F32;
  return t;
}

// Enough elements that two threads each take a part.
constexpr size_t kN = 1 << 16;

} // namespace

TEST_CASE("adam flushes subnormal moments to zero on every thread, and keeps the formula",
          "[optimizer]") {
  auto dev = epl::backend::makeCpuDevice(2);
  const float tiny = FLT_MIN / 64; // subnormal
  // Even elements: no gradient, a subnormal first moment. Odd ones: an ordinary update.
  std::vector<float> p(kN, 0.5f), g(kN), m(kN), v(kN, 1e-6f);
  for (size_t i = 0; i < kN; ++i) {
    g[i] = i % 2 ? 0.25f : 0.f;
    m[i] = i % 2 ? 0.01f : tiny;
  }
  REQUIRE(std::fpclassify(m[0]) == FP_SUBNORMAL);
  OptimizerCall c;
  c.kind = OptimizerKind::Adam;
  c.lr = 1e-3f;
  c.step = 3;
  c.param = viewOf(p), c.grad = viewOf(g), c.state1 = viewOf(m), c.state2 = viewOf(v);
  dev->optimizerStep(c);
  dev->synchronize();

  double bc1 = 1 - std::pow(0.9, 3), bc2 = 1 - std::pow(0.999, 3);
  double m1 = 0.9 * 0.01 + 0.1 * 0.25, v1 = 0.999 * 1e-6 + 0.001 * 0.0625;
  double p1 = 0.5 - 1e-3 / bc1 * m1 / (std::sqrt(v1) / std::sqrt(bc2) + 1e-8);
  for (size_t i : {size_t{0}, size_t{2}, kN / 2, kN - 2}) {
    INFO("element " << i);
    CHECK(m[i] == 0.f); // 0.9 x a subnormal, flushed; unflushed it stays subnormal
    CHECK(p[i] == 0.5f);
    CHECK(v[i] == Approx(0.999 * 1e-6).epsilon(1e-6));
  }
  for (size_t i : {size_t{1}, kN / 2 + 1, kN - 1}) {
    INFO("element " << i);
    CHECK(m[i] == Approx(m1).epsilon(1e-6));
    CHECK(v[i] == Approx(v1).epsilon(1e-4)); // 1 - beta2 from beta2's float: 1.3e-5 off
    CHECK(p[i] == Approx(p1).epsilon(1e-6));
  }
  // The calling thread's mode is restored: a subnormal product is still subnormal here.
  volatile float x = FLT_MIN;
  volatile float half = 0.5f;
  CHECK(std::fpclassify(x * half) == FP_SUBNORMAL);
}

TEST_CASE("sgd's momentum buffer flushes subnormals to zero", "[optimizer]") {
  auto dev = epl::backend::makeCpuDevice(2);
  std::vector<float> p(kN, 1.f), g(kN, 0.f), buf(kN, FLT_MIN / 8);
  OptimizerCall c;
  c.kind = OptimizerKind::Sgd;
  c.lr = 0.1f;
  c.momentum = 0.9f;
  c.step = 2;
  c.param = viewOf(p), c.grad = viewOf(g), c.state1 = viewOf(buf);
  dev->optimizerStep(c);
  dev->synchronize();
  for (size_t i : {size_t{0}, kN / 2, kN - 1}) {
    INFO("element " << i);
    CHECK(buf[i] == 0.f);
    CHECK(p[i] == 1.f);
  }
}
