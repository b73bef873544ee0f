// cross_entropy and mse: a batch's mean loss, a scalar.
#include "ir/ops/Family.h"

#include <fmt/format.h>

namespace epl::ir::ops {

namespace {

std::string inferCrossEntropy(const OpInfo& op, const std::vector<TensorType>& in, const Attrs&,
                              std::vector<TensorType>& out) {
  const TensorType &lg = in[0], &tg = in[1];
  int64_t v = 0;
  std::string err;
  if (!(err = knownLast(op.name, lg, v)).empty() || !(err = needFloat(op.name, lg)).empty())
    return err;
  if (!isIntegral(tg.dtype))
    return fmt::format("`cross_entropy` needs integer targets, got {}", tensorStr(tg));
  Shape lead(lg.shape.begin(), lg.shape.end() - 1);
  if (lead != tg.shape)
    return fmt::format("shape mismatch: `cross_entropy` logits {} need targets `{}`, got {}",
                       tensorStr(lg), shapeStr(lead), tensorStr(tg));
  out.push_back(TensorType{lg.dtype, {}});
  return "";
}

// Saved: lse f32[rows], the log-sum-exp of each row of logits.
std::vector<TensorType> crossEntropySaved(const std::vector<TensorType>& in, const Attrs&) {
  return {f32(allButLast(in[0].shape))};
}

std::string inferMse(const OpInfo& op, const std::vector<TensorType>& in, const Attrs&,
                     std::vector<TensorType>& out) {
  if (!(in[0].shape == in[1].shape))
    return fmt::format("shape mismatch: `mse` got {} and {}", tensorStr(in[0]), tensorStr(in[1]));
  std::string err = needFloat(op.name, in[0]);
  if (!err.empty()) return err;
  out.push_back(TensorType{in[0].dtype, {}});
  return "";
}

} // namespace

void addLosses(Table& t) {
  OpInfo& ce = t.add(OpKind::CrossEntropy, "cross_entropy",
                     {tensor("logits", "unnormalised scores"), tensor("targets", "class ids"),
                      optInt("ignore_index", kNoIgnoredClass,
                             "targets of this class count nothing: not in the mean, no gradient")},
                     SplitRule::Vocab,
                     "mean softmax cross-entropy (fused with log-softmax) over the targets kept",
                     "logits: [..., V], targets: i32[...] -> f32[]");
  ce.infer = inferCrossEntropy;
  ce.saved = crossEntropySaved;
  ce.savedCount = 1;
  ce.needsInputs = true;
  ce.halfAsStored = true;

  OpInfo& mse =
      t.add(OpKind::Mse, "mse", {tensor("pred", "prediction"), tensor("target", "target")},
            SplitRule::Replicated, "mean squared error", "pred: [...], target: [...] -> f32[]");
  mse.infer = inferMse;
  mse.needsInputs = true;
}

} // namespace epl::ir::ops
