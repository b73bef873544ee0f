// The rank programs of pipelines: what each stage runs, sends and receives, its slots,
// and that every rank's communication fits together (the schedule pass asserts it; these
// tests show it for gpipe, 1f1b and zb, 2 to 4 stages, 1 to 8 micro-batches, stage groups
// of several devices, data-parallel copies of them, and that the check would catch a
// wrong tag, a wrong share of a re-cut micro-batch or a missing gradient reduction).
#include "passes/PipelinePrograms.h"
#include "Planned.h"
#include "ir/Printer.h"
#include "ir/StreamCheck.h"
#include "lib/Epl.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <set>
#include <sstream>

namespace {

// A linear layer per stage; the last stage also holds the loss.
// `copies` data-parallel copies of the pipeline: -np stages x copies.
std::optional<epl::ir::Module> planPipeline(int stages, int micros, const char* schedule,
                                            int copies = 1, int chunks = 1) {
  std::string blocks = "  replicate { h = relu(linear(x, 16)) }\n";
  for (int s = 1; s + 1 < stages; ++s)
    blocks += "  replicate { h = relu(linear(h, 16)) }\n";
  std::string text = fmt::format(R"(
model net(x: f32[B, 16], y: i32[B]) {{
{}  replicate {{ loss = cross_entropy(linear(h, 4), y) }}
  return loss
}}
policy {{ micro_batches = {} schedule = {} chunks = {} }}
train net {{
  data = synthetic(samples = 64)
  batch = {}
  clip_grad_norm = 1.0
}}
)",
                                 blocks, micros, schedule, chunks, 2 * micros * copies);
  return epl::testing::planned("pipe.epl", text, stages / chunks * copies);
}

// Stages of the given group sizes, a linear layer each (the last one also the loss), with
// micro-batches of `micro` samples per replica.
std::optional<epl::ir::Module> planGroups(const std::vector<int>& groups, int micros, int micro,
                                          const char* schedule, int copies) {
  std::string blocks;
  int devices = 0;
  for (size_t s = 0; s < groups.size(); ++s) {
    devices += groups[s];
    bool last = s + 1 == groups.size();
    blocks += fmt::format("  replicate({}) {{ {} }}\n", groups[s],
                          s == 0 ? "h = relu(linear(x, 16))"
                          : last ? "loss = cross_entropy(linear(h, 4), y)"
                                 : "h = relu(linear(h, 16))");
  }
  std::string text = fmt::format(R"(
model net(x: f32[B, 16], y: i32[B]) {{
{}  return loss
}}
policy {{ micro_batches = {} schedule = {} }}
train net {{
  data = synthetic(samples = 64)
  batch = {}
  clip_grad_norm = 1.0
}}
)",
                                 blocks, micros, schedule, micro * micros * copies);
  return epl::testing::planned("groups.epl", text, devices * copies);
}

// Every rank's step and evaluation communication fits together (ir/StreamCheck.h).
void checkStreamsFit(const epl::ir::Module& m) {
  for (bool eval : {false, true}) {
    auto error = epl::ir::checkStreams(epl::passes::programStreams(m, eval));
    CHECK_FALSE(error);
    if (error) FAIL(error->str());
  }
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
        auto m = planPipeline(p, micros, schedule);
        REQUIRE(m);
        REQUIRE(static_cast<int>(m->programs.size()) == p);
        checkStreamsFit(*m);
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

// The Runs of backward ops that write `part` of their gradients.
int runs(const epl::ir::Module& m, const std::vector<epl::ir::Instr>& list,
         epl::ir::BackwardPart part) {
  return static_cast<int>(std::count_if(list.begin(), list.end(), [&](const epl::ir::Instr& in) {
    return in.kind == InstrKind::Run && m.ops[in.op].phase == epl::ir::Phase::Backward &&
           in.part == part;
  }));
}

// Where the first instruction of micro-batch `micro` that matches `pred` sits in the step.
template <class Pred> long firstOf(const std::vector<epl::ir::Instr>& list, int micro, Pred pred) {
  auto it = std::find_if(list.begin(), list.end(),
                         [&](const epl::ir::Instr& in) { return in.micro == micro && pred(in); });
  return it == list.end() ? -1 : static_cast<long>(it - list.begin());
}

TEST_CASE("zb programs split every backward into B and W, and fit together") {
  using epl::ir::BackwardPart;
  for (int p : {2, 3, 4})
    for (int micros : {1, 2, 4, 8}) {
      INFO(p << " stages, " << micros << " micro-batches");
      auto m = planPipeline(p, micros, "zb");
      REQUIRE(m);
      checkStreamsFit(*m);
      for (int s = 0; s < p; ++s) {
        const epl::ir::Program& prog = m->programs[s];
        bool first = s == 0, last = s == p - 1;
        CHECK(runs(*m, prog.step, BackwardPart::Whole) == 0);
        // B: the relu, and the linear's input gradient unless its input is the model's;
        // the last stage: the loss and the linear. W: the one linear's weight and bias.
        CHECK(runs(*m, prog.step, BackwardPart::Inputs) == micros * (first ? 1 : 2));
        CHECK(runs(*m, prog.step, BackwardPart::Params) == micros);
        CHECK(count(prog.step, InstrKind::Send) == count(prog.step, InstrKind::Recv));
        CHECK(count(prog.step, InstrKind::Recv) == micros * ((first ? 0 : 1) + (last ? 0 : 1)));
        // Activations stay until W: at most p micro-batches between F and W (1F1B: p - s
        // between F and B).
        CHECK(prog.slots == std::min(micros, p));
        for (int i = 0; i < micros; ++i) {
          auto isW = [&](const epl::ir::Instr& in) {
            return in.kind == InstrKind::Run && in.part == BackwardPart::Params;
          };
          auto isB = [&](const epl::ir::Instr& in) {
            return in.kind == InstrKind::Run && in.part == BackwardPart::Inputs;
          };
          auto sendsGrad = [&](const epl::ir::Instr& in) {
            return in.kind == InstrKind::Send && m->ops[in.op].phase == epl::ir::Phase::Backward;
          };
          long b = firstOf(prog.step, i, isB), w = firstOf(prog.step, i, isW);
          REQUIRE(b >= 0);
          CHECK(b < w);
          // The gradient leaves with B, before W (that is the point of zb).
          if (!first) CHECK(firstOf(prog.step, i, sendsGrad) < w);
          // W adds micro-batches in increasing order, as 1f1b's whole backward does.
          if (i > 0) CHECK(firstOf(prog.step, i - 1, isW) < w);
        }
      }
    }
}

TEST_CASE("zb holds activations until W: p slots on every stage, where 1f1b has p - s") {
  auto zb = planPipeline(4, 8, "zb"), oneF = planPipeline(4, 8, "1f1b");
  REQUIRE(zb);
  REQUIRE(oneF);
  for (int s = 0; s < 4; ++s) {
    CHECK(zb->programs[s].slots == 4);
    CHECK(oneF->programs[s].slots == 4 - s);
  }
  std::ostringstream out;
  epl::ir::printProgram(*zb, 1, out);
  CHECK(out.str().find("linear.backward-inputs") != std::string::npos);
  CHECK(out.str().find("linear.backward-params") != std::string::npos);
}

TEST_CASE("a step's receives share a ring of buffers: as many micro-batches' as the slots, "
          "and one more") {
  // A middle stage receives an activation and a gradient a micro-batch (micro-batches of 2
  // samples of 16 f32: 128 bytes each); 1f1b keeps
  // 4 - s of them in flight, so its ring is 2 x (4 - s + 1) receives, whatever the count of
  // micro-batches; gpipe keeps every micro-batch, so every receive has a buffer.
  for (int micros : {8, 16, 64}) {
    INFO(micros << " micro-batches");
    auto oneF = planPipeline(4, micros, "1f1b"), gpipe = planPipeline(4, micros, "gpipe");
    REQUIRE(oneF);
    REQUIRE(gpipe);
    for (int s = 1; s < 3; ++s) {
      const epl::ir::Program& p = oneF->programs[s];
      CHECK(p.recvRing == 2 * (4 - s + 1));
      epl::ir::Module::ReceivePlan ring = oneF->receivePlan(p, p.step, p.recvRing);
      CHECK(ring.bytes == 128 * 2 * (4 - s + 1));
      int late = 0;
      for (size_t i = 0; i < p.step.size(); ++i)
        late += ring.postedAfter[i] >= 0;
      CHECK(late == 2 * micros - p.recvRing);
      const epl::ir::Program& g = gpipe->programs[s];
      CHECK(g.recvRing == 2 * micros);
      CHECK(gpipe->receivePlan(g, g.step, g.recvRing).bytes == 128 * 2 * micros);
    }
  }
}

TEST_CASE("backward send/recv ops move gradients back to the stage that sent") {
  auto m = planPipeline(2, 2, "1f1b");
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
  auto m = planPipeline(3, 4, "1f1b");
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

TEST_CASE("copies of a pipeline: each replica's own transfers, each stage's buckets summed over "
          "its replicas") {
  for (const char* schedule : {"gpipe", "1f1b"})
    for (auto [p, copies] : {std::pair{2, 2}, std::pair{2, 3}, std::pair{4, 2}})
      for (int micros : {1, 4}) {
        INFO(schedule << ", " << p << " stages x " << copies << " copies, " << micros
                      << " micro-batches");
        auto m = planPipeline(p, micros, schedule, copies);
        REQUIRE(m);
        REQUIRE(static_cast<int>(m->programs.size()) == p * copies);
        CHECK(m->reduceRanks == copies);
        checkStreamsFit(*m);
        for (int rank = 0; rank < p * copies; ++rank) {
          const epl::ir::Program& prog = m->programs[rank];
          int replica = rank / p, stage = rank % p;
          CHECK(prog.stage == stage);
          CHECK(prog.dataRank == replica);
          CHECK(prog.lossRank == replica * p + p - 1);
          for (const epl::ir::Instr& in : prog.step)
            if (in.kind == InstrKind::Send || in.kind == InstrKind::Recv)
              CHECK(in.peer / p == replica);
          int buckets = 0;
          for (const epl::ir::GradBucket& b : m->buckets)
            buckets += b.stage == stage;
          CHECK(buckets >= 1);
          CHECK(count(prog.step, InstrKind::ReduceStart) == buckets);
          CHECK(count(prog.step, InstrKind::ReduceWait) == buckets);
          // Started in the last micro-batch; all waited before the first optimizer op.
          bool optimizer = false;
          for (const epl::ir::Instr& in : prog.step) {
            if (in.kind == InstrKind::ReduceStart) CHECK(in.micro == micros - 1);
            if (in.kind == InstrKind::ReduceWait) CHECK_FALSE(optimizer);
            if (in.kind == InstrKind::Run && m->ops[in.op].phase == epl::ir::Phase::Optimizer)
              optimizer = true;
          }
        }
      }
}

TEST_CASE("the check catches a replica that leaves out a gradient reduction") {
  auto m = planPipeline(2, 4, "1f1b", 2);
  REQUIRE(m);
  auto& step = m->programs[3].step;
  int bucket = -1;
  for (auto it = step.begin(); it != step.end();)
    if ((it->kind == InstrKind::ReduceStart || it->kind == InstrKind::ReduceWait) &&
        (bucket < 0 || it->bucket == bucket)) {
      bucket = it->bucket;
      it = step.erase(it);
    } else {
      ++it;
    }
  auto error = epl::ir::checkStreams(epl::passes::programStreams(*m, false));
  REQUIRE(error);
  CHECK(error->str().find("rank 1") != std::string::npos);
}

TEST_CASE("replicas run replica 0's programs on their own ranks, and replica 0's streams check "
          "them") {
  auto same = [](const epl::ir::Instr& a, const epl::ir::Instr& b, int shift) {
    return a.kind == b.kind && a.op == b.op && a.micro == b.micro && a.bucket == b.bucket &&
           a.tensor == b.tensor && a.tag == b.tag && a.accumulate == b.accumulate &&
           a.firstRow == b.firstRow && a.rows == b.rows && a.part == b.part && a.use == b.use &&
           (a.peer < 0 ? b.peer == a.peer : b.peer == a.peer + shift);
  };
  std::vector<std::optional<epl::ir::Module>> plans;
  plans.push_back(planPipeline(2, 4, "1f1b", 3));
  plans.push_back(planPipeline(4, 4, "zb", 2));
  plans.push_back(planGroups({1, 2, 4}, 2, 4, "1f1b", 2));
  for (auto& m : plans) {
    REQUIRE(m);
    int size = m->mesh.replicaSize;
    REQUIRE(m->mesh.dataParallel >= 2);
    for (const epl::ir::Program& p : m->programs) {
      const epl::ir::Program& first = m->programs[p.rank % size];
      int shift = p.replica * size;
      CHECK(p.rank == first.rank + shift);
      CHECK(p.lossRank == first.lossRank + shift);
      REQUIRE(p.step.size() == first.step.size());
      REQUIRE(p.eval.size() == first.eval.size());
      for (size_t i = 0; i < p.step.size(); ++i)
        CHECK(same(first.step[i], p.step[i], shift));
      for (size_t i = 0; i < p.eval.size(); ++i)
        CHECK(same(first.eval[i], p.eval[i], shift));
    }
    for (bool eval : {false, true}) {
      epl::ir::CommStreams one = epl::passes::programStreams(*m, eval, true);
      for (size_t r = size; r < one.ranks.size(); ++r)
        CHECK(one.ranks[r].empty());
      for (const std::vector<int>& group : one.groups)
        for (int member : group)
          CHECK(member < size);
      auto error = epl::ir::checkStreams(one);
      CHECK_FALSE(error);
    }
  }
  // A mistake in replica 0 is still caught.
  auto& m = plans[0];
  for (epl::ir::Instr& in : m->programs[1].step)
    if (in.kind == InstrKind::Recv && in.micro == 0) {
      in.tag += 1;
      break;
    }
  auto error = epl::ir::checkStreams(epl::passes::programStreams(*m, false, true));
  REQUIRE(error);
  CHECK(error->str().find("rank 1") != std::string::npos);
}

TEST_CASE("stage groups: each rank runs its share of every micro-batch, re-cut between groups "
          "of different sizes") {
  for (const char* schedule : {"gpipe", "1f1b", "zb"})
    for (int copies : {1, 2}) {
      std::vector<int> groups{1, 2, 4};
      INFO(schedule << ", groups 1 + 2 + 4, " << copies << " copies");
      auto m = planGroups(groups, 2, 4, schedule, copies);
      REQUIRE(m);
      REQUIRE(m->programs.size() == 7u * copies);
      checkStreamsFit(*m);
      for (const epl::ir::Program& prog : m->programs) {
        int g = groups[prog.stage];
        CHECK(prog.localBatch == 4 / g);
        CHECK(prog.dataRanks == copies * g);
        CHECK(prog.dataRank == prog.replica * g + prog.local);
        // The forward sends of one micro-batch cover this rank's share once, in order.
        int64_t next = 0;
        for (const epl::ir::Instr& in : prog.step)
          if (in.kind == InstrKind::Send && in.micro == 0 &&
              m->ops[in.op].phase == epl::ir::Phase::Forward) {
            CHECK(in.firstRow == next);
            next += in.rows;
            CHECK(in.peer / 7 == prog.replica);
          }
        if (prog.stage + 1 < 3) CHECK(next == prog.localBatch);
        // Every stage has several ranks in all but stage 0 of one copy, which sums nothing.
        int buckets = count(prog.step, InstrKind::ReduceStart);
        CHECK((buckets == 0) == (copies * g == 1));
      }
      for (const epl::ir::GradBucket& b : m->buckets)
        CHECK(b.ranks == copies * groups[b.stage]);
    }
}

TEST_CASE("the check catches a rank that sends another share of a re-cut micro-batch") {
  auto m = planGroups({1, 2}, 2, 4, "1f1b", 1);
  REQUIRE(m);
  for (epl::ir::Instr& in : m->programs[0].step)
    if (in.kind == InstrKind::Send && in.rows == 2 && in.peer == 2) {
      in.rows = 1; // half the samples the receiver expects
      break;
    }
  auto error = epl::ir::checkStreams(epl::passes::programStreams(*m, false));
  REQUIRE(error);
  INFO(error->str());
  CHECK(error->str().find("rank 0") != std::string::npos);
}

TEST_CASE("interleaved chunks: each rank runs its stage blocks round-robin, one load per "
          "micro-batch, and the programs fit together") {
  for (auto [blocks, chunks] : {std::pair{4, 2}, std::pair{6, 3}, std::pair{6, 2}})
    for (int copies : {1, 2})
      for (int micros : {2, 4, 6}) {
        int depth = blocks / chunks;
        if (micros % depth != 0) continue;
        INFO(blocks << " blocks, " << chunks << " chunks, " << copies << " copies, " << micros
                    << " micro-batches");
        auto m = planPipeline(blocks, micros, "interleaved", copies, chunks);
        REQUIRE(m);
        REQUIRE(m->mesh.chunks == chunks);
        REQUIRE(static_cast<int>(m->programs.size()) == depth * copies);
        checkStreamsFit(*m);
        for (const epl::ir::Program& prog : m->programs) {
          CHECK(prog.stages == depth);
          for (const epl::ir::Instr& in : prog.step)
            if (in.kind == InstrKind::Run && m->ops[in.op].phase != epl::ir::Phase::Optimizer)
              CHECK(m->ops[in.op].stage % depth == prog.stage);
          CHECK(count(prog.step, InstrKind::Load) == micros);
          CHECK(count(prog.eval, InstrKind::Load) == 1);
          for (int q : prog.params)
            CHECK(m->ops[m->params[q].op].stage % depth == prog.stage);
          CHECK(prog.slots >= 1);
          CHECK(prog.slots <= micros);
        }
      }
}

namespace {

// Every instruction that writes a gradient of a bucket comes before the reduction of that
// bucket starts: in its micro-batch under ZeRO stage 2 (each reduce-scatters its own), in
// the step otherwise (the micro-batches add into one gradient, reduced once).
void checkReductionsFollowWrites(const epl::ir::Module& m) {
  for (const epl::ir::Program& p : m.programs) {
    INFO("rank " << p.rank);
    std::vector<int> bucketOf = m.paramBuckets(p), paramOfGrad(m.tensors.size(), -1);
    for (size_t q = 0; q < m.params.size(); ++q)
      if (m.params[q].grad >= 0) paramOfGrad[m.params[q].grad] = static_cast<int>(q);
    std::set<std::pair<int, int>> started; // (micro-batch or 0, bucket)
    int reductions = 0;
    for (const epl::ir::Instr& in : p.step) {
      int micro = m.zeroShardsGradients() ? in.micro : 0;
      if (in.kind == InstrKind::ReduceStart && !in.tie) {
        started.insert({micro, in.bucket});
        ++reductions;
      }
      if (in.kind != InstrKind::Run || m.ops[in.op].phase == epl::ir::Phase::Optimizer) continue;
      const epl::ir::Op& op = m.ops[in.op];
      for (size_t k = 0; k < op.outputs.size(); ++k) {
        int t = op.outputs[k];
        if (t < 0 || paramOfGrad[t] < 0 || !m.runWrites(in, k)) continue;
        int b = bucketOf[paramOfGrad[t]];
        INFO("gradient of " << m.params[paramOfGrad[t]].name << ", bucket " << b);
        CHECK_FALSE(started.count({micro, b}));
      }
    }
    CHECK(reductions > 0);
  }
}

} // namespace

TEST_CASE("a gradient bucket's reduction starts after every write of its gradients, zb's "
          "deferred parameter gradients too") {
  // Three stages of two ranks, the head tied to the embedding; the last stage's first op
  // has no parameters, so its input gradients end the backward before the W parts run.
  const char* text = R"(
model net(tokens: i32[B, 16]) {{
  replicate(2) {{ h = embedding(tokens, 256, 32) + positions(16, 32) }}
  replicate(2) {{ h = relu(linear(h, 32)) }}
  replicate(2) {{
    h = relu(h)
    loss = cross_entropy(linear(layer_norm(h), 256, bias = false, tie = embedding), next(tokens))
  }}
  return loss
}}
policy {{
  micro_batches = 4
  schedule = zb
  {}
}}
train net {{
  data = synthetic(samples = 64, classes = 256)
  batch = 48
}}
)";
  for (const char* policy :
       {"", "overlap_comm = false", "zero = 2", "zero = 2 overlap_comm = false"}) {
    INFO(policy);
    auto m = epl::testing::planned("zb.epl", fmt::format(text, policy), 6);
    REQUIRE(m);
    REQUIRE(m->programs.size() == 6);
    checkReductionsFollowWrites(*m);
  }
}
