// moe: a call (the builtin) becomes four ops in the order they run (docs/language.md,
// "moe"): the router's softmax gates; each token's top-k experts under the capacity, its
// copies grouped by expert; each expert's mlp over its rows; the rows weighted back into
// their tokens.
#include "ir/ops/Family.h"

#include "support/Assert.h"

#include <fmt/format.h>

namespace epl::ir::ops {

namespace {

// The dispatched rows for tokens x [B, ..., D]: [B, R k, D], R the dims between the batch
// and the width (1 for [B, D]); nullopt past 2^63 - 1.
std::optional<Shape> moeRows(const TensorType& x, int64_t k) {
  std::optional<Dim> r = product(Shape(x.shape.begin() + 1, x.shape.end() - 1));
  if (r) r = r->times(constant(k));
  if (!r) return std::nullopt;
  return Shape{x.shape[0], *r, x.shape.back()};
}

std::string inferMoe(const OpInfo& op, const std::vector<TensorType>& in, const Attrs& attrs,
                     std::vector<TensorType>& out) {
  int64_t d = 0, e = intAttr(attrs, "experts"), k = intAttr(attrs, "top_k");
  std::string err;
  if (!(err = knownLast(op.name, in[0], d)).empty() ||
      !(err = positive(op.name, "experts", e)).empty() ||
      !(err = positive(op.name, "hidden", intAttr(attrs, "hidden"))).empty() ||
      !(err = positive(op.name, "top_k", k)).empty())
    return err;
  if (k > e) return fmt::format("`moe` top_k ({}) cannot exceed experts ({})", k, e);
  if (in[0].shape.size() < 2)
    return fmt::format("`moe` needs tokens [B, ..., D], got {}", tensorStr(in[0]));
  if (floatAttr(attrs, "capacity_factor") < 0)
    return "`moe` argument `capacity_factor` must not be negative (0: no limit)";
  if (floatAttr(attrs, "aux_weight") < 0) return "`moe` argument `aux_weight` must not be negative";
  if (!moeRows(in[0], k))
    return fmt::format("`moe` tokens {} x top_k {} pass 2^63 - 1", tensorStr(in[0]), k);
  out.push_back(in[0]);
  return "";
}

std::vector<ParamSpec> expertParams(const std::vector<TensorType>& in, const Attrs& attrs) {
  int64_t d = lastWidth(in), e = intAttr(attrs, "experts"), f = intAttr(attrs, "hidden");
  auto u = ParamInit::Uniform; // each expert's input width: D, then F
  return {{"fc1_weight", {constant(e), constant(f), constant(d)}, u, d},
          {"fc1_bias", {constant(e), constant(f)}, u, d},
          {"fc2_weight", {constant(e), constant(d), constant(f)}, u, f},
          {"fc2_bias", {constant(e), constant(d)}, u, f}};
}

// The router's weight is named as the moe call's (frontend, emitMoe).
std::vector<ParamSpec> routerParams(const std::vector<TensorType>& in, const Attrs& attrs) {
  return {{"router_weight",
           {constant(intAttr(attrs, "experts")), constant(lastWidth(in))},
           ParamInit::Uniform,
           lastWidth(in)}};
}

std::vector<ParamSpec> moeParams(const std::vector<TensorType>& in, const Attrs& attrs) {
  std::vector<ParamSpec> p = routerParams(in, attrs);
  for (ParamSpec& s : expertParams(in, attrs))
    p.push_back(std::move(s));
  return p;
}

std::string inferRouter(const OpInfo&, const std::vector<TensorType>& in, const Attrs& attrs,
                        std::vector<TensorType>& out) {
  Shape s = in[0].shape;
  s.back() = constant(intAttr(attrs, "experts"));
  out.push_back(TensorType{in[0].dtype, s});
  return "";
}

// x [N, D] by Wr^T [D, E], Wr [E, D].
std::vector<Product> routerProducts(const std::vector<Sizes>& in, const std::vector<Sizes>& params,
                                    const Sizes&, const Attrs&) {
  return {{rowsOf(in[0]), static_cast<double>(params[0][0]), static_cast<double>(params[0][1])}};
}

std::string inferDispatch(const OpInfo&, const std::vector<TensorType>& in, const Attrs& attrs,
                          std::vector<TensorType>& out) {
  std::optional<Shape> rows = moeRows(in[0], intAttr(attrs, "top_k"));
  EPL_ASSERT(rows.has_value(), "the moe call's rule checked the rows' size");
  out.push_back(TensorType{in[0].dtype, *rows});
  out.push_back(TensorType{DType::I32, {constant(intAttr(attrs, "experts"))}});
  out.push_back(TensorType{DType::F32, {constant(4)}});
  return "";
}

// Every dispatched row (the capacity's padding included) through its expert's two
// linears, the rows shared evenly by this rank's El experts: [M / El, D] by [D, F] and
// [M / El, F] by [F, D] for each, W1 [El, F, D].
std::vector<Product> expertsProducts(const std::vector<Sizes>& in, const std::vector<Sizes>& params,
                                     const Sizes&, const Attrs&) {
  double experts = static_cast<double>(params[0][0]), f = static_cast<double>(params[0][1]),
         d = static_cast<double>(params[0][2]), rows = rowsOf(in[0]) / experts;
  return {{rows, f, d, experts}, {rows, d, f, experts}};
}

std::string inferCombine(const OpInfo&, const std::vector<TensorType>& in, const Attrs&,
                         std::vector<TensorType>& out) {
  Shape s = in[1].shape;
  s.back() = in[0].shape.back();
  out.push_back(TensorType{in[0].dtype, s});
  return "";
}

std::vector<ArgSpec> routing() {
  return {integer("experts", "number of experts E"),
          optInt("top_k", 2, "experts each token is routed to"),
          optFloat("capacity_factor", 0.0, "see moe"), optFloat("aux_weight", 0.01, "see moe")};
}

} // namespace

void addMoe(Table& t) {
  OpInfo& moe = t.add(
      OpKind::Moe, "moe",
      {x(), integer("experts", "number of experts E"), integer("hidden", "expert hidden width F"),
       optInt("top_k", 2, "experts each token is routed to"),
       optFloat("capacity_factor", 0.0,
                "rows each expert takes per sample: factor x tokens x top_k / E; 0: no limit"),
       optFloat("aux_weight", 0.01, "weight of the load-balancing loss (Switch Transformer)")},
      SplitRule::Experts,
      "mixture of experts: a linear router, top-k routing under a capacity, E gelu mlps and "
      "a load-balancing loss",
      "x: [B, ..., D] -> [B, ..., D]");
  moe.infer = inferMoe;
  moe.params = moeParams;
  moe.differentiable = false; // a call becomes the four ops below
  moe.cut = "experts";

  OpInfo& router = t.add(OpKind::MoeRouter, "moe_router",
                         {x(), integer("experts", "number of experts E")}, SplitRule::Tokens,
                         "moe's router: softmax(x Wr^T)", "x: [..., D] -> gates [..., E]", false);
  router.infer = inferRouter;
  router.params = routerParams;
  router.products = routerProducts;
  router.needsInputs = true;
  router.needsOutput = true;

  std::vector<ArgSpec> a{x(), tensor("gates", "the router's gates")};
  for (ArgSpec& r : routing())
    a.push_back(std::move(r));
  OpInfo& dispatch = t.add(
      OpKind::MoeDispatch, "moe_dispatch", a, SplitRule::Tokens,
      "moe's routing: each token's top-k experts under the capacity, copies grouped by expert",
      "x: [B, ..., D], gates [B, ..., E] -> rows [B, R k, D], counts i32[E], stats f32[4]", false);
  dispatch.infer = inferDispatch;
  dispatch.outputs = 3;
  dispatch.needsInputs = true; // the routing is recomputed from the gates

  a[0] = tensor("rows", "the expert outputs, grouped as dispatched");
  OpInfo& combine =
      t.add(OpKind::MoeCombine, "moe_combine", a, SplitRule::Tokens,
            "moe's combine: each token's expert outputs weighted by its renormalised gates",
            "rows [B, R k, D], gates [B, ..., E] -> [B, ..., D]", false);
  combine.infer = inferCombine;
  combine.needsInputs = true;

  OpInfo& experts = t.add(
      OpKind::MoeExperts, "moe_experts",
      {tensor("rows", "token copies grouped by expert"), tensor("counts", "rows of each expert"),
       integer("experts", "number of experts E"), integer("hidden", "expert hidden width F")},
      SplitRule::Experts, "moe's experts: E gelu mlps, each over its rows",
      "rows [B, R k, D], counts i32[E] -> [B, R k, D]", false);
  experts.infer = sameAsInput;
  experts.params = expertParams;
  experts.saved = hiddenSaved;
  experts.savedCount = 1;
  experts.activationSaved = 1;
  experts.products = expertsProducts;
  experts.needsInputs = true;
  experts.cut = "experts";
  experts.castsWeights = true;
}

} // namespace epl::ir::ops
