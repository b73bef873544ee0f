// layer_norm and rms_norm: normalisation over the last dim, rows = every other dim;
// batch_norm: over every dim but the channels (dim 1), with running statistics.
#include "ir/ops/Family.h"

#include <fmt/format.h>

namespace epl::ir::ops {

namespace {

// Also softmax's rule (Pointwise.cpp): a float input with a known width, kept.
std::string inferRowWise(const OpInfo& op, const std::vector<TensorType>& in, const Attrs&,
                         std::vector<TensorType>& out) {
  int64_t d = 0;
  std::string err;
  if (!(err = knownLast(op.name, in[0], d)).empty() || !(err = needFloat(op.name, in[0])).empty())
    return err;
  out.push_back(in[0]);
  return "";
}

std::vector<ParamSpec> layerNormParams(const std::vector<TensorType>& in, const Attrs&) {
  return {{"weight", {constant(lastWidth(in))}, ParamInit::One},
          {"bias", {constant(lastWidth(in))}, ParamInit::Zero}};
}

std::vector<ParamSpec> rmsNormParams(const std::vector<TensorType>& in, const Attrs&) {
  return {{"weight", {constant(lastWidth(in))}, ParamInit::One}};
}

// Saved: mean f32[rows], rstd f32[rows].
std::vector<TensorType> layerNormSaved(const std::vector<TensorType>& in, const Attrs&) {
  return {f32(allButLast(in[0].shape)), f32(allButLast(in[0].shape))};
}

// Saved: rstd f32[rows].
std::vector<TensorType> rmsNormSaved(const std::vector<TensorType>& in, const Attrs&) {
  return {f32(allButLast(in[0].shape))};
}

// x: [B, C, ...] floating point, C known.
std::string inferBatchNorm(const OpInfo& op, const std::vector<TensorType>& in, const Attrs&,
                           std::vector<TensorType>& out) {
  const TensorType& x = in[0];
  std::string err = needFloat(op.name, x);
  if (!err.empty()) return err;
  if (x.shape.size() < 2 || !x.shape[1].isConstant())
    return fmt::format("`batch_norm` needs an input `[B, C, ...]` with a known channel count C, "
                       "got {}",
                       tensorStr(x));
  out.push_back(x);
  return "";
}

int64_t channelsOf(const std::vector<TensorType>& in) {
  return in.empty() || in[0].shape.size() < 2 ? 0 : in[0].shape[1].coef;
}

// weight and bias, then the running mean and variance: state, not trained (PyTorch's
// buffers), which the training forward updates.
std::vector<ParamSpec> batchNormParams(const std::vector<TensorType>& in, const Attrs&) {
  Shape c = {constant(channelsOf(in))};
  ParamSpec mean{"running_mean", c, ParamInit::Zero}, var{"running_var", c, ParamInit::One};
  mean.trainable = var.trainable = false;
  return {{"weight", c, ParamInit::One}, {"bias", c, ParamInit::Zero}, mean, var};
}

// Saved: the batch's mean f32[C] and rstd f32[C].
std::vector<TensorType> batchNormSaved(const std::vector<TensorType>& in, const Attrs&) {
  return {f32({constant(channelsOf(in))}), f32({constant(channelsOf(in))})};
}

} // namespace

OpInfo::InferFn rowWiseRule() {
  return inferRowWise;
}

namespace {

// A normalisation's entry: its rules, and the `saved` statistics its backward reads with
// its inputs.
void normalisation(OpInfo& info, OpInfo::InferFn infer, decltype(OpInfo::params) params,
                   decltype(OpInfo::saved) saved, int savedCount) {
  info.infer = infer;
  info.params = params;
  info.saved = saved;
  info.savedCount = savedCount;
  info.needsInputs = true;
}

} // namespace

void addNorms(Table& t) {
  OpInfo& layer =
      t.add(OpKind::LayerNorm, "layer_norm", {x(), optFloat("eps", 1e-5, "added to the variance")},
            SplitRule::RowWise, "layer normalisation over the last dim, with scale and shift",
            "x: [..., D] -> [..., D]");
  normalisation(layer, inferRowWise, layerNormParams, layerNormSaved, 2);
  layer.halfAsStored = true;

  OpInfo& rms =
      t.add(OpKind::RmsNorm, "rms_norm", {x(), optFloat("eps", 1e-6, "added to the mean square")},
            SplitRule::RowWise, "root-mean-square normalisation over the last dim, with scale",
            "x: [..., D] -> [..., D]");
  normalisation(rms, inferRowWise, rmsNormParams, rmsNormSaved, 1);

  OpInfo& batch =
      t.add(OpKind::BatchNorm, "batch_norm",
            {x(), optFloat("eps", 1e-5, "added to the variance"),
             optFloat("momentum", 0.1, "weight of each batch in the running statistics")},
            SplitRule::Replicated,
            "batch normalisation of each channel (dim 1) over the batch and the other dims, with "
            "scale, shift and running statistics",
            "x: [B, C, ...] -> [B, C, ...]");
  normalisation(batch, inferBatchNorm, batchNormParams, batchNormSaved, 2);
}

} // namespace epl::ir::ops
