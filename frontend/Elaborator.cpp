// Globals, the model body and parallel blocks. Expressions live in Expressions.cpp.
#include "frontend/Elaborator.h"

#include "support/Text.h"

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <sstream>

namespace epl::frontend {

namespace {

// Every op a model may expand to; beyond it the script is almost surely a mistake.
constexpr size_t kMaxOps = 2'000'000;

const std::set<std::string> kScalarTypes{"int", "float", "bool", "str"};

// The value of the first `return` in a body, looking inside its blocks, or null.
const ast::Expr* returnValue(const std::vector<ast::Stmt>& body) {
  for (const ast::Stmt& s : body) {
    if (s.kind == ast::StmtKind::Return) return s.values[0].get();
    if (s.kind == ast::StmtKind::Parallel)
      if (const ast::Expr* e = returnValue(s.block->body)) return e;
  }
  return nullptr;
}

} // namespace

const std::set<std::string>& scalarTypes() {
  return kScalarTypes;
}

const char* kindName(Value::Kind k) {
  switch (k) {
  case Value::Kind::Int:
    return "an integer";
  case Value::Kind::Float:
    return "a number";
  case Value::Kind::Bool:
    return "a boolean";
  case Value::Kind::String:
    return "a string";
  case Value::Kind::Word:
    return "a word";
  case Value::Kind::None:
    return "`none`";
  case Value::Kind::Auto:
    return "`auto`";
  case Value::Kind::Dim:
    return "a symbolic dim";
  case Value::Kind::Tensor:
    return "a tensor";
  case Value::Kind::List:
    return "a list";
  case Value::Kind::Record:
    return "a record";
  }
  return "a value";
}

void Elaborator::fail(const ast::Expr& e, std::string message) {
  diags_.error(e.loc, std::move(message)).length(e.length);
  throw CompileAborted{};
}

void Elaborator::defineGlobal(const std::string& name, SourceLoc loc, const char* what) {
  if (ir::findBuiltin(name)) {
    diags_.error(loc, fmt::format("`{}` is a builtin and cannot be redefined", name))
        .length(static_cast<uint32_t>(name.size()))
        .help(fmt::format("choose another name for this {}", what));
    throw CompileAborted{};
  }
  auto it = globalLocs_.find(name);
  if (it != globalLocs_.end()) {
    diags_.error(loc, fmt::format("`{}` is defined twice", name))
        .length(static_cast<uint32_t>(name.size()))
        .noteAt(it->second, "first defined here");
    throw CompileAborted{};
  }
  globalLocs_[name] = loc;
}

// let, def and model names share one namespace, checked in load order (imports first).
void Elaborator::declareGlobals() {
  for (const auto& f : files_) {
    for (const ast::Binding& b : f->lets) {
      defineGlobal(b.name, b.loc, "constant");
      globals_.vars[b.name] = eval(*b.value, globals_, nullptr);
      if (globals_.vars[b.name].kind == Value::Kind::Tensor)
        fail(*b.value, "`let` needs a constant");
    }
    for (const ast::Function& fn : f->functions) {
      defineGlobal(fn.name, fn.loc, fn.isModel ? "model" : "def");
      checkSignature(fn);
      if (fn.isModel)
        models_.push_back(&fn);
      else
        defs_[fn.name] = &fn;
    }
  }
}

// Parameter types are checked where they are declared, so a `def` no model calls still
// gets them checked (its body is checked where it is expanded, at each call).
void Elaborator::checkSignature(const ast::Function& fn) {
  std::vector<std::string> names(kScalarTypes.begin(), kScalarTypes.end());
  std::set<std::string> seen;
  for (const ast::Param& p : fn.params) {
    if (!seen.insert(p.name).second) {
      diags_.error(p.loc, fmt::format("parameter `{}` is declared twice", p.name))
          .length(static_cast<uint32_t>(p.name.size()));
      throw CompileAborted{};
    }
    if (p.type.isTensor || kScalarTypes.count(p.type.name)) continue;
    unknownType(p.type, names);
  }
  if (fn.result && !fn.result->isTensor && !kScalarTypes.count(fn.result->name))
    unknownType(*fn.result, names);
}

void Elaborator::unknownType(const ast::TypeRef& type, const std::vector<std::string>& names) {
  std::string near = closestMatch(type.name, names);
  auto d = diags_.error(type.loc, fmt::format("unknown type `{}`", type.name));
  d.length(static_cast<uint32_t>(type.name.size()));
  d.help(near.empty() ? "types are a tensor type such as f32[B, D], or int, float, bool, str"
                      : fmt::format("did you mean `{}`?", near));
  throw CompileAborted{};
}

std::optional<ir::Module> Elaborator::run(uint32_t mainFile) {
  // Hands the syntax trees to the caller on every way out (FrontendOptions::syntax).
  struct KeepSyntax {
    Elaborator& e;
    ~KeepSyntax() {
      if (e.options_.syntax) *e.options_.syntax = std::move(e.files_);
    }
  } keepSyntax{*this};
  std::vector<uint32_t> stack;
  mainFile_ = mainFile;
  // Keyed like resolved imports, so an import of the main script is seen as a cycle.
  std::error_code ec;
  fileIds_[std::filesystem::weakly_canonical(diags_.sources().path(mainFile), ec).string()] =
      mainFile;
  loaded_[mainFile] = false;
  if (!load(mainFile, stack)) return std::nullopt;
  try {
    declareGlobals();
  } catch (const CompileAborted&) {
    return std::nullopt;
  }
  const ast::File& main = *files_.back();
  const ast::Function* chosen = nullptr;
  if (!main.trains.empty()) {
    const std::string& name = main.trains[0].target;
    for (const auto* m : models_)
      if (m->name == name) chosen = m;
    if (!chosen) {
      std::vector<std::string> names;
      for (const auto* m : models_)
        names.push_back(m->name);
      auto d = diags_.error(main.trains[0].targetLoc, fmt::format("unknown model `{}`", name));
      d.length(static_cast<uint32_t>(name.size()));
      std::string near = closestMatch(name, names);
      if (!near.empty()) d.help(fmt::format("did you mean `{}`?", near));
      return std::nullopt;
    }
  } else if (!models_.empty()) {
    chosen = models_.back();
  }
  if (!chosen) {
    diags_.error(SourceLoc{mainFile, 1, 1}, "no `model` in this script")
        .help("declare one: model net(x: f32[B, 784], y: i32[B]) { … }");
    return std::nullopt;
  }
  std::optional<ir::Module> result;
  for (const auto* m : models_) {
    auto module = elaborateModel(*m);
    if (m == chosen) result = std::move(module);
  }
  if (!result) {
    // The model failed; its settings are read all the same, so that a mistake there is
    // reported with the model's (an editor shows both at once).
    ir::Module placeholder;
    placeholder.modelName = chosen->name;
    placeholder.loc = chosen->loc;
    checkSettings(placeholder);
    return std::nullopt;
  }
  if (diags_.hasErrors()) return std::nullopt;
  checkSettings(*result);
  if (!diags_.hasErrors() && result->train.present) checkTrainedInputs(*chosen, *result);
  if (diags_.hasErrors()) return std::nullopt;
  return result;
}

std::optional<ir::Module> Elaborator::elaborateModel(const ast::Function& model) {
  ir::Module m;
  m.modelName = model.name;
  m.loc = model.loc;
  nameCounts_.clear();
  opBudget_ = kMaxOps;
  try {
    Frame frame;
    bindModelInputs(model, m, frame);
    Context ctx;
    ctx.module = &m;
    ctx.topLevel = true;
    Value result = runBody(model.body, frame, ctx);
    checkModelResult(model, result, m);
  } catch (const CompileAborted&) {
    return std::nullopt;
  }
  chainLayers(m);
  return m;
}

// Layers knobs that can move layers between stages without changing the model: repeats of
// one def in different top-level blocks, each's ops right after the previous one's (a block
// ends with its repeat, the next block begins with its own, an inner block holds nothing
// else). Each chain of two or more gets an id; the other Layers knobs are dropped, and so
// are the Groups knobs unless every stage has one.
void Elaborator::chainLayers(ir::Module& m) {
  using Kind = ir::LayoutKnob::Kind;
  std::vector<ir::LayoutKnob*> layers;
  for (ir::LayoutKnob& k : m.layoutKnobs)
    if (k.kind == Kind::Layers) layers.push_back(&k);
  std::sort(layers.begin(), layers.end(), [](const ir::LayoutKnob* a, const ir::LayoutKnob* b) {
    return a->firstOp < b->firstOp;
  });
  int chains = 0;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i + 1;
    while (j < layers.size() && layers[j]->def == layers[i]->def &&
           layers[j]->firstOp == layers[j - 1]->endOp && layers[j]->block != layers[j - 1]->block)
      ++j;
    if (j - i >= 2) {
      for (size_t k = i; k < j; ++k)
        layers[k]->chain = chains;
      ++chains;
    }
    i = j;
  }
  // Group sizes move between stages only where every stage pins its own.
  size_t stages = 0, pinned = 0;
  for (const ir::Scope& sc : m.scopes)
    stages += sc.kind == ir::ScopeKind::Stage;
  for (ir::LayoutKnob& k : m.layoutKnobs)
    pinned += k.kind == Kind::Groups;
  for (ir::LayoutKnob& k : m.layoutKnobs)
    if (k.kind == Kind::Groups && pinned == stages && stages >= 2) k.chain = 0;
  m.layoutKnobs.erase(std::remove_if(m.layoutKnobs.begin(), m.layoutKnobs.end(),
                                     [](const ir::LayoutKnob& k) {
                                       return (k.kind == Kind::Layers || k.kind == Kind::Groups) &&
                                              k.chain < 0;
                                     }),
                      m.layoutKnobs.end());
}

// The dims of a model input: integers, known names or new symbols, each positive.
ir::Shape Elaborator::inputShape(const ast::Param& p, Frame& frame) {
  ir::Shape shape;
  for (const auto& d : p.type.dims) {
    if (unbound(*d, frame)) frame.vars[d->text] = Value::ofDim(ir::Dim::symbol(d->text));
    Value v = eval(*d, frame, nullptr);
    if (v.kind != Value::Kind::Int && v.kind != Value::Kind::Dim)
      fail(*d, fmt::format("a dim must be an integer or a name, found {}", kindName(v.kind)));
    if (v.asDim().coef <= 0)
      fail(*d, fmt::format("a dim must be positive, got {}", v.asDim().str()));
    shape.push_back(v.asDim());
  }
  return shape;
}

// model gpt(tokens: i32[B, seq]): each input a tensor whose first dim is the batch symbol.
void Elaborator::bindModelInputs(const ast::Function& model, ir::Module& m, Frame& frame) {
  if (model.params.empty()) {
    diags_.error(model.loc, fmt::format("model `{}` has no inputs", model.name))
        .help("a model takes its batch as tensors, e.g. (x: f32[B, 784], y: i32[B])");
    throw CompileAborted{};
  }
  for (const ast::Param& p : model.params) {
    if (!p.type.isTensor || p.type.dims.empty()) {
      diags_
          .error(p.type.loc,
                 fmt::format("model input `{}` must be a tensor with a batch dim", p.name))
          .help("write it as e.g. f32[B, 784]");
      throw CompileAborted{};
    }
    ir::Shape shape = inputShape(p, frame);
    const ir::Dim& batch = shape[0];
    if (batch.isConstant() || batch.syms.size() != 1 || batch.coef != 1)
      fail(*p.type.dims[0],
           "the first dim of a model input is the batch and must be a name such as `B`");
    if (m.batchSymbol.empty())
      m.batchSymbol = batch.syms[0];
    else if (m.batchSymbol != batch.syms[0])
      fail(*p.type.dims[0],
           fmt::format("every model input must share the batch dim `{}`", m.batchSymbol));
    ir::TensorType type{*ir::parseDType(p.type.name), shape};
    if (!ir::checkedBytes(type, {})) {
      diags_
          .error(p.type.loc, fmt::format("model input `{}` of `{}` is larger than 2^63 - 1 bytes",
                                         p.name, type.str()))
          .length(static_cast<uint32_t>(p.type.name.size()));
      throw CompileAborted{};
    }
    int t = m.addTensor(p.name, type, -1);
    m.inputs.push_back(t);
    frame.vars[p.name] = Value::ofTensor(t);
  }
}

// A trained model loads real batches, so every dim of its inputs but the batch must be
// known: a free symbol such as `T` has no size to load, or to plan memory for.
void Elaborator::checkTrainedInputs(const ast::Function& model, const ir::Module& m) {
  for (size_t i = 0; i < model.params.size(); ++i) {
    const ir::Shape& shape = m.tensors[m.inputs[i]].type.shape;
    for (size_t k = 1; k < shape.size(); ++k) {
      if (shape[k].isConstant()) continue;
      const ast::Expr& d = *model.params[i].type.dims[k];
      diags_
          .error(d.loc, fmt::format("dim {} of model input `{}` is `{}`, but training `{}` needs "
                                    "every dim except the batch to be known",
                                    k, model.params[i].name, shape[k].str(), model.name))
          .length(d.length)
          .help(fmt::format("give `{}` a value with `let`, e.g. `let {} = 128`", shape[k].syms[0],
                            shape[k].syms[0]));
      return;
    }
  }
}

void Elaborator::checkModelResult(const ast::Function& model, const Value& v, ir::Module& m) {
  if (v.kind == Value::Kind::None) {
    diags_.error(model.loc, fmt::format("model `{}` does not return its loss", model.name))
        .length(static_cast<uint32_t>(model.name.size()))
        .help("end the model with `return loss`");
    throw CompileAborted{};
  }
  if (v.kind != Value::Kind::Tensor || !m.tensors[v.tensor].type.shape.empty() ||
      ir::isIntegral(m.tensors[v.tensor].type.dtype)) {
    std::string got = v.kind == Value::Kind::Tensor ? "`" + m.tensors[v.tensor].type.str() + "`"
                                                    : kindName(v.kind);
    const ast::Expr* at = returnValue(model.body);
    diags_
        .error(at ? at->loc : model.loc,
               fmt::format("model `{}` must return a scalar loss, got {}", model.name, got))
        .length(at ? at->length : static_cast<uint32_t>(model.name.size()))
        .help("return a loss such as `cross_entropy(logits, labels)`");
    throw CompileAborted{};
  }
  m.outputs.push_back(v.tensor);
  checkIgnoredClass(m);
}

// A cross-entropy with an ignored class averages over the global batch's kept targets,
// which every rank counts from the data before its step (docs/architecture.md): so it must
// be the loss, and its targets the data's.
void Elaborator::checkIgnoredClass(const ir::Module& m) {
  for (const ir::Op& op : m.ops) {
    if (op.kind != ir::OpKind::CrossEntropy || ir::ignoredClass(&op.attrs) < 0) continue;
    if (op.outputs[0] != m.outputs[0]) {
      diags_.error(op.site, "`ignore_index` needs this `cross_entropy` to be the model's loss")
          .length(static_cast<uint32_t>(op.name.size()))
          .help("return it from the model as it is, or leave out `ignore_index`");
      throw CompileAborted{};
    }
    if (m.dataSource(op.inputs[1]).input < 0) {
      diags_
          .error(op.site, "`ignore_index` needs targets that come from the data: a model "
                          "input, or `next(…)` of one, at most reshaped or transposed")
          .length(static_cast<uint32_t>(op.name.size()))
          .help("pass the targets as the data gives them, or leave out `ignore_index`");
      throw CompileAborted{};
    }
  }
}

// Runs statements in order; returns the value of `return`, or None when there is none.
Value Elaborator::runBody(const std::vector<ast::Stmt>& body, Frame& frame, Context& ctx) {
  Value result;
  bool returned = false;
  for (const ast::Stmt& s : body) {
    if (returned) {
      diags_.error(s.loc, "code after `return` never runs");
      throw CompileAborted{};
    }
    switch (s.kind) {
    case ast::StmtKind::Assign: {
      Value v = eval(*s.values[0], frame, &ctx);
      if (s.targets.size() != 1) {
        diags_.error(s.targetLocs[1],
                     fmt::format("this expression gives one value, not {}", s.targets.size()));
        throw CompileAborted{};
      }
      if (v.kind == Value::Kind::None) fail(*s.values[0], "this expression has no value");
      frame.vars[s.targets[0]] = v;
      break;
    }
    case ast::StmtKind::Parallel:
      runParallel(*s.block, frame, ctx, returned, result);
      break;
    case ast::StmtKind::Return:
      if (s.values.size() != 1) fail(*s.values[1], "return one value");
      result = eval(*s.values[0], frame, &ctx);
      returned = true;
      break;
    }
  }
  return result;
}

int64_t Elaborator::blockWidth(const ast::ParallelBlock& b, Frame& frame, Context& ctx) {
  if (!b.width) return 0;
  int64_t w = expectInt(*b.width, frame, &ctx, "a block width");
  if (w <= 0 || w > 1'000'000)
    fail(*b.width, fmt::format("a block width must be between 1 and 1000000, got {}", w));
  return w;
}

void Elaborator::noteLayoutKnob(const ast::Expr& e, ir::LayoutKnob::Kind kind, const Frame& frame,
                                ir::Module& m) {
  const ast::Expr* literal = nullptr;
  std::string let;
  if (e.kind == ast::ExprKind::Int) {
    literal = &e;
  } else if (e.kind == ast::ExprKind::Name && !frame.vars.count(e.text)) {
    for (const ast::Binding& b : files_.back()->lets) // the main script's
      if (b.name == e.text && b.value->kind == ast::ExprKind::Int) {
        literal = b.value.get();
        let = b.name;
      }
  }
  if (!literal || literal->loc.file != mainFile_) return;
  for (const ir::LayoutKnob& k : m.layoutKnobs)
    if (k.loc.line == literal->loc.line && k.loc.col == literal->loc.col) return;
  ir::LayoutKnob k;
  k.kind = kind;
  k.let = let;
  k.loc = literal->loc;
  k.length = literal->length;
  k.value = eval(*literal, globals_, nullptr).i;
  m.layoutKnobs.push_back(k);
}

// replicate(n) { … } at the top of a model is a pipeline stage; split(n) { … } is a stage
// when at the top, else a tensor-parallel region of the enclosing stage.
void Elaborator::runParallel(const ast::ParallelBlock& b, Frame& frame, Context& ctx,
                             bool& returned, Value& result) {
  bool isSplit = b.kind == ast::BlockKind::Split;
  const char* kw = isSplit ? "split" : "replicate";
  ir::Module& m = *ctx.module;
  if (!ctx.topLevel && !isSplit) {
    diags_.error(b.loc, "`replicate` blocks are pipeline stages and must be at the top of a model")
        .length(9)
        .help("ops outside `split` blocks already run replicated within their stage");
    throw CompileAborted{};
  }
  if (!ctx.topLevel && m.splitScopeOf(ctx.scope) >= 0) {
    diags_.error(b.loc, "`split` blocks do not nest")
        .length(5)
        .noteAt(m.scopes[m.splitScopeOf(ctx.scope)].loc, "inside this split");
    throw CompileAborted{};
  }
  int64_t repeat = 1;
  if (b.repeat) {
    if (!ctx.topLevel)
      fail(*b.repeat, fmt::format("`repeat` on a block repeats a stage and needs a top-level "
                                  "block, not `{}` inside one",
                                  kw));
    repeat = expectInt(*b.repeat, frame, &ctx, "a repeat count");
    if (repeat <= 0 || repeat > 100000)
      fail(*b.repeat, fmt::format("a repeat count must be between 1 and 100000, got {}", repeat));
    noteLayoutKnob(*b.repeat, ir::LayoutKnob::Kind::Stages, frame, m);
  }
  int64_t width = blockWidth(b, frame, ctx);
  if (isSplit && b.width) noteLayoutKnob(*b.width, ir::LayoutKnob::Kind::SplitWidth, frame, m);
  if (!isSplit && ctx.topLevel && repeat == 1 && b.width && b.width->kind == ast::ExprKind::Int &&
      b.width->loc.file == mainFile_)
    noteLayoutKnob(*b.width, ir::LayoutKnob::Kind::Groups, frame, m);
  bool isAuto = b.isAuto || (!b.width && isSplit);
  if (isAuto && isSplit && b.loc.file == mainFile_) {
    // `split(auto)` or `split` in the main script: the search may write a width in its
    // place, read here as the block's width.
    ir::LayoutKnob k;
    k.kind = ir::LayoutKnob::Kind::SplitWidth;
    k.bare = !b.isAuto;
    k.loc = b.isAuto ? b.autoLoc : b.loc;
    k.length = b.isAuto ? 4 : 5;
    bool noted = false;
    for (const ir::LayoutKnob& other : m.layoutKnobs)
      noted |= other.loc.line == k.loc.line && other.loc.col == k.loc.col;
    if (!noted) m.layoutKnobs.push_back(k);
    auto chosen = options_.literalValues.find({k.loc.line, k.loc.col});
    if (chosen != options_.literalValues.end() && chosen->second > 0) {
      width = chosen->second;
      isAuto = false;
    }
  }
  for (int64_t r = 0; r < repeat; ++r) {
    ir::Scope scope;
    scope.kind = ctx.topLevel ? ir::ScopeKind::Stage : ir::ScopeKind::Split;
    scope.isSplitStage = ctx.topLevel && isSplit;
    scope.parent = ctx.scope;
    scope.width = static_cast<int>(width);
    scope.isAuto = isAuto;
    scope.loc = b.loc;
    Context inner = ctx;
    inner.scope = m.addScope(scope);
    inner.topLevel = false;
    inner.onceBlock = ctx.topLevel && repeat == 1 ? inner.scope : -1;
    Value v = runBody(b.body, frame, inner);
    if (v.kind != Value::Kind::None) {
      returned = true;
      result = v;
    }
  }
}

} // namespace epl::frontend
