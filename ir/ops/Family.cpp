// The op families' shared helpers and the table they fill (ir/ops/Family.h).
#include "ir/ops/Family.h"

#include "support/Assert.h"

#include <fmt/format.h>

namespace epl::ir::ops {

ArgSpec tensor(std::string name, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Tensor, true, int64_t{0}, {}, std::move(doc), ""};
}
ArgSpec optTensor(std::string name, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Tensor, false, false, {}, std::move(doc), ""};
}
ArgSpec x() {
  return tensor("x", "input tensor");
}
ArgSpec integer(std::string name, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Int, true, int64_t{0}, {}, std::move(doc), ""};
}
ArgSpec optInt(std::string name, int64_t def, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Int, false, def, {}, std::move(doc), ""};
}
ArgSpec optIntFrom(std::string name, std::string from, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Int,   false, int64_t{0}, {},
                 std::move(doc),  std::move(from)};
}
ArgSpec optFloat(std::string name, double def, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Float, false, def, {}, std::move(doc), ""};
}
ArgSpec optBool(std::string name, bool def, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Bool, false, def, {}, std::move(doc), ""};
}
ArgSpec optWord(std::string name, std::string def, std::vector<std::string> words,
                std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Word, false, def, std::move(words), std::move(doc), ""};
}

ArgSpec optName(std::string name, std::string doc) {
  return ArgSpec{std::move(name), ArgKind::Word, false, std::string(), {}, std::move(doc), ""};
}

namespace {
constexpr size_t kKinds = static_cast<size_t>(OpKind::OptimizerStep) + 1;
} // namespace

Table::Table() : entries_(kKinds), defined_(kKinds, false) {}

OpInfo& Table::add(OpKind kind, std::string name, std::vector<ArgSpec> args, SplitRule split,
                   std::string summary, std::string shapes, bool builtin) {
  size_t k = static_cast<size_t>(kind);
  EPL_ASSERT(k < kKinds && !defined_[k], "an op kind is defined twice");
  defined_[k] = true;
  OpInfo& e = entries_[k];
  e.kind = kind;
  e.name = std::move(name);
  e.args = std::move(args);
  e.split = split;
  e.builtin = builtin;
  e.summary = std::move(summary);
  e.shapes = std::move(shapes);
  return e;
}

std::vector<OpInfo> Table::finish() {
  for (size_t k = 0; k < kKinds; ++k) {
    EPL_ASSERT(defined_[k], "an op kind has no definition in ir/ops/");
    EPL_ASSERT(entries_[k].infer != nullptr, "an op kind has no shape rule");
    EPL_ASSERT((entries_[k].saved != nullptr) == (entries_[k].savedCount > 0),
               "an op saves tensors without a rule for them, or the other way round");
  }
  return std::move(entries_);
}

std::string tensorStr(const TensorType& t) {
  return "`" + t.str() + "`";
}

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

std::optional<Dim> product(const Shape& dims) {
  std::optional<Dim> p = Dim::constant(1);
  for (size_t i = 0; i < dims.size() && p; ++i)
    p = p->times(dims[i]);
  return p;
}

std::vector<TensorType> hiddenSaved(const std::vector<TensorType>& in, const Attrs& attrs) {
  Shape h = allButLast(in[0].shape);
  h.push_back(constant(intAttr(attrs, "hidden")));
  return {f32(h)};
}

std::string sameAsInput(const OpInfo&, const std::vector<TensorType>& in, const Attrs&,
                        std::vector<TensorType>& out) {
  out.push_back(in[0]);
  return "";
}

} // namespace epl::ir::ops
