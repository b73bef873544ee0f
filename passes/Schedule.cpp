// schedule: each rank's instruction stream for one training step and for evaluation.
//
// One device (-np 1) runs, per step:
//   zero the parameter gradients;
//   for each micro-batch: load it, run the forward ops in program order, seed the loss
//   gradient, run the backward ops (autodiff emitted them in reverse order already);
//   then the grad-norm op (when clipping) and the optimizer ops.
// Evaluation loads one batch and runs the forward ops alone.
// Streams for several ranks (pipelines, tensor and data parallelism) are not built yet:
// the plan for -np > 1 has no programs and `epl run` says so.
#include "passes/Passes.h"

#include "support/Assert.h"

namespace epl::passes {

namespace {

class Schedule : public Pass {
public:
  const char* name() const override { return "schedule"; }

  bool run(ir::Module& m, PassContext&) override {
    m.programs.clear();
    if (!m.train.present || m.lossGrad < 0 || m.mesh.np != 1) return false;
    ir::Program p;
    p.step.push_back({ir::InstrKind::ZeroGrads, -1, 0});
    for (int micro = 0; micro < m.policy.microBatches; ++micro)
      appendMicroBatch(m, micro, p.step);
    for (size_t i = 0; i < m.ops.size(); ++i)
      if (m.ops[i].phase == ir::Phase::Optimizer)
        p.step.push_back({ir::InstrKind::Run, static_cast<int>(i), 0});
    p.eval.push_back({ir::InstrKind::Load, -1, 0});
    for (size_t i = 0; i < m.ops.size(); ++i)
      if (m.ops[i].phase == ir::Phase::Forward)
        p.eval.push_back({ir::InstrKind::Run, static_cast<int>(i), 0});
    m.programs.push_back(std::move(p));
    return true;
  }

private:
  static void appendMicroBatch(const ir::Module& m, int micro, std::vector<ir::Instr>& out) {
    out.push_back({ir::InstrKind::Load, -1, micro});
    for (size_t i = 0; i < m.ops.size(); ++i) {
      const ir::Op& op = m.ops[i];
      EPL_ASSERT(ir::opInfo(op.kind).split != ir::SplitRule::Communication,
                 "a one-device plan has no communication");
      if (op.phase == ir::Phase::Forward)
        out.push_back({ir::InstrKind::Run, static_cast<int>(i), micro});
    }
    out.push_back({ir::InstrKind::SeedGrad, -1, micro});
    for (size_t i = 0; i < m.ops.size(); ++i)
      if (m.ops[i].phase == ir::Phase::Backward)
        out.push_back({ir::InstrKind::Run, static_cast<int>(i), micro});
  }
};

} // namespace

std::unique_ptr<Pass> createSchedulePass() {
  return std::make_unique<Schedule>();
}

} // namespace epl::passes
