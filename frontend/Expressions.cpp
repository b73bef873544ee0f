// Expressions: integer arithmetic, tensor arithmetic, and emitting ops into the module.
#include "frontend/Elaborator.h"

#include "support/Text.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace epl::frontend {

bool Elaborator::unbound(const ast::Expr& e, const Frame& frame) const {
  return e.kind == ast::ExprKind::Name && !frame.vars.count(e.text) && !globals_.vars.count(e.text);
}

Value Elaborator::lookup(const ast::Expr& e, Frame& frame) {
  auto it = frame.vars.find(e.text);
  if (it != frame.vars.end()) return it->second;
  it = globals_.vars.find(e.text);
  if (it != globals_.vars.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [n, v] : frame.vars)
    names.push_back(n);
  for (const auto& [n, v] : globals_.vars)
    names.push_back(n);
  auto d = diags_.error(e.loc, fmt::format("unknown name `{}`", e.text));
  d.length(e.length);
  std::string near = closestMatch(e.text, names);
  if (!near.empty())
    d.help(fmt::format("did you mean `{}`?", near));
  else if (ir::findBuiltin(e.text) || defs_.count(e.text))
    d.help(fmt::format("`{}` is a layer: call it, as in `{}(x, …)`", e.text, e.text));
  throw CompileAborted{};
}

int64_t Elaborator::expectInt(const ast::Expr& e, Frame& frame, Context* ctx,
                              const std::string& what) {
  Value v = eval(e, frame, ctx);
  if (v.kind == Value::Kind::Dim)
    fail(e, fmt::format("{} must be a known integer, but `{}` depends on the batch", what,
                        v.dim.str()));
  if (v.kind != Value::Kind::Int)
    fail(e, fmt::format("{} must be an integer, found {}", what, kindName(v.kind)));
  return v.i;
}

Value Elaborator::eval(const ast::Expr& e, Frame& frame, Context* ctx) {
  using K = ast::ExprKind;
  switch (e.kind) {
  case K::Int:
    if (e.loc.file == mainFile_ && !options_.literalValues.empty()) {
      auto other = options_.literalValues.find({e.loc.line, e.loc.col});
      if (other != options_.literalValues.end()) return Value::ofInt(other->second);
    }
    return Value::ofInt(e.intValue);
  case K::Size: {
    Value v = Value::ofInt(e.intValue);
    v.isSize = true;
    return v;
  }
  case K::Float:
    return Value::ofFloat(e.floatValue);
  case K::Bool:
    return Value::ofBool(e.intValue != 0);
  case K::String:
    return Value::ofString(e.text);
  case K::Word:
    return Value::ofWord(e.text);
  case K::Auto: {
    Value v;
    v.kind = Value::Kind::Auto;
    return v;
  }
  case K::None:
    return Value{};
  case K::Name:
    return lookup(e, frame);
  case K::Neg: {
    Value v = eval(*e.operands[0], frame, ctx);
    if (v.kind == Value::Kind::Int) {
      if (v.i == INT64_MIN) fail(e, "integer overflow");
      return Value::ofInt(-v.i);
    }
    if (v.kind == Value::Kind::Float) return Value::ofFloat(-v.f);
    if (v.kind == Value::Kind::Tensor && ctx)
      return emitOp(ir::OpKind::Scale, e, {v.tensor}, {{"factor", -1.0}}, *ctx, "scale", false);
    fail(e, fmt::format("cannot negate {}", kindName(v.kind)));
  }
  case K::Binary:
    return evalBinary(e, frame, ctx);
  case K::Call:
    return evalCall(e, frame, ctx, false);
  case K::Repeat:
    return evalRepeat(e, frame, ctx);
  case K::List: {
    Value v;
    v.kind = Value::Kind::List;
    for (const auto& item : e.operands)
      v.items.push_back(eval(*item, frame, ctx));
    return v;
  }
  case K::Record:
    fail(e, "a record `{ … }` is only allowed as a setting value");
  }
  fail(e, "unsupported expression");
}

namespace {

// "`layers` (6)" for a named operand, "6" for a literal or a larger expression.
std::string operandText(const ast::Expr& e, int64_t value) {
  if (e.kind == ast::ExprKind::Name) return fmt::format("`{}` ({})", e.text, value);
  return std::to_string(value);
}

bool checkedArith(char op, int64_t a, int64_t b, int64_t& r) {
  switch (op) {
  case '+':
    return !__builtin_add_overflow(a, b, &r);
  case '-':
    return !__builtin_sub_overflow(a, b, &r);
  case '*':
    return !__builtin_mul_overflow(a, b, &r);
  }
  return false;
}

} // namespace

// Integer arithmetic: exact, overflow-checked; `/` must divide, `//` and `%` floor.
Value Elaborator::evalInts(const ast::Expr& e, const Value& a, const Value& b) {
  const std::string& op = e.text;
  if (op == "/" || op == "//" || op == "%") {
    if (b.i == 0) fail(e, "division by zero");
    if (op == "/" && a.i % b.i != 0)
      fail(e, fmt::format("{} is not divisible by {}", operandText(*e.operands[0], a.i),
                          operandText(*e.operands[1], b.i)));
    if (a.i == INT64_MIN && b.i == -1) fail(e, "integer overflow");
    // `//` and `%` floor, as in Python: (a // b) * b + a % b == a for every sign.
    int64_t q = a.i / b.i, r = a.i % b.i;
    if (r != 0 && ((r < 0) != (b.i < 0))) {
      --q;
      r += b.i;
    }
    return Value::ofInt(op == "%" ? r : q);
  }
  int64_t r = 0;
  if (!checkedArith(op[0], a.i, b.i, r))
    fail(e, fmt::format("integer overflow in {} {} {}", a.i, op, b.i));
  return Value::ofInt(r);
}

// Numbers are 64-bit floats, and as with literals a result must be 0 or a normal float:
// infinity, or a product or quotient that rounds to 0 or a subnormal, is an error.
Value Elaborator::evalNumbers(const ast::Expr& e, double x, double y) {
  const std::string& op = e.text;
  if (op == "//" || op == "%") fail(e, fmt::format("`{}` needs integers", op));
  if (op == "/" && y == 0) fail(e, "division by zero");
  double r = op == "+" ? x + y : op == "-" ? x - y : op == "*" ? x * y : x / y;
  bool exactZero = r == 0 && (op == "+" || op == "-" || x == 0 || (op == "*" && y == 0));
  if (std::isinf(r)) fail(e, fmt::format("number overflow in {} {} {}", x, op, y));
  if (!std::isnormal(r) && !exactZero)
    fail(e, fmt::format("number underflow in {} {} {}", x, op, y));
  return Value::ofFloat(r);
}

// Integers: exact arithmetic, `/` must divide (so `layers / 2` never drops a layer), `//`
// floors. Symbolic dims multiply. Tensors: + - * elementwise, or scaled by a number.
Value Elaborator::evalBinary(const ast::Expr& e, Frame& frame, Context* ctx) {
  Value a = eval(*e.operands[0], frame, ctx), b = eval(*e.operands[1], frame, ctx);

  const std::string& op = e.text;
  using VK = Value::Kind;
  if (a.kind == VK::Int && b.kind == VK::Int) {
    // Arithmetic on a size gives a size (`2 * 8GB`); a size over a size is a ratio.
    Value r = evalInts(e, a, b);
    bool ratio = a.isSize && b.isSize && (op == "/" || op == "//");
    r.isSize = (a.isSize || b.isSize) && !ratio;
    return r;
  }
  if (a.isNumber() && b.isNumber()) return evalNumbers(e, a.number(), b.number());
  bool aDim = a.kind == VK::Dim || a.kind == VK::Int, bDim = b.kind == VK::Dim || b.kind == VK::Int;
  if (aDim && bDim) {
    if (op == "*") {
      std::optional<ir::Dim> d = a.asDim().times(b.asDim());
      if (!d) fail(e, fmt::format("dim overflow in `{}` * `{}`", a.asDim().str(), b.asDim().str()));
      return Value::ofDim(*d);
    }
    if (op == "/" && b.kind == VK::Int) {
      auto q = a.asDim().divide(b.i);
      if (!q) fail(e, fmt::format("`{}` is not divisible by {}", a.dim.str(), b.i));
      return Value::ofDim(*q);
    }
    fail(e,
         fmt::format("`{}` on the symbolic dim `{}` is not supported; only `*` and exact `/` are",
                     op, (a.kind == VK::Dim ? a : b).dim.str()));
  }
  if (a.kind == VK::Tensor && b.kind == VK::Tensor && ctx &&
      (op == "+" || op == "-" || op == "*")) {
    ir::OpKind k = op == "+" ? ir::OpKind::Add : op == "-" ? ir::OpKind::Sub : ir::OpKind::Mul;
    return emitOp(k, e, {a.tensor, b.tensor}, {}, *ctx, ir::opInfo(k).name, false);
  }
  if (ctx && ((a.kind == VK::Tensor && b.isNumber() && (op == "*" || op == "/")) ||
              (b.kind == VK::Tensor && a.isNumber() && op == "*"))) {
    const Value& t = a.kind == VK::Tensor ? a : b;
    double factor = a.kind == VK::Tensor ? b.number() : a.number();
    if (op == "/") {
      if (factor == 0) fail(e, "division by zero");
      factor = 1.0 / factor;
    }
    return emitOp(ir::OpKind::Scale, e, {t.tensor}, {{"factor", factor}}, *ctx, "scale", false);
  }
  fail(e, fmt::format("cannot apply `{}` to {} and {}", op, kindName(a.kind), kindName(b.kind)));
}

std::string Elaborator::uniqueName(Context& ctx, const std::string& base, bool inRepeat) {
  int& n = nameCounts_[ctx.namePrefix + base];
  std::string name = ctx.namePrefix + base;
  if (inRepeat || n > 0) name += "." + std::to_string(n);
  ++n;
  return name;
}

// The batch is dim 0 of every tensor that has one: data parallelism cuts there.
void Elaborator::checkBatchFirst(const ast::Expr& at, const ir::Module& m, const std::string& op,
                                 const std::vector<ir::TensorType>& out) {
  const std::string& b = m.batchSymbol;
  for (const auto& t : out)
    for (size_t i = 1; i < t.shape.size(); ++i)
      if (std::count(t.shape[i].syms.begin(), t.shape[i].syms.end(), b))
        fail(at,
             fmt::format(
                 "`{}` would move the batch dim `{}` to dim {} of `{}`; the batch must stay first",
                 op, b, i, t.str()));
}

// Data parallelism divides dim 0 over ranks, so no op may reduce or index it away: the
// message when mean, select or narrow would, else "".
std::string Elaborator::batchTaken(const ir::Module& m, ir::OpKind kind,
                                   const std::vector<ir::TensorType>& in, const ir::Attrs& attrs) {
  using K = ir::OpKind;
  if (kind != K::Mean && kind != K::Select && kind != K::Narrow) return "";
  const ir::Shape& s = in[0].shape;
  int64_t d = ir::intAttr(attrs, "dim");
  if (d < 0) d += static_cast<int64_t>(s.size());
  if (d != 0 || s.empty()) return ""; // another dim, or out of range (the shape rule says)
  const std::vector<std::string>& syms = s[0].syms;
  if (std::find(syms.begin(), syms.end(), m.batchSymbol) == syms.end()) return "";
  return fmt::format("`{}` cannot take dim 0 of `{}`: it holds the batch `{}`, which data "
                     "parallelism divides over ranks",
                     ir::opInfo(kind).name, in[0].str(), m.batchSymbol);
}

void Elaborator::failInOp(const ast::Expr& at, const Context& ctx, const std::string& message) {
  auto d = diags_.error(at.loc, message);
  d.length(at.length);
  // Inside a def (maybe in stdlib/), also show the model line that expanded it.
  if (ctx.site.valid()) d.noteAt(ctx.site, "in the expansion of this call");
  throw CompileAborted{};
}

// Each tensor an op makes (its outputs, its parameters, what autodiff will save for the
// backward) must fit in 2^63 - 1 bytes with each symbol counting 1. mesh-assignment checks
// again once the batch is bound.
void Elaborator::checkTensorSizes(const ast::Expr& at, const Context& ctx, ir::OpKind kind,
                                  const std::vector<ir::TensorType>& in, const ir::Attrs& attrs,
                                  const std::vector<ir::TensorType>& out,
                                  const std::vector<ir::ParamSpec>& params) {
  const std::string& op = ir::opInfo(kind).name;
  auto check = [&](const ir::TensorType& t, const std::string& what, const char* after) {
    if (!ir::checkedBytes(t, {}))
      failInOp(at, ctx,
               fmt::format("`{}` {} `{}`{}, larger than 2^63 - 1 bytes", op, what, t.str(), after));
  };
  for (const auto& t : out)
    check(t, "makes", "");
  for (const auto& p : params)
    check(ir::TensorType{ir::DType::F32, p.shape}, fmt::format("has a parameter `{}` of", p.name),
          "");
  for (const auto& t : ir::gradInfo(kind, in, attrs).saved)
    check(t, "saves", " for the backward");
}

// A layer that ties its weight to parameter `tied` of an earlier one needs a weight of the
// same shape, cut the same way: both outside `split` blocks or both in the same one.
void Elaborator::checkTiedWeight(const ast::Expr& at, const Context& ctx, const ir::Op& op,
                                 int tied, const ir::TensorType& want) {
  const ir::Module& m = *ctx.module;
  const ir::Param& p = m.params[tied];
  const ir::Op& owner = m.ops[p.op];
  if (p.type.shape != want.shape)
    failInOp(at, ctx,
             fmt::format("`{}` needs a weight `{}`, but `{}` of `{}` is `{}`: a tied weight has "
                         "one shape",
                         ir::opInfo(op.kind).name, want.str(), p.name, owner.name, p.type.str()));
  if ((m.splitScopeOf(owner.scope) < 0) != (m.splitScopeOf(op.scope) < 0))
    failInOp(at, ctx,
             fmt::format("`{}` ties its weight to `{}`'s, but only one of the two is in a "
                         "`split` block: a tied weight is cut one way, so put both layers in "
                         "`split` blocks of one width or both outside any",
                         ir::opInfo(op.kind).name, owner.name));
}

Value Elaborator::emitOp(ir::OpKind kind, const ast::Expr& at, std::vector<int> inputs,
                         ir::Attrs attrs, Context& ctx, const std::string& name, bool inRepeat,
                         const std::string& fixedName, const std::string& paramOwner) {
  ir::Module& m = *ctx.module;
  if (opBudget_-- == 0) fail(at, "the model expands to more than 2,000,000 ops");
  std::vector<ir::TensorType> in, out;
  for (int t : inputs)
    in.push_back(m.tensors[t].type);
  std::string err = batchTaken(m, kind, in, attrs); // before the shape rule: B has no size
  if (err.empty()) err = ir::inferTypes(kind, in, attrs, out);
  if (!err.empty()) failInOp(at, ctx, err);
  checkBatchFirst(at, m, ir::opInfo(kind).name, out);
  std::vector<ir::ParamSpec> params = ir::paramSpecs(kind, in, attrs);
  checkTensorSizes(at, ctx, kind, in, attrs, out, params);
  ir::Op op;
  op.kind = kind;
  op.name = fixedName.empty() ? uniqueName(ctx, name, inRepeat) : fixedName;
  op.inputs = std::move(inputs);
  op.scope = ctx.scope;
  op.loc = at.loc;
  op.site = ctx.site.valid() ? ctx.site : at.loc;
  int id = static_cast<int>(m.ops.size());
  auto tie = attrs.find("tie");
  int tied = tie == attrs.end() ? -1 : tiedWeight(m, std::get<std::string>(tie->second));
  for (const auto& spec : params) {
    if (tied >= 0 && spec.name == "weight") { // linear's `tie`: the earlier layer's weight
      checkTiedWeight(at, ctx, op, tied, ir::TensorType{ir::DType::F32, spec.shape});
      op.params.push_back(tied);
      continue;
    }
    ir::Param p{(paramOwner.empty() ? op.name : paramOwner) + "." + spec.name,
                ir::TensorType{ir::DType::F32, spec.shape}, id, -1};
    p.init = spec.init;
    p.fanIn = spec.fanIn;
    p.initStd = spec.std;
    p.trainable = spec.trainable;
    m.params.push_back(std::move(p));
    op.params.push_back(static_cast<int>(m.params.size()) - 1);
  }
  op.attrs = std::move(attrs);
  for (size_t k = 0; k < out.size(); ++k)
    op.outputs.push_back(
        m.addTensor(op.name + (out.size() > 1 ? "." + std::to_string(k) : ""), out[k], id));
  m.ops.push_back(std::move(op));
  return Value::ofTensor(m.ops.back().outputs[0]);
}

// A `moe` call becomes its four ops (ir/Ops.h): `NAME.router`, `NAME.dispatch`,
// `NAME.experts` and the combine `NAME`, whose output is the call's value; the parameters
// keep the call's names (`NAME.router_weight`, `NAME.fc1_weight`, …), so a checkpoint
// names them as a script reads them.
Value Elaborator::emitMoe(const ast::Expr& at, int x, const ir::Attrs& attrs, Context& ctx,
                          bool inRepeat) {
  ir::Module& m = *ctx.module;
  std::vector<ir::TensorType> in{m.tensors[x].type}, out;
  std::string err = ir::inferTypes(ir::OpKind::Moe, in, attrs, out);
  if (!err.empty()) failInOp(at, ctx, err);
  checkTensorSizes(at, ctx, ir::OpKind::Moe, in, attrs, out,
                   ir::paramSpecs(ir::OpKind::Moe, in, attrs));
  std::string name = uniqueName(ctx, "moe", inRepeat);
  auto pick = [&](std::initializer_list<const char*> keys) {
    ir::Attrs a;
    for (const char* k : keys)
      a[k] = attrs.at(k);
    return a;
  };
  ir::Attrs routing = pick({"experts", "top_k", "capacity_factor", "aux_weight"});
  int gates = emitOp(ir::OpKind::MoeRouter, at, {x}, pick({"experts"}), ctx, "", false,
                     name + ".router", name)
                  .tensor;
  int rows =
      emitOp(ir::OpKind::MoeDispatch, at, {x, gates}, routing, ctx, "", false, name + ".dispatch")
          .tensor;
  int counts = m.ops.back().outputs[1];
  int expertRows = emitOp(ir::OpKind::MoeExperts, at, {rows, counts}, pick({"experts", "hidden"}),
                          ctx, "", false, name + ".experts", name)
                       .tensor;
  return emitOp(ir::OpKind::MoeCombine, at, {expertRows, gates}, routing, ctx, "", false, name);
}

} // namespace epl::frontend
