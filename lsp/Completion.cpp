// Completion (see Completion.h). The block the cursor is in is read from the text itself,
// braces counted outside comments and strings, so it works while the script has errors.
#include "lsp/Completion.h"

#include "frontend/Settings.h"
#include "ir/Ops.h"
#include "lsp/Hover.h"

#include <cctype>
#include <set>
#include <string>
#include <vector>

namespace epl::lsp {

using nlohmann::json;

namespace {

enum class Block { Top, Policy, Train, Model, Value };

// LSP CompletionItemKind values.
constexpr int kFunction = 3, kProperty = 10, kKeyword = 14;

std::string firstWord(const std::string& s) {
  size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  size_t b = a;
  while (b < s.size() && (std::isalnum(static_cast<unsigned char>(s[b])) || s[b] == '_'))
    ++b;
  return s.substr(a, b - a);
}

// The blocks open at `end`, innermost last, each known by the first word of the line its
// `{` is on (`policy`, `train`, `model`, `def`, `replicate`, `split`; a `{` after `=` is a
// value such as `eval = { … }`).
std::vector<Block> openBlocks(const std::string& text, size_t end) {
  std::vector<Block> open;
  size_t lineStart = 0;
  bool inString = false;
  for (size_t i = 0; i < end && i < text.size(); ++i) {
    char c = text[i];
    if (c == '\n') {
      lineStart = i + 1;
      inString = false;
      continue;
    }
    if (inString) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        inString = false;
      continue;
    }
    if (c == '"') {
      inString = true;
    } else if (c == '#') {
      while (i + 1 < end && text[i + 1] != '\n')
        ++i;
    } else if (c == '{') {
      std::string before = text.substr(lineStart, i - lineStart);
      std::string word = firstWord(before);
      size_t eq = before.rfind('=');
      Block b =
          eq != std::string::npos && before.find_first_not_of(" \t", eq + 1) == std::string::npos
              ? Block::Value
          : word == "policy"              ? Block::Policy
          : word == "train"               ? Block::Train
          : word.empty() && !open.empty() ? open.back()
                                          : Block::Model;
      open.push_back(b);
    } else if (c == '}' && !open.empty()) {
      open.pop_back();
    }
  }
  return open;
}

json item(const std::string& label, int kind, const std::string& detail, const std::string& doc) {
  json i = {{"label", label}, {"kind", kind}};
  if (!detail.empty()) i["detail"] = detail;
  if (!doc.empty()) i["documentation"] = {{"kind", "markdown"}, {"value", doc}};
  return i;
}

void keys(const std::vector<frontend::KeyDoc>& list, json& items) {
  for (const frontend::KeyDoc& k : list)
    items.push_back(item(k.name, kProperty,
                         k.type + (k.defaultValue.empty() ? "" : ", default " + k.defaultValue),
                         k.doc));
}

// The defs the script declares: `def NAME(`.
std::set<std::string> defsOf(const std::string& text) {
  std::set<std::string> out;
  for (size_t at = text.find("def "); at != std::string::npos; at = text.find("def ", at + 4)) {
    if (at > 0 && text[at - 1] != '\n' && text[at - 1] != ' ') continue;
    std::string name = firstWord(text.substr(at + 4, 64));
    if (!name.empty()) out.insert(name);
  }
  return out;
}

} // namespace

json completion(const LineIndex& text, Position p) {
  const std::string& all = text.text();
  size_t at = text.offsetOf(p);
  std::vector<Block> open = openBlocks(all, at);
  Block here = open.empty() ? Block::Top : open.back();
  size_t lineStart = all.rfind('\n', at == 0 ? 0 : at - 1);
  lineStart = lineStart == std::string::npos || at == 0 ? 0 : lineStart + 1;
  std::string line = all.substr(lineStart, at - lineStart);
  bool afterEquals = line.find('=') != std::string::npos;
  json items = json::array();
  if (here == Block::Policy && !afterEquals) keys(frontend::policyKeys(), items);
  if (here == Block::Train && !afterEquals) keys(frontend::trainKeys(), items);
  if (here == Block::Train && afterEquals) {
    // The calls of the setting being written (`optimizer = ` gives the optimizers), or all.
    std::string key = firstWord(line);
    bool known = false;
    for (const frontend::KeyDoc& c : frontend::settingCalls())
      known = known || c.type == key;
    for (const frontend::KeyDoc& c : frontend::settingCalls())
      if (!known || c.type == key)
        items.push_back(item(c.name, kFunction, c.name + "(" + c.defaultValue + ")", c.doc));
  }
  if (here == Block::Model) {
    for (const ir::OpInfo& op : ir::allOps())
      if (op.builtin) items.push_back(item(op.name, kFunction, opSignature(op), op.summary));
    for (const std::string& d : defsOf(all))
      items.push_back(item(d, kFunction, "def in this script", ""));
    for (const char* k : {"replicate", "split", "repeat", "return", "let"})
      items.push_back(item(k, kKeyword, "", ""));
  }
  if (here == Block::Top)
    for (const char* k : {"import", "let", "def", "model", "policy", "train"})
      items.push_back(item(k, kKeyword, "", ""));
  return {{"isIncomplete", false}, {"items", items}};
}

} // namespace epl::lsp
