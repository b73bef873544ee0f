// schedule: each rank's instruction stream for one training step and for evaluation.
//
// One device (-np 1), and every rank of a purely data-parallel plan, runs per step:
//   zero the parameter gradients;
//   for each micro-batch: load it, run the forward ops in program order, seed the loss
//   gradient, run the backward ops (autodiff emitted them in reverse order already);
//   in the last micro-batch, start each gradient bucket's reduction right after the
//   backward op that completes it (data-parallel pass);
//   wait for every bucket, in the order they started;
//   then the grad-norm op (when clipping) and the optimizer ops.
// With ZeRO stage 2 (Module::zeroShardsGradients) every micro-batch reduce-scatters its
// buckets into the ranks' gradient slices, placed as a pipeline's are
// (addGradientReductions): a bucket's reduction starts after the op that completes it and
// is waited for once the next bucket's has started, so its gradients live about two
// buckets long.
// Evaluation loads one batch and runs the forward ops alone.
// Each rank of a data-parallel plan runs on 1/np of each micro-batch.
// A stage with split regions runs the same way on each rank of its split group, the
// regions' communication ops among the forward and backward ops (Module::splitCollective).
// A pipeline gets one program per rank: its stage, its place in the stage's group and its
// data-parallel copy (passes/PipelinePrograms.cpp). What else runs with split regions is not
// built yet: such a plan has no programs and `epl run` says why (Module::runRefusal).
//
// Every plan with programs of several ranks then goes through the communication check
// (ir/StreamCheck.h): the programs are built to fit, so a problem is a compiler bug.
// A pipeline's replicas run replica 0's programs on their own ranks, so replica 0's streams
// are checked for them all, except under ZeRO-3 (passes/PipelinePrograms.h, programStreams).
// A pipeline's step posts its receives into a ring of buffers (Program::recvRing), each once
// the buffer's previous receive is read, unless the check finds that this stalls the ranks:
// then each receive has a buffer of its own, all posted at the start.
// A plan for costing only (PassContext::costOnly, Module::costOnly) gets the program of
// each stage's first rank in the first replica and no check: the search (docs/cluster.md)
// predicts thousands of devices' plans from them. With PassContext::overMemory it plans
// each program's memory as it makes it (the memory-plan pass's work) and stops at the first
// that does not fit its devices (Module::stoppedOver): a plan that does not fit is out of
// the search whatever its other stages hold. With PassContext::positions it makes only
// those positions' programs (recompute = auto's trials), their memory planned likewise.
#include "passes/Passes.h"
#include "passes/PipelinePrograms.h"

#include "ir/StreamCheck.h"
#include "support/Assert.h"

#include <map>

namespace epl::passes {

namespace {

class Schedule : public Pass {
public:
  const char* name() const override { return "schedule"; }

  bool run(ir::Module& m, PassContext& ctx) override {
    m.programs.clear();
    m.costOnly = ctx.costOnly;
    m.stoppedOver = false;
    if (!m.train.present || m.lossGrad < 0 || !m.planned) return false;
    if (!m.runRefusal().empty()) return false;
    if (m.mesh.stages.size() > 1) {
      if (ctx.plansMemoryAsMade()) {
        // Each stage's memory planned as it is made, up to the first that does not fit; what
        // a memory plan reads of the other programs (ZeRO's domains) is in their outlines.
        m.programs = costOnlyOutlines(m);
        const std::vector<char>& wanted = ctx.positions;
        m.programs = pipelinePrograms(
            m,
            [&](ir::Program& p) {
              planMemory(m, p, nullptr); // one program a stage: no two alike
              return m.stoppedOver = ctx.overMemory && ctx.overMemory(m, p);
            },
            [&](int position) {
              return wanted.empty() || (static_cast<size_t>(position) < wanted.size() &&
                                        wanted[static_cast<size_t>(position)]);
            });
        return true;
      }
      m.programs = pipelinePrograms(m);
      if (m.costOnly) return true;
      // Receives in a ring of buffers wait for their buffer's previous receive; where that
      // would stall the ranks, every receive gets a buffer of its own, posted at the start.
      // Where the ring passes, that check was the step's: the evaluation's is left. The
      // replicas run replica 0's programs on their own ranks, so replica 0's streams stand
      // for every rank's (programStreams), except where ZeRO-3 gathers across replicas.
      bool one = m.mesh.dataParallel > 1 && !m.zeroShardsParams();
      bool stalls = ir::checkStreams(programStreams(m, false, one)).has_value();
      if (stalls) {
        for (ir::Program& p : m.programs) {
          p.recvRing = 0;
          placeReceives(m, p);
        }
      }
      checkCommunication(m, stalls, one);
      return true;
    }
    // A pinned `replicate(n)` stage divides each replica's micro-batch over its n devices:
    // from here on shapes are per rank. A stage with split regions is one split group: its
    // ranks run the same program, data-parallel outside the regions, each its piece inside.
    int group = m.mesh.stages[0].group;
    int width = m.mesh.stages[0].splitWidth;
    ir::Program p;
    p.dataRanks = m.mesh.np;
    p.splitWidth = width;
    if (group > 1) {
      m.mesh.placeBatch(p);
      m.bindings[m.batchSymbol] = p.localBatch;
    }
    p.step.push_back({ir::InstrKind::ZeroGrads, -1, 0, -1});
    int last = static_cast<int>(m.policy.microBatches) - 1;
    bool shards = m.zeroShardsGradients();
    for (int micro = 0; micro <= last; ++micro)
      appendMicroBatch(m, micro, micro == last && !shards, p.step);
    if (shards) addGradientReductions(m, 0, p.step);
    for (size_t b = 0; b < m.buckets.size() && !shards; ++b)
      p.step.push_back({ir::InstrKind::ReduceWait, -1, last, static_cast<int>(b)});
    for (size_t i = 0; i < m.ops.size(); ++i)
      if (m.ops[i].phase == ir::Phase::Optimizer)
        p.step.push_back({ir::InstrKind::Run, static_cast<int>(i), 0, -1});
    p.eval.push_back({ir::InstrKind::Load, -1, 0, -1});
    for (size_t i = 0; i < m.ops.size(); ++i)
      if (m.ops[i].phase == ir::Phase::Forward)
        p.eval.push_back({ir::InstrKind::Run, static_cast<int>(i), 0, -1});
    addParamGathers(m, p, p.step, &p.keepsGather);
    addParamGathers(m, p, p.eval);
    for (size_t q = 0; q < m.params.size(); ++q)
      if (m.params[q].grad >= 0) p.params.push_back(static_cast<int>(q));
    auto batch = m.bindings.find(m.batchSymbol);
    p.localBatch = batch == m.bindings.end() ? 0 : batch->second;
    if (group == 1) p.wholeBatch = p.localBatch;
    p.microBatches = static_cast<int>(m.policy.microBatches);
    p.commDtype = m.policy.commDtype;
    for (int r = 0; r < (m.costOnly ? 1 : m.mesh.np); ++r) {
      p.rank = p.lossRank = p.dataRank = r;
      p.replica = width > 1 ? r / group : r;
      p.local = width > 1 ? r % group : 0;
      p.splitRank = r % width;
      int share = p.readsWhole ? width : 1;
      p.readers = p.dataRanks / share;
      p.reader = r / share;
      m.programs.push_back(p);
    }
    if (ctx.plansMemoryAsMade()) planMemory(m, m.programs[0], nullptr); // its one program
    if (!m.costOnly) checkCommunication(m, true, false);
    return true;
  }

private:
  // The evaluation's streams, and the step's unless they were checked already; of replica
  // 0's ranks alone with `oneReplica` (programStreams).
  static void checkCommunication(const ir::Module& m, bool step, bool oneReplica) {
    if (m.programs.size() < 2) return;
    for (bool eval : {false, true})
      if (eval || step)
        if (auto error = ir::checkStreams(programStreams(m, eval, oneReplica)))
          EPL_ASSERT(false, error->str().c_str());
  }

  // reduce: this micro-batch starts the buckets' reductions.
  static void appendMicroBatch(const ir::Module& m, int micro, bool reduce,
                               std::vector<ir::Instr>& out) {
    out.push_back({ir::InstrKind::Load, -1, micro, -1});
    for (size_t i = 0; i < m.ops.size(); ++i) {
      const ir::Op& op = m.ops[i];
      if (op.phase == ir::Phase::Forward)
        out.push_back({ir::InstrKind::Run, static_cast<int>(i), micro, -1});
    }
    out.push_back({ir::InstrKind::SeedGrad, -1, micro, -1});
    // Buckets by the op that readies them, in bucket order: one pass over the ops.
    std::multimap<int, int> readyAfter;
    for (size_t b = 0; reduce && b < m.buckets.size(); ++b)
      readyAfter.emplace(m.buckets[b].readyOp, static_cast<int>(b));
    for (size_t i = 0; i < m.ops.size(); ++i) {
      if (!ir::inBackwardPass(m.ops[i].phase)) continue;
      out.push_back({ir::InstrKind::Run, static_cast<int>(i), micro, -1});
      auto [begin, end] = readyAfter.equal_range(static_cast<int>(i));
      for (auto it = begin; it != end; ++it)
        out.push_back({ir::InstrKind::ReduceStart, -1, micro, it->second});
    }
  }
};

} // namespace

std::unique_ptr<Pass> createSchedulePass() {
  return std::make_unique<Schedule>();
}

} // namespace epl::passes
