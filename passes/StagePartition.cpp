// stage-partition: assign each op to a pipeline stage.
//
// Rules (docs/language.md, "Stages"):
//   1. Each top-level `replicate`/`split` block (after `repeat` expansion) is one stage,
//      in program order. A model with no blocks is one replicated stage.
//   2. An op inside a block belongs to that block's stage.
//   3. An op outside every block joins the next stage in program order, or the last
//      stage when no block follows it (the embedding before stage 0, the loss after the
//      final block), and behaves as if written inside that stage's block: joining a
//      top-level `split(n)` stage, it is tensor-parallel too.
//   4. With -np 1 the whole model is one stage on the one device: the reference run that
//      every parallel plan must match (docs/language.md, "-np 1").
//   5. A weight tied across stages (linear's `tie`) has a copy in each stage that reads it.
#include "passes/Passes.h"

#include <algorithm>
#include <fmt/format.h>

namespace epl::passes {

namespace {

class StagePartition : public Pass {
public:
  const char* name() const override { return "stage-partition"; }

  bool run(ir::Module& m, PassContext& ctx) override {
    m.mesh.stages.clear();
    if (ctx.np == 1) return oneStage(m);
    std::vector<int> stageOfScope(m.scopes.size(), -1);
    for (size_t s = 1; s < m.scopes.size(); ++s) {
      const ir::Scope& sc = m.scopes[s];
      if (sc.kind != ir::ScopeKind::Stage) continue;
      ir::StagePlan st;
      st.scope = static_cast<int>(s);
      st.loc = sc.loc;
      st.pinned = !sc.isSplitStage && sc.width > 0;
      stageOfScope[s] = static_cast<int>(m.mesh.stages.size());
      m.mesh.stages.push_back(st);
    }
    if (m.mesh.stages.empty()) {
      ir::StagePlan st;
      st.loc = m.loc;
      m.mesh.stages.push_back(st);
    }
    int last = static_cast<int>(m.mesh.stages.size()) - 1;
    std::vector<int> counts(m.mesh.stages.size(), 0);
    // Walk backwards so a loose op can take the stage of the next staged op.
    int next = last;
    for (size_t i = m.ops.size(); i-- > 0;) {
      ir::Op& op = m.ops[i];
      int scope = m.stageScopeOf(op.scope);
      op.stage = scope >= 0 ? stageOfScope[scope] : next;
      int stageScope = m.mesh.stages[op.stage].scope;
      if (scope < 0 && op.scope == 0 && stageScope >= 0) op.scope = stageScope;
      next = op.stage;
      ++counts[op.stage];
    }
    for (auto& st : m.mesh.stages)
      st.allSplit = true;
    for (const ir::Op& op : m.ops)
      if (m.splitScopeOf(op.scope) < 0) m.mesh.stages[op.stage].allSplit = false;
    for (size_t s = 0; s < counts.size(); ++s)
      if (counts[s] == 0) {
        ctx.diags.error(m.mesh.stages[s].loc, fmt::format("stage {} has no ops", s))
            .help("remove the empty block, or move layers into it");
        return true;
      }
    recordTiedCopies(m, ctx);
    return true;
  }

private:
  // A weight two layers share (linear's `tie`) in different stages: each of those stages
  // holds a copy (Param::copies), as Megatron-LM holds the embedding in the first stage and
  // the last. The copies' gradients are summed over the ranks of those stages once a step
  // (under ZeRO stage 2 and 3, of the slices each stage reduce-scattered: Instr::tie). Two
  // copies on one rank are refused: with interleaved chunks, two stages of one pipeline
  // rank (stage s of S runs on pipeline rank s mod (S / chunks)).
  static void recordTiedCopies(ir::Module& m, PassContext& ctx) {
    for (ir::Param& p : m.params)
      p.copies.clear();
    int stages = static_cast<int>(m.mesh.stages.size()), chunks = m.policy.chunks;
    int pipelineRanks = chunks > 1 && stages % chunks == 0 ? stages / chunks : 0;
    for (const ir::Op& op : m.ops) {
      for (int q : op.params) {
        ir::Param& p = m.params[q];
        const ir::Op& owner = m.ops[p.op];
        if (owner.stage == op.stage ||
            std::find(p.copies.begin(), p.copies.end(), op.stage) != p.copies.end())
          continue;
        // The stage already holding a copy on op's pipeline rank, if any.
        int sharer = -1;
        if (pipelineRanks > 1) {
          if (owner.stage % pipelineRanks == op.stage % pipelineRanks) sharer = owner.stage;
          for (int c : p.copies)
            if (c % pipelineRanks == op.stage % pipelineRanks) sharer = c;
        }
        p.copies.push_back(op.stage);
        if (sharer < 0) continue;
        auto d = ctx.diags.error(
            op.site,
            fmt::format("`{}` (stage {}) ties its weight to `{}`, and stage {} holds it on the "
                        "same pipeline rank ({} of {}): a rank holds one copy of a tied weight "
                        "so far",
                        op.name, op.stage, owner.name, sharer, op.stage % pipelineRanks,
                        pipelineRanks));
        if (op.site.line == op.loc.line && op.site.file == op.loc.file)
          d.length(static_cast<uint32_t>(ir::opInfo(op.kind).name.size()));
        if (m.policy.keyLocs.count("chunks")) d.noteAt(m.policy.keyLocs.at("chunks"), "set here");
        d.help("use `chunks = 1`, tie layers of stages on different pipeline ranks, or keep "
               "both layers in one stage");
        return;
      }
    }
  }

  static bool oneStage(ir::Module& m) {
    for (ir::Param& p : m.params)
      p.copies.clear();
    ir::StagePlan st;
    st.loc = m.loc;
    m.mesh.stages.push_back(st);
    for (ir::Op& op : m.ops)
      op.stage = 0;
    return true;
  }
};

} // namespace

std::unique_ptr<Pass> createStagePartitionPass() {
  return std::make_unique<StagePartition>();
}

} // namespace epl::passes
