// The op table (ir/Ops.h) and the functions that look it up. Each family's entries and
// rules are in ir/ops/.
#include "ir/Ops.h"

#include "ir/ops/Family.h"
#include "support/Assert.h"

#include <algorithm>
#include <fmt/format.h>

namespace epl::ir {

namespace {

std::vector<OpInfo> buildTable() {
  ops::Table t;
  ops::addDense(t);
  ops::addLookups(t);
  ops::addNorms(t);
  ops::addAttention(t);
  ops::addMoe(t);
  ops::addImage(t);
  ops::addPointwise(t);
  ops::addShapes(t);
  ops::addSlicing(t);
  ops::addLosses(t);
  ops::addCollectives(t);
  ops::addTraining(t);
  return t.finish();
}

} // namespace

int OpInfo::tensorInputs(const Attrs& attrs) const {
  int n = 0;
  for (const auto& a : args)
    n += a.kind == ArgKind::Tensor && (a.required || givesTensor(attrs, a.name));
  return n;
}

bool givesTensor(const Attrs& attrs, const std::string& name) {
  auto it = attrs.find(name);
  return it != attrs.end() && std::holds_alternative<bool>(it->second) &&
         std::get<bool>(it->second);
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
  const std::vector<OpInfo>& table = allOps();
  size_t k = static_cast<size_t>(kind);
  EPL_ASSERT(k < table.size(), "op kind missing from the op table");
  return table[k];
}

std::string cutAttr(OpKind kind) {
  return opInfo(kind).cut;
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
int64_t ignoredClass(const Attrs* a) {
  if (!a) return kNoIgnoredClass;
  auto it = a->find("ignore_index");
  return it == a->end() ? kNoIgnoredClass : std::get<int64_t>(it->second);
}
int64_t keptTargets(const int32_t* t, int64_t n, int64_t ignored) {
  int64_t kept = 0;
  for (int64_t r = 0; r < n; ++r)
    kept += t[r] != ignored;
  return kept;
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

std::string inferTypes(OpKind kind, const std::vector<TensorType>& in, const Attrs& attrs,
                       std::vector<TensorType>& out) {
  const OpInfo& op = opInfo(kind);
  out.clear();
  std::string err = op.infer(op, in, attrs, out);
  if (!err.empty()) out.clear();
  return err;
}

std::vector<ParamSpec> paramSpecs(OpKind kind, const std::vector<TensorType>& in,
                                  const Attrs& attrs) {
  const OpInfo& op = opInfo(kind);
  return op.params ? op.params(in, attrs) : std::vector<ParamSpec>{};
}

GradInfo gradInfo(OpKind kind, const std::vector<TensorType>& in, const Attrs& attrs) {
  const OpInfo& op = opInfo(kind);
  GradInfo g;
  g.differentiable = op.differentiable;
  g.needsInputs = op.needsInputs;
  g.needsOutput = op.needsOutput;
  if (op.saved) g.saved = op.saved(in, attrs);
  EPL_ASSERT(g.saved.size() == static_cast<size_t>(op.savedCount),
             "an op's saved tensors are not as many as its entry says");
  return g;
}

namespace {

// The parameter names of an op: its optional arguments missing from `attrs` (a kernel
// call may leave them out) read as their defaults.
std::vector<ParamSpec> paramNames(const OpInfo& op, const Attrs& attrs) {
  if (!op.params) return {};
  bool whole = true;
  for (const ArgSpec& a : op.args)
    whole = whole && (a.kind == ArgKind::Tensor || attrs.count(a.name) > 0);
  if (whole) return op.params({}, attrs);
  Attrs filled = attrs;
  for (const ArgSpec& a : op.args)
    if (a.kind != ArgKind::Tensor && !a.required && !filled.count(a.name))
      filled.emplace(a.name, argDefault(op, a, filled));
  return op.params({}, filled);
}

} // namespace

Attr argDefault(const OpInfo& op, const ArgSpec& arg, const Attrs& attrs) {
  if (arg.defaultArg.empty()) return arg.defaultValue;
  auto it = attrs.find(arg.defaultArg);
  if (it != attrs.end()) return it->second;
  for (const ArgSpec& a : op.args)
    if (a.name == arg.defaultArg && !a.required) return argDefault(op, a, attrs);
  EPL_ASSERT(false, "an argument's default names an argument that is missing");
  return arg.defaultValue;
}

int outputBiasIndex(OpKind kind, const Attrs& attrs) {
  const OpInfo& op = opInfo(kind);
  if (op.outputBias.empty()) return -1;
  std::vector<ParamSpec> p = paramNames(op, attrs);
  for (size_t k = 0; k < p.size(); ++k)
    if (p[k].name == op.outputBias) return static_cast<int>(k);
  return -1;
}

CallArity callArity(OpKind kind, const Attrs& attrs, bool backward) {
  const OpInfo& op = opInfo(kind);
  EPL_ASSERT(op.split != SplitRule::Communication, "a collective has no kernel call");
  size_t n = static_cast<size_t>(op.tensorInputs(attrs));
  size_t p = paramNames(op, attrs).size();
  size_t saved = static_cast<size_t>(op.savedCount);
  if (backward) return CallArity{2 + n + p + saved, n + p};
  return CallArity{n + p, static_cast<size_t>(op.outputs) + saved};
}

AttentionSlots attentionSlots(const Attrs& attrs, bool backward) {
  // Its parameters as callArity counts them: the biases with `bias` (as given, or its
  // default).
  int params = static_cast<int>(paramNames(opInfo(OpKind::Attention), attrs).size());
  bool biased = params == 4, masked = givesTensor(attrs, "mask");
  int inputs = masked ? 2 : 1, first = (backward ? 1 : 0) + inputs;
  AttentionSlots a{};
  a.mask = masked ? first - 1 : -1;
  a.wqkv = first;
  a.bqkv = biased ? first + 1 : -1;
  a.wp = first + (biased ? 2 : 1);
  a.bp = biased ? first + 3 : -1;
  a.qkv = first + params + 1; // after y
  a.ctx = a.qkv + 1;
  a.lse = a.qkv + 2;
  a.dwqkv = inputs;
  a.dbqkv = biased ? inputs + 1 : -1;
  a.dwp = inputs + (biased ? 2 : 1);
  a.dbp = biased ? inputs + 3 : -1;
  return a;
}

uint64_t productInputs(OpKind kind, const Attrs& attrs, bool backward) {
  switch (kind) {
  case OpKind::Linear: // [x, W, b?] / [dy, x, W, b?, y]
    return backward ? 0b111 : 0b11;
  case OpKind::Mlp: // [x, W1, b1, W2, b2] / [dy, x, W1, b1, W2, b2, y, h]
    return backward ? 0b10111 : 0b1011;
  case OpKind::Attention: { // the projections' operands, the saved context
    AttentionSlots a = attentionSlots(attrs, backward);
    uint64_t mask = uint64_t{1} | uint64_t{1} << a.wqkv | uint64_t{1} << a.wp;
    return backward ? mask | uint64_t{1} << 1 | uint64_t{1} << a.ctx : mask;
  }
  default:
    return 0;
  }
}

uint64_t widenedInputs(OpKind kind, bool backward, size_t inputs) {
  return kind == OpKind::Mlp && backward && inputs > 7 ? uint64_t{1} << 7 : 0;
}

std::vector<Product> opProducts(OpKind kind, const std::vector<Sizes>& in,
                                const std::vector<Sizes>& params, const Sizes& out,
                                const Attrs& attrs, bool backward) {
  const OpInfo& op = opInfo(kind);
  if (!op.products) return {};
  std::vector<Product> forward = op.products(in, params, out, attrs);
  if (!backward) return forward;
  // C = A op(B) gives dA = dC op(B)^T and, for B, a sum over C's rows: dB = dC^T A when B
  // is [n, k] (A B^T), A^T dC when it is [k, n] (A B). Each as the kernels call it.
  std::vector<Product> b;
  for (const Product& p : forward) {
    EPL_ASSERT(p.layout != GemmLayout::AtB, "a forward product is A B^T or A B");
    if (p.layout == GemmLayout::ABt) {
      b.push_back({p.m, p.k, p.n, p.count, GemmLayout::AB, p.perHead});
      b.push_back({p.n, p.k, p.m, p.count, GemmLayout::AtB, p.perHead});
    } else {
      b.push_back({p.m, p.k, p.n, p.count, GemmLayout::ABt, p.perHead});
      b.push_back({p.k, p.n, p.m, p.count, GemmLayout::AtB, p.perHead});
    }
  }
  return b;
}

const char* gemmLayoutName(GemmLayout l) {
  return l == GemmLayout::AB ? "AB" : l == GemmLayout::AtB ? "AtB" : "ABt";
}

Flops opFlops(OpKind kind, const std::vector<Sizes>& in, const std::vector<Sizes>& params,
              const Sizes& out, const Attrs& attrs) {
  double forward = 0;
  for (const Product& p : opProducts(kind, in, params, out, attrs, false))
    forward += p.flops();
  return Flops{forward, 2 * forward};
}

} // namespace epl::ir
