// param-accounting: parameters, and the model states (parameters, gradients, optimizer
// states) each device holds, per stage; rejects a plan whose model states alone exceed
// the declared `device_memory`.
//
// Bytes per parameter, after the ZeRO paper (Rajbhandari et al.), with Psi parameters:
//   amp none:        4 param + 4 grad + optimizer (adam/adamw 8, sgd+momentum 4, sgd 0)
//   amp fp16/bf16:   2 param + 2 grad + 4 fp32 master + the same optimizer moments
// so mixed-precision Adam holds 16 Psi. ZeRO over the N devices that hold the same shard
// (outer data-parallel x copies in the stage) divides: stage 1 the optimizer states
// (4 Psi + 12 Psi / N), stage 2 also gradients (2 Psi + 14 Psi / N), stage 3 also
// parameters (16 Psi / N). `offload = optimizer` moves optimizer states off the device;
// `offload = params` (ZeRO-3) moves parameters too.
#include "passes/Passes.h"

#include "support/Assert.h"
#include "support/Checked.h"
#include "support/Text.h"

#include <fmt/format.h>

namespace epl::passes {

namespace {

struct StateBytes {
  int64_t param = 4, grad = 4, optimizer = 8;
};

// amp keeps no half copy of the weights (the kernels round them where they read them): the
// f32 weights are the master copy and the gradients f32, so amp changes no model state
// (docs/architecture.md, "Mixed precision").
StateBytes bytesPerParam(const ir::Module& m) {
  StateBytes b;
  b.optimizer = 4 * m.optimizerStates();
  return b;
}

int64_t ceilDiv(int64_t a, int64_t b) {
  return a / b + (a % b != 0);
}

// mesh-assignment keeps the bytes of all parameters with their states below 2^62, so
// these cannot overflow; they are checked all the same.
int64_t times(int64_t a, int64_t b) {
  std::optional<int64_t> r = checkedMul(a, b);
  EPL_ASSERT(r.has_value(), "parameter bytes past 2^63 - 1 after mesh-assignment");
  return *r;
}

void add(int64_t& sum, int64_t v) {
  std::optional<int64_t> r = checkedAdd(sum, v);
  EPL_ASSERT(r.has_value(), "parameter bytes past 2^63 - 1 after mesh-assignment");
  sum = *r;
}

class ParamAccounting : public Pass {
public:
  const char* name() const override { return "param-accounting"; }

  bool run(ir::Module& m, PassContext& ctx) override {
    for (auto& st : m.mesh.stages)
      st = clearFigures(st);
    StateBytes per = bytesPerParam(m);
    for (size_t q = 0; q < m.params.size(); ++q) {
      std::vector<int> stages = m.stagesHolding(static_cast<int>(q));
      for (int s : stages)
        account(m, m.params[q], s, s == stages[0], per);
    }
    checkFit(m, ctx);
    return true;
  }

private:
  // Parameter p's figures in stage s: the model's count where it was made (`whole`), and
  // what each device of s holds.
  static void account(ir::Module& m, const ir::Param& p, int s, bool whole, StateBytes per) {
    ir::ZeroStage zero = m.policy.zero;
    const ir::Op& op = m.ops[p.op];
    ir::StagePlan& st = m.mesh.stages[s];
    std::optional<int64_t> count = ir::numElements(p.type.shape, {});
    EPL_ASSERT(count.has_value(), "a parameter's shape is concrete and checked");
    int64_t n = *count;
    int region = m.splitScopeOf(op.scope);
    int64_t ways = p.shardDim >= 0 && region >= 0 ? m.scopes[region].width : 1;
    // Devices holding this same shard: ZeRO partitions states over them.
    int64_t holders =
        static_cast<int64_t>(m.mesh.dataParallel) * (region >= 0 ? st.copies() : st.group);
    int64_t local = n / ways;
    if (whole) {
      add(st.paramCount, n);
      add(st.paramBytes, times(n, ir::dtypeBytes(p.type.dtype)));
    }
    add(st.rankParamCount, local);
    add(st.rankParamBytes, times(local, ir::dtypeBytes(p.type.dtype)));
    auto shard = [&](bool sharded, int64_t bytes) {
      return times(sharded ? ceilDiv(local, holders) : local, bytes);
    };
    int64_t params = shard(zero >= ir::ZeroStage::Parameters, per.param);
    int64_t grads = shard(zero >= ir::ZeroStage::Gradients, per.grad);
    int64_t optimizer = shard(zero >= ir::ZeroStage::OptimizerStates, per.optimizer);
    if (m.policy.offload != ir::Offload::None) {
      add(st.offloadedBytes, optimizer);
      optimizer = 0;
    }
    if (m.policy.offload == ir::Offload::Params) {
      add(st.offloadedBytes, params);
      params = 0;
    }
    add(st.stateParamBytes, params);
    add(st.stateGradBytes, grads);
    add(st.stateOptimizerBytes, optimizer);
  }

  static ir::StagePlan clearFigures(ir::StagePlan st) {
    st.paramCount = st.paramBytes = st.rankParamCount = st.rankParamBytes = 0;
    st.stateParamBytes = st.stateGradBytes = st.stateOptimizerBytes = st.offloadedBytes = 0;
    return st;
  }

  // Model states are a floor on a device's memory: activations and buffers come on top,
  // so a plan whose states alone do not fit cannot run.
  void checkFit(const ir::Module& m, PassContext& ctx) {
    int64_t limit = m.policy.deviceMemoryBytes;
    if (limit <= 0) return;
    for (size_t s = 0; s < m.mesh.stages.size(); ++s) {
      const ir::StagePlan& st = m.mesh.stages[s];
      if (st.modelStateBytes() <= limit) continue;
      ctx.diags
          .error(
              m.policy.keyLocs.at("device_memory"),
              fmt::format(
                  "model states need {} on each device of stage {}, more than `device_memory` ({})",
                  formatBytes(st.modelStateBytes()), s, formatBytes(limit)))
          .length(13)
          .note(fmt::format("parameters {} + gradients {} + optimizer states {}",
                            formatBytes(st.stateParamBytes), formatBytes(st.stateGradBytes),
                            formatBytes(st.stateOptimizerBytes)))
          .help("raise `zero`, offload the optimizer, split wider or add stages");
      return;
    }
  }
};

} // namespace

std::unique_ptr<Pass> createParamAccountingPass() {
  return std::make_unique<ParamAccounting>();
}

} // namespace epl::passes
