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
#include "passes/Passes.h"

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
    tiesInOneStage(m, ctx);
    return true;
  }

private:
  // A weight two layers share (linear's `tie`) lives in one stage: both layers must run
  // there. Across stages each would hold a copy whose gradients are summed between the
  // stages (as Megatron-LM does for the embedding and the head), which EPL does not do yet.
  static void tiesInOneStage(const ir::Module& m, PassContext& ctx) {
    for (size_t i = 0; i < m.ops.size(); ++i) {
      const ir::Op& op = m.ops[i];
      for (int p : op.params) {
        const ir::Op& owner = m.ops[m.params[p].op];
        if (owner.stage == op.stage) continue;
        auto d = ctx.diags.error(
            op.site, fmt::format("`{}` (stage {}) ties its weight to `{}`, which is in stage {}: "
                                 "a tied weight is used in one pipeline stage",
                                 op.name, op.stage, owner.name, owner.stage));
        if (op.site.line == op.loc.line && op.site.file == op.loc.file)
          d.length(static_cast<uint32_t>(ir::opInfo(op.kind).name.size()));
        d.noteAt(owner.site, fmt::format("`{}` is here, in stage {}", owner.name, owner.stage));
        d.help("keep both layers in one stage (in one `replicate` block, or both outside "
               "every block), or drop `tie`; weights shared across stages are not "
               "supported yet");
        return;
      }
    }
  }

  static bool oneStage(ir::Module& m) {
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
