// The communication passes insert, and the ops autodiff adds for training. The backward of
// a bridge is the transposed bridge (a reduce-scatter for an all-gather, …), chosen where
// the per-rank streams are built; it reads nothing saved.
#include "ir/ops/Family.h"

namespace epl::ir::ops {

namespace {

std::string inferAllToAll(const OpInfo&, const std::vector<TensorType>& in, const Attrs& attrs,
                          std::vector<TensorType>& out) {
  out.push_back(in[0]);
  if (std::get<std::string>(attrs.at("phase")) == "dispatch") out.push_back(in[1]);
  return "";
}

std::string inferGradNorm(const OpInfo&, const std::vector<TensorType>&, const Attrs&,
                          std::vector<TensorType>& out) {
  out.push_back(TensorType{DType::F32, {}});
  return "";
}

std::string inferNothing(const OpInfo&, const std::vector<TensorType>&, const Attrs&,
                         std::vector<TensorType>&) {
  return "";
}

} // namespace

void addCollectives(Table& t) {
  auto comm = [&](OpKind k, std::string name, std::string summary) {
    t.add(k, std::move(name), {x()}, SplitRule::Communication, std::move(summary), "same shape",
          false)
        .infer = sameAsInput;
  };
  comm(OpKind::AllGather, "all_gather", "gather the pieces of a tensor along a dim");
  comm(OpKind::AllReduce, "all_reduce", "sum partial results");
  comm(OpKind::ReduceScatter, "reduce_scatter", "sum partial results, keep this device's piece");
  t.add(OpKind::AllToAll, "all_to_all",
        {tensor("rows", "moe's dispatched rows"), tensor("counts", "rows per expert")},
        SplitRule::Communication, "move moe's rows to the devices of their experts, or back",
        "rows, counts -> rows (and, dispatching, this device's experts' counts)", false)
      .infer = inferAllToAll;
  comm(OpKind::Slice, "slice", "keep this device's piece of a tensor (no transfer)");
  comm(OpKind::SendRecv, "send_recv", "move an activation to the next stage");
  comm(OpKind::Identity, "identity",
       "a whole tensor entering a split op; the backward sums the op's partial gradients");
}

void addTraining(Table& t) {
  OpInfo& norm =
      t.add(OpKind::GradNorm, "grad_norm", {}, SplitRule::Replicated,
            "global L2 norm of the parameter gradients, for clipping", "-> f32[]", false);
  norm.infer = inferGradNorm;
  norm.differentiable = false;
  OpInfo& step =
      t.add(OpKind::OptimizerStep, "optimizer_step", {}, SplitRule::Replicated,
            "update one parameter (and its optimizer state) from its gradient", "", false);
  step.infer = inferNothing;
  step.differentiable = false;
}

} // namespace epl::ir::ops
