// The rank programs of pipelines of one-device stages: what each stage runs, sends and
// receives, its slots, and that every rank's communication fits together (the schedule
// pass asserts it; these tests show it for gpipe and 1f1b, 2 to 4 stages, 1 to 8
// micro-batches, and that the check would catch a wrong tag).
#include "passes/PipelinePrograms.h"
#include "driver/Epl.h"
#include "ir/StreamCheck.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <fmt/format.h>

namespace {

// A linear layer per stage; the last stage also holds the loss.
std::optional<epl::ir::Module> plan(int stages, int micros, const char* schedule) {
  std::string blocks = "  replicate { h = relu(linear(x, 16)) }\n";
  for (int s = 1; s + 1 < stages; ++s)
    blocks += "  replicate { h = relu(linear(h, 16)) }\n";
  std::string text = fmt::format(R"(
model net(x: f32[B, 16], y: i32[B]) {{
{}  replicate {{ loss = cross_entropy(linear(h, 4), y) }}
  return loss
}}
policy {{ micro_batches = {} schedule = {} }}
train net {{
  data = synthetic(samples = 64)
  batch = {}
  clip_grad_norm = 1.0
}}
)",
                                 blocks, micros, schedule, 2 * micros);
  epl::Session session;
  epl::PlanOptions options;
  options.np = stages;
  auto m = epl::planText("pipe.epl", text, session, options);
  for (const auto& d : session.diags.all())
    FAIL(d.message);
  return m;
}

int count(const std::vector<epl::ir::Instr>& list, epl::ir::InstrKind kind) {
  return static_cast<int>(std::count_if(list.begin(), list.end(),
                                        [&](const epl::ir::Instr& in) { return in.kind == kind; }));
}

} // namespace

using epl::ir::InstrKind;

TEST_CASE("pipeline programs fit together for gpipe and 1f1b") {
  for (const char* schedule : {"gpipe", "1f1b"})
    for (int p : {2, 3, 4})
      for (int micros : {1, 2, 4, 8}) {
        INFO(schedule << ", " << p << " stages, " << micros << " micro-batches");
        auto m = plan(p, micros, schedule);
        REQUIRE(m);
        REQUIRE(static_cast<int>(m->programs.size()) == p);
        for (bool eval : {false, true}) {
          auto error = epl::ir::checkStreams(epl::passes::programStreams(*m, eval));
          CHECK_FALSE(error);
          if (error) FAIL(error->str());
        }
        for (int s = 0; s < p; ++s) {
          const epl::ir::Program& prog = m->programs[s];
          bool first = s == 0, last = s == p - 1;
          CHECK(prog.stage == s);
          CHECK(prog.lossRank == p - 1);
          // Per micro-batch: an activation in and a gradient out, unless first; the
          // mirror image unless last.
          CHECK(count(prog.step, InstrKind::Recv) == micros * ((first ? 0 : 1) + (last ? 0 : 1)));
          CHECK(count(prog.step, InstrKind::Send) == count(prog.step, InstrKind::Recv));
          CHECK(count(prog.step, InstrKind::Load) == micros);
          CHECK(count(prog.step, InstrKind::SeedGrad) == (last ? micros : 0));
          CHECK(count(prog.step, InstrKind::ZeroGrads) == 1);
          CHECK(count(prog.eval, InstrKind::Recv) == (first ? 0 : 1));
          CHECK(count(prog.eval, InstrKind::Send) == (last ? 0 : 1));
          // One linear a stage: weight and bias, updated by this stage alone.
          CHECK(prog.params.size() == 2);
          int expectSlots = std::string(schedule) == "gpipe" ? micros : std::min(micros, p - s);
          CHECK(prog.slots == expectSlots);
          CHECK(prog.offset.size() == m->tensors.size());
        }
      }
}

TEST_CASE("backward send/recv ops move gradients back to the stage that sent") {
  auto m = plan(2, 2, "1f1b");
  REQUIRE(m);
  int forward = 0, backward = 0;
  for (const epl::ir::Op& op : m->ops) {
    if (op.kind != epl::ir::OpKind::SendRecv) continue;
    int64_t from = epl::ir::intAttr(op.attrs, "from_stage"),
            to = epl::ir::intAttr(op.attrs, "to_stage");
    if (op.phase == epl::ir::Phase::Forward) {
      ++forward;
      CHECK(from == 0);
      CHECK(to == 1);
    } else {
      ++backward;
      CHECK(from == 1);
      CHECK(to == 0);
      CHECK(op.stage == 0);
      REQUIRE(op.accumulate.size() == 1);
      CHECK_FALSE(op.accumulate[0]); // the relu's output is read by the send alone
    }
  }
  CHECK(forward == 1);
  CHECK(backward == 1);
}

TEST_CASE("the check catches a receive with another micro-batch's tag") {
  auto m = plan(3, 4, "1f1b");
  REQUIRE(m);
  for (epl::ir::Instr& in : m->programs[1].step)
    if (in.kind == InstrKind::Recv && in.micro == 0) {
      in.tag += 1; // micro-batch 1's activation
      break;
    }
  auto error = epl::ir::checkStreams(epl::passes::programStreams(*m, false));
  REQUIRE(error);
  CHECK(error->str().find("rank 1") != std::string::npos);
}
