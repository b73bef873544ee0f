// Backward needs of every builtin op (see GradRules.h for the saved tensors' meaning).
#include "ir/GradRules.h"

#include "support/Assert.h"

namespace epl::ir {

namespace {

Shape allButLast(const Shape& s) {
  return Shape(s.begin(), s.end() - (s.empty() ? 0 : 1));
}

TensorType f32(Shape s) {
  return TensorType{DType::F32, std::move(s)};
}

} // namespace

GradInfo gradInfo(OpKind kind, const std::vector<TensorType>& in, const Attrs& attrs) {
  using K = OpKind;
  GradInfo g;
  auto c = [](int64_t v) { return Dim::constant(v); };
  const Shape x = in.empty() ? Shape{} : in[0].shape;
  switch (kind) {
  case K::Linear:
  case K::Embedding:
  case K::Conv2d:
  case K::Gelu:
  case K::Silu:
  case K::Mul:
  case K::Mse:
    g.needsInputs = true;
    break;
  case K::Positions:
  case K::Dropout: // the mask is drawn again from the same seed
  case K::AvgPool:
  case K::Add:
  case K::Sub:
  case K::Scale:
  case K::Flatten:
  case K::Reshape:
  case K::Transpose:
    break;
  case K::Relu:
  case K::Tanh:
  case K::Sigmoid:
  case K::Softmax:
    g.needsOutput = true;
    break;
  case K::LayerNorm:
    g.needsInputs = true;
    g.saved = {f32(allButLast(x)), f32(allButLast(x))};
    break;
  case K::RmsNorm:
    g.needsInputs = true;
    g.saved = {f32(allButLast(x))};
    break;
  case K::Attention: {
    EPL_ASSERT(x.size() == 3, "attention input must be [B, T, D]");
    g.needsInputs = true;
    std::optional<Dim> qkv = x[2].times(c(3));
    EPL_ASSERT(qkv.has_value(), "the attention shape rule refuses widths past (2^63 - 1) / 3");
    g.saved = {f32({x[0], x[1], *qkv}), f32(x), f32({x[0], c(intAttr(attrs, "heads")), x[1]})};
    break;
  }
  case K::Mlp: {
    g.needsInputs = true;
    Shape h = allButLast(x);
    h.push_back(c(intAttr(attrs, "hidden")));
    g.saved = {f32(h)};
    break;
  }
  case K::Moe: // a call becomes the four ops below
    g.differentiable = false;
    break;
  case K::MoeRouter:
    g.needsInputs = true;
    g.needsOutput = true;
    break;
  case K::MoeDispatch: // the routing is recomputed from the gates
  case K::MoeCombine:
    g.needsInputs = true;
    break;
  case K::MoeExperts: {
    g.needsInputs = true;
    Shape h = allButLast(x);
    h.push_back(c(intAttr(attrs, "hidden")));
    g.saved = {f32(h)};
    break;
  }
  case K::MaxPool:
    g.saved = {TensorType{DType::I32, {}}}; // shape filled below from the output
    break;
  case K::CrossEntropy:
    g.needsInputs = true;
    g.saved = {f32(allButLast(x))};
    break;
  case K::Next:
  case K::GradNorm:
  case K::OptimizerStep:
    g.differentiable = false;
    break;
  case K::AllGather: // the backward of a bridge is the transposed bridge (reduce-scatter
  case K::AllReduce: // for an all-gather, …), chosen where per-rank streams are built;
  case K::ReduceScatter:
  case K::AllToAll: // it reads nothing saved
  case K::Slice:
  case K::SendRecv:
  case K::Identity:
    break;
  }
  if (kind == K::MaxPool) {
    std::vector<TensorType> out;
    inferTypes(kind, in, attrs, out);
    g.saved[0].shape = out.at(0).shape;
  }
  return g;
}

} // namespace epl::ir
