// Clipping and a loss scale read on the device (OptimizerCall::squaredNorm): the update
// multiplies the gradient by updateFactor of the squared norm in device memory, the same bits
// as the host's factor passed as gradScale, and skips where a loss scale's gradients
// overflowed. On the CPU device, the guarded one (memory not the host's), and a GPU where
// there is one.
#include "backend/Device.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

namespace {

using epl::backend::Device;
using epl::backend::OptimizerCall;
using epl::backend::OptimizerKind;
using epl::backend::TensorView;

struct Buffer {
  Buffer(Device& dev, const std::vector<float>& values)
      : dev(dev), n(static_cast<int64_t>(values.size())), p(dev.allocate(4 * n)) {
    dev.copyToDevice(p, values.data(), 4 * n);
  }
  ~Buffer() { dev.release(p); }
  std::vector<float> read() const {
    std::vector<float> out(static_cast<size_t>(n));
    dev.copyToHost(out.data(), p, 4 * n);
    dev.synchronize();
    return out;
  }
  TensorView view() const { return TensorView{p, epl::ir::DType::F32, {n}}; }
  Device& dev;
  int64_t n;
  void* p;
};

// The devices the update runs on.
std::vector<std::unique_ptr<Device>> devices() {
  std::vector<std::unique_ptr<Device>> out;
  out.push_back(epl::backend::makeCpuDevice(2));
  out.push_back(epl::backend::makeGuardedCpuDevice(2));
  if (epl::backend::cudaAvailable()) out.push_back(epl::backend::makeDevice("cuda", {}));
  return out;
}

// The parameter and its two states after one step from the same start (zero states), the
// gradients scaled by `lossScale` (0: none) and the factor either read on the device (from
// `squaredNorm`) or worked out as the host did before: the clip factor of the unscaled norm
// where maxNorm > 0, in double, over the scale.
std::vector<float> step(Device& dev, OptimizerKind kind, float squaredNorm, double maxNorm,
                        double lossScale, bool onDevice) {
  std::vector<float> p(1000), g(1000), zero(1000, 0.f);
  double scale = lossScale > 0 ? lossScale : 1;
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = std::sin(static_cast<float>(i));
    g[i] = static_cast<float>(0.1f * std::cos(static_cast<float>(3 * i)) * scale);
  }
  Buffer param(dev, p), grad(dev, g), m(dev, zero), v(dev, zero), norm(dev, {squaredNorm});
  OptimizerCall c;
  c.kind = kind;
  c.weightDecay = kind == OptimizerKind::AdamW ? 0.1f : 0.f; // SGD: the gradient's step alone
  c.momentum = 0.9f;
  c.param = param.view(), c.grad = grad.view(), c.state1 = m.view(), c.state2 = v.view();
  if (onDevice) {
    c.squaredNorm = static_cast<const float*>(norm.p);
    c.maxNorm = maxNorm;
    c.lossScale = lossScale;
  } else {
    double coef = maxNorm / (std::sqrt(static_cast<double>(squaredNorm)) / scale + 1e-6);
    float clip = maxNorm > 0 && coef < 1 ? static_cast<float>(coef) : 1.f;
    c.gradScale = lossScale > 0 ? static_cast<float>(clip / lossScale) : clip;
  }
  dev.optimizerStep(c);
  std::vector<float> out = param.read(), m1 = m.read(), v1 = v.read();
  out.insert(out.end(), m1.begin(), m1.end());
  out.insert(out.end(), v1.begin(), v1.end());
  return out;
}

} // namespace

TEST_CASE("the clip factor: max_norm / (norm + 1e-6) below 1, else 1") {
  CHECK(epl::backend::clipFactor(4.f, 1.0) == static_cast<float>(1.0 / (2.0 + 1e-6)));
  CHECK(epl::backend::clipFactor(0.25f, 1.0) == 1.f);
  CHECK(epl::backend::clipFactor(0.f, 1.0) == 1.f);
  // Under a loss scale of 4 the norm is a quarter: 8 / 4 = 2 over 1 clips by a half, over 4.
  CHECK(epl::backend::updateFactor(64.f, 1.0, 4.0) ==
        static_cast<float>(static_cast<float>(1.0 / (2.0 + 1e-6)) / 4.0));
  CHECK(epl::backend::updateFactor(64.f, 0.0, 4.0) == 0.25f); // no clipping
  CHECK(epl::backend::updateFactor(4.f, 1.0, 0.0) == epl::backend::clipFactor(4.f, 1.0));
  CHECK(epl::backend::overflowed(INFINITY, 4.0));
  CHECK(epl::backend::overflowed(NAN, 4.0));
  CHECK_FALSE(epl::backend::overflowed(3e38f, 4.0));
  // Without a loss scale an infinite norm skips nothing: its clip factor is 0, as in
  // clip_grad_norm_.
  CHECK_FALSE(epl::backend::overflowed(INFINITY, 0.0));
  CHECK(epl::backend::updateFactor(INFINITY, 1.0, 0.0) == 0.f);
}

TEST_CASE("an update reading its clip factor on the device matches one given it by the host") {
  for (auto& dev : devices()) {
    INFO(dev->name());
    for (OptimizerKind kind : {OptimizerKind::AdamW, OptimizerKind::Sgd})
      for (float squared : {9.f, 0.01f}) { // clipped (norm 3 over 1), and not
        INFO("squared norm " << squared);
        std::vector<float> device = step(*dev, kind, squared, 1.0, 0, true),
                           host = step(*dev, kind, squared, 1.0, 0, false);
        CHECK(device == host);
      }
    // And the factor acts: SGD's step (lr 1e-3) clipped by a third moves each parameter a
    // third as far as unclipped.
    std::vector<float> before = step(*dev, OptimizerKind::Sgd, 0.f, 1.0, 0, false); // factor 1
    std::vector<float> clipped = step(*dev, OptimizerKind::Sgd, 9.f, 1.0, 0, true);
    float p = std::sin(5.f), full = before[5] - p, third = clipped[5] - p;
    CHECK(third == Approx(full / 3).epsilon(1e-3));
  }
}

TEST_CASE("under a loss scale the update unscales and clips on the device, and skips an overflow") {
  const double scale = 65536;
  for (auto& dev : devices()) {
    INFO(dev->name());
    for (OptimizerKind kind : {OptimizerKind::AdamW, OptimizerKind::Adam, OptimizerKind::Sgd}) {
      INFO("optimizer " << static_cast<int>(kind));
      // The scaled gradients' squared norm: 9 scale^2 clips (norm 3 over 1), 0.01 scale^2
      // does not; with and without clipping.
      for (double maxNorm : {1.0, 0.0})
        for (double unscaled : {9.0, 0.01}) {
          float squared = static_cast<float>(unscaled * scale * scale);
          INFO("max norm " << maxNorm << ", squared norm " << squared);
          CHECK(step(*dev, kind, squared, maxNorm, scale, true) ==
                step(*dev, kind, squared, maxNorm, scale, false));
        }
      // The update's gradient is the unscaled one: as a step without a scale, within
      // rounding (the scaled gradient is rounded to float).
      std::vector<float> scaled = step(*dev, kind, 0.01f * 65536 * 65536, 0.0, scale, true),
                         plain = step(*dev, kind, 0.01f, 0.0, 0, false);
      for (size_t i = 0; i < plain.size(); i += 97)
        CHECK(scaled[i] == Approx(plain[i]).epsilon(1e-5));
      // An overflow leaves the parameter and its states as they were.
      std::vector<float> start(3000, 0.f);
      for (size_t i = 0; i < 1000; ++i)
        start[i] = std::sin(static_cast<float>(i));
      for (float bad : {INFINITY, NAN}) {
        INFO("squared norm " << bad);
        CHECK(step(*dev, kind, bad, 1.0, scale, true) == start);
      }
    }
  }
}
