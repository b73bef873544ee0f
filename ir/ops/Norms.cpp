// layer_norm and rms_norm: normalisation over the last dim, rows = every other dim.
#include "ir/ops/Family.h"

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

} // namespace

OpInfo::InferFn rowWiseRule() {
  return inferRowWise;
}

void addNorms(Table& t) {
  OpInfo& layer =
      t.add(OpKind::LayerNorm, "layer_norm", {x(), optFloat("eps", 1e-5, "added to the variance")},
            SplitRule::RowWise, "layer normalisation over the last dim, with scale and shift",
            "x: [..., D] -> [..., D]");
  layer.infer = inferRowWise;
  layer.params = layerNormParams;
  layer.saved = layerNormSaved;
  layer.savedCount = 2;
  layer.needsInputs = true;

  OpInfo& rms =
      t.add(OpKind::RmsNorm, "rms_norm", {x(), optFloat("eps", 1e-6, "added to the mean square")},
            SplitRule::RowWise, "root-mean-square normalisation over the last dim, with scale",
            "x: [..., D] -> [..., D]");
  rms.infer = inferRowWise;
  rms.params = rmsNormParams;
  rms.saved = rmsNormSaved;
  rms.savedCount = 1;
  rms.needsInputs = true;
}

} // namespace epl::ir::ops
