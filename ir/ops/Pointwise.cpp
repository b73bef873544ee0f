// Elementwise and row-wise ops without parameters: the activations, softmax, dropout and
// arithmetic (add, sub and mul broadcast as NumPy does).
#include "ir/ops/Family.h"

#include <fmt/format.h>

namespace epl::ir::ops {

namespace {

// Right-aligned broadcasting of two shapes, as in NumPy.
bool broadcast(const Shape& a, const Shape& b, Shape& out) {
  size_t n = std::max(a.size(), b.size());
  out.assign(n, constant(1));
  for (size_t i = 0; i < n; ++i) {
    const Dim* da = i < a.size() ? &a[a.size() - 1 - i] : nullptr;
    const Dim* db = i < b.size() ? &b[b.size() - 1 - i] : nullptr;
    Dim& o = out[n - 1 - i];
    if (!da)
      o = *db;
    else if (!db)
      o = *da;
    else if (*da == *db)
      o = *da;
    else if (*da == constant(1))
      o = *db;
    else if (*db == constant(1))
      o = *da;
    else
      return false;
  }
  return true;
}

std::string inferFloat(const OpInfo& op, const std::vector<TensorType>& in, const Attrs&,
                       std::vector<TensorType>& out) {
  std::string err = needFloat(op.name, in[0]);
  if (!err.empty()) return err;
  out.push_back(in[0]);
  return "";
}

std::string inferDropout(const OpInfo&, const std::vector<TensorType>& in, const Attrs& attrs,
                         std::vector<TensorType>& out) {
  double p = floatAttr(attrs, "p");
  if (p < 0 || p >= 1) return fmt::format("`dropout` p must be in [0, 1), got {}", p);
  out.push_back(in[0]);
  return "";
}

std::string inferBinary(const OpInfo& op, const std::vector<TensorType>& in, const Attrs&,
                        std::vector<TensorType>& out) {
  const char* s = op.kind == OpKind::Add ? "+" : op.kind == OpKind::Sub ? "-" : "*";
  if (in[0].dtype != in[1].dtype)
    return fmt::format("`{}` needs tensors of one dtype, got {} and {}", s, tensorStr(in[0]),
                       tensorStr(in[1]));
  Shape b;
  if (!broadcast(in[0].shape, in[1].shape, b))
    return fmt::format("shape mismatch: cannot apply `{}` to {} and {}", s, tensorStr(in[0]),
                       tensorStr(in[1]));
  out.push_back(TensorType{in[0].dtype, b});
  return "";
}

} // namespace

void addPointwise(Table& t) {
  using S = SplitRule;
  // The backward of each: what it reads (the input, the output or nothing) is its
  // derivative's argument.
  OpInfo& gelu =
      t.add(OpKind::Gelu, "gelu",
            {x(), optWord("approx", "tanh", {"tanh", "none"},
                          "tanh: the tanh approximation; none: exact, x Phi(x) with erf")},
            S::Elementwise, "GELU (tanh approximation by default)", "same shape");
  gelu.infer = inferFloat;
  gelu.needsInputs = true;
  OpInfo& relu = t.add(OpKind::Relu, "relu", {x()}, S::Elementwise, "max(x, 0)", "same shape");
  relu.infer = inferFloat;
  relu.needsOutput = true;
  OpInfo& silu = t.add(OpKind::Silu, "silu", {x()}, S::Elementwise, "x * sigmoid(x)", "same shape");
  silu.infer = inferFloat;
  silu.needsInputs = true;
  OpInfo& tanh =
      t.add(OpKind::Tanh, "tanh", {x()}, S::Elementwise, "hyperbolic tangent", "same shape");
  tanh.infer = inferFloat;
  tanh.needsOutput = true;
  OpInfo& sigmoid =
      t.add(OpKind::Sigmoid, "sigmoid", {x()}, S::Elementwise, "logistic function", "same shape");
  sigmoid.infer = inferFloat;
  sigmoid.needsOutput = true;
  OpInfo& softmax = t.add(OpKind::Softmax, "softmax", {x()}, S::RowWise,
                          "softmax over the last dim", "same shape");
  softmax.infer = rowWiseRule();
  softmax.needsOutput = true;
  OpInfo& dropout = t.add(OpKind::Dropout, "dropout",
                          {x(), optFloat("p", 0.1, "probability of zeroing, in [0, 1)")},
                          S::Elementwise, "seeded dropout, identity in evaluation", "same shape");
  dropout.infer = inferDropout; // its backward draws the mask again from the same seed

  OpInfo& add =
      t.add(OpKind::Add, "add", {tensor("a", "left"), tensor("b", "right")}, S::Elementwise,
            "elementwise sum with broadcasting, also written a + b", "broadcast shape");
  add.infer = inferBinary;
  add.halfAsStored = true;
  OpInfo& sub =
      t.add(OpKind::Sub, "sub", {tensor("a", "left"), tensor("b", "right")}, S::Elementwise,
            "elementwise difference with broadcasting, also written a - b", "broadcast shape");
  sub.infer = inferBinary;
  OpInfo& mul =
      t.add(OpKind::Mul, "mul", {tensor("a", "left"), tensor("b", "right")}, S::Elementwise,
            "elementwise product with broadcasting, also written a * b", "broadcast shape");
  mul.infer = inferBinary;
  mul.needsInputs = true;
  OpInfo& scale = t.add(OpKind::Scale, "scale", {x(), optFloat("factor", 1.0, "multiplier")},
                        S::Elementwise, "multiply by a number, also written x * 0.5", "same shape");
  scale.infer = inferFloat;
}

} // namespace epl::ir::ops
