// attention: multi-head self-attention over x [B, T, D], H heads of width D / H, with fused
// q, k, v and output projections.
#include "ir/ops/Family.h"

#include "support/Assert.h"
#include "support/Checked.h"

#include <fmt/format.h>

namespace epl::ir::ops {

namespace {

std::string inferAttention(const OpInfo& op, const std::vector<TensorType>& in, const Attrs& attrs,
                           std::vector<TensorType>& out) {
  int64_t d = 0, h = intAttr(attrs, "heads");
  if (in[0].shape.size() != 3)
    return fmt::format("`attention` needs a [B, T, D] input, got {}", tensorStr(in[0]));
  std::string err;
  if (!(err = knownLast(op.name, in[0], d)).empty() ||
      !(err = positive(op.name, "heads", h)).empty())
    return err;
  if (d % h != 0) return fmt::format("attention width ({}) must be divisible by heads ({})", d, h);
  if (!checkedMul(d, 3)) // the fused q, k, v projection is 3 x d wide
    return fmt::format("attention width ({}) is too large: 3 x {} passes 2^63 - 1", d, d);
  out.push_back(in[0]);
  return "";
}

std::vector<ParamSpec> attentionParams(const std::vector<TensorType>& in, const Attrs& attrs) {
  int64_t d = lastWidth(in);
  auto u = ParamInit::Uniform;
  if (!std::get<bool>(attrs.at("bias")))
    return {{"qkv_weight", {constant(3 * d), constant(d)}, u, d},
            {"proj_weight", {constant(d), constant(d)}, u, d}};
  return {{"qkv_weight", {constant(3 * d), constant(d)}, u, d},
          {"qkv_bias", {constant(3 * d)}, u, d},
          {"proj_weight", {constant(d), constant(d)}, u, d},
          {"proj_bias", {constant(d)}, u, d}};
}

// Saved: qkv f32[B, T, 3D], ctx f32[B, T, D] (heads joined, before the output
// projection), lse f32[B, H, T] (log-sum-exp of each softmax row).
std::vector<TensorType> attentionSaved(const std::vector<TensorType>& in, const Attrs& attrs) {
  const Shape& x = in[0].shape;
  EPL_ASSERT(x.size() == 3, "attention input must be [B, T, D]");
  std::optional<Dim> qkv = x[2].times(constant(3));
  EPL_ASSERT(qkv.has_value(), "the attention shape rule refuses widths past (2^63 - 1) / 3");
  return {f32({x[0], x[1], *qkv}), f32(x), f32({x[0], constant(intAttr(attrs, "heads")), x[1]})};
}

// The projections, [B T, M] by [M, 3 d] and [B T, d] by [d, M], and for each sample and
// head of this rank the scores Q K^T, [T, E] by [E, T], and their product with V, [T, T]
// by [T, E]. d is the width of this rank's heads (Wqkv [3 d, M]), E = M / heads a head's.
// The whole T x T square, as the papers count it, though causal kernels skip half.
std::vector<Product> attentionProducts(const std::vector<Sizes>& in,
                                       const std::vector<Sizes>& params, const Sizes&,
                                       const Attrs& attrs) {
  const Sizes &x = in[0], &wqkv = params[0];
  double b = static_cast<double>(x[0]), t = static_cast<double>(x[1]), m = widthOf(x);
  double d = static_cast<double>(wqkv[0]) / 3;
  double e = m / static_cast<double>(intAttr(attrs, "heads")), heads = d / e;
  return {{b * t, 3 * d, m}, {b * t, m, d}, {t, t, e, b * heads}, {t, e, t, b * heads}};
}

} // namespace

void addAttention(Table& t) {
  OpInfo& a =
      t.add(OpKind::Attention, "attention",
            {x(), integer("heads", "attention heads, must divide D"),
             optBool("causal", true, "mask future positions"),
             optBool("bias", true, "add biases in the qkv and output projections")},
            SplitRule::Heads, "multi-head self-attention with fused qkv and output projections",
            "x: [B, T, D] -> [B, T, D]");
  a.infer = inferAttention;
  a.params = attentionParams;
  a.saved = attentionSaved;
  a.savedCount = 3;
  a.activationSaved = 2; // qkv and ctx; not the log-sum-exp
  a.products = attentionProducts;
  a.needsInputs = true;
  a.cut = "heads";
  a.outputBias = "proj_bias";
  a.castsWeights = true;
}

} // namespace epl::ir::ops
