// Model states per device against the ZeRO paper's formulas (mixed-precision Adam, Psi
// parameters, N data-parallel devices): 16 Psi; ZeRO-1 4 Psi + 12 Psi / N; ZeRO-2
// 2 Psi + 14 Psi / N; ZeRO-3 16 Psi / N.
#include "driver/Epl.h"

#include <catch2/catch.hpp>
#include <fmt/format.h>

namespace {

constexpr int64_t kPsi = 1024 * 1024; // one 1024x1024 linear without bias

int64_t modelStates(const std::string& policy, const std::string& optimizer, int np) {
  std::string text = fmt::format(R"(
model net(x: f32[B, 1024], y: i32[B]) {{
  return mse(linear(x, 1024, bias = false), x)
}}
policy {{ {} }}
train net {{
  data = synthetic(samples = 64)
  batch = 64
  optimizer = {}
}}
)",
                                 policy, optimizer);
  epl::Session session;
  epl::PlanOptions options;
  options.np = np;
  auto m = epl::planText("states.epl", text, session, options);
  if (!m) {
    for (const auto& d : session.diags.all())
      FAIL(d.message);
    return -1;
  }
  REQUIRE(m->mesh.stages.size() == 1);
  return m->mesh.stages[0].modelStateBytes();
}

} // namespace

TEST_CASE("mixed-precision Adam model states follow the ZeRO formulas") {
  for (int n : {1, 2, 4, 8}) {
    INFO("N = " << n);
    CHECK(modelStates("amp = bf16", "adam(lr = 1e-3)", n) == 16 * kPsi);
    CHECK(modelStates("amp = bf16 zero = 1", "adam(lr = 1e-3)", n) == 4 * kPsi + 12 * kPsi / n);
    CHECK(modelStates("amp = fp16 zero = 2", "adamw(lr = 1e-3)", n) == 2 * kPsi + 14 * kPsi / n);
    CHECK(modelStates("amp = bf16 zero = 3", "adamw(lr = 1e-3)", n) == 16 * kPsi / n);
  }
}

TEST_CASE("fp32 and SGD model states") {
  CHECK(modelStates("amp = none", "adam(lr = 1e-3)", 1) == 16 * kPsi); // 4 + 4 + 8
  CHECK(modelStates("amp = none", "sgd(lr = 0.1, momentum = 0.9)", 1) == 12 * kPsi);
  CHECK(modelStates("amp = none", "sgd(lr = 0.1)", 1) == 8 * kPsi);
  CHECK(modelStates("amp = none zero = 1", "sgd(lr = 0.1, momentum = 0.9)", 4) == 8 * kPsi + kPsi);
}

TEST_CASE("offloading the optimizer leaves parameters and gradients on the device") {
  CHECK(modelStates("amp = bf16 offload = optimizer", "adam(lr = 1e-3)", 2) == 4 * kPsi);
  CHECK(modelStates("amp = bf16 zero = 3 offload = params", "adam(lr = 1e-3)", 4) == 2 * kPsi / 4);
}
