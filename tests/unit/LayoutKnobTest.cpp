// The numbers of a script that set its layout (ir::LayoutKnob): found where a top-level
// block's repeat count or a split width is written, and read as other values when the
// search tries another layout (PlanOptions::literalValues).
#include "Planned.h"

#include <catch2/catch.hpp>

namespace {

const char* kScript = R"(let layers = 4, stages = 2
def layer(x: f32[B, 64]) -> f32[B, 64] { return relu(linear(x, 64)) }
model net(x: f32[B, 64], y: i32[B]) {
  h = x
  repeat(stages) replicate {
    h = repeat(layers / stages) layer(h)
  }
  split(2) { loss = cross_entropy(linear(h, 10), y) }
  return loss
}
policy { micro_batches = 4 }
train net {
  data = synthetic(samples = 64)
  batch = 16
}
)";

std::optional<epl::ir::Module> plan(std::map<std::pair<uint32_t, uint32_t>, int64_t> values,
                                    int np) {
  epl::PlanOptions options;
  options.np = np;
  options.literalValues = std::move(values);
  return epl::testing::planned("knobs.epl", kScript, options);
}

} // namespace

TEST_CASE("a layout's numbers: the let a stage repeat names, a split width written in place") {
  auto m = plan({}, 6);
  REQUIRE(m);
  REQUIRE(m->layoutKnobs.size() == 2);
  const epl::ir::LayoutKnob& stages = m->layoutKnobs[0];
  CHECK(stages.kind == epl::ir::LayoutKnob::Kind::Stages);
  CHECK(stages.let == "stages");
  CHECK(stages.loc.line == 1);
  CHECK(stages.loc.col == 26);
  CHECK(stages.value == 2);
  const epl::ir::LayoutKnob& width = m->layoutKnobs[1];
  CHECK(width.kind == epl::ir::LayoutKnob::Kind::SplitWidth);
  CHECK(width.let.empty());
  CHECK(width.loc.line == 8);
  CHECK(width.loc.col == 9);
  CHECK(width.value == 2);
  CHECK(m->mesh.stages.size() == 3);
  CHECK(m->mesh.stages[2].splitWidth == 2);

  // Other values: the let's every use follows (the inner repeat too), the width changes.
  auto other = plan({{{1, 26}, 4}, {{8, 9}, 1}}, 10);
  REQUIRE(other);
  CHECK(other->mesh.stages.size() == 5);
  CHECK(other->mesh.stages[4].splitWidth == 1);
  CHECK(other->layoutKnobs[0].value == 4);
  CHECK(other->layoutKnobs[1].value == 1);
}

// `split(auto)` and a bare `split` are knobs too: the planner's choice (value 0) unless
// the search writes a width in the auto's place, or after the keyword.
TEST_CASE("a layout's numbers: split(auto) and split take a width in place") {
  const char* script = R"(def layer(x: f32[B, 64]) -> f32[B, 64] { return relu(linear(x, 64)) }
model net(x: f32[B, 64], y: i32[B]) {
  h = repeat(2) layer(x)
  split(auto) { h = layer(h) }
  split { loss = cross_entropy(linear(h, 16), y) }
  return loss
}
train net {
  data = synthetic(samples = 64)
  batch = 16
}
)";
  auto plan = [&](std::map<std::pair<uint32_t, uint32_t>, int64_t> values) {
    epl::PlanOptions options;
    options.np = 4;
    options.literalValues = std::move(values);
    return epl::testing::planned("auto.epl", script, options);
  };
  auto m = plan({});
  REQUIRE(m);
  REQUIRE(m->layoutKnobs.size() == 2);
  const epl::ir::LayoutKnob &a = m->layoutKnobs[0], &bare = m->layoutKnobs[1];
  CHECK(a.kind == epl::ir::LayoutKnob::Kind::SplitWidth);
  CHECK(a.value == 0);
  CHECK_FALSE(a.bare);
  CHECK(a.loc.line == 4);
  CHECK(a.loc.col == 9); // the auto
  CHECK(a.length == 4);
  CHECK(bare.bare);
  CHECK(bare.loc.line == 5);
  CHECK(bare.loc.col == 3); // the keyword
  CHECK(bare.length == 5);
  auto widths = [](const epl::ir::Module& p) {
    std::vector<int> out;
    for (const epl::ir::StagePlan& s : p.mesh.stages)
      out.push_back(s.splitWidth);
    return out;
  };
  // The planner's choice: the stage group's devices for a split stage with no width.
  CHECK(widths(*m) == std::vector<int>{2, 2});
  auto other = plan({{{4, 9}, 2}, {{5, 3}, 1}});
  REQUIRE(other);
  CHECK(widths(*other) == std::vector<int>{2, 1});
}
