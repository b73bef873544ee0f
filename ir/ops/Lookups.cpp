// embedding and positions: learned tables read by index.
#include "ir/ops/Family.h"

#include <fmt/format.h>

namespace epl::ir::ops {

namespace {

// `std`: the standard deviation of the initial values, N(0, std).
std::string positiveStd(const OpInfo& op, const Attrs& attrs) {
  double std = floatAttr(attrs, "std");
  if (std > 0 && std < 1e30) return "";
  return fmt::format("`{}` argument `std` must be a positive number, got {}", op.name, std);
}

std::string inferEmbedding(const OpInfo& op, const std::vector<TensorType>& in, const Attrs& attrs,
                           std::vector<TensorType>& out) {
  if (!isIntegral(in[0].dtype))
    return fmt::format("`embedding` needs integer token ids, got {}", tensorStr(in[0]));
  std::string err;
  if (!(err = positive(op.name, "vocab", intAttr(attrs, "vocab"))).empty() ||
      !(err = positive(op.name, "dim", intAttr(attrs, "dim"))).empty() ||
      !(err = positiveStd(op, attrs)).empty())
    return err;
  Shape s = in[0].shape;
  s.push_back(constant(intAttr(attrs, "dim")));
  out.push_back(TensorType{DType::F32, s});
  return "";
}

std::vector<ParamSpec> embeddingParams(const std::vector<TensorType>&, const Attrs& attrs) {
  return {{"weight",
           {constant(intAttr(attrs, "vocab")), constant(intAttr(attrs, "dim"))},
           ParamInit::Normal,
           1,
           floatAttr(attrs, "std")}};
}

std::string inferPositions(const OpInfo& op, const std::vector<TensorType>&, const Attrs& attrs,
                           std::vector<TensorType>& out) {
  int64_t seq = intAttr(attrs, "seq"), dim = intAttr(attrs, "dim");
  std::string err;
  if (!(err = positive(op.name, "seq", seq)).empty() ||
      !(err = positive(op.name, "dim", dim)).empty() || !(err = positiveStd(op, attrs)).empty())
    return err;
  out.push_back(TensorType{DType::F32, {constant(seq), constant(dim)}});
  return "";
}

std::vector<ParamSpec> positionsParams(const std::vector<TensorType>&, const Attrs& attrs) {
  return {{"weight",
           {constant(intAttr(attrs, "seq")), constant(intAttr(attrs, "dim"))},
           ParamInit::Normal,
           1,
           floatAttr(attrs, "std")}};
}

} // namespace

void addLookups(Table& t) {
  OpInfo& embedding =
      t.add(OpKind::Embedding, "embedding",
            {tensor("tokens", "integer token ids"), integer("vocab", "number of rows"),
             integer("dim", "embedding width"),
             optFloat("std", 1, "standard deviation of the initial values")},
            SplitRule::Vocab, "learned lookup table", "tokens: i32[...] -> f32[..., dim]");
  embedding.infer = inferEmbedding;
  embedding.params = embeddingParams;
  embedding.needsInputs = true;
  embedding.cut = "vocab";

  OpInfo& positions =
      t.add(OpKind::Positions, "positions",
            {integer("seq", "positions"), integer("dim", "width"),
             optFloat("std", 1, "standard deviation of the initial values")},
            SplitRule::Replicated, "learned position embedding, added to a [B, seq, dim] input",
            "-> f32[seq, dim]");
  positions.infer = inferPositions;
  positions.params = positionsParams;
}

} // namespace epl::ir::ops
