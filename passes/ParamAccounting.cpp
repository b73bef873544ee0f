// param-accounting: parameters and their bytes per stage and per device.
//
// A parameter cut by split-layout is held 1/w by each device of its split group; every
// device of a stage group holds the same amount (the copies of a region are alike).
#include "passes/Passes.h"

namespace epl::passes {

namespace {

class ParamAccounting : public Pass {
public:
  const char* name() const override { return "param-accounting"; }

  bool run(ir::Module& m, PassContext&) override {
    for (auto& st : m.mesh.stages) st.paramCount = st.paramBytes = st.rankParamCount = st.rankParamBytes = 0;
    for (const ir::Param& p : m.params) {
      const ir::Op& op = m.ops[p.op];
      ir::StagePlan& st = m.mesh.stages[op.stage];
      int64_t n = *ir::numElements(p.type.shape, {});
      int64_t bytes = n * ir::dtypeBytes(p.type.dtype);
      int region = m.splitScopeOf(op.scope);
      int64_t ways = p.shardDim >= 0 && region >= 0 ? m.scopes[region].width : 1;
      st.paramCount += n;
      st.paramBytes += bytes;
      st.rankParamCount += n / ways;
      st.rankParamBytes += bytes / ways;
    }
    return true;
  }
};

} // namespace

std::unique_ptr<Pass> createParamAccountingPass() { return std::make_unique<ParamAccounting>(); }

} // namespace epl::passes
