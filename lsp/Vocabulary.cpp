// The vocabulary and token dumps behind `epl lsp --vocabulary` / `--tokens` (lsp/Vocabulary.h).
#include "lsp/Vocabulary.h"

#include "frontend/Frontend.h"
#include "frontend/Settings.h"
#include "ir/Ops.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace epl::lsp {

using nlohmann::json;

namespace {

bool isWord(const std::string& s) {
  if (s.empty()) return false;
  bool letter = false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
    letter = letter || std::isalpha(static_cast<unsigned char>(c));
  }
  return letter;
}

// The word values of the policy keys, read from their types ("gpipe | 1f1b | interleaved | zb").
std::set<std::string> policyWords() {
  std::set<std::string> out;
  for (const auto& k : frontend::policyKeys()) {
    if (k.type.find('|') == std::string::npos) continue;
    std::stringstream alternatives(k.type);
    std::string item;
    while (std::getline(alternatives, item, '|')) {
      size_t a = item.find_first_not_of(' '), b = item.find_last_not_of(' ');
      if (a == std::string::npos) continue;
      item = item.substr(a, b - a + 1);
      if (isWord(item)) out.insert(item);
    }
  }
  return out;
}

} // namespace

void printVocabulary(std::ostream& out) {
  json v;
  std::set<std::string> opWords;
  for (const auto& op : ir::allOps()) {
    if (!op.builtin) continue;
    v["builtins"].push_back(op.name);
    for (const auto& a : op.args)
      opWords.insert(a.words.begin(), a.words.end());
  }
  for (const auto& k : frontend::policyKeys())
    v["policyKeys"].push_back(k.name);
  for (const auto& k : frontend::trainKeys())
    v["trainKeys"].push_back(k.name);
  for (const auto& c : frontend::settingCalls())
    v["settingCalls"].push_back({{"name", c.name}, {"group", c.type}});
  v["scalarTypes"] = frontend::scalarTypes();
  v["policyWords"] = policyWords();
  v["opWords"] = opWords;
  out << v.dump(2) << "\n";
}

bool printTokens(const std::vector<std::string>& files, std::ostream& out) {
  json all = json::object();
  bool ok = true;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    auto tokens = in ? frontend::lexTokens(text.str()) : std::nullopt;
    if (!tokens) {
      ok = false;
      continue;
    }
    json list = json::array();
    for (const auto& t : *tokens)
      list.push_back({t.kind, t.line, t.col, t.text});
    all[path] = list;
  }
  out << all.dump() << "\n";
  return ok;
}

} // namespace epl::lsp
