// linear and mlp: the matrix-multiplying layers of width D in, out (or F hidden) across.
#include "ir/ops/Family.h"

namespace epl::ir::ops {

namespace {

std::string inferLinear(const OpInfo& op, const std::vector<TensorType>& in, const Attrs& attrs,
                        std::vector<TensorType>& out) {
  int64_t d = 0, n = intAttr(attrs, "out");
  std::string err;
  if (!(err = knownLast(op.name, in[0], d)).empty() || !(err = needFloat(op.name, in[0])).empty() ||
      !(err = positive(op.name, "out", n)).empty())
    return err;
  Shape s = in[0].shape;
  s.back() = constant(n);
  out.push_back(TensorType{in[0].dtype, s});
  return "";
}

std::vector<ParamSpec> linearParams(const std::vector<TensorType>& in, const Attrs& attrs) {
  int64_t d = lastWidth(in), n = intAttr(attrs, "out");
  std::vector<ParamSpec> p{{"weight", {constant(n), constant(d)}, ParamInit::Uniform, d}};
  if (std::get<bool>(attrs.at("bias"))) p.push_back({"bias", {constant(n)}, ParamInit::Uniform, d});
  return p;
}

// x [N, D] by W^T [D, out], W [out, D].
std::vector<Product> linearProducts(const std::vector<Sizes>& in, const std::vector<Sizes>& params,
                                    const Sizes&, const Attrs&) {
  return {{rowsOf(in[0]), static_cast<double>(params[0][0]), static_cast<double>(params[0][1])}};
}

std::string inferMlp(const OpInfo& op, const std::vector<TensorType>& in, const Attrs& attrs,
                     std::vector<TensorType>& out) {
  int64_t d = 0;
  std::string err;
  if (!(err = knownLast(op.name, in[0], d)).empty() || !(err = needFloat(op.name, in[0])).empty() ||
      !(err = positive(op.name, "hidden", intAttr(attrs, "hidden"))).empty())
    return err;
  out.push_back(in[0]);
  return "";
}

std::vector<ParamSpec> mlpParams(const std::vector<TensorType>& in, const Attrs& attrs) {
  int64_t d = lastWidth(in), f = intAttr(attrs, "hidden");
  return {{"fc1_weight", {constant(f), constant(d)}, ParamInit::Uniform, d},
          {"fc1_bias", {constant(f)}, ParamInit::Uniform, d},
          {"fc2_weight", {constant(d), constant(f)}, ParamInit::Uniform, f},
          {"fc2_bias", {constant(d)}, ParamInit::Uniform, f}};
}

// x [N, D] by W1^T [D, F], then [N, F] by W2^T [F, D]; W1 [F, D].
std::vector<Product> mlpProducts(const std::vector<Sizes>& in, const std::vector<Sizes>& params,
                                 const Sizes&, const Attrs&) {
  double rows = rowsOf(in[0]), f = static_cast<double>(params[0][0]),
         d = static_cast<double>(params[0][1]);
  return {{rows, f, d}, {rows, d, f}};
}

} // namespace

void addDense(Table& t) {
  OpInfo& linear =
      t.add(OpKind::Linear, "linear",
            {x(), integer("out", "output width"), optBool("bias", true, "add a bias"),
             optName("tie", "an earlier layer whose `weight` this one shares")},
            SplitRule::Linear, "affine map y = x W^T + b", "x: [..., D] -> [..., out]");
  linear.infer = inferLinear;
  linear.params = linearParams;
  linear.products = linearProducts;
  linear.needsInputs = true;
  linear.cut = "out";
  linear.outputBias = "bias";
  linear.castsWeights = true;
  linear.halfOutputByRows = true;

  OpInfo& mlp =
      t.add(OpKind::Mlp, "mlp",
            {x(), integer("hidden", "hidden width F"),
             optWord("act", "gelu", {"gelu", "gelu_exact", "relu", "silu"},
                     "activation between the two linears (gelu: tanh form; gelu_exact: with erf)")},
            SplitRule::Hidden, "two linears with an activation between", "x: [..., D] -> [..., D]");
  mlp.infer = inferMlp;
  mlp.params = mlpParams;
  mlp.saved = hiddenSaved;
  mlp.savedCount = 1;
  mlp.activationSaved = 1;
  mlp.products = mlpProducts;
  mlp.needsInputs = true;
  mlp.cut = "hidden";
  mlp.outputBias = "fc2_bias";
  mlp.castsWeights = true;
}

} // namespace epl::ir::ops
