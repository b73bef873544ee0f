// The recompute pass: which forward ops run again before which backward ops, what the
// backward then reads, and what that does to a rank's activation memory.
#include "Planned.h"
#include "lib/Epl.h"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <set>

namespace {

using epl::ir::Phase;

// Two blocks of a small decoder, each an attention and an mlp block (nested defs), and a
// head outside them; `recompute` as given.
std::optional<epl::ir::Module> plannedRecompute(const std::string& recompute, int np = 1) {
  std::string text = fmt::format(R"(
def attn(x: f32[B, T, D]) -> f32[B, T, D] {{
  return x + dropout(attention(layer_norm(x), 2), 0.1)
}}
def ff(x: f32[B, T, D]) -> f32[B, T, D] {{
  return x + mlp(layer_norm(x), 4 * D)
}}
def block(x: f32[B, T, D]) -> f32[B, T, D] {{
  return ff(attn(x))
}}
model net(x: f32[B, 8, 16]) {{
  h = repeat(2) block(x)
  return mse(linear(h, 16), x)
}}
policy {{ micro_batches = 2 recompute = {} }}
train net {{ data = synthetic(samples = 64) batch = 8 }}
)",
                                 recompute);
  return epl::testing::planned("recompute.epl", text, np);
}

// The ops of phase `p` whose name starts with `prefix`.
std::vector<const epl::ir::Op*> opsOf(const epl::ir::Module& m, Phase p,
                                      const std::string& prefix) {
  std::vector<const epl::ir::Op*> out;
  for (const epl::ir::Op& op : m.ops)
    if (op.phase == p && op.name.rfind(prefix, 0) == 0) out.push_back(&op);
  return out;
}

} // namespace

TEST_CASE("recompute = every runs each block's forward again before its backward") {
  auto none = plannedRecompute("none"), every = plannedRecompute("every");
  REQUIRE(none);
  REQUIRE(every);
  CHECK(opsOf(*none, Phase::Recompute, "").empty());
  for (const char* block : {"block.0/", "block.1/"}) {
    auto again = opsOf(*every, Phase::Recompute, block);
    // Everything but the last residual add, whose output no backward op of the block reads.
    CHECK(again.size() == opsOf(*every, Phase::Forward, block).size() - 1);
    for (const epl::ir::Op* op : again) {
      CHECK(every->ops[op->forward].phase == Phase::Forward);
      CHECK(every->ops[op->forward].kind == op->kind);
    }
    // The block's backward ops read no tensor the block's forward made: they read the
    // recomputed copies, the block's input, parameters and gradients.
    std::set<int> forwardOps;
    for (size_t i = 0; i < every->ops.size(); ++i)
      if (every->ops[i].phase == Phase::Forward && every->ops[i].name.rfind(block, 0) == 0)
        forwardOps.insert(static_cast<int>(i));
    for (const epl::ir::Op* op : opsOf(*every, Phase::Backward, block))
      for (int t : op->inputs)
        if (t >= 0) CHECK_FALSE(forwardOps.count(every->tensors[t].producer));
  }
  // The recomputations run in each micro-batch's backward, before the block's backward
  // ops, and only in the training step.
  const epl::ir::Program& p = every->programs.at(0);
  int firstBackward = -1, recomputes = 0;
  for (size_t k = 0; k < p.step.size(); ++k) {
    const epl::ir::Instr& in = p.step[k];
    if (in.kind != epl::ir::InstrKind::Run || in.micro != 0) continue;
    Phase ph = every->ops[in.op].phase;
    if (ph == Phase::Backward && firstBackward < 0) firstBackward = static_cast<int>(k);
    if (ph == Phase::Recompute) {
      ++recomputes;
      CHECK(firstBackward >= 0);
    }
  }
  CHECK(recomputes == static_cast<int>(opsOf(*every, Phase::Recompute, "").size()));
  for (const epl::ir::Instr& in : p.eval)
    if (in.kind == epl::ir::InstrKind::Run) CHECK(every->ops[in.op].phase == Phase::Forward);
  // The activations at peak: a block's input instead of all it makes.
  CHECK(every->programs[0].activationBytes() < none->programs[0].activationBytes());
}

TEST_CASE("recompute lists defs: each call of one, at any depth") {
  auto ff = plannedRecompute("[ff]");
  REQUIRE(ff);
  CHECK_FALSE(opsOf(*ff, Phase::Recompute, "block.0/ff/").empty());
  CHECK_FALSE(opsOf(*ff, Phase::Recompute, "block.1/ff/").empty());
  CHECK(opsOf(*ff, Phase::Recompute, "block.0/attn/").empty());
  // A listed def inside a listed def is part of the outer one's block.
  auto both = plannedRecompute("[block, ff]");
  REQUIRE(both);
  CHECK(opsOf(*both, Phase::Recompute, "block.0/").size() ==
        opsOf(*plannedRecompute("every"), Phase::Recompute, "block.0/").size());
}

TEST_CASE("recompute = auto recomputes the fewest blocks that fit device_memory") {
  auto peak = [](const epl::ir::Module& m) {
    int64_t most = 0;
    for (const epl::ir::Program& p : m.programs)
      most = std::max(most, p.peakBytes());
    return most;
  };
  auto none = plannedRecompute("none"), every = plannedRecompute("every");
  REQUIRE(none);
  REQUIRE(every);
  int64_t keep = peak(*none), all = peak(*every);
  REQUIRE(all < keep);
  // No budget: nothing to fit, nothing recomputed.
  auto free = plannedRecompute("auto");
  REQUIRE(free);
  CHECK(free->autoRecompute.ran);
  CHECK(free->autoRecompute.chosen == 0);
  CHECK(opsOf(*free, Phase::Recompute, "").empty());
  // A budget every plan fits: nothing.
  auto roomy = plannedRecompute(fmt::format("auto device_memory = {}KB", keep / 1000 + 1));
  REQUIRE(roomy);
  CHECK(roomy->autoRecompute.chosen == 0);
  CHECK(peak(*roomy) == keep);
  // Between the two: one of the two blocks fits, with the plan it predicted.
  auto tight = plannedRecompute(fmt::format("auto device_memory = {}KB", (keep + all) / 2000));
  REQUIRE(tight);
  const epl::ir::Module::AutoRecompute& a = tight->autoRecompute;
  CHECK(a.blocks == 2);
  CHECK(a.chosen == 1);
  CHECK(a.peakWithout == keep);
  CHECK(a.peakWith == peak(*tight));
  CHECK(peak(*tight) <= a.budget);
  // Not below every block recomputed (here equal: the backward's kernel workspaces, which
  // recompute leaves alone, set the peak of both).
  CHECK(peak(*tight) >= all);
  // Less than even every block recomputed needs: all of them, as close as it gets.
  auto small = plannedRecompute(fmt::format("auto device_memory = {}KB", all / 1000 - 1));
  REQUIRE(small);
  CHECK(small->autoRecompute.chosen == 2);
  CHECK(peak(*small) == all);
}

// A pipeline stage holds a slot per micro-batch in flight for what lives from its forward
// to its backward, and one region, shared by the micro-batches in turn, for what lives
// inside one forward or one backward. Recomputing a stage of one block then leaves only
// the block's input in the slots.
TEST_CASE("recompute shrinks the slots of one-block pipeline stages") {
  auto pipeline = [](const std::string& recompute) {
    std::string text = fmt::format(R"(
def ff(x: f32[B, T, D]) -> f32[B, T, D] {{
  return x + mlp(layer_norm(x), 4 * D)
}}
model net(x: f32[B, 8, 16]) {{
  replicate {{ h = ff(x) }}
  replicate {{ h = ff(h) }}
  return mse(linear(h, 16), x)
}}
policy {{ micro_batches = 4 schedule = 1f1b recompute = {} }}
train net {{ data = synthetic(samples = 64) batch = 8 }}
)",
                                   recompute);
    return epl::testing::planned("pipeline.epl", text, 2);
  };
  auto none = pipeline("none"), every = pipeline("every");
  REQUIRE(none);
  REQUIRE(every);
  const epl::ir::Program &a = none->programs.at(0), &b = every->programs.at(0);
  REQUIRE(a.slots == 2);
  REQUIRE(b.slots == 2);
  CHECK(b.sharedBytes > 0);
  CHECK(b.slotStride() * 3 <= a.slotStride()); // the mlp's hidden layer (4 D) is recomputed
  CHECK(b.activationBytes() < a.activationBytes());
  // What is sent to the next stage keeps its slot: the send may still be in flight.
  for (const epl::ir::Instr& in : b.step)
    if (in.kind == epl::ir::InstrKind::Send) CHECK_FALSE(b.isShared(in.tensor));
}

namespace {

// Three stages of 2, 1 and 3 blocks, with `policy` (its keys on one line) and `train`.
std::string threeStages(const std::string& policy, const std::string& train) {
  return fmt::format(R"(
def ff(x: f32[B, T, D]) -> f32[B, T, D] {{
  return x + mlp(layer_norm(x), 4 * D)
}}
model net(x: f32[B, 64, 16]) {{
  replicate {{ h = repeat(2) ff(x) }}
  replicate {{ h = ff(h) }}
  replicate {{ h = repeat(3) ff(h) }}
  return mse(linear(h, 16), x)
}}
policy {{ {} }}
train net {{ data = synthetic(samples = 64) batch = 32 {} }}
)",
                     policy, train);
}

} // namespace

// `recompute = auto` chooses each stage's blocks between none and all of them, so where
// some stage fits the budget neither with `none` nor with `every`, the auto plan does not
// fit either: what `epl plan --search` relies on to leave such autos out.
TEST_CASE("recompute = auto does not fit where a stage fits with neither none nor every") {
  auto plan = [](int micros, const char* schedule, const std::string& recompute) {
    std::string text = threeStages(
        fmt::format("micro_batches = {} schedule = {} recompute = {}", micros, schedule, recompute),
        "");
    epl::PlanOptions options;
    options.np = 3;
    options.costOnly = true;
    return epl::testing::planned("stages.epl", text, options);
  };
  auto stagePeaks = [](const epl::ir::Module& m) {
    std::vector<int64_t> out(3, 0);
    for (const epl::ir::Program& p : m.programs)
      out.at(p.stage) = std::max(out.at(p.stage), p.peakBytes());
    return out;
  };
  int neither = 0, open = 0;
  for (int micros : {2, 4, 8})
    for (const char* schedule : {"gpipe", "1f1b"}) {
      auto none = plan(micros, schedule, "none"), every = plan(micros, schedule, "every");
      REQUIRE(none);
      REQUIRE(every);
      std::vector<int64_t> a = stagePeaks(*none), b = stagePeaks(*every);
      // Budgets just under and over each stage's peaks, in device_memory's KB, above the
      // model states (a plan whose states do not fit is an error).
      int64_t states = 0;
      for (const epl::ir::Program& p : none->programs)
        states = std::max(states, p.paramBytes + p.gradBytes + p.optimizerBytes);
      std::set<int64_t> budgets;
      for (const std::vector<int64_t>* peaks : {&a, &b})
        for (int64_t v : *peaks)
          for (int64_t kb : {v / 1000 - 1, v / 1000 + 1})
            if (kb * 1000 > states) budgets.insert(kb);
      for (int64_t kb : budgets) {
        int64_t budget = kb * 1000;
        bool stuck = false;
        for (size_t s = 0; s < a.size(); ++s)
          stuck |= a[s] > budget && b[s] > budget;
        auto chosen = plan(micros, schedule, fmt::format("auto device_memory = {}KB", kb));
        REQUIRE(chosen);
        std::vector<int64_t> c = stagePeaks(*chosen);
        int64_t peak = *std::max_element(c.begin(), c.end());
        INFO("micro_batches " << micros << ", " << schedule << ", budget " << budget);
        if (stuck) {
          CHECK(peak > budget);
          ++neither;
        } else {
          ++open;
        }
      }
    }
  CHECK(neither > 0);
  CHECK(open > 0);
}

// A cost-only plan's auto plans only the pipeline positions whose peak its bisection still
// needs (each position's peak depends on its own blocks alone): it chooses what the plan of
// every rank chooses, with the same peaks.
TEST_CASE("recompute = auto in a cost-only plan chooses what the plan of every rank does") {
  auto plan = [](const char* schedule, const char* zero, const std::string& recompute,
                 bool costOnly) {
    std::string text =
        threeStages(fmt::format("micro_batches = 4 schedule = {} zero = {} recompute = {}",
                                schedule, zero, recompute),
                    "optimizer = adam(lr = 0.001)");
    epl::PlanOptions options;
    options.np = 6;
    options.costOnly = costOnly;
    return epl::testing::planned("stages.epl", text, options);
  };
  int chose = 0;
  for (const char* schedule : {"gpipe", "1f1b"})
    for (const char* zero : {"0", "1"}) {
      auto none = plan(schedule, zero, "none", true), every = plan(schedule, zero, "every", true);
      REQUIRE(none);
      REQUIRE(every);
      int64_t low = 0, high = 0;
      for (const epl::ir::Program& p : every->programs)
        low = std::max(low, p.peakBytes());
      for (const epl::ir::Program& p : none->programs)
        high = std::max(high, p.peakBytes());
      for (int step = 1; step < 8; ++step) {
        int64_t kb = (low + (high - low) * step / 8) / 1000;
        INFO(schedule << ", zero " << zero << ", budget " << kb << " KB");
        std::string recompute = fmt::format("auto device_memory = {}KB", kb);
        auto cheap = plan(schedule, zero, recompute, true),
             whole = plan(schedule, zero, recompute, false);
        REQUIRE(cheap);
        REQUIRE(whole);
        const epl::ir::Module::AutoRecompute &a = cheap->autoRecompute, &b = whole->autoRecompute;
        CHECK(a.chosen == b.chosen);
        CHECK(a.names == b.names);
        CHECK(a.peakWith == b.peakWith);
        CHECK(a.peakWithout == b.peakWithout);
        for (const epl::ir::Program& p : cheap->programs)
          CHECK(p.peakBytes() == whole->firstProgramOf(p.stage)->peakBytes());
        chose += a.chosen > 0 && a.chosen < 6;
      }
    }
  CHECK(chose > 0);
}

// Under `interleaved`, a pipeline rank holds several stages (chunks), and its memory plan
// depends on the blocks recomputed in all of them: `recompute = auto` chooses among every
// chunk's blocks, so wherever recomputing every block fits the budget, its plan fits too,
// and some budgets take blocks of the second chunks (stages 2 and 3).
TEST_CASE("recompute = auto under interleaved chooses among every chunk's blocks") {
  auto plan = [](const std::string& recompute) {
    std::string text = fmt::format(R"(
def ff(x: f32[B, T, D]) -> f32[B, T, D] {{
  return x + mlp(layer_norm(x), 4 * D)
}}
model net(x: f32[B, 64, 16]) {{
  replicate {{ h = repeat(2) ff(x) }}
  replicate {{ h = repeat(2) ff(h) }}
  replicate {{ h = repeat(2) ff(h) }}
  replicate {{ h = repeat(2) ff(h) }}
  return mse(linear(h, 16), x)
}}
policy {{ micro_batches = 4 schedule = interleaved chunks = 2 recompute = {} }}
train net {{ data = synthetic(samples = 64) batch = 32 }}
)",
                                   recompute);
    epl::PlanOptions options;
    options.np = 2;
    return epl::testing::planned("interleaved.epl", text, options);
  };
  auto peak = [](const epl::ir::Module& m) {
    int64_t most = 0;
    for (const epl::ir::Program& p : m.programs)
      most = std::max(most, p.peakBytes());
    return most;
  };
  auto none = plan("none"), every = plan("every");
  REQUIRE(none);
  REQUIRE(every);
  REQUIRE(none->mesh.depth() == 2);
  REQUIRE(none->mesh.stages.size() == 4);
  int64_t low = peak(*every), high = peak(*none);
  REQUIRE(low < high);
  int secondChunks = 0;
  for (int step = 0; step < 8; ++step) {
    int64_t kb = (low + (high - low) * step / 8) / 1000 + 1;
    INFO("budget " << kb << " KB");
    auto chosen = plan(fmt::format("auto device_memory = {}KB", kb));
    REQUIRE(chosen);
    CHECK(peak(*chosen) <= kb * 1000);
    CHECK(chosen->autoRecompute.peakWith == peak(*chosen));
    for (const std::string& name : chosen->autoRecompute.names)
      for (const epl::ir::Op& op : chosen->ops)
        if (op.name.rfind(name + "/", 0) == 0 && op.stage >= 2) {
          ++secondChunks;
          break;
        }
  }
  CHECK(secondChunks > 0);
}
