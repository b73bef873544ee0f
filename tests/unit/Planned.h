// A script planned for a device count, for the tests of what the planner and the schedule
// make of it: any diagnostic fails the running test.
#pragma once
#include "lib/Epl.h"

#include <catch2/catch.hpp>
#include <optional>
#include <string>

namespace epl::testing {

// A one-layer model in one stage, for what a plan without a pipeline or split shows.
inline const char* kOneStage = R"(
model net(x: f32[B, 8], y: i32[B]) {
  return cross_entropy(linear(x, 4), y)
}
train net {
  data = synthetic(samples = 8)
  batch = 8
}
)";

// Two one-device stages of a linear each, 4 micro-batches: the smallest pipeline.
inline const char* kTwoStages = R"(
model net(x: f32[B, 64], y: i32[B]) {
  replicate {
    h = relu(linear(x, 128))
  }
  replicate {
    loss = cross_entropy(linear(h, 10), y)
  }
  return loss
}
policy { micro_batches = 4 }
train net {
  data = synthetic(samples = 64)
  batch = 16
}
)";

inline std::optional<ir::Module> planned(const std::string& file, const std::string& text,
                                         const PlanOptions& options) {
  Session session;
  auto m = planText(file, text, session, options);
  for (const auto& d : session.diags.all())
    FAIL(d.message);
  return m;
}

inline std::optional<ir::Module> planned(const std::string& file, const std::string& text, int np) {
  PlanOptions options;
  options.np = np;
  return planned(file, text, options);
}

} // namespace epl::testing
