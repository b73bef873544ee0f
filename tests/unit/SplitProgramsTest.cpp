// The rank programs of a stage with split regions: what each rank holds (local shapes of
// tensors and parameters), what every communication op moves forward and backward (the
// transposes), and that the ranks' communication fits together.
#include "Planned.h"
#include "ir/StreamCheck.h"
#include "lib/Epl.h"
#include "passes/PipelinePrograms.h"

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fstream>
#include <iterator>

namespace {

std::optional<epl::ir::Module> plannedSplit(const std::string& text, int np) {
  return epl::testing::planned("split.epl", text, np);
}

// Data-parallel linear layers around a split mlp and a column-then-row linear pair (split
// attention: tests/parallel/gpt_split.epl).
std::optional<epl::ir::Module> planSplit(int width, int np) {
  std::string text = fmt::format(R"(
model net(x: f32[B, 16], y: i32[B]) {{
  replicate {{
    h = linear(x, 16)
    split({}) {{
      h = h + mlp(layer_norm(h), 32)
      h = linear(gelu(linear(h, 24)), 16)
    }}
    loss = cross_entropy(linear(h, 4), y)
  }}
  return loss
}}
policy {{ micro_batches = 2 }}
train net {{
  data = synthetic(samples = 64)
  batch = 16
  clip_grad_norm = 1.0
}}
)",
                                 width);
  return plannedSplit(text, np);
}

int opNamed(const epl::ir::Module& m, const std::string& name, epl::ir::Phase phase) {
  for (size_t i = 0; i < m.ops.size(); ++i)
    if (m.ops[i].name == name && m.ops[i].phase == phase) return static_cast<int>(i);
  FAIL("no op " << name);
  return -1;
}

int paramNamed(const epl::ir::Module& m, const std::string& name) {
  for (size_t q = 0; q < m.params.size(); ++q)
    if (m.params[q].name == name) return static_cast<int>(q);
  FAIL("no parameter " << name);
  return -1;
}

} // namespace

TEST_CASE("a split stage's ranks hold their batch share outside regions, pieces inside") {
  using epl::ir::Phase;
  auto m = planSplit(2, 2);
  REQUIRE(m);
  REQUIRE(m->runRefusal().empty());
  REQUIRE(m->programs.size() == 2);
  const epl::ir::Program& p = m->programs[1];
  CHECK(p.splitWidth == 2);
  CHECK(p.splitRank == 1);
  CHECK(p.localBatch == 4); // 16 samples, 2 micro-batches, 2 ranks
  auto out = [&](const std::string& op) {
    return m->localShape(p, m->ops[opNamed(*m, op, Phase::Forward)].outputs[0]);
  };
  CHECK(out("linear") == std::vector<int64_t>{4, 16});   // data-parallel
  CHECK(out("mlp") == std::vector<int64_t>{8, 16});      // partial sums, the whole batch
  CHECK(out("linear.1") == std::vector<int64_t>{8, 12}); // column: half of 24
  CHECK(out("linear.2") == std::vector<int64_t>{8, 16}); // row: partial sums
  CHECK(out("linear.3") == std::vector<int64_t>{4, 4});  // data-parallel again
  CHECK(m->localParamShape(p, paramNamed(*m, "mlp.fc1_weight")) == std::vector<int64_t>{16, 16});
  CHECK(m->localParamShape(p, paramNamed(*m, "mlp.fc2_weight")) == std::vector<int64_t>{16, 16});
  CHECK(m->localParamShape(p, paramNamed(*m, "linear.2.weight")) == std::vector<int64_t>{16, 12});
  CHECK(m->localParamShape(p, paramNamed(*m, "linear.2.bias")) == std::vector<int64_t>{16});
}

TEST_CASE("split communication: all-reduce <-> identity, all-gather <-> slice") {
  using epl::ir::Phase;
  auto m = planSplit(2, 2);
  REQUIRE(m);
  const epl::ir::Program& p = m->programs[0];
  int moves = 0, allReduces = 0;
  for (size_t i = 0; i < m->ops.size(); ++i) {
    const epl::ir::Op& op = m->ops[i];
    auto c = m->splitCollective(p, static_cast<int>(i));
    bool backward = op.phase == Phase::Backward;
    epl::ir::OpKind kind = backward ? m->ops[op.forward].kind : op.kind;
    using K = epl::ir::OpKind;
    bool expected = (!backward && (kind == K::AllReduce || kind == K::AllGather)) ||
                    (backward && (kind == K::Identity || kind == K::Slice));
    if (op.phase == Phase::Optimizer) expected = false;
    CHECK(c.has_value() == expected);
    if (!c) continue;
    ++moves;
    allReduces += c->kind == epl::ir::CollectiveKind::AllReduce;
    if (kind == K::AllGather) CHECK(c->bytes == 4 * 4 * 16); // each rank's 4 samples
  }
  // Forward: the batch gathered, two all-reduces. Backward: two identities' all-reduces
  // (before the mlp and the column linear) and the slice's gather.
  CHECK(moves == 6);
  CHECK(allReduces == 4);
  for (bool eval : {false, true})
    CHECK_FALSE(epl::ir::checkStreams(epl::passes::programStreams(*m, eval)).has_value());
}

TEST_CASE("copies of a split group sum their pieces' gradients over the same split rank") {
  auto m = planSplit(2, 4);
  REQUIRE(m);
  REQUIRE(m->programs.size() == 4);
  CHECK(m->programs[3].splitRank == 1);
  CHECK(m->programs[3].replica == 1);
  int pieces = 0;
  for (const epl::ir::GradBucket& b : m->buckets) {
    CHECK(b.ranks == (b.pieces ? 2 : 4));
    pieces += b.pieces;
  }
  CHECK(pieces > 0);
  for (bool eval : {false, true})
    CHECK_FALSE(epl::ir::checkStreams(epl::passes::programStreams(*m, eval)).has_value());
}

TEST_CASE("a split stage whose micro-batch does not divide over its devices reads it whole") {
  // Stage 1's micro-batch (6) does not divide over its devices (4): each reads its copy's
  // 6 samples of the labels, which no all-gather then joins.
  std::string text = R"(
model net(x: f32[B, 64], y: i32[B]) {
  replicate(2) {
    x = relu(linear(x, 64))
  }
  split(4) {
    loss = cross_entropy(linear(relu(linear(x, 256)), 12), y)
  }
  return loss
}
train net { data = synthetic(samples = 60) batch = 6 }
)";
  auto m = plannedSplit(text, 6);
  REQUIRE(m);
  REQUIRE(m->programs.size() == 6);
  for (int r : {0, 1}) {
    const epl::ir::Program& p = m->programs[r];
    CHECK_FALSE(p.readsWhole);
    CHECK((p.localBatch == 3 && p.readers == 2 && p.reader == r));
  }
  for (int r : {2, 3, 4, 5}) {
    const epl::ir::Program& p = m->programs[r];
    CHECK(p.readsWhole);
    CHECK((p.localBatch == 6 && p.wholeBatch == 6 && p.readers == 1 && p.reader == 0));
    CHECK(m->localShape(p, m->inputs[1]) == std::vector<int64_t>{6});
  }
  for (const epl::ir::Op& op : m->ops)
    CHECK(op.kind != epl::ir::OpKind::AllGather);
  for (bool eval : {false, true})
    CHECK_FALSE(epl::ir::checkStreams(epl::passes::programStreams(*m, eval)).has_value());
}

TEST_CASE("model chunks on the same devices need one split width") {
  std::ifstream in(std::string(EPL_SOURCE_DIR) + "/tests/parallel/chunk_widths.epl");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE_FALSE(text.empty());
  auto m = plannedSplit(text, 4);
  REQUIRE(m);
  CHECK(m->programs.empty());
  CHECK(m->runRefusal() == "4 pipeline stages and model chunks of split widths 2 (stage 0) and 1 "
                           "(stage 2) on the same devices");
}

TEST_CASE("split experts: the rows of a device's experts arrive by all-to-all, and go back") {
  std::string text = R"(
model net(x: f32[B, 8, 16]) {
  replicate {
    h = linear(x, 16)
    split(2) {
      h = h + moe(layer_norm(h), 4, 32, top_k = 2, capacity_factor = 1.5)
    }
    loss = mse(h, x)
  }
  return loss
}
train net { data = synthetic(samples = 64) batch = 8 }
)";
  auto m = plannedSplit(text, 2);
  REQUIRE(m);
  REQUIRE(m->programs.size() == 2);
  const epl::ir::Program& p = m->programs[1];
  using epl::ir::Phase;
  // Each device routes its own 4 samples; its experts see up to the copy's 8 samples' rows.
  CHECK(m->localShape(p, m->ops[opNamed(*m, "moe.dispatch", Phase::Forward)].outputs[0]) ==
        std::vector<int64_t>{4, 16, 16});
  const epl::ir::Op& experts = m->ops[opNamed(*m, "moe.experts", Phase::Forward)];
  CHECK(m->localShape(p, experts.inputs[0]) == std::vector<int64_t>{8, 16, 16});
  CHECK(m->localShape(p, experts.inputs[1]) == std::vector<int64_t>{2}); // its 2 experts' counts
  CHECK(m->localParamShape(p, paramNamed(*m, "moe.fc1_weight")) == std::vector<int64_t>{2, 32, 16});
  CHECK(m->localParamShape(p, paramNamed(*m, "moe.router_weight")) == std::vector<int64_t>{4, 16});
  // The router's whole weight sees each device's own tokens: summed over the group.
  CHECK(m->params[paramNamed(*m, "moe.router_weight")].sumOverSplit);
  epl::ir::Module::SplitTraffic traffic = m->splitTraffic(p);
  CHECK(traffic.allToAlls[0] == 2); // dispatch, combine
  CHECK(traffic.allToAlls[1] == 2); // their backwards
  CHECK(traffic.allToAllBytes[0] == 2 * 4 * (4 * 16 * 16));
  for (bool eval : {false, true})
    CHECK_FALSE(epl::ir::checkStreams(epl::passes::programStreams(*m, eval)).has_value());
}

TEST_CASE("a transformer layer split t ways moves 4 all-reduces of b s h a micro-batch") {
  for (int t : {2, 4}) {
    std::string text = R"(
model net(x: f32[B, 8, 16]) {
  replicate {
    h = linear(x, 16)
    split()" + std::to_string(t) +
                       R"() {
      h = h + attention(layer_norm(h), 4)
      h = h + mlp(layer_norm(h), 64)
    }
    loss = mse(h, x)
  }
  return loss
}
train net { data = synthetic(samples = 64) batch = 8 }
)";
    auto m = plannedSplit(text, t);
    REQUIRE(m);
    REQUIRE(m->programs.size() == static_cast<size_t>(t));
    epl::ir::Module::SplitTraffic traffic = m->splitTraffic(m->programs[0]);
    const int64_t b = 8, s = 8, h = 16, bsh = 4 * b * s * h; // f32 bytes of one activation
    CHECK(traffic.allReduces[0] == 2); // after attention's and the mlp's partial sums
    CHECK(traffic.allReduces[1] == 2); // into them: the identities' backward
    CHECK(traffic.allReduceBytes[0] == 2 * bsh);
    CHECK(traffic.allReduceBytes[1] == 2 * bsh);
    // The region's entry gathers the batch; its exit's backward gathers the gradient.
    CHECK(traffic.allGathers[0] == 1);
    CHECK(traffic.allGathers[1] == 1);
    int64_t gathers = (traffic.allGatherBytes[0] + traffic.allGatherBytes[1]) * (t - 1) / t;
    CHECK(traffic.ringSendBytes == 8 * bsh * (t - 1) / t + gathers);
  }
}

// The split traffic of `layers` transformer layers split t ways inside a region (a
// sequence of 8, width 16, batch 8 a micro-batch).
epl::ir::Module::SplitTraffic layerTraffic(int t, int layers, bool sequenceParallel) {
  std::string text = fmt::format(R"(
def layer(h: f32[B, T, D]) -> f32[B, T, D] {{
  h = h + attention(layer_norm(h), 4)
  return h + mlp(layer_norm(h), 64)
}}
model net(x: f32[B, 8, 16]) {{
  replicate {{
    h = linear(x, 16)
    split({}) {{
      h = repeat({}) layer(h)
    }}
    loss = mse(h, x)
  }}
  return loss
}}
policy {{ sequence_parallel = {} }}
train net {{ data = synthetic(samples = 64) batch = 8 }}
)",
                                 t, layers, sequenceParallel ? "true" : "false");
  auto m = plannedSplit(text, t);
  REQUIRE(m);
  REQUIRE(m->programs.size() == static_cast<size_t>(t));
  return m->splitTraffic(m->programs[0]);
}

TEST_CASE("sequence parallelism moves a layer's activations as all-gathers and reduce-scatters "
          "at the all-reduces' volume, and gathers the slices again in the backward") {
  const int64_t b = 8, s = 8, h = 16, bsh = 4 * b * s * h; // f32 bytes of one activation
  for (int t : {2, 4}) {
    // One more layer adds what a layer in the middle of the region moves.
    for (bool sp : {false, true}) {
      // With it, the backward gathers attention's and the mlp's inputs again (Megatron-LM's
      // way: only their slices are kept): 2 more all-gathers of b·s·h.
      auto two = layerTraffic(t, 2, sp), three = layerTraffic(t, 3, sp);
      CHECK(three.ringSendBytes - two.ringSendBytes == (sp ? 10 : 8) * bsh * (t - 1) / t);
      for (int k : {0, 1}) { // forward, backward
        int allReduces = three.allReduces[k] - two.allReduces[k];
        int gathers = three.allGathers[k] - two.allGathers[k];
        int scatters = three.reduceScatters[k] - two.reduceScatters[k];
        CHECK(allReduces == (sp ? 0 : 2));
        CHECK(gathers == (sp ? 2 + 2 * k : 0));
        CHECK(scatters == (sp ? 2 : 0));
        CHECK(three.allReduceBytes[k] - two.allReduceBytes[k] == allReduces * bsh);
        CHECK(three.allGatherBytes[k] - two.allGatherBytes[k] == gathers * bsh);
        CHECK(three.reduceScatterBytes[k] - two.reduceScatterBytes[k] == scatters * bsh);
      }
    }
  }
}

TEST_CASE("sequence parallelism needs the sequence to divide by the split width") {
  epl::Session session;
  epl::PlanOptions options;
  options.np = 2;
  auto m = epl::planText("split.epl", R"(
model net(x: f32[B, 7, 16]) {
  split(2) {
    h = x + mlp(layer_norm(x), 32)
    loss = mse(layer_norm(h), x)
  }
  return loss
}
policy { sequence_parallel = true }
train net { data = synthetic(samples = 64) batch = 8 }
)",
                         session, options);
  REQUIRE(session.diags.hasErrors());
  CHECK(session.diags.all()[0].message ==
        "sequence length (7) must be divisible by split width (2) with `sequence_parallel = true`");
}
