// The numbers of a script that set its layout (ir::LayoutKnob): found where a top-level
// block's repeat count or a split width is written, and read as other values when the
// search tries another layout (PlanOptions::literalValues).
#include "Planned.h"

#include <catch2/catch.hpp>

namespace {

const char* kTwoStages = R"(let layers = 4, stages = 2
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

std::optional<epl::ir::Module> planDealt(std::map<std::pair<uint32_t, uint32_t>, int64_t> values,
                                         int np) {
  epl::PlanOptions options;
  options.np = np;
  options.literalValues = std::move(values);
  return epl::testing::planned("knobs.epl", kTwoStages, options);
}

// The module's knobs of one kind, in order.
std::vector<const epl::ir::LayoutKnob*> knobsOf(const epl::ir::Module& m,
                                                epl::ir::LayoutKnob::Kind kind) {
  std::vector<const epl::ir::LayoutKnob*> out;
  for (const epl::ir::LayoutKnob& k : m.layoutKnobs)
    if (k.kind == kind) out.push_back(&k);
  return out;
}

} // namespace

TEST_CASE("a layout's numbers: the let a stage repeat names, a split width written in place") {
  auto m = planDealt({}, 6);
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
  auto other = planDealt({{{1, 26}, 4}, {{8, 9}, 1}}, 10);
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

// A def's layers written as repeats in neighbouring stages are one chain of knobs
// (the search deals the layers over those stages); anything between them, a repeated
// stage or another def breaks the chain, and lone repeats are no knobs.
TEST_CASE("a layout's numbers: a def's layers repeated in neighbouring stages") {
  auto script =
      [](const std::string& first, const std::string& between, const std::string& second) {
        return R"(def layer(x: f32[B, 64]) -> f32[B, 64] { return relu(linear(x, 64)) }
def other(x: f32[B, 64]) -> f32[B, 64] { return gelu(linear(x, 64)) }
model net(x: f32[B, 64], y: i32[B]) {
  replicate {
    h = linear(x, 64)
    h = )" + first +
               R"(
  }
)" + between + R"(
  replicate {
    h = )" + second +
               R"(
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
      };
  auto layers = [](const epl::ir::Module& m) {
    return knobsOf(m, epl::ir::LayoutKnob::Kind::Layers);
  };
  auto chained =
      epl::testing::planned("chain.epl", script("repeat(3) layer(h)", "", "repeat(5) layer(h)"), 2);
  REQUIRE(chained);
  auto knobs = layers(*chained);
  REQUIRE(knobs.size() == 2);
  CHECK(knobs[0]->def == "layer");
  CHECK(knobs[0]->value == 3);
  CHECK(knobs[0]->loc.line == 6);
  CHECK(knobs[0]->loc.col == 16);
  CHECK(knobs[1]->value == 5);
  CHECK(knobs[1]->loc.line == 10);
  CHECK(knobs[0]->chain == knobs[1]->chain);
  CHECK(knobs[0]->chain >= 0);

  // Other values move layers between the stages (6 and 2 where the script says `first`
  // and `second`): `layers` of them, each 64 x 65 parameters, from stage 1 to stage 0.
  auto checkMoved = [&](const std::string& first, const std::string& second,
                        const epl::ir::Module& before, int64_t layers) {
    epl::PlanOptions options;
    options.np = 2;
    options.literalValues = {{{6, 16}, 6}, {{10, 16}, 2}};
    auto moved = epl::testing::planned("chain.epl", script(first, "", second), options);
    REQUIRE(moved);
    CHECK(moved->mesh.stages[0].paramCount == before.mesh.stages[0].paramCount + layers * 64 * 65);
    CHECK(moved->mesh.stages[1].paramCount == before.mesh.stages[1].paramCount - layers * 64 * 65);
    CHECK(moved->params.size() == before.params.size()); // the model keeps its parameters
  };
  checkMoved("repeat(3) layer(h)", "repeat(5) layer(h)", *chained, 3);

  // Counts written as expressions are knobs too: their whole text, which a layout's value
  // replaces (`(8 / 2)` read as 6 leaves `8` and `2` alone).
  auto written = epl::testing::planned(
      "chain.epl", script("repeat(8 / 2) layer(h)", "", "repeat((2 * 2)) layer(h)"), 2);
  REQUIRE(written);
  auto exprKnobs = layers(*written);
  REQUIRE(exprKnobs.size() == 2);
  CHECK(exprKnobs[0]->value == 4);
  CHECK(exprKnobs[0]->loc.col == 16);
  CHECK(exprKnobs[0]->length == 5);
  CHECK(exprKnobs[1]->length == 7);
  CHECK(exprKnobs[0]->chain == exprKnobs[1]->chain);
  checkMoved("repeat(8 / 2) layer(h)", "repeat((2 * 2)) layer(h)", *written, 2);

  // No chain: an op between the repeats, another def, or one repeat alone.
  for (const auto& [first, between, second] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"repeat(3) layer(h)", "  h = relu(h)", "repeat(5) layer(h)"},
           {"repeat(3) layer(h)", "", "repeat(5) other(h)"},
           {"layer(h)", "", "repeat(5) layer(h)"}}) {
    INFO(first << " | " << between << " | " << second);
    auto m = epl::testing::planned("chain.epl", script(first, between, second), 2);
    REQUIRE(m);
    CHECK(layers(*m).empty());
  }
}

// Where every stage pins its group (`replicate(n)` with a literal n), the widths are one
// chain (the search deals one replica's devices over the stages); a stage left to the
// planner, or a width from a `let`, leaves them out.
TEST_CASE("a layout's numbers: the pinned group sizes of every stage") {
  auto script = [](const std::string& second) {
    return R"(let w = 2
model net(x: f32[B, 64], y: i32[B]) {
  replicate(2) {
    h = relu(linear(x, 64))
  }
  )" + second +
           R"( {
    loss = cross_entropy(linear(h, 10), y)
  }
  return loss
}
train net {
  data = synthetic(samples = 64)
  batch = 12
}
)";
  };
  auto groups = [](const epl::ir::Module& m) {
    return knobsOf(m, epl::ir::LayoutKnob::Kind::Groups);
  };
  auto pinned = epl::testing::planned("groups.epl", script("replicate(2)"), 4);
  REQUIRE(pinned);
  auto knobs = groups(*pinned);
  REQUIRE(knobs.size() == 2);
  CHECK(knobs[0]->loc.line == 3);
  CHECK(knobs[0]->loc.col == 13);
  CHECK(knobs[1]->loc.line == 6);
  CHECK(knobs[0]->value == 2);
  CHECK(knobs[0]->chain == 0);
  CHECK(knobs[1]->chain == 0);

  // Other values: one device to stage 0, three to stage 1, the replica still 4.
  epl::PlanOptions options;
  options.np = 4;
  options.literalValues = {{{3, 13}, 1}, {{6, 13}, 3}};
  auto moved = epl::testing::planned("groups.epl", script("replicate(2)"), options);
  REQUIRE(moved);
  REQUIRE(moved->mesh.stages.size() == 2);
  CHECK(moved->mesh.stages[0].group == 1);
  CHECK(moved->mesh.stages[1].group == 3);
  CHECK(moved->mesh.replicaSize == 4);

  for (const auto& [second, np] :
       std::vector<std::pair<const char*, int>>{{"replicate", 3}, {"replicate(w)", 4}}) {
    INFO(second);
    auto m = epl::testing::planned("groups.epl", script(second), np);
    REQUIRE(m);
    CHECK(groups(*m).empty());
  }
}
