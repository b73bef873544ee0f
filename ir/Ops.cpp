// The builtin op table (signatures, split rules, parameter shapes); shape rules are in
// ShapeRules.cpp.
//
// Shape legend: B batch, T time, D width, H heads, V vocab, C channels, E experts,
// F hidden width, K kernel.
#include "ir/Ops.h"

#include "support/Assert.h"

#include <algorithm>
#include <fmt/format.h>

namespace epl::ir {

namespace {

ArgSpec tensor(std::string name, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Tensor, true, int64_t{0}, {}, std::move(doc)};
}
ArgSpec integer(std::string name, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Int, true, int64_t{0}, {}, std::move(doc)};
}
ArgSpec optInt(std::string name, int64_t def, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Int, false, def, {}, std::move(doc)};
}
ArgSpec optFloat(std::string name, double def, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Float, false, def, {}, std::move(doc)};
}
ArgSpec optBool(std::string name, bool def, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Bool, false, def, {}, std::move(doc)};
}
ArgSpec optWord(std::string name, std::string def, std::vector<std::string> words,
                std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Word, false, def, std::move(words), std::move(doc)};
}

std::vector<OpInfo> buildTable() {
  using K = OpKind;
  using S = SplitRule;
  auto x = [] { return tensor("x", "input tensor"); };
  std::vector<OpInfo> t;
  auto add = [&](K k, std::string name, std::vector<ArgSpec> args, S split, std::string summary,
                 std::string shapes) {
    t.push_back(OpInfo{k, std::move(name), std::move(args), split, true, std::move(summary),
                       std::move(shapes)});
  };
  add(K::Linear, "linear",
      {x(), integer("out", "output width"), optBool("bias", true, "add a bias")}, S::Linear,
      "affine map y = x W^T + b", "x: [..., D] -> [..., out]");
  add(K::Embedding, "embedding",
      {tensor("tokens", "integer token ids"), integer("vocab", "number of rows"),
       integer("dim", "embedding width")},
      S::Vocab, "learned lookup table", "tokens: i32[...] -> f32[..., dim]");
  add(K::Positions, "positions", {integer("seq", "positions"), integer("dim", "width")},
      S::Replicated, "learned position embedding, added to a [B, seq, dim] input",
      "-> f32[seq, dim]");
  add(K::LayerNorm, "layer_norm", {x(), optFloat("eps", 1e-5, "added to the variance")}, S::RowWise,
      "layer normalisation over the last dim, with scale and shift", "x: [..., D] -> [..., D]");
  add(K::RmsNorm, "rms_norm", {x(), optFloat("eps", 1e-6, "added to the mean square")}, S::RowWise,
      "root-mean-square normalisation over the last dim, with scale", "x: [..., D] -> [..., D]");
  add(K::Attention, "attention",
      {x(), integer("heads", "attention heads, must divide D"),
       optBool("causal", true, "mask future positions"),
       optBool("bias", true, "add biases in the qkv and output projections")},
      S::Heads, "multi-head self-attention with fused qkv and output projections",
      "x: [B, T, D] -> [B, T, D]");
  add(K::Mlp, "mlp",
      {x(), integer("hidden", "hidden width F"),
       optWord("act", "gelu", {"gelu", "gelu_exact", "relu", "silu"},
               "activation between the two linears (gelu: tanh form; gelu_exact: with erf)")},
      S::Hidden, "two linears with an activation between", "x: [..., D] -> [..., D]");
  add(K::Moe, "moe",
      {x(), integer("experts", "number of experts E"), integer("hidden", "expert hidden width F"),
       optInt("top_k", 2, "experts each token is routed to"),
       optFloat("capacity_factor", 0.0,
                "rows each expert takes per sample: factor x tokens x top_k / E; 0: no limit"),
       optFloat("aux_weight", 0.01, "weight of the load-balancing loss (Switch Transformer)")},
      S::Experts,
      "mixture of experts: a linear router, top-k routing under a capacity, E gelu mlps and "
      "a load-balancing loss",
      "x: [B, ..., D] -> [B, ..., D]");
  auto moePart = [&](K k, std::string name, std::vector<ArgSpec> args, S split, std::string summary,
                     std::string shapes) {
    t.push_back(OpInfo{k, std::move(name), std::move(args), split, false, std::move(summary),
                       std::move(shapes)});
  };
  auto routing = [] {
    return std::vector<ArgSpec>{integer("experts", "number of experts E"),
                                optInt("top_k", 2, "experts each token is routed to"),
                                optFloat("capacity_factor", 0.0, "see moe"),
                                optFloat("aux_weight", 0.01, "see moe")};
  };
  moePart(K::MoeRouter, "moe_router", {x(), integer("experts", "number of experts E")}, S::Tokens,
          "moe's router: softmax(x Wr^T)", "x: [..., D] -> gates [..., E]");
  {
    std::vector<ArgSpec> a{x(), tensor("gates", "the router's gates")};
    for (auto& r : routing())
      a.push_back(r);
    moePart(K::MoeDispatch, "moe_dispatch", a, S::Tokens,
            "moe's routing: each token's top-k experts under the capacity, copies grouped by "
            "expert",
            "x: [B, ..., D], gates [B, ..., E] -> rows [B, R k, D], counts i32[E], stats f32[4]");
    a[0] = tensor("rows", "the expert outputs, grouped as dispatched");
    moePart(K::MoeCombine, "moe_combine", a, S::Tokens,
            "moe's combine: each token's expert outputs weighted by its renormalised gates",
            "rows [B, R k, D], gates [B, ..., E] -> [B, ..., D]");
  }
  moePart(K::MoeExperts, "moe_experts",
          {tensor("rows", "token copies grouped by expert"),
           tensor("counts", "rows of each expert"), integer("experts", "number of experts E"),
           integer("hidden", "expert hidden width F")},
          S::Experts, "moe's experts: E gelu mlps, each over its rows",
          "rows [B, R k, D], counts i32[E] -> [B, R k, D]");
  add(K::Conv2d, "conv2d",
      {x(), integer("channels", "output channels"), integer("kernel", "square kernel size K"),
       optInt("stride", 1, "step"), optInt("padding", 0, "zeros on each side"),
       optBool("bias", true, "add a bias")},
      S::Channels, "2-d convolution", "x: [B, C, H, W] -> [B, channels, H', W']");
  add(K::Gelu, "gelu",
      {x(), optWord("approx", "tanh", {"tanh", "none"},
                    "tanh: the tanh approximation; none: exact, x Phi(x) with erf")},
      S::Elementwise, "GELU (tanh approximation by default)", "same shape");
  add(K::Relu, "relu", {x()}, S::Elementwise, "max(x, 0)", "same shape");
  add(K::Silu, "silu", {x()}, S::Elementwise, "x * sigmoid(x)", "same shape");
  add(K::Tanh, "tanh", {x()}, S::Elementwise, "hyperbolic tangent", "same shape");
  add(K::Sigmoid, "sigmoid", {x()}, S::Elementwise, "logistic function", "same shape");
  add(K::Softmax, "softmax", {x()}, S::RowWise, "softmax over the last dim", "same shape");
  add(K::Dropout, "dropout", {x(), optFloat("p", 0.1, "probability of zeroing, in [0, 1)")},
      S::Elementwise, "seeded dropout, identity in evaluation", "same shape");
  add(K::MaxPool, "max_pool",
      {x(), integer("kernel", "window K"), optInt("stride", 0, "step; 0 means the kernel")},
      S::Elementwise, "2-d max pooling", "x: [B, C, H, W] -> [B, C, H', W']");
  add(K::AvgPool, "avg_pool",
      {x(), integer("kernel", "window K"), optInt("stride", 0, "step; 0 means the kernel")},
      S::Elementwise, "2-d average pooling", "x: [B, C, H, W] -> [B, C, H', W']");
  add(K::Add, "add", {tensor("a", "left"), tensor("b", "right")}, S::Elementwise,
      "elementwise sum with broadcasting, also written a + b", "broadcast shape");
  add(K::Sub, "sub", {tensor("a", "left"), tensor("b", "right")}, S::Elementwise,
      "elementwise difference with broadcasting, also written a - b", "broadcast shape");
  add(K::Mul, "mul", {tensor("a", "left"), tensor("b", "right")}, S::Elementwise,
      "elementwise product with broadcasting, also written a * b", "broadcast shape");
  add(K::Scale, "scale", {x(), optFloat("factor", 1.0, "multiplier")}, S::Elementwise,
      "multiply by a number, also written x * 0.5", "same shape");
  add(K::Flatten, "flatten", {x()}, S::Replicated, "keep the batch dim, flatten the rest",
      "x: [B, ...] -> [B, n]");
  add(K::Reshape, "reshape",
      {x(),
       ArgSpec{"shape", ArgKind::Dims, true, int64_t{0}, {}, "new shape, one entry may be -1"}},
      S::Replicated, "same elements, new shape", "x -> shape");
  add(K::Transpose, "transpose", {x(), integer("dim0", "first dim"), integer("dim1", "second dim")},
      S::Replicated, "swap two dims (negative counts from the end)", "swapped shape");
  add(K::Next, "next", {tensor("tokens", "token ids")}, S::Replicated,
      "next-token targets: element t is token t+1 of the sample's window",
      "tokens: i32[B, T] -> i32[B, T]");
  add(K::CrossEntropy, "cross_entropy",
      {tensor("logits", "unnormalised scores"), tensor("targets", "class ids")}, S::Vocab,
      "mean softmax cross-entropy (fused with log-softmax)",
      "logits: [..., V], targets: i32[...] -> f32[]");
  add(K::Mse, "mse", {tensor("pred", "prediction"), tensor("target", "target")}, S::Replicated,
      "mean squared error", "pred: [...], target: [...] -> f32[]");
  auto comm = [&](K k, std::string name, std::string summary) {
    t.push_back(OpInfo{
        k, std::move(name), {x()}, S::Communication, false, std::move(summary), "same shape"});
  };
  comm(K::AllGather, "all_gather", "gather the pieces of a tensor along a dim");
  comm(K::AllReduce, "all_reduce", "sum partial results");
  comm(K::ReduceScatter, "reduce_scatter", "sum partial results, keep this device's piece");
  t.push_back(OpInfo{K::AllToAll,
                     "all_to_all",
                     {tensor("rows", "moe's dispatched rows"), tensor("counts", "rows per expert")},
                     S::Communication,
                     false,
                     "move moe's rows to the devices of their experts, or back",
                     "rows, counts -> rows (and, dispatching, this device's experts' counts)"});
  comm(K::Slice, "slice", "keep this device's piece of a tensor (no transfer)");
  comm(K::SendRecv, "send_recv", "move an activation to the next stage");
  comm(K::Identity, "identity",
       "a whole tensor entering a split op; the backward sums the op's partial gradients");
  t.push_back(OpInfo{K::GradNorm,
                     "grad_norm",
                     {},
                     S::Replicated,
                     false,
                     "global L2 norm of the parameter gradients, for clipping",
                     "-> f32[]"});
  t.push_back(OpInfo{K::OptimizerStep,
                     "optimizer_step",
                     {},
                     S::Replicated,
                     false,
                     "update one parameter (and its optimizer state) from its gradient",
                     ""});
  return t;
}

} // namespace

int OpInfo::tensorArgs() const {
  int n = 0;
  for (const auto& a : args)
    n += a.kind == ArgKind::Tensor;
  return n;
}

const std::vector<OpInfo>& allOps() {
  static const std::vector<OpInfo> table = buildTable();
  return table;
}

OpKind builtinOf(OpKind kind) {
  switch (kind) {
  case OpKind::MoeRouter:
  case OpKind::MoeDispatch:
  case OpKind::MoeExperts:
  case OpKind::MoeCombine:
    return OpKind::Moe;
  default:
    return kind;
  }
}

const OpInfo& opInfo(OpKind kind) {
  for (const auto& i : allOps())
    if (i.kind == kind) return i;
  EPL_ASSERT(false, "op kind missing from the op table");
  std::abort();
}

std::string cutAttr(OpKind kind) {
  switch (kind) {
  case OpKind::Attention:
    return "heads";
  case OpKind::Mlp:
    return "hidden";
  case OpKind::Moe:
  case OpKind::MoeExperts:
    return "experts";
  case OpKind::Embedding:
    return "vocab";
  case OpKind::Linear:
    return "out";
  case OpKind::Conv2d:
    return "channels";
  default:
    return "";
  }
}

const OpInfo* findBuiltin(const std::string& name) {
  for (const auto& i : allOps())
    if (i.builtin && i.name == name) return &i;
  return nullptr;
}

int64_t intAttr(const Attrs& a, const std::string& key) {
  auto it = a.find(key);
  EPL_ASSERT(it != a.end() && std::holds_alternative<int64_t>(it->second), "missing int attribute");
  return std::get<int64_t>(it->second);
}
double floatAttr(const Attrs& a, const std::string& key) {
  auto it = a.find(key);
  EPL_ASSERT(it != a.end(), "missing float attribute");
  if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  EPL_ASSERT(std::holds_alternative<double>(it->second), "attribute is not a number");
  return std::get<double>(it->second);
}
std::string attrStr(const Attr& a) {
  if (auto* i = std::get_if<int64_t>(&a)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&a)) return fmt::format("{}", *d);
  if (auto* b = std::get_if<bool>(&a)) return *b ? "true" : "false";
  if (auto* s = std::get_if<std::string>(&a)) return *s;
  return shapeStr(std::get<Shape>(a));
}

std::vector<ParamSpec> paramSpecs(OpKind kind, const std::vector<TensorType>& in,
                                  const Attrs& attrs) {
  using K = OpKind;
  auto c = [](int64_t v) { return Dim::constant(v); };
  auto last = [&] { return in.empty() || in[0].shape.empty() ? 0 : in[0].shape.back().coef; };
  switch (kind) {
  case K::Linear: {
    int64_t d = last(), n = intAttr(attrs, "out");
    std::vector<ParamSpec> p{{"weight", {c(n), c(d)}}};
    if (std::get<bool>(attrs.at("bias"))) p.push_back({"bias", {c(n)}});
    return p;
  }
  case K::Embedding:
    return {{"weight", {c(intAttr(attrs, "vocab")), c(intAttr(attrs, "dim"))}}};
  case K::Positions:
    return {{"weight", {c(intAttr(attrs, "seq")), c(intAttr(attrs, "dim"))}}};
  case K::LayerNorm:
    return {{"weight", {c(last())}}, {"bias", {c(last())}}};
  case K::RmsNorm:
    return {{"weight", {c(last())}}};
  case K::Attention: {
    int64_t d = last();
    if (!std::get<bool>(attrs.at("bias")))
      return {{"qkv_weight", {c(3 * d), c(d)}}, {"proj_weight", {c(d), c(d)}}};
    return {{"qkv_weight", {c(3 * d), c(d)}},
            {"qkv_bias", {c(3 * d)}},
            {"proj_weight", {c(d), c(d)}},
            {"proj_bias", {c(d)}}};
  }
  case K::Mlp: {
    int64_t d = last(), f = intAttr(attrs, "hidden");
    return {{"fc1_weight", {c(f), c(d)}},
            {"fc1_bias", {c(f)}},
            {"fc2_weight", {c(d), c(f)}},
            {"fc2_bias", {c(d)}}};
  }
  case K::Moe: {
    int64_t d = last(), e = intAttr(attrs, "experts"), f = intAttr(attrs, "hidden");
    return {{"router_weight", {c(e), c(d)}},
            {"fc1_weight", {c(e), c(f), c(d)}},
            {"fc1_bias", {c(e), c(f)}},
            {"fc2_weight", {c(e), c(d), c(f)}},
            {"fc2_bias", {c(e), c(d)}}};
  }
  case K::MoeRouter: // named as the moe call's (frontend, emitMoe)
    return {{"router_weight", {c(intAttr(attrs, "experts")), c(last())}}};
  case K::MoeExperts: {
    int64_t d = last(), e = intAttr(attrs, "experts"), f = intAttr(attrs, "hidden");
    return {{"fc1_weight", {c(e), c(f), c(d)}},
            {"fc1_bias", {c(e), c(f)}},
            {"fc2_weight", {c(e), c(d), c(f)}},
            {"fc2_bias", {c(e), c(d)}}};
  }
  case K::Conv2d: {
    int64_t ch = intAttr(attrs, "channels"), k = intAttr(attrs, "kernel");
    int64_t inC = in[0].shape[1].coef;
    std::vector<ParamSpec> p{{"weight", {c(ch), c(inC), c(k), c(k)}}};
    if (std::get<bool>(attrs.at("bias"))) p.push_back({"bias", {c(ch)}});
    return p;
  }
  default:
    return {};
  }
}

} // namespace epl::ir
