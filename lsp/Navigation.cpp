// Definitions and document symbols (lsp/Navigation.h).
#include "lsp/Navigation.h"

#include "lsp/Diagnostics.h"
#include "lsp/SyntaxQuery.h"

#include <fmt/format.h>

namespace epl::lsp {

using nlohmann::json;

namespace {

// LSP SymbolKind values.
enum SymbolKind {
  File = 1,
  Module = 2,
  Namespace = 3,
  Class = 5,
  Property = 7,
  Function = 12,
  Variable = 13,
  Constant = 14,
  Object = 19,
};

uint32_t len(const std::string& s) {
  return static_cast<uint32_t>(s.size());
}

// A local of the function whose span holds `offset`: a parameter, or the first
// statement that assigns it.
std::optional<SourceLoc> localDefinition(const ast::File& main, const LineIndex& text,
                                         size_t offset, const std::string& name) {
  for (const ast::Function& fn : main.functions) {
    if (!functionSpan(text, fn).contains(offset)) continue;
    for (const ast::Param& p : fn.params)
      if (p.name == name) return p.loc;
    std::optional<SourceLoc> found;
    forEachStmt(fn.body, [&](const ast::Stmt& s) {
      for (size_t i = 0; i < s.targets.size() && !found; ++i)
        if (s.targets[i] == name) found = s.targetLocs[i];
    });
    return found;
  }
  return std::nullopt;
}

std::optional<SourceLoc> globalDefinition(const Analysis& a, const std::string& name) {
  for (const auto& f : a.syntax) {
    for (const ast::Binding& b : f->lets)
      if (b.name == name) return b.loc;
    for (const ast::Function& fn : f->functions)
      if (fn.name == name) return fn.loc;
  }
  return std::nullopt;
}

} // namespace

json definition(const Analysis& a, const LineIndex& text, const std::string& uri, Position p) {
  const ast::File* main = a.mainSyntax();
  if (!main) return nullptr;
  size_t offset = text.offsetOf(p);
  auto [line, col] = text.locOf(offset);
  // On an import path: the file it loaded.
  for (const ast::Import& imp : main->imports) {
    if (imp.loc.line != line || col < imp.loc.col || col > imp.loc.col + len(imp.path) + 1)
      continue;
    uint32_t f = a.importedFile(a.mainFile, imp.path);
    if (f == 0) return nullptr;
    return locationJson(a, text, uri, SourceLoc{f, 1, 1}, 0);
  }
  auto [s, e] = wordAt(text.text(), offset);
  if (s == e) return nullptr;
  std::string name = text.text().substr(s, e - s);
  std::optional<SourceLoc> at = localDefinition(*main, text, offset, name);
  if (!at) at = globalDefinition(a, name);
  if (!at) return nullptr;
  return locationJson(a, text, uri, *at, len(name));
}

namespace {

// The text between two offsets on one line, with runs of white space made one space.
std::string squeeze(std::string_view s) {
  std::string out;
  for (char c : s) {
    bool space = c == ' ' || c == '\t' || c == '\r' || c == '\n';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : c;
  }
  while (!out.empty() && out.back() == ' ')
    out.pop_back();
  return out;
}

// The rest of a line after `offset`, without its comment.
std::string restOfLine(const LineIndex& text, size_t offset) {
  const std::string& t = text.text();
  size_t eol = t.find('\n', offset);
  if (eol == std::string::npos) eol = t.size();
  size_t hash = findCode(t, offset, '#');
  if (hash != std::string::npos && hash < eol) eol = hash;
  return squeeze(std::string_view(t).substr(offset, eol - offset));
}

// Where the value of one `let` binding ends: the first comma outside brackets and strings
// (`let a = [1, 2], b = 3` gives `[1, 2]` for `a`).
size_t firstTopLevelComma(const std::string& value) {
  int depth = 0;
  for (size_t i = 0; i < value.size(); ++i) {
    char c = value[i];
    if (c == '"') {
      for (++i; i < value.size() && value[i] != '"'; ++i)
        if (value[i] == '\\') ++i;
    } else if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if (c == ')' || c == ']' || c == '}') {
      --depth;
    } else if (c == ',' && depth == 0) {
      return i;
    }
  }
  return value.size();
}

json symbol(const LineIndex& text, std::string name, std::string detail, int kind, size_t begin,
            size_t end, SourceLoc nameLoc, uint32_t nameLength) {
  Range range{text.positionOf(begin), text.positionOf(std::max(begin, end))};
  Range selection = text.rangeOf(nameLoc.line, nameLoc.col, nameLength);
  json s = {{"name", std::move(name)},
            {"kind", kind},
            {"range", rangeJson(range)},
            {"selectionRange", rangeJson(selection)},
            {"children", json::array()}};
  if (!detail.empty()) s["detail"] = std::move(detail);
  return s;
}

// "stage 1" / "stages 0-2" for a top-level block of the planned model, from the plan.
std::string stageDetail(const Analysis& a, SourceLoc blockLoc) {
  if (!a.module || !a.module->planned) return "";
  std::vector<int> stages;
  const auto& mesh = a.module->mesh;
  for (size_t s = 0; s < mesh.stages.size(); ++s)
    if (sameLoc(a.module->scopes[mesh.stages[s].scope].loc, blockLoc))
      stages.push_back(static_cast<int>(s));
  if (stages.empty()) return "";
  const ir::StagePlan& first = mesh.stages[stages.front()];
  std::string which = stages.size() == 1
                          ? fmt::format("stage {}", stages.front())
                          : fmt::format("stages {}-{}", stages.front(), stages.back());
  return fmt::format("{}: {} device{}", which, first.group, first.group == 1 ? "" : "s");
}

void addBlocks(const Analysis& a, const LineIndex& text, const std::vector<ast::Stmt>& body,
               json& children) {
  for (const ast::Stmt& s : body) {
    if (!s.block) continue;
    const ast::ParallelBlock& b = *s.block;
    Span span = blockSpan(text, b.loc);
    size_t brace = findCode(text.text(), span.begin, '{');
    std::string head = squeeze(
        std::string_view(text.text())
            .substr(span.begin, (brace == std::string::npos ? span.end : brace) - span.begin));
    const char* keyword = b.kind == ast::BlockKind::Split ? "split" : "replicate";
    json sym = symbol(text, head.empty() ? keyword : head, stageDetail(a, b.loc), Namespace,
                      span.begin, span.end, b.loc, len(keyword));
    addBlocks(a, text, b.body, sym["children"]);
    children.push_back(std::move(sym));
  }
}

json functionSymbol(const Analysis& a, const LineIndex& text, const ast::Function& fn) {
  Span span = functionSpan(text, fn);
  size_t nameEnd = text.offsetOf(fn.loc.line, fn.loc.col) + fn.name.size();
  size_t brace = findCode(text.text(), nameEnd, '{');
  std::string signature =
      brace == std::string::npos
          ? ""
          : squeeze(std::string_view(text.text()).substr(nameEnd, brace - nameEnd));
  json sym = symbol(text, fn.name, signature, fn.isModel ? Class : Function, span.begin, span.end,
                    fn.loc, len(fn.name));
  for (const ast::Param& p : fn.params) {
    size_t at = text.offsetOf(p.loc.line, p.loc.col);
    size_t typeAt = text.offsetOf(p.type.loc.line, p.type.loc.col);
    std::string type = restOfLine(text, typeAt);
    size_t cut = type.find_first_of(",)");
    // A tensor type holds commas inside its brackets: keep up to the closing `]`.
    if (p.type.isTensor) cut = type.find(']') == std::string::npos ? cut : type.find(']') + 1;
    sym["children"].push_back(symbol(text, p.name, type.substr(0, cut), Variable, at,
                                     at + p.name.size(), p.loc, len(p.name)));
  }
  addBlocks(a, text, fn.body, sym["children"]);
  return sym;
}

json settingsSymbol(const LineIndex& text, const ast::SettingsBlock& b, bool isTrain) {
  Span span = blockSpan(text, b.loc);
  std::string name = isTrain ? "train " + b.target : "policy";
  json sym = symbol(text, name, "", Object, span.begin, span.end, b.loc, isTrain ? 5 : 6);
  for (const ast::Setting& s : b.settings) {
    size_t at = text.offsetOf(s.loc.line, s.loc.col);
    std::string value = restOfLine(text, at + s.key.size());
    if (!value.empty() && value[0] == '=') value = squeeze(value.substr(1));
    sym["children"].push_back(
        symbol(text, s.key, value, Property, at, at + s.key.size(), s.loc, len(s.key)));
  }
  return sym;
}

} // namespace

json documentSymbols(const Analysis& a, const LineIndex& text) {
  json out = json::array();
  const ast::File* main = a.mainSyntax();
  if (!main) return out;
  std::vector<std::pair<size_t, json>> items; // by offset, so the outline keeps file order
  for (const ast::Import& imp : main->imports) {
    size_t at = text.offsetOf(imp.loc.line, imp.loc.col);
    items.emplace_back(at, symbol(text, imp.path, "import", File, at, at + imp.path.size() + 2,
                                  imp.loc, len(imp.path) + 2));
  }
  for (const ast::Binding& b : main->lets) {
    size_t at = text.offsetOf(b.loc.line, b.loc.col);
    std::string value = restOfLine(text, at + b.name.size());
    if (!value.empty() && value[0] == '=') value = squeeze(value.substr(1));
    value = value.substr(0, firstTopLevelComma(value));
    items.emplace_back(
        at, symbol(text, b.name, value, Constant, at, at + b.name.size(), b.loc, len(b.name)));
  }
  for (const ast::Function& fn : main->functions)
    items.emplace_back(text.offsetOf(fn.loc.line, fn.loc.col), functionSymbol(a, text, fn));
  for (const auto& b : main->policies)
    items.emplace_back(text.offsetOf(b.loc.line, b.loc.col), settingsSymbol(text, b, false));
  for (const auto& b : main->trains)
    items.emplace_back(text.offsetOf(b.loc.line, b.loc.col), settingsSymbol(text, b, true));
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  for (auto& [at, sym] : items)
    out.push_back(std::move(sym));
  return out;
}

} // namespace epl::lsp
