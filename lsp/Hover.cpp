// Hover text from the op table, the setting tables and the plan (lsp/Hover.h).
#include "lsp/Hover.h"

#include "frontend/Settings.h"
#include "ir/Printer.h"
#include "lsp/Diagnostics.h"
#include "lsp/SyntaxQuery.h"
#include "support/Text.h"

#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <set>

namespace epl::lsp {

using nlohmann::json;

std::string opSignature(const ir::OpInfo& info) {
  std::vector<std::string> args;
  for (const auto& a : info.args)
    args.push_back(a.required                                       ? a.name
                   : a.kind == ir::ArgKind::Tensor                  ? a.name + " = none"
                   : a.kind == ir::ArgKind::Word && a.words.empty() ? a.name + " = none" // a name
                   : a.defaultArg.empty() ? a.name + " = " + ir::attrStr(a.defaultValue)
                                          : a.name + " = " + a.defaultArg);
  return fmt::format("{}({})", info.name, fmt::join(args, ", "));
}

namespace {

std::string opDoc(const ir::OpInfo& info) {
  return fmt::format("```epl\n{}\n```\n{}; `{}`", opSignature(info), info.summary, info.shapes);
}

std::string lineOf(const Analysis& a, SourceLoc loc) {
  if (loc.file == a.mainFile) return fmt::format("line {}", loc.line);
  return fmt::format("{}:{}", a.session->sources.path(loc.file), loc.line);
}

// "plan for -np 8: 2 data-parallel × 2 stages × split 2"
std::string meshLine(const Analysis& a) {
  const ir::Mesh& mesh = a.module->mesh;
  int split = 1;
  for (const auto& s : mesh.stages)
    split = std::max(split, s.splitWidth);
  std::string np = a.np > 0 ? fmt::format("-np {}", a.np)
                            : fmt::format("one replica ({} devices; set -np)", mesh.replicaSize);
  return fmt::format("plan for {}: {} data-parallel × {} stage{} × split {}", np, mesh.dataParallel,
                     mesh.stages.size(), mesh.stages.size() == 1 ? "" : "s", split);
}

// Where an op runs: its stage and devices, and its split block and form.
std::string placement(const Analysis& a, const ir::Op& op) {
  const ir::Module& m = *a.module;
  if (op.stage < 0 || op.stage >= static_cast<int>(m.mesh.stages.size())) return "not placed";
  const ir::StagePlan& st = m.mesh.stages[op.stage];
  std::string out =
      fmt::format("stage {} ({}): {} device{}, ranks {}", op.stage, lineOf(a, st.loc), st.group,
                  st.group == 1 ? "" : "s", ir::stageRankRanges(m.mesh, op.stage));
  int split = m.splitScopeOf(op.scope);
  if (split < 0) return out;
  const ir::Scope& sc = m.scopes[split];
  int width = sc.width > 0 ? sc.width : st.splitWidth;
  std::string form = op.splitForm == ir::SplitForm::None ? "not split, whole on each device"
                                                         : ir::splitFormName(op.splitForm);
  std::string layout;
  if (!op.outputs.empty()) layout = ", output " + m.tensors[op.outputs[0]].layout.str();
  return out + fmt::format("; split({}) at {}: {}{}", width, lineOf(a, sc.loc), form, layout);
}

int64_t elements(const ir::Module& m, const ir::Param& p) {
  return ir::numElements(p.type.shape, m.bindings).value_or(0);
}

int64_t paramCount(const ir::Module& m, const ir::Op& op) {
  int64_t n = 0;
  for (int p : op.params) // a tied weight counts at the layer that made it
    if (m.params[p].op >= 0 && &m.ops[m.params[p].op] == &op) n += elements(m, m.params[p]);
  return n;
}

// "`f32[B, 128, 256] -> f32[B, 128, 256]`"
std::string typesOf(const ir::Module& m, const ir::Op& op) {
  std::vector<std::string> in, out;
  for (int t : op.inputs)
    in.push_back(m.tensors[t].type.str());
  if (!op.outputs.empty()) out.push_back(m.tensors[op.outputs[0]].type.str()); // the result
  return fmt::format("`{}{}{}`", fmt::join(in, ", "), in.empty() ? "-> " : " -> ",
                     fmt::join(out, ", "));
}

// "`weight f32[256, 256]`, `bias f32[256]`"
std::string paramList(const ir::Module& m, const ir::Op& op) {
  std::vector<std::string> parts;
  for (int p : op.params) {
    const std::string& name = m.params[p].name;
    size_t dot = name.rfind('.');
    bool tied = m.params[p].op >= 0 && &m.ops[m.params[p].op] != &op; // `tie`: another's weight
    parts.push_back(fmt::format("`{} {}`{}", dot == std::string::npos ? name : name.substr(dot + 1),
                                m.params[p].type.str(),
                                tied ? fmt::format(" (tied: `{}`)", name) : ""));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

// Equal lines once each, with "(×n)" for repeats, in first-seen order.
std::vector<std::string> counted(const std::vector<std::string>& lines) {
  std::vector<std::string> order;
  std::map<std::string, int> n;
  for (const auto& l : lines)
    if (n[l]++ == 0) order.push_back(l);
  for (auto& l : order)
    if (n[l] > 1) l += fmt::format(" (×{})", n[l]);
  return order;
}

std::string bullets(const std::vector<std::string>& lines, size_t max = 6) {
  std::string out;
  for (size_t i = 0; i < lines.size() && i < max; ++i)
    out += "- " + lines[i] + "\n";
  if (lines.size() > max) out += fmt::format("- … and {} more\n", lines.size() - max);
  return out;
}

// The plan of the ops one builtin call became (several when a def holding it is called
// more than once).
std::string builtinPlan(const Analysis& a, const std::vector<int>& ops) {
  const ir::Module& m = *a.module;
  std::vector<std::string> types, places;
  std::set<int64_t> counts;
  int64_t total = 0;
  for (int id : ops) {
    types.push_back(typesOf(m, m.ops[id]));
    places.push_back(placement(a, m.ops[id]));
    counts.insert(paramCount(m, m.ops[id]));
    total += paramCount(m, m.ops[id]);
  }
  std::string out = fmt::format("**{}**", meshLine(a));
  if (ops.size() > 1) out += fmt::format(", this call expands {} times", ops.size());
  out += "\n\n" + bullets(counted(types), 3);
  const ir::Op& first = m.ops[ops.front()];
  if (total > 0) {
    std::string each = counts.size() == 1 && ops.size() > 1
                           ? fmt::format(" each, {} in all", withCommas(total))
                           : "";
    out += fmt::format("- parameters: {} ({}){}\n", withCommas(*counts.begin()),
                       paramList(m, first), each);
  } else {
    out += "- no parameters\n";
  }
  // Its matrix products on the first rank of its stage, a micro-batch.
  if (const ir::Program* p = m.firstProgramOf(first.stage))
    if (double flops = m.runFlops(*p, ops.front()).forward; flops > 0)
      out += fmt::format("- compute: {} in matrix products on rank {} a micro-batch, backward "
                         "twice that\n",
                         formatFlops(flops), p->rank);
  return out + bullets(counted(places));
}

// The plan of everything a def call in the model body expanded to.
std::string defPlan(const Analysis& a, const std::vector<int>& ops) {
  const ir::Module& m = *a.module;
  std::set<std::string> expansions;
  std::map<int, std::pair<int64_t, size_t>> byStage; // stage -> params, ops
  int64_t total = 0;
  for (int id : ops) {
    const ir::Op& op = m.ops[id];
    expansions.insert(op.name.substr(0, op.name.find('/')));
    int64_t n = paramCount(m, op);
    total += n;
    byStage[op.stage].first += n;
    byStage[op.stage].second += 1;
  }
  std::string out = fmt::format("**{}**, this call expands to {} ops", meshLine(a), ops.size());
  if (expansions.size() > 1) out += fmt::format(" ({} repeats)", expansions.size());
  out += "\n\n";
  out += fmt::format("- parameters: {}", withCommas(total));
  if (expansions.size() > 1 && total % static_cast<int64_t>(expansions.size()) == 0)
    out += fmt::format(" ({} each)", withCommas(total / static_cast<int64_t>(expansions.size())));
  out += "\n";
  std::vector<std::string> places;
  for (const auto& [stage, pn] : byStage) {
    ir::Op probe;
    probe.stage = stage;
    probe.scope = 0;
    places.push_back(fmt::format("{}: {} ops, {} parameters", placement(a, probe), pn.second,
                                 withCommas(pn.first)));
  }
  return out + bullets(places);
}

bool forward(const ir::Op& op) {
  return op.phase == ir::Phase::Forward &&
         ir::opInfo(op.kind).split != ir::SplitRule::Communication;
}

std::vector<int> opsWritten(const Analysis& a, SourceLoc loc, std::optional<ir::OpKind> kind) {
  std::vector<int> out;
  if (!a.module) return out;
  for (size_t i = 0; i < a.module->ops.size(); ++i) {
    const ir::Op& op = a.module->ops[i];
    if (forward(op) && sameLoc(op.loc, loc) && (!kind || ir::builtinOf(op.kind) == *kind))
      out.push_back(static_cast<int>(i));
  }
  return out;
}

std::vector<int> opsExpandedFrom(const Analysis& a, SourceLoc site) {
  std::vector<int> out;
  if (!a.module) return out;
  for (size_t i = 0; i < a.module->ops.size(); ++i) {
    const ir::Op& op = a.module->ops[i];
    if (forward(op) && sameLoc(op.site, site) && !sameLoc(op.loc, site))
      out.push_back(static_cast<int>(i));
  }
  return out;
}

// The header of a def or model as written, with the comment lines just above it.
std::string functionDoc(const Analysis& a, const ast::Function& fn) {
  LineIndex text(a.session->sources.text(fn.fileId));
  Span span = functionSpan(text, fn);
  size_t brace = findCode(text.text(), span.begin, '{');
  std::string header(
      text.text().substr(span.begin, (brace == std::string::npos ? span.end : brace) - span.begin));
  while (!header.empty() && std::isspace(static_cast<unsigned char>(header.back())))
    header.pop_back();
  std::vector<std::string> comment;
  for (uint32_t l = fn.loc.line - 1; l >= 1; --l) {
    std::string_view line = text.line(l);
    size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line[first] != '#') break;
    comment.insert(comment.begin(), std::string(line.substr(first + 1)));
  }
  std::string out = fmt::format("```epl\n{}\n```\n", header);
  for (auto& c : comment)
    out += (c.empty() || c[0] != ' ' ? c : c.substr(1)) + "\n";
  out += fmt::format("\n*{} in {}*", fn.isModel ? "model" : "def", lineOf(a, fn.loc));
  return out;
}

const ast::Function* findFunction(const Analysis& a, const std::string& name) {
  for (const auto& f : a.syntax)
    for (const ast::Function& fn : f->functions)
      if (fn.name == name) return &fn;
  return nullptr;
}

const ast::Binding* findLet(const Analysis& a, const std::string& name) {
  for (const auto& f : a.syntax)
    for (const ast::Binding& b : f->lets)
      if (b.name == name) return &b;
  return nullptr;
}

std::string letDoc(const Analysis& a, const ast::Binding& b) {
  LineIndex text(a.session->sources.text(b.loc.file));
  std::string line(text.line(b.loc.line));
  size_t hash = findCode(line, 0, '#');
  if (hash != std::string::npos) line = line.substr(0, hash);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())))
    line.pop_back();
  size_t first = line.find_first_not_of(" \t");
  return fmt::format("```epl\n{}\n```\n*let in {}*",
                     first == std::string::npos ? line : line.substr(first), lineOf(a, b.loc));
}

std::string settingCallDoc(const std::string& name) {
  for (const auto& c : frontend::settingCalls())
    if (c.name == name)
      return fmt::format("```epl\n{}({})\n```\n{} for `{}`", c.name, c.defaultValue, c.doc, c.type);
  return "";
}

std::string keyDoc(const ast::SettingsBlock& b, bool isTrain, const std::string& key) {
  for (const auto& k : isTrain ? frontend::trainKeys() : frontend::policyKeys())
    if (k.name == key)
      return fmt::format("**{}** `{}` key: {}\n\n- type: {}\n- default: `{}`", k.name,
                         isTrain ? "train" : "policy", k.doc, k.type, k.defaultValue);
  (void)b;
  return "";
}

json hoverJson(const std::string& markdown, Range r) {
  if (markdown.empty()) return nullptr;
  return {{"contents", {{"kind", "markdown"}, {"value", markdown}}}, {"range", rangeJson(r)}};
}

// A call written in the script: a builtin (or a setting call in policy/train), or a def.
std::string callDoc(const Analysis& a, const ast::Expr& call, const std::string& name,
                    bool inSettings) {
  if (inSettings) return settingCallDoc(name);
  if (const ir::OpInfo* info = ir::findBuiltin(name)) {
    std::string doc = opDoc(*info);
    std::vector<int> ops = opsWritten(a, call.loc, info->kind);
    if (!ops.empty()) doc += "\n\n---\n" + builtinPlan(a, ops);
    return doc;
  }
  const ast::Function* fn = findFunction(a, name);
  if (!fn) return "";
  std::string doc = functionDoc(a, *fn);
  std::vector<int> ops = opsExpandedFrom(a, call.loc);
  if (!ops.empty()) doc += "\n\n---\n" + defPlan(a, ops);
  return doc;
}

bool inSettingsBlock(const ast::File& main, const LineIndex& text, size_t offset) {
  for (const auto* blocks : {&main.policies, &main.trains})
    for (const auto& b : *blocks)
      if (blockSpan(text, b.loc).contains(offset)) return true;
  return false;
}

// The stages a block became: one line each, or for more than three (`repeat(8) split(8)`)
// one line per shape of stage with its parameter range.
std::vector<std::string> stageLines(const ir::Module& m, const std::vector<int>& stages) {
  std::vector<std::string> lines;
  auto shape = [&](const ir::StagePlan& st) {
    return fmt::format("{} device{}, split width {}, {} cop{}", st.group, st.group == 1 ? "" : "s",
                       st.splitWidth, st.copies(), st.copies() == 1 ? "y" : "ies");
  };
  if (stages.size() <= 3) {
    for (int s : stages)
      lines.push_back(fmt::format("stage {}: {}; ranks {}; {} parameters on each device", s,
                                  shape(m.mesh.stages[s]), ir::stageRankRanges(m.mesh, s),
                                  withCommas(m.mesh.stages[s].rankParamCount)));
    return lines;
  }
  std::map<std::string, std::vector<int>> byShape;
  for (int s : stages)
    byShape[shape(m.mesh.stages[s])].push_back(s);
  for (const auto& [text, group] : byShape) {
    int64_t lo = INT64_MAX, hi = 0;
    for (int s : group) {
      lo = std::min(lo, m.mesh.stages[s].rankParamCount);
      hi = std::max(hi, m.mesh.stages[s].rankParamCount);
    }
    std::string params =
        lo == hi ? withCommas(lo) : fmt::format("{} to {}", withCommas(lo), withCommas(hi));
    std::string which = group.back() - group.front() + 1 == static_cast<int>(group.size())
                            ? fmt::format("{}-{}", group.front(), group.back())
                            : fmt::format("{}", fmt::join(group, ", "));
    lines.push_back(fmt::format("stages {} ({} stages): {} each; {} parameters on each device",
                                which, group.size(), text, params));
  }
  return lines;
}

// A `replicate` or `split` block: the stages it became and the split forms of its ops.
std::string blockDoc(const Analysis& a, const ast::ParallelBlock& b) {
  bool isSplit = b.kind == ast::BlockKind::Split;
  std::string doc = isSplit ? "`split(n) { … }`: tensor parallel over n devices"
                            : "`replicate(n) { … }`: data parallel over n devices";
  if (!a.module || !a.module->planned) return doc;
  const ir::Module& m = *a.module;
  std::vector<int> stages;
  for (size_t s = 0; s < m.mesh.stages.size(); ++s)
    if (sameLoc(m.scopes[m.mesh.stages[s].scope].loc, b.loc)) stages.push_back(static_cast<int>(s));
  std::vector<std::string> lines = stageLines(m, stages);
  std::vector<std::string> forms;
  for (const ir::Op& op : m.ops) {
    int split = m.splitScopeOf(op.scope);
    if (!forward(op) || split < 0 || !sameLoc(m.scopes[split].loc, b.loc)) continue;
    forms.push_back(ir::opInfo(op.kind).name + " " +
                    (op.splitForm == ir::SplitForm::None ? std::string("replicated")
                                                         : ir::splitFormName(op.splitForm)));
  }
  if (!forms.empty())
    lines.push_back("split forms: " + fmt::format("{}", fmt::join(counted(forms), ", ")));
  if (lines.empty()) return doc;
  return doc + "\n\n---\n**" + meshLine(a) + "**\n\n" + bullets(lines, 8);
}

const ast::ParallelBlock* blockAt(const ast::File& main, SourceLoc at) {
  const ast::ParallelBlock* found = nullptr;
  for (const ast::Function& fn : main.functions)
    forEachStmt(fn.body, [&](const ast::Stmt& s) {
      if (s.block && sameLoc(s.block->loc, at)) found = s.block.get();
    });
  return found;
}

json operatorHover(const Analysis& a, const ast::File& main, const LineIndex& text, size_t offset) {
  const ast::Expr* e = binaryAt(main, text, offset);
  if (!e) return nullptr;
  std::vector<int> ops = opsWritten(a, e->loc, std::nullopt);
  if (ops.empty()) return nullptr;
  const ir::OpInfo& info = ir::opInfo(a.module->ops[ops.front()].kind);
  return hoverJson(opDoc(info) + "\n\n---\n" + builtinPlan(a, ops),
                   text.rangeOf(e->loc.line, e->loc.col, e->length));
}

} // namespace

json hover(const Analysis& a, const LineIndex& text, Position p) {
  const ast::File* main = a.mainSyntax();
  size_t offset = text.offsetOf(p);
  auto [s, e] = wordAt(text.text(), offset);
  if (s == e) return main ? operatorHover(a, *main, text, offset) : nullptr;
  std::string name = text.text().substr(s, e - s);
  Range range{text.positionOf(s), text.positionOf(e)};
  auto [line, col] = text.locOf(s);
  SourceLoc at{a.mainFile, line, col};
  if (main) {
    bool settings = inSettingsBlock(*main, text, s);
    if (const ast::Expr* call = callAt(*main, text, s, name))
      return hoverJson(callDoc(a, *call, name, settings), range);
    if (const ast::ParallelBlock* b = blockAt(*main, at)) return hoverJson(blockDoc(a, *b), range);
    for (const auto& b : main->policies)
      for (const auto& st : b.settings)
        if (sameLoc(st.loc, at)) return hoverJson(keyDoc(b, false, name), range);
    for (const auto& b : main->trains)
      for (const auto& st : b.settings)
        if (sameLoc(st.loc, at)) return hoverJson(keyDoc(b, true, name), range);
  }
  if (const ast::Function* fn = findFunction(a, name)) return hoverJson(functionDoc(a, *fn), range);
  if (const ast::Binding* b = findLet(a, name)) return hoverJson(letDoc(a, *b), range);
  if (const ir::OpInfo* info = ir::findBuiltin(name)) return hoverJson(opDoc(*info), range);
  return nullptr;
}

} // namespace epl::lsp
