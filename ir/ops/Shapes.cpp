// flatten, reshape, transpose and next: the same elements in another arrangement.
#include "ir/ops/Family.h"

#include <algorithm>
#include <fmt/format.h>

namespace epl::ir::ops {

namespace {

std::string inferFlatten(const OpInfo&, const std::vector<TensorType>& in, const Attrs&,
                         std::vector<TensorType>& out) {
  if (in[0].shape.size() < 2)
    return fmt::format("`flatten` needs at least two dims, got {}", tensorStr(in[0]));
  std::optional<Dim> rest = product(Shape(in[0].shape.begin() + 1, in[0].shape.end()));
  if (!rest)
    return fmt::format("`flatten` of {} gives a dim larger than 2^63 - 1", tensorStr(in[0]));
  out.push_back(TensorType{in[0].dtype, {in[0].shape[0], *rest}});
  return "";
}

std::string inferReshape(const OpInfo&, const std::vector<TensorType>& in, const Attrs& attrs,
                         std::vector<TensorType>& out) {
  const TensorType& x = in[0];
  const Shape& target = std::get<Shape>(attrs.at("shape"));
  Shape given;
  int wild = -1;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == constant(-1)) {
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

std::string inferTranspose(const OpInfo&, const std::vector<TensorType>& in, const Attrs& attrs,
                           std::vector<TensorType>& out) {
  int64_t r = static_cast<int64_t>(in[0].shape.size());
  int64_t a = intAttr(attrs, "dim0"), b = intAttr(attrs, "dim1");
  if (a < 0) a += r;
  if (b < 0) b += r;
  if (a < 0 || a >= r || b < 0 || b >= r)
    return fmt::format("`transpose` dims ({}, {}) out of range for {}", intAttr(attrs, "dim0"),
                       intAttr(attrs, "dim1"), tensorStr(in[0]));
  Shape s = in[0].shape;
  std::swap(s[a], s[b]);
  out.push_back(TensorType{in[0].dtype, s});
  return "";
}

std::string inferNext(const OpInfo&, const std::vector<TensorType>& in, const Attrs&,
                      std::vector<TensorType>& out) {
  if (!isIntegral(in[0].dtype) || in[0].shape.size() != 2)
    return fmt::format("`next` needs integer tokens [B, T], got {}", tensorStr(in[0]));
  out.push_back(in[0]);
  return "";
}

} // namespace

void addShapes(Table& t) {
  using S = SplitRule;
  t.add(OpKind::Flatten, "flatten", {x()}, S::Replicated, "keep the batch dim, flatten the rest",
        "x: [B, ...] -> [B, n]")
      .infer = inferFlatten;
  t.add(OpKind::Reshape, "reshape",
        {x(),
         ArgSpec{"shape", ArgKind::Dims, true, int64_t{0}, {}, "new shape, one entry may be -1"}},
        S::Replicated, "same elements, new shape", "x -> shape")
      .infer = inferReshape;
  t.add(OpKind::Transpose, "transpose",
        {x(), integer("dim0", "first dim"), integer("dim1", "second dim")}, S::Replicated,
        "swap two dims (negative counts from the end)", "swapped shape")
      .infer = inferTranspose;
  OpInfo& next = t.add(OpKind::Next, "next", {tensor("tokens", "token ids")}, S::Replicated,
                       "next-token targets: element t is token t+1 of the sample's window",
                       "tokens: i32[B, T] -> i32[B, T]");
  next.infer = inferNext;
  next.differentiable = false;
}

} // namespace epl::ir::ops
