// Calls: argument binding, builtin layers, `def` inlining with shape unification, and
// `repeat`.
#include "frontend/Elaborator.h"

#include "support/Text.h"

#include <algorithm>
#include <fmt/format.h>

namespace epl::frontend {

namespace {

// A layer's parameter `weight` is named `<layer>.weight`.
bool isWeight(const std::string& param) {
  static const std::string suffix = ".weight";
  return param.size() > suffix.size() &&
         param.compare(param.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A name argument (linear's `tie`) left out, or given as `none`.
bool nameLeftOut(const Value& v) {
  bool text = v.kind == Value::Kind::Word || v.kind == Value::Kind::String;
  return v.kind == Value::Kind::None || (text && v.s.empty()) ||
         (v.kind == Value::Kind::Word && v.s == "none");
}

} // namespace

// A parameter's default, read in the callee's frame; a bare name for a `str` parameter is
// a word (`act: str = gelu`), as it is in a call.
Value Elaborator::defaultValue(const ast::Param& p, Frame& callee) {
  const ast::Expr& d = *p.defaultValue;
  bool bare = unbound(d, callee);
  if (!p.type.isTensor && p.type.name == "str" && bare) return Value::ofWord(d.text);
  return eval(d, callee, nullptr);
}

// Positional then keyword arguments against a parameter list. Reports arity mistakes.
std::vector<Value> Elaborator::bindArgs(const ast::Expr& call,
                                        const std::vector<std::string>& names,
                                        const std::vector<bool>& required,
                                        const std::vector<bool>& wordArgs, Frame& frame,
                                        Context* ctx, const std::string& what,
                                        std::vector<const ast::Expr*>& argExprs) {
  std::vector<Value> vals(names.size());
  std::vector<bool> given(names.size(), false);
  argExprs.assign(names.size(), nullptr);
  size_t positional = 0;
  bool sawKeyword = false;
  for (const ast::Arg& a : call.args) {
    size_t slot = 0;
    if (a.keyword.empty()) {
      if (sawKeyword) fail(*a.value, "a positional argument cannot follow a keyword argument");
      if (positional >= names.size())
        fail(*a.value, fmt::format("{} takes {} argument{} but more were given", what, names.size(),
                                   names.size() == 1 ? "" : "s"));
      slot = positional++;
    } else {
      sawKeyword = true;
      auto it = std::find(names.begin(), names.end(), a.keyword);
      if (it == names.end()) {
        auto d =
            diags_.error(a.keywordLoc, fmt::format("{} has no argument `{}`", what, a.keyword));
        d.length(static_cast<uint32_t>(a.keyword.size()));
        std::string near = closestMatch(a.keyword, names);
        if (!near.empty()) d.help(fmt::format("did you mean `{}`?", near));
        throw CompileAborted{};
      }
      slot = static_cast<size_t>(it - names.begin());
      if (given[slot]) {
        diags_.error(a.keywordLoc, fmt::format("argument `{}` is given twice", a.keyword))
            .length(static_cast<uint32_t>(a.keyword.size()));
        throw CompileAborted{};
      }
    }
    given[slot] = true;
    argExprs[slot] = a.value.get();
    // A bare name for a word argument (`act = gelu`) is the word itself, not a variable;
    // so is `none` (`approx = none`).
    const ast::Expr& v = *a.value;
    bool none = wordArgs[slot] && v.kind == ast::ExprKind::None;
    bool bareWord = wordArgs[slot] && unbound(v, frame);
    vals[slot] = none       ? Value::ofWord("none")
                 : bareWord ? Value::ofWord(v.text)
                            : eval(v, frame, ctx);
  }
  for (size_t i = 0; i < names.size(); ++i)
    if (!given[i] && required[i])
      fail(call, fmt::format("{} is missing argument `{}`", what, names[i]));
  return vals;
}

Value Elaborator::evalCall(const ast::Expr& e, Frame& frame, Context* ctx, bool inRepeat) {
  const ir::OpInfo* info = ir::findBuiltin(e.text);
  auto def = defs_.find(e.text);
  if (!info && def == defs_.end()) {
    std::vector<std::string> names;
    for (const auto& op : ir::allOps())
      if (op.builtin) names.push_back(op.name);
    for (const auto& [n, d] : defs_)
      names.push_back(n);
    auto d = diags_.error(e.loc, fmt::format("unknown layer or function `{}`", e.text));
    d.length(e.length);
    std::string file = importDefining(e.text);
    if (!file.empty()) {
      d.note(
          fmt::format("`{}` is a `def` of `{}`, which this script does not import", e.text, file));
      d.help(fmt::format("add `import \"{}\"` at the top", file));
      throw CompileAborted{};
    }
    std::string near = closestMatch(e.text, names);
    if (!near.empty()) d.help(fmt::format("did you mean `{}`?", near));
    throw CompileAborted{};
  }
  if (!ctx)
    fail(e, fmt::format("`{}` makes tensors and can only be called inside a model or def", e.text));
  std::vector<std::string> names;
  std::vector<bool> required, wordArgs;
  std::vector<const ast::Expr*> argExprs;
  if (info) {
    for (const auto& a : info->args) {
      names.push_back(a.name);
      required.push_back(a.required);
      wordArgs.push_back(a.kind == ir::ArgKind::Word);
    }
    auto vals =
        bindArgs(e, names, required, wordArgs, frame, ctx, fmt::format("`{}`", e.text), argExprs);
    for (size_t i = 0; i < vals.size(); ++i)
      if (!argExprs[i]) {
        if (info->args[i].kind == ir::ArgKind::Tensor) continue; // an optional tensor left out
        const std::string& from = info->args[i].defaultArg;
        if (!from.empty()) { // an earlier argument's value (`kv_heads = heads`)
          for (size_t k = 0; k < i; ++k)
            if (info->args[k].name == from) vals[i] = vals[k];
          continue;
        }
        const ir::Attr& d = info->args[i].defaultValue;
        if (auto* iv = std::get_if<int64_t>(&d))
          vals[i] = Value::ofInt(*iv);
        else if (auto* fv = std::get_if<double>(&d))
          vals[i] = Value::ofFloat(*fv);
        else if (auto* bv = std::get_if<bool>(&d))
          vals[i] = Value::ofBool(*bv);
        else
          vals[i] = Value::ofWord(std::get<std::string>(d));
      }
    // Check argument kinds here, where each argument's location is known.
    for (size_t i = 0; i < vals.size(); ++i) {
      const ir::ArgSpec& spec = info->args[i];
      const ast::Expr& at = argExprs[i] ? *argExprs[i] : e;
      const Value& v = vals[i];
      using VK = Value::Kind;
      auto wrong = [&](const char* want) {
        fail(at, fmt::format("argument `{}` of `{}` must be {}, found {}", spec.name, e.text, want,
                             v.kind == VK::Dim ? "the symbolic dim `" + v.dim.str() + "`"
                                               : kindName(v.kind)));
      };
      switch (spec.kind) {
      case ir::ArgKind::Tensor:
        // An optional tensor may be `none`: left out (a def passing on its own optional one).
        if (argExprs[i] && v.kind != VK::Tensor && (spec.required || v.kind != VK::None))
          wrong(spec.required ? "a tensor" : "a tensor or `none`");
        break;
      case ir::ArgKind::Int:
        if (v.kind != VK::Int) wrong("an integer");
        break;
      case ir::ArgKind::Float:
        if (!v.isNumber()) wrong("a number");
        break;
      case ir::ArgKind::Bool:
        if (v.kind != VK::Bool) wrong("`true` or `false`");
        break;
      case ir::ArgKind::Word:
        if (spec.words.empty() && nameLeftOut(v)) break; // `tie = none`
        if (v.kind == VK::Tensor && spec.name == "tie")
          fail(at, fmt::format("`tie` names a layer, not a tensor: write the layer's name as "
                               "plans print it, such as `tie = embedding`"));
        if (v.kind != VK::Word && v.kind != VK::String) wrong("a word");
        if (spec.words.empty()) { // a name (linear's `tie`)
          if (argExprs[i] && spec.name == "tie") checkTie(at, v.s, *ctx);
          break;
        }
        if (std::find(spec.words.begin(), spec.words.end(), v.s) == spec.words.end()) {
          std::string near = closestMatch(v.s, spec.words);
          auto d = diags_.error(
              at.loc, fmt::format("argument `{}` of `{}` must be one of {}, found `{}`", spec.name,
                                  e.text, fmt::format("`{}`", fmt::join(spec.words, "`, `")), v.s));
          d.length(at.length);
          if (!near.empty()) d.help(fmt::format("did you mean `{}`?", near));
          throw CompileAborted{};
        }
        break;
      case ir::ArgKind::Dims:
        if (v.kind != VK::List) wrong("a list of dims");
        for (const auto& item : v.items)
          if (item.kind != VK::Int && item.kind != VK::Dim) wrong("a list of dims");
        break;
      }
    }
    return callBuiltin(*info, e, std::move(vals), *ctx, inRepeat);
  }
  const ast::Function& fn = *def->second;
  for (const auto& p : fn.params) {
    names.push_back(p.name);
    required.push_back(!p.defaultValue);
    wordArgs.push_back(!p.type.isTensor && p.type.name == "str");
  }
  auto vals =
      bindArgs(e, names, required, wordArgs, frame, ctx, fmt::format("`{}`", e.text), argExprs);
  return callDef(fn, e, std::move(vals), *ctx, inRepeat);
}

// The parameter `weight` of the earlier forward op named `layer` (its own, or the one it
// shares through its own `tie`), or -1.
int Elaborator::tiedWeight(const ir::Module& m, const std::string& layer) {
  for (const ir::Op& op : m.ops)
    if (op.phase == ir::Phase::Forward && op.name == layer)
      for (int p : op.params)
        if (isWeight(m.params[p].name)) return p;
  return -1;
}

// linear's `tie = NAME`: NAME must be an earlier layer with a `weight`, as plans name it.
void Elaborator::checkTie(const ast::Expr& at, const std::string& layer, Context& ctx) {
  const ir::Module& m = *ctx.module;
  if (tiedWeight(m, layer) >= 0) return;
  std::vector<std::string> layers;
  for (const ir::Op& op : m.ops)
    if (tiedWeight(m, op.name) >= 0) layers.push_back(op.name);
  auto d =
      diags_.error(at.loc, fmt::format("`tie = {}` names no earlier layer with a `weight`", layer));
  d.length(at.length);
  std::string near = closestMatch(layer, layers);
  if (!near.empty())
    d.help(fmt::format("did you mean `{}`?", near));
  else
    d.help("`tie` shares the weight of a layer written before this one, such as the "
           "`embedding` whose matrix a language model's head reuses");
  throw CompileAborted{};
}

Value Elaborator::callBuiltin(const ir::OpInfo& info, const ast::Expr& call,
                              std::vector<Value> args, Context& ctx, bool inRepeat) {
  std::vector<int> inputs;
  ir::Attrs attrs;
  for (size_t i = 0; i < args.size(); ++i) {
    const ir::ArgSpec& spec = info.args[i];
    const Value& v = args[i];
    switch (spec.kind) {
    case ir::ArgKind::Tensor:
      if (v.kind != Value::Kind::Tensor) break; // an optional tensor left out
      inputs.push_back(v.tensor);
      if (!spec.required) attrs[spec.name] = true;
      break;
    case ir::ArgKind::Int:
      attrs[spec.name] = v.i;
      break;
    case ir::ArgKind::Float:
      attrs[spec.name] = v.number();
      break;
    case ir::ArgKind::Bool:
      attrs[spec.name] = v.i != 0;
      break;
    case ir::ArgKind::Word:
      if (spec.words.empty() && nameLeftOut(v)) break; // no attribute
      attrs[spec.name] = v.s;
      break;
    case ir::ArgKind::Dims: {
      ir::Shape s;
      for (const auto& item : v.items)
        s.push_back(item.asDim());
      attrs[spec.name] = s;
      break;
    }
    }
  }
  if (info.kind == ir::OpKind::Moe) return emitMoe(call, inputs.at(0), attrs, ctx, inRepeat);
  return emitOp(info.kind, call, std::move(inputs), std::move(attrs), ctx, info.name, inRepeat);
}

// Binds one `def` parameter: checks the kind, and for a tensor unifies its declared dims
// with the argument's (a new name binds, a known one must match).
void Elaborator::bindParam(const ast::Param& p, const Value& v, const ast::Expr* argExpr,
                           const ast::Expr& call, Frame& callee, const ast::Function& def,
                           Context& ctx) {
  const ast::Expr& at = argExpr ? *argExpr : call;
  auto mismatch = [&](const std::string& want, const std::string& got) {
    diags_
        .error(at.loc,
               fmt::format("argument `{}` of `{}` expects {}, got {}", p.name, def.name, want, got))
        .length(at.length)
        .noteAt(p.loc, fmt::format("`{}` is declared here", p.name));
    throw CompileAborted{};
  };
  if (!p.type.isTensor) {
    const std::string& t = p.type.name;
    bool ok = (t == "int" && v.kind == Value::Kind::Int) || (t == "float" && v.isNumber()) ||
              (t == "bool" && v.kind == Value::Kind::Bool) ||
              (t == "str" && (v.kind == Value::Kind::String || v.kind == Value::Kind::Word));
    if (!ok) mismatch(fmt::format("`{}`", t), kindName(v.kind));
    callee.vars[p.name] = t == "float" ? Value::ofFloat(v.number()) : v;
    return;
  }
  // An optional tensor (`mask: i32[B, T] = none`) left out or given as `none`: the body
  // passes it on to an op's optional tensor argument, which leaves it out too.
  if (v.kind == Value::Kind::None && p.defaultValue &&
      p.defaultValue->kind == ast::ExprKind::None) {
    callee.vars[p.name] = v;
    return;
  }
  if (v.kind == Value::Kind::None) {
    diags_
        .error(at.loc,
               fmt::format("argument `{}` of `{}` expects a tensor, got `none`", p.name, def.name))
        .length(at.length)
        .noteAt(p.loc, fmt::format("`{}` is declared here", p.name))
        .help(fmt::format("declare it `{}: {}[…] = none` for a tensor the caller may leave out",
                          p.name, p.type.name));
    throw CompileAborted{};
  }
  if (v.kind != Value::Kind::Tensor) mismatch("a tensor", kindName(v.kind));
  const ir::TensorType& actual = ctx.module->tensors[v.tensor].type;
  std::string want = p.type.name + "[…]";
  if (ir::parseDType(p.type.name) != actual.dtype || actual.shape.size() != p.type.dims.size()) {
    std::vector<std::string> dims;
    for (const auto& d : p.type.dims)
      dims.push_back(d->kind == ast::ExprKind::Name ? d->text : "_");
    mismatch(fmt::format("`{}[{}]`", p.type.name, fmt::join(dims, ", ")), "`" + actual.str() + "`");
  }
  for (size_t i = 0; i < p.type.dims.size(); ++i) {
    const ast::Expr& d = *p.type.dims[i];
    if (unbound(d, callee)) {
      callee.vars[d.text] = Value::ofDim(actual.shape[i]);
      continue;
    }
    Value dv = eval(d, callee, nullptr);
    if ((dv.kind != Value::Kind::Int && dv.kind != Value::Kind::Dim) ||
        dv.asDim() != actual.shape[i])
      mismatch(fmt::format("dim {} to be `{}`", i,
                           dv.kind == Value::Kind::Int || dv.kind == Value::Kind::Dim
                               ? dv.asDim().str()
                               : "?"),
               "`" + actual.str() + "`");
  }
  callee.vars[p.name] = v;
}

Value Elaborator::callDef(const ast::Function& def, const ast::Expr& call, std::vector<Value> args,
                          Context& ctx, bool inRepeat) {
  auto self = std::find(ctx.callStack.begin(), ctx.callStack.end(), &def);
  if (self != ctx.callStack.end()) {
    std::vector<std::string> via; // the defs between, for mutual recursion
    for (auto it = self + 1; it != ctx.callStack.end(); ++it)
      via.push_back("`" + (*it)->name + "`");
    diags_
        .error(call.loc, via.empty() ? fmt::format("`{}` calls itself", def.name)
                                     : fmt::format("`{}` calls itself through {}", def.name,
                                                   fmt::join(via, ", ")))
        .length(call.length)
        .noteAt(def.loc, fmt::format("`{}` is defined here", def.name))
        .help("EPL expands every `def` at compile time; repeat a block with `repeat(k) f(x)`");
    throw CompileAborted{};
  }
  Frame callee;
  Context inner = ctx;
  inner.callStack.push_back(&def);
  inner.topLevel = false;
  inner.namePrefix = uniqueName(ctx, def.name, inRepeat) + "/";
  if (!ctx.site.valid()) inner.site = call.loc;
  std::vector<const ast::Expr*> argExprs(call.args.size(), nullptr);
  // Argument expressions by parameter, for locations.
  std::vector<const ast::Expr*> bySlot(def.params.size(), nullptr);
  size_t pos = 0;
  for (const auto& a : call.args) {
    if (a.keyword.empty())
      bySlot[pos++] = a.value.get();
    else
      for (size_t i = 0; i < def.params.size(); ++i)
        if (def.params[i].name == a.keyword) bySlot[i] = a.value.get();
  }
  for (size_t i = 0; i < def.params.size(); ++i) {
    const ast::Param& p = def.params[i];
    Value v = bySlot[i] ? args[i] : defaultValue(p, callee);
    bindParam(p, v, bySlot[i], call, callee, def, ctx);
  }
  Value result = runBody(def.body, callee, inner);
  if (result.kind == Value::Kind::None) {
    diags_.error(def.loc, fmt::format("`{}` does not return a value", def.name))
        .length(static_cast<uint32_t>(def.name.size()))
        .help("end the def with `return x`");
    throw CompileAborted{};
  }
  const std::string resultType = def.result && !def.result->isTensor ? def.result->name : "";
  bool scalarMismatch = (resultType == "int" && result.kind != Value::Kind::Int) ||
                        (resultType == "float" && !result.isNumber()) ||
                        (resultType == "bool" && result.kind != Value::Kind::Bool) ||
                        (resultType == "str" && result.kind != Value::Kind::String &&
                         result.kind != Value::Kind::Word);
  if (def.result &&
      (scalarMismatch || def.result->isTensor != (result.kind == Value::Kind::Tensor))) {
    std::string got = result.kind == Value::Kind::Tensor
                          ? "`" + ctx.module->tensors[result.tensor].type.str() + "`"
                          : kindName(result.kind);
    fail(call, fmt::format("`{}` returns {}, not the declared `{}{}`", def.name, got,
                           def.result->name, def.result->isTensor ? "[…]" : ""));
  }
  if (def.result && result.kind == Value::Kind::Tensor) {
    // The declared dims are read in the def's own frame, where its parameters' dims
    // (B, T, D, …) are bound; a name bound nowhere matches anything.
    const ir::TensorType& t = ctx.module->tensors[result.tensor].type;
    bool same =
        ir::parseDType(def.result->name) == t.dtype && def.result->dims.size() == t.shape.size();
    std::vector<std::string> declared;
    for (size_t i = 0; i < def.result->dims.size(); ++i) {
      const ast::Expr& d = *def.result->dims[i];
      bool free = unbound(d, callee);
      Value v = free ? Value::ofWord(d.text) : eval(d, callee, nullptr);
      bool isDim = v.kind == Value::Kind::Int || v.kind == Value::Kind::Dim;
      declared.push_back(isDim ? v.asDim().str() : d.text);
      if (same && !free && (!isDim || v.asDim() != t.shape[i])) same = false;
    }
    if (!same)
      fail(call, fmt::format("`{}` returns `{}`, not the declared `{}[{}]`", def.name, t.str(),
                             def.result->name, fmt::join(declared, ", ")));
  }
  return result;
}

// repeat(k) f(x, …): f applied k times, each output fed back as the first argument.
Value Elaborator::evalRepeat(const ast::Expr& e, Frame& frame, Context* ctx) {
  const ast::Expr& count = *e.operands[0];
  // The count may be read as another value (the search's layouts, LayoutKnob::Kind::Layers),
  // keyed by where its text begins.
  int64_t k = 0;
  auto chosen = options_.literalValues.find({count.begin.line, count.begin.col});
  if (count.span > 0 && count.begin.file == mainFile_ && chosen != options_.literalValues.end())
    k = chosen->second;
  else
    k = expectInt(count, frame, ctx, "a repeat count");
  if (k <= 0 || k > 100000)
    fail(*e.operands[0], fmt::format("a repeat count must be between 1 and 100000, got {}", k));
  if (e.args.empty() || !e.args[0].keyword.empty())
    fail(e, "`repeat(k) f(x, …)` needs the value to thread through as f's first argument");
  if (!ctx) fail(e, "`repeat` can only be used inside a model or def");
  const ast::Expr& first = *e.args[0].value;
  if (first.kind != ast::ExprKind::Name)
    fail(first,
         "the first argument of a repeated call must be a name, e.g. `repeat(6) block(x, 8)`");
  // The threaded name is rebound in a copy of the frame, so the caller's `x` is unchanged.
  Frame local = frame;
  Value v;
  size_t firstOp = ctx->module->ops.size();
  for (int64_t i = 0; i < k; ++i) {
    v = evalCall(e, local, ctx, true);
    local.vars[first.text] = v;
  }
  noteLayers(e, *ctx, firstOp, k);
  return v;
}

// A count of the main script (a literal, or an expression on one line such as
// `layers / 2`, which a layout replaces whole), directly in a top-level block that runs
// once (ir::LayoutKnob::Kind::Layers): the search may move layers between stages.
void Elaborator::noteLayers(const ast::Expr& e, Context& ctx, size_t firstOp, int64_t count) {
  const ast::Expr& written = *e.operands[0];
  if (written.span == 0 || written.begin.file != mainFile_ || ctx.onceBlock < 0 ||
      ctx.scope != ctx.onceBlock || !ctx.callStack.empty())
    return;
  SourceLoc at = written.begin;
  ir::Module& m = *ctx.module;
  for (const ir::LayoutKnob& k : m.layoutKnobs)
    if (k.loc.line == at.line && k.loc.col == at.col) return;
  ir::LayoutKnob k;
  k.kind = ir::LayoutKnob::Kind::Layers;
  k.loc = at;
  k.length = written.span;
  k.value = count;
  k.def = e.text;
  k.block = ctx.onceBlock;
  k.firstOp = firstOp;
  k.endOp = m.ops.size();
  m.layoutKnobs.push_back(k);
}

} // namespace epl::frontend
