// Diagnostics from libepl to LSP (lsp/Diagnostics.h).
#include "lsp/Diagnostics.h"

#include <map>

namespace epl::lsp {

using nlohmann::json;

json rangeJson(const Range& r) {
  return {{"start", {{"line", r.start.line}, {"character", r.start.character}}},
          {"end", {{"line", r.end.line}, {"character", r.end.character}}}};
}

Range rangeIn(const Analysis& a, const LineIndex& mainText, SourceLoc loc, uint32_t length) {
  if (!loc.valid()) return Range{};
  if (loc.file == a.mainFile) return mainText.rangeOf(loc.line, loc.col, length);
  return LineIndex(a.session->sources.text(loc.file)).rangeOf(loc.line, loc.col, length);
}

json locationJson(const Analysis& a, const LineIndex& mainText, const std::string& documentUri,
                  SourceLoc loc, uint32_t length) {
  std::string uri = loc.file == a.mainFile ? documentUri : pathToUri(a.pathOf(loc.file));
  return {{"uri", uri}, {"range", rangeJson(rangeIn(a, mainText, loc, length))}};
}

namespace {

// For each file reached through the main script's imports, the `import` of the main script
// that leads to it.
std::map<uint32_t, SourceLoc> importAnchors(const Analysis& a) {
  std::map<uint32_t, SourceLoc> anchors;
  const ast::File* main = a.mainSyntax();
  if (!main) return anchors;
  for (const ast::Import& imp : main->imports) {
    std::vector<uint32_t> work{a.importedFile(a.mainFile, imp.path)};
    while (!work.empty()) {
      uint32_t f = work.back();
      work.pop_back();
      if (f == 0 || f == a.mainFile || !anchors.emplace(f, imp.loc).second) continue;
      if (const ast::File* syn = a.syntaxOf(f))
        for (const ast::Import& inner : syn->imports)
          work.push_back(a.importedFile(f, inner.path));
    }
  }
  return anchors;
}

// A script with defs and no model, such as a library, is not an error in an editor: its
// defs are checked where a model calls them, as `epl check` does for imported files.
bool isLibraryNoise(const Analysis& a, const Diagnostic& d) {
  const ast::File* main = a.mainSyntax();
  if (!main || d.loc.file != a.mainFile || d.message.rfind("no `model`", 0) != 0) return false;
  for (const ast::Function& f : main->functions)
    if (f.isModel) return false;
  return !main->functions.empty() || !main->lets.empty();
}

// Where a diagnostic located in another file shows in the main script: at the call of the
// main script that expanded it (a note), else at the `import` that leads to its file (the
// quoted path), else on the first line.
Range placeInMain(const Analysis& a, const Diagnostic& d, const LineIndex& text,
                  const std::map<uint32_t, SourceLoc>& anchors) {
  for (const auto& [loc, note] : d.notes) {
    if (loc.file != a.mainFile) continue;
    auto [s, e] = wordAt(text.text(), text.offsetOf(loc.line, loc.col));
    if (e > s) return Range{text.positionOf(s), text.positionOf(e)};
    return text.rangeOf(loc.line, loc.col, 1);
  }
  auto anchor = anchors.find(d.loc.file);
  if (anchor != anchors.end()) {
    size_t s = text.offsetOf(anchor->second.line, anchor->second.col);
    size_t e = text.text().find('"', s + 1);
    size_t eol = text.text().find('\n', s);
    if (e == std::string::npos || e > eol)
      return text.rangeOf(anchor->second.line, anchor->second.col, 1);
    return Range{text.positionOf(s), text.positionOf(e + 1)};
  }
  return text.rangeOf(1, 1, 1);
}

} // namespace

json toLspDiagnostics(const Analysis& a, const LineIndex& text, const std::string& documentUri) {
  std::map<uint32_t, SourceLoc> anchors = importAnchors(a);
  json out = json::array();
  for (const Diagnostic& d : a.session->diags.all()) {
    if (isLibraryNoise(a, d)) continue;
    std::string message = d.message;
    for (const auto& n : d.plainNotes)
      message += "\nnote: " + n;
    for (const auto& h : d.helps)
      message += "\nhelp: " + h;
    json related = json::array();
    // Where the diagnostic goes in this document.
    Range r = text.rangeOf(d.loc.line, d.loc.col, d.length);
    if (d.loc.file != a.mainFile) {
      r = placeInMain(a, d, text, anchors);
      if (d.loc.valid())
        related.push_back({{"location", locationJson(a, text, documentUri, d.loc, d.length)},
                           {"message", d.message}});
    }
    for (const auto& [loc, note] : d.notes)
      if (loc.valid())
        related.push_back(
            {{"location", locationJson(a, text, documentUri, loc, 1)}, {"message", note}});
    json item = {{"range", rangeJson(r)},
                 {"severity", d.severity == Severity::Error ? 1 : 2},
                 {"source", "epl"},
                 {"message", message}};
    if (!related.empty()) item["relatedInformation"] = related;
    out.push_back(item);
  }
  return out;
}

} // namespace epl::lsp
