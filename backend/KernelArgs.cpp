// What a kernel call carries (see KernelArgs.h).
#include "backend/KernelArgs.h"

#include "support/Assert.h"

#include <cstdlib>
#include <variant>

namespace epl::backend {

namespace {

ir::Attr attrOrDefault(const KernelCall& c, const std::string& key) {
  if (c.attrs) {
    auto it = c.attrs->find(key);
    if (it != c.attrs->end()) return it->second;
  }
  const ir::OpInfo& op = ir::opInfo(c.kind);
  for (const auto& a : op.args)
    if (a.name == key && !a.required) return ir::argDefault(op, a, attrsOf(c));
  EPL_ASSERT(false, "kernel call lacks a required attribute");
  std::abort();
}

} // namespace

const ir::Attrs& attrsOf(const KernelCall& c) {
  static const ir::Attrs none;
  return c.attrs ? *c.attrs : none;
}

int64_t attrInt(const KernelCall& c, const std::string& key) {
  const ir::Attr a = attrOrDefault(c, key);
  EPL_ASSERT(std::holds_alternative<int64_t>(a), "attribute is not an integer");
  return std::get<int64_t>(a);
}

double attrFloat(const KernelCall& c, const std::string& key) {
  const ir::Attr a = attrOrDefault(c, key);
  if (auto* i = std::get_if<int64_t>(&a)) return static_cast<double>(*i);
  EPL_ASSERT(std::holds_alternative<double>(a), "attribute is not a number");
  return std::get<double>(a);
}

bool attrBool(const KernelCall& c, const std::string& key) {
  const ir::Attr a = attrOrDefault(c, key);
  EPL_ASSERT(std::holds_alternative<bool>(a), "attribute is not a bool");
  return std::get<bool>(a);
}

std::string attrWord(const KernelCall& c, const std::string& key) {
  const ir::Attr a = attrOrDefault(c, key);
  EPL_ASSERT(std::holds_alternative<std::string>(a), "attribute is not a word");
  return std::get<std::string>(a);
}

GradOut gradOut(const KernelCall& c, size_t i) {
  EPL_ASSERT(i < c.out.size(), "backward call has too few outputs");
  const TensorView& t = c.out[i];
  if (!t.data) return {};
  EPL_ASSERT(t.dtype == ir::DType::F32, "gradients are f32");
  return GradOut{t.f32(), accumulates(c, i)};
}

bool accumulates(const KernelCall& c, size_t i) {
  return i < c.accumulate.size() && c.accumulate[i];
}

void expectArity(const KernelCall& c) {
  EPL_ASSERT(c.attrs != nullptr, "a kernel call has no attributes");
  ir::CallArity a = ir::callArity(c.kind, *c.attrs, c.backward);
  EPL_ASSERT(c.in.size() == a.in, "kernel call has the wrong number of inputs");
  EPL_ASSERT(c.out.size() == a.out, "kernel call has the wrong number of outputs");
}

} // namespace epl::backend
