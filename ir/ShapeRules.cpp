// Shape rules: the output types of every op from its input types and attributes.
//
// Shape legend: B batch, T time, D width, H heads, V vocab, C channels, E experts,
// F hidden width, K kernel.
#include "ir/Ops.h"
#include "support/Assert.h"

#include "support/Checked.h"

#include <algorithm>
#include <fmt/format.h>

namespace epl::ir {

namespace {

std::string tensorStr(const TensorType& t) {
  return "`" + t.str() + "`";
}

// Right-aligned broadcasting of two shapes, as in NumPy.
bool broadcast(const Shape& a, const Shape& b, Shape& out) {
  size_t n = std::max(a.size(), b.size());
  out.assign(n, Dim::constant(1));
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
    else if (*da == Dim::constant(1))
      o = *db;
    else if (*db == Dim::constant(1))
      o = *da;
    else
      return false;
  }
  return true;
}

// The last dim as a known integer, or an error naming the op.
std::string knownLast(const std::string& op, const TensorType& t, int64_t& v) {
  if (t.shape.empty())
    return fmt::format("`{}` needs an input with at least one dim, got {}", op, tensorStr(t));
  const Dim& d = t.shape.back();
  if (!d.isConstant())
    return fmt::format("`{}` needs a known input width, but the last dim of {} is `{}`", op,
                       tensorStr(t), d.str());
  v = d.coef;
  return "";
}

std::string needFloat(const std::string& op, const TensorType& t) {
  if (isIntegral(t.dtype))
    return fmt::format("`{}` needs a floating-point tensor, got {}", op, tensorStr(t));
  return "";
}

std::string positive(const std::string& op, const std::string& arg, int64_t v) {
  if (v <= 0) return fmt::format("`{}` argument `{}` must be positive, got {}", op, arg, v);
  return "";
}

// The output side of a convolution or pooling window: (n + 2 x pad - k) / stride + 1.
// nullopt when the kernel does not fit; `tooLarge` when n + 2 x pad passes 2^63 - 1.
std::optional<int64_t> windowOutput(int64_t n, int64_t k, int64_t stride, int64_t pad,
                                    bool& tooLarge) {
  std::optional<int64_t> padded = checkedMul(pad, 2);
  if (padded) padded = checkedAdd(n, *padded);
  tooLarge = !padded;
  if (!padded || *padded < k) return std::nullopt;
  return (*padded - k) / stride + 1;
}

std::string inferImage(const std::string& op, const TensorType& x, int64_t outC, int64_t k,
                       int64_t stride, int64_t pad, std::vector<TensorType>& out) {
  if (x.shape.size() != 4)
    return fmt::format("`{}` needs a [B, C, H, W] input, got {}", op, tensorStr(x));
  if (!x.shape[2].isConstant() || !x.shape[3].isConstant())
    return fmt::format("`{}` needs known height and width, got {}", op, tensorStr(x));
  Shape s = x.shape;
  for (int i : {2, 3}) {
    bool tooLarge = false;
    std::optional<int64_t> v = windowOutput(x.shape[i].coef, k, stride, pad, tooLarge);
    if (tooLarge)
      return fmt::format("`{}` padding {} makes the input too large: more than 2^63 - 1", op, pad);
    if (!v)
      return fmt::format("`{}` kernel {} does not fit the {}x{} input of {}", op, k,
                         x.shape[2].coef, x.shape[3].coef, tensorStr(x));
    s[i] = Dim::constant(*v);
  }
  if (outC > 0) s[1] = Dim::constant(outC);
  out.push_back(TensorType{x.dtype, s});
  return "";
}

// The product of dims, or nullopt when its constant passes 2^63 - 1.
std::optional<Dim> product(const Shape& dims) {
  std::optional<Dim> p = Dim::constant(1);
  for (size_t i = 0; i < dims.size() && p; ++i)
    p = p->times(dims[i]);
  return p;
}

// moe's dispatched rows for tokens x [B, ..., D]: [B, R k, D], R the dims between the
// batch and the width (1 for [B, D]); nullopt past 2^63 - 1.
std::optional<Shape> moeRows(const TensorType& x, int64_t k) {
  std::optional<Dim> r = product(Shape(x.shape.begin() + 1, x.shape.end() - 1));
  if (r) r = r->times(Dim::constant(k));
  if (!r) return std::nullopt;
  return Shape{x.shape[0], *r, x.shape.back()};
}

std::string inferReshape(const TensorType& x, const Shape& target, std::vector<TensorType>& out) {
  Shape given;
  int wild = -1;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == Dim::constant(-1)) {
      if (wild >= 0) return "`reshape` allows at most one -1 entry";
      wild = static_cast<int>(i);
    } else if (target[i].coef <= 0) {
      return fmt::format("`reshape` entries must be positive or -1, got {}", target[i].str());
    } else {
      given.push_back(target[i]);
    }
  }
  std::optional<Dim> known = product(given), total = product(x.shape);
  if (!known)
    return fmt::format("`reshape` to {} has more than 2^63 - 1 elements", shapeStr(target));
  if (!total) return fmt::format("`reshape` of {} has too many elements", tensorStr(x));
  Shape s = target;
  if (wild >= 0) {
    // total / known must be a monomial: divide constants, cancel symbols.
    std::vector<std::string> syms = total->syms;
    for (const auto& sym : known->syms) {
      auto it = std::find(syms.begin(), syms.end(), sym);
      if (it == syms.end())
        return fmt::format("`reshape` cannot fit {} into {}", tensorStr(x), shapeStr(target));
      syms.erase(it);
    }
    if (total->coef % known->coef != 0)
      return fmt::format("`reshape` cannot fit {} into {}", tensorStr(x), shapeStr(target));
    s[wild] = Dim{total->coef / known->coef, syms};
  } else if (*known != *total) {
    return fmt::format("`reshape` cannot fit {} ({} elements) into {}", tensorStr(x), total->str(),
                       shapeStr(target));
  }
  out.push_back(TensorType{x.dtype, s});
  return "";
}

} // namespace

std::string inferTypes(OpKind kind, const std::vector<TensorType>& in, const Attrs& attrs,
                       std::vector<TensorType>& out) {
  using K = OpKind;
  const std::string& op = opInfo(kind).name;
  out.clear();
  std::string err;
  auto fail = [&](std::string e) {
    out.clear();
    return e;
  };
  switch (kind) {
  case K::Linear: {
    int64_t d = 0, n = intAttr(attrs, "out");
    if (!(err = knownLast(op, in[0], d)).empty() || !(err = needFloat(op, in[0])).empty() ||
        !(err = positive(op, "out", n)).empty())
      return fail(err);
    Shape s = in[0].shape;
    s.back() = Dim::constant(n);
    out.push_back(TensorType{in[0].dtype, s});
    return "";
  }
  case K::Embedding: {
    if (!isIntegral(in[0].dtype))
      return fail(fmt::format("`embedding` needs integer token ids, got {}", tensorStr(in[0])));
    if (!(err = positive(op, "vocab", intAttr(attrs, "vocab"))).empty() ||
        !(err = positive(op, "dim", intAttr(attrs, "dim"))).empty())
      return fail(err);
    Shape s = in[0].shape;
    s.push_back(Dim::constant(intAttr(attrs, "dim")));
    out.push_back(TensorType{DType::F32, s});
    return "";
  }
  case K::Positions: {
    int64_t seq = intAttr(attrs, "seq"), dim = intAttr(attrs, "dim");
    if (!(err = positive(op, "seq", seq)).empty() || !(err = positive(op, "dim", dim)).empty())
      return fail(err);
    out.push_back(TensorType{DType::F32, {Dim::constant(seq), Dim::constant(dim)}});
    return "";
  }
  case K::LayerNorm:
  case K::RmsNorm:
  case K::Softmax: {
    int64_t d = 0;
    if (!(err = knownLast(op, in[0], d)).empty() || !(err = needFloat(op, in[0])).empty())
      return fail(err);
    out.push_back(in[0]);
    return "";
  }
  case K::Attention: {
    int64_t d = 0, h = intAttr(attrs, "heads");
    if (in[0].shape.size() != 3)
      return fail(fmt::format("`attention` needs a [B, T, D] input, got {}", tensorStr(in[0])));
    if (!(err = knownLast(op, in[0], d)).empty() || !(err = positive(op, "heads", h)).empty())
      return fail(err);
    if (d % h != 0)
      return fail(fmt::format("attention width ({}) must be divisible by heads ({})", d, h));
    if (!checkedMul(d, 3)) // the fused q, k, v projection is 3 x d wide
      return fail(fmt::format("attention width ({}) is too large: 3 x {} passes 2^63 - 1", d, d));
    out.push_back(in[0]);
    return "";
  }
  case K::Mlp: {
    int64_t d = 0;
    if (!(err = knownLast(op, in[0], d)).empty() || !(err = needFloat(op, in[0])).empty() ||
        !(err = positive(op, "hidden", intAttr(attrs, "hidden"))).empty())
      return fail(err);
    out.push_back(in[0]);
    return "";
  }
  case K::Moe: {
    int64_t d = 0, e = intAttr(attrs, "experts"), k = intAttr(attrs, "top_k");
    if (!(err = knownLast(op, in[0], d)).empty() || !(err = positive(op, "experts", e)).empty() ||
        !(err = positive(op, "hidden", intAttr(attrs, "hidden"))).empty() ||
        !(err = positive(op, "top_k", k)).empty())
      return fail(err);
    if (k > e) return fail(fmt::format("`moe` top_k ({}) cannot exceed experts ({})", k, e));
    if (in[0].shape.size() < 2)
      return fail(fmt::format("`moe` needs tokens [B, ..., D], got {}", tensorStr(in[0])));
    if (floatAttr(attrs, "capacity_factor") < 0)
      return fail("`moe` argument `capacity_factor` must not be negative (0: no limit)");
    if (floatAttr(attrs, "aux_weight") < 0)
      return fail("`moe` argument `aux_weight` must not be negative");
    if (!moeRows(in[0], k))
      return fail(fmt::format("`moe` tokens {} x top_k {} pass 2^63 - 1", tensorStr(in[0]), k));
    out.push_back(in[0]);
    return "";
  }
  case K::MoeRouter: {
    Shape s = in[0].shape;
    s.back() = Dim::constant(intAttr(attrs, "experts"));
    out.push_back(TensorType{in[0].dtype, s});
    return "";
  }
  case K::MoeDispatch: {
    std::optional<Shape> rows = moeRows(in[0], intAttr(attrs, "top_k"));
    EPL_ASSERT(rows.has_value(), "the moe call's rule checked the rows' size");
    out.push_back(TensorType{in[0].dtype, *rows});
    out.push_back(TensorType{DType::I32, {Dim::constant(intAttr(attrs, "experts"))}});
    out.push_back(TensorType{DType::F32, {Dim::constant(4)}});
    return "";
  }
  case K::MoeExperts:
    out.push_back(in[0]);
    return "";
  case K::MoeCombine: {
    Shape s = in[1].shape;
    s.back() = in[0].shape.back();
    out.push_back(TensorType{in[0].dtype, s});
    return "";
  }
  case K::Conv2d: {
    int64_t c = intAttr(attrs, "channels"), k = intAttr(attrs, "kernel");
    int64_t st = intAttr(attrs, "stride"), pad = intAttr(attrs, "padding");
    if (!(err = positive(op, "channels", c)).empty() ||
        !(err = positive(op, "kernel", k)).empty() || !(err = positive(op, "stride", st)).empty())
      return fail(err);
    if (pad < 0) return fail("`conv2d` padding must not be negative");
    if (in[0].shape.size() == 4 && !in[0].shape[1].isConstant())
      return fail(fmt::format("`conv2d` needs known input channels, got {}", tensorStr(in[0])));
    return inferImage(op, in[0], c, k, st, pad, out);
  }
  case K::MaxPool:
  case K::AvgPool: {
    int64_t k = intAttr(attrs, "kernel"), st = intAttr(attrs, "stride");
    if (!(err = positive(op, "kernel", k)).empty()) return fail(err);
    if (st < 0) return fail(fmt::format("`{}` stride must not be negative", op));
    return inferImage(op, in[0], 0, k, st == 0 ? k : st, 0, out);
  }
  case K::Gelu:
  case K::Relu:
  case K::Silu:
  case K::Tanh:
  case K::Sigmoid:
  case K::Scale:
    if (!(err = needFloat(op, in[0])).empty()) return fail(err);
    out.push_back(in[0]);
    return "";
  case K::Dropout: {
    double p = floatAttr(attrs, "p");
    if (p < 0 || p >= 1) return fail(fmt::format("`dropout` p must be in [0, 1), got {}", p));
    out.push_back(in[0]);
    return "";
  }
  case K::Add:
  case K::Sub:
  case K::Mul: {
    static const char* sym[] = {"+", "-", "*"};
    const char* s = sym[kind == K::Add ? 0 : kind == K::Sub ? 1 : 2];
    if (in[0].dtype != in[1].dtype)
      return fail(fmt::format("`{}` needs tensors of one dtype, got {} and {}", s, tensorStr(in[0]),
                              tensorStr(in[1])));
    Shape b;
    if (!broadcast(in[0].shape, in[1].shape, b))
      return fail(fmt::format("shape mismatch: cannot apply `{}` to {} and {}", s, tensorStr(in[0]),
                              tensorStr(in[1])));
    out.push_back(TensorType{in[0].dtype, b});
    return "";
  }
  case K::Flatten: {
    if (in[0].shape.size() < 2)
      return fail(fmt::format("`flatten` needs at least two dims, got {}", tensorStr(in[0])));
    std::optional<Dim> rest = product(Shape(in[0].shape.begin() + 1, in[0].shape.end()));
    if (!rest)
      return fail(
          fmt::format("`flatten` of {} gives a dim larger than 2^63 - 1", tensorStr(in[0])));
    out.push_back(TensorType{in[0].dtype, {in[0].shape[0], *rest}});
    return "";
  }
  case K::Reshape:
    return inferReshape(in[0], std::get<Shape>(attrs.at("shape")), out);
  case K::Transpose: {
    int64_t r = static_cast<int64_t>(in[0].shape.size());
    int64_t a = intAttr(attrs, "dim0"), b = intAttr(attrs, "dim1");
    if (a < 0) a += r;
    if (b < 0) b += r;
    if (a < 0 || a >= r || b < 0 || b >= r)
      return fail(fmt::format("`transpose` dims ({}, {}) out of range for {}",
                              intAttr(attrs, "dim0"), intAttr(attrs, "dim1"), tensorStr(in[0])));
    Shape s = in[0].shape;
    std::swap(s[a], s[b]);
    out.push_back(TensorType{in[0].dtype, s});
    return "";
  }
  case K::Next:
    if (!isIntegral(in[0].dtype) || in[0].shape.size() != 2)
      return fail(fmt::format("`next` needs integer tokens [B, T], got {}", tensorStr(in[0])));
    out.push_back(in[0]);
    return "";
  case K::CrossEntropy: {
    const TensorType &lg = in[0], &tg = in[1];
    int64_t v = 0;
    if (!(err = knownLast(op, lg, v)).empty() || !(err = needFloat(op, lg)).empty())
      return fail(err);
    if (!isIntegral(tg.dtype))
      return fail(fmt::format("`cross_entropy` needs integer targets, got {}", tensorStr(tg)));
    Shape lead(lg.shape.begin(), lg.shape.end() - 1);
    if (lead != tg.shape)
      return fail(fmt::format("shape mismatch: `cross_entropy` logits {} need targets `{}`, got {}",
                              tensorStr(lg), shapeStr(lead), tensorStr(tg)));
    out.push_back(TensorType{lg.dtype, {}});
    return "";
  }
  case K::Mse:
    if (!(in[0].shape == in[1].shape))
      return fail(
          fmt::format("shape mismatch: `mse` got {} and {}", tensorStr(in[0]), tensorStr(in[1])));
    if (!(err = needFloat(op, in[0])).empty()) return fail(err);
    out.push_back(TensorType{in[0].dtype, {}});
    return "";
  case K::AllToAll:
    out.push_back(in[0]);
    if (std::get<std::string>(attrs.at("phase")) == "dispatch") out.push_back(in[1]);
    return "";
  case K::AllGather:
  case K::AllReduce:
  case K::ReduceScatter:
  case K::Slice:
  case K::SendRecv:
  case K::Identity:
    out.push_back(in[0]);
    return "";
  case K::GradNorm:
    out.push_back(TensorType{DType::F32, {}});
    return "";
  case K::OptimizerStep:
    return "";
  }
  return "unknown op";
}

} // namespace epl::ir
