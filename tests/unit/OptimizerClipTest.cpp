// Clipping read on the device (OptimizerCall::squaredNorm): the update multiplies the
// gradient by clipFactor of the squared norm in device memory, the same bits as the host's
// factor passed as gradScale. On the CPU device and the guarded one (memory not the host's).
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

// The parameter after one step from the same start, the clip factor either read on the
// device (from `squaredNorm`) or passed from the host.
std::vector<float> step(Device& dev, OptimizerKind kind, float squaredNorm, double maxNorm,
                        bool onDevice) {
  std::vector<float> p(1000), g(1000), zero(1000, 0.f);
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = std::sin(static_cast<float>(i));
    g[i] = 0.1f * std::cos(static_cast<float>(3 * i));
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
  } else {
    c.gradScale = epl::backend::clipFactor(squaredNorm, maxNorm);
  }
  dev.optimizerStep(c);
  return param.read();
}

} // namespace

TEST_CASE("the clip factor: max_norm / (norm + 1e-6) below 1, else 1") {
  CHECK(epl::backend::clipFactor(4.f, 1.0) == static_cast<float>(1.0 / (2.0 + 1e-6)));
  CHECK(epl::backend::clipFactor(0.25f, 1.0) == 1.f);
  CHECK(epl::backend::clipFactor(0.f, 1.0) == 1.f);
}

TEST_CASE("an update reading its clip factor on the device matches one given it by the host") {
  std::unique_ptr<Device> devices[] = {epl::backend::makeCpuDevice(2),
                                       epl::backend::makeGuardedCpuDevice(2)};
  for (auto& dev : devices) {
    INFO(dev->name());
    for (OptimizerKind kind : {OptimizerKind::AdamW, OptimizerKind::Sgd})
      for (float squared : {9.f, 0.01f}) { // clipped (norm 3 over 1), and not
        INFO("squared norm " << squared);
        std::vector<float> device = step(*dev, kind, squared, 1.0, true),
                           host = step(*dev, kind, squared, 1.0, false);
        CHECK(device == host);
      }
    // And the factor acts: SGD's step (lr 1e-3) clipped by a third moves each parameter a
    // third as far as unclipped.
    std::vector<float> before = step(*dev, OptimizerKind::Sgd, 0.f, 1.0, false); // factor 1
    std::vector<float> clipped = step(*dev, OptimizerKind::Sgd, 9.f, 1.0, true);
    float p = std::sin(5.f), full = before[5] - p, third = clipped[5] - p;
    CHECK(third == Approx(full / 3).epsilon(1e-3));
  }
}
