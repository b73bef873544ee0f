// attention: multi-head self-attention over x [B, T, D], H heads of width E = D / H, with
// fused q, k, v and output projections; KV heads of k and v (grouped-query attention: each
// H / KV query heads share one), optionally rotary position embeddings on q and k, and an
// optional padding mask [B, T] of the keys each sample has (non-zero keeps a key).
#include "ir/ops/Family.h"

#include "support/Assert.h"
#include "support/Checked.h"

#include <fmt/format.h>

namespace epl::ir::ops {

namespace {

// The k and v heads: `kv_heads`, or `heads` where the attributes lack it (a call from
// before it existed).
int64_t kvHeads(const Attrs& attrs) {
  auto it = attrs.find("kv_heads");
  return it == attrs.end() ? intAttr(attrs, "heads") : std::get<int64_t>(it->second);
}

bool rotary(const Attrs& attrs) {
  auto it = attrs.find("rotary");
  return it != attrs.end() && std::get<bool>(it->second);
}

// The padding mask: integers [B, T], the batch and time of x [B, T, D].
std::string checkMask(const TensorType& x, const TensorType& mask) {
  if (!isIntegral(mask.dtype))
    return fmt::format("`attention` needs an integer `mask` (1 keeps a key, 0 masks it), got {}",
                       tensorStr(mask));
  Shape want(x.shape.begin(), x.shape.begin() + 2);
  if (mask.shape != want)
    return fmt::format("shape mismatch: `attention` input {} needs a `mask` of shape `{}`, got {}",
                       tensorStr(x), shapeStr(want), tensorStr(mask));
  return "";
}

std::string inferAttention(const OpInfo& op, const std::vector<TensorType>& in, const Attrs& attrs,
                           std::vector<TensorType>& out) {
  int64_t d = 0, h = intAttr(attrs, "heads"), kv = kvHeads(attrs);
  if (in[0].shape.size() != 3)
    return fmt::format("`attention` needs a [B, T, D] input, got {}", tensorStr(in[0]));
  std::string err;
  if (!(err = knownLast(op.name, in[0], d)).empty() ||
      !(err = positive(op.name, "heads", h)).empty() ||
      !(err = positive(op.name, "kv_heads", kv)).empty())
    return err;
  if (d % h != 0) return fmt::format("attention width ({}) must be divisible by heads ({})", d, h);
  if (h % kv != 0)
    return fmt::format("attention heads ({}) must be divisible by kv_heads ({})", h, kv);
  if (rotary(attrs)) {
    if ((d / h) % 2 != 0)
      return fmt::format(
          "`rotary` needs an even head width, got {} (attention width {} / heads {})", d / h, d, h);
    if (!(floatAttr(attrs, "rotary_base") > 0))
      return fmt::format("`attention` argument `rotary_base` must be positive, got {}",
                         attrStr(attrs.at("rotary_base")));
  }
  if (!checkedMul(d, 3)) // the fused q, k, v projection is at most 3 x d wide
    return fmt::format("attention width ({}) is too large: 3 x {} passes 2^63 - 1", d, d);
  if (in.size() > 1 && !(err = checkMask(in[0], in[1])).empty()) return err;
  out.push_back(in[0]);
  return "";
}

// The rows of the fused projection: q's D, then k's and v's KV E each.
int64_t qkvRows(int64_t d, const Attrs& attrs) {
  int64_t h = intAttr(attrs, "heads");
  return h > 0 ? d + 2 * kvHeads(attrs) * (d / h) : 3 * d;
}

std::vector<ParamSpec> attentionParams(const std::vector<TensorType>& in, const Attrs& attrs) {
  int64_t d = lastWidth(in), rows = qkvRows(d, attrs);
  auto u = ParamInit::Uniform;
  if (!std::get<bool>(attrs.at("bias")))
    return {{"qkv_weight", {constant(rows), constant(d)}, u, d},
            {"proj_weight", {constant(d), constant(d)}, u, d}};
  return {{"qkv_weight", {constant(rows), constant(d)}, u, d},
          {"qkv_bias", {constant(rows)}, u, d},
          {"proj_weight", {constant(d), constant(d)}, u, d},
          {"proj_bias", {constant(d)}, u, d}};
}

// Saved: qkv f32[B, T, D + 2 KV E] (q and k after the rotary embedding, when on), ctx
// f32[B, T, D] (heads joined, before the output projection), lse f32[B, H, T] (log-sum-exp
// of each softmax row).
std::vector<TensorType> attentionSaved(const std::vector<TensorType>& in, const Attrs& attrs) {
  const Shape& x = in[0].shape;
  EPL_ASSERT(x.size() == 3 && x[2].isConstant(), "attention input must be [B, T, D]");
  int64_t rows = qkvRows(x[2].coef, attrs); // the shape rule bounds it by 3 D
  return {f32({x[0], x[1], constant(rows)}), f32(x),
          f32({x[0], constant(intAttr(attrs, "heads")), x[1]})};
}

// The projections, [B T, M] by [M, r] and [B T, d] by [d, M], and for each sample and
// head of this rank the scores Q K^T, [T, E] by [E, T], and their product with V, [T, T]
// by [T, E]. r is the rows of this rank's Wqkv (its q, k and v heads: a 1 / w share of
// the whole D + 2 KV E), d the width of its query heads, E = M / heads a head's.
// The whole T x T square, as the papers count it, though causal kernels skip half.
std::vector<Product> attentionProducts(const std::vector<Sizes>& in,
                                       const std::vector<Sizes>& params, const Sizes&,
                                       const Attrs& attrs) {
  const Sizes &x = in[0], &wqkv = params[0];
  double b = static_cast<double>(x[0]), t = static_cast<double>(x[1]), m = widthOf(x);
  double rows = static_cast<double>(wqkv[0]);
  double share = rows / static_cast<double>(qkvRows(x.back(), attrs));
  double e = m / static_cast<double>(intAttr(attrs, "heads")), d = share * m, heads = d / e;
  return {{b * t, rows, m},
          {b * t, m, d},
          {t, t, e, b * heads, GemmLayout::ABt, true},
          {t, e, t, b * heads, GemmLayout::AB, true}};
}

} // namespace

void addAttention(Table& t) {
  OpInfo& a = t.add(
      OpKind::Attention, "attention",
      {x(), integer("heads", "attention heads, must divide D"),
       optBool("causal", true, "mask future positions"),
       optBool("bias", true, "add biases in the qkv and output projections"),
       optIntFrom("kv_heads", "heads",
                  "k and v heads, must divide heads (grouped-query attention; 1: multi-query)"),
       optBool("rotary", false, "rotary position embeddings on q and k (LLaMA's)"),
       optFloat("rotary_base", 10000, "the base of the rotary frequencies"),
       optTensor("mask", "integer [B, T]: keys to attend to (non-zero) and padding (0)")},
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
  a.cutAlso = "kv_heads";
  a.outputBias = "proj_bias";
  a.castsWeights = true;
}

} // namespace epl::ir::ops
