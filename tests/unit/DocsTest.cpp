// Keeps docs/language.md in step with the code: every builtin op, policy key, train key,
// setting call and grammar keyword must appear in it, written in backticks (`name`).
#include "frontend/Settings.h"
#include "ir/Ops.h"

#include <catch2/catch.hpp>

#include <cctype>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string readSource(const std::string& relative) {
  std::ifstream in(std::string(EPL_SOURCE_DIR) + "/" + relative, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool isWord(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// The word-like quoted literals of the grammar's lexer rules (rules named in upper case):
// keywords such as 'import' and 'none', dtype names, size units. Parser-rule literals
// such as '->' or '{' are punctuation and are left out.
std::set<std::string> grammarKeywords(const std::string& g) {
  std::set<std::string> out;
  std::string rule;     // the rule being read; empty between rules
  std::string lastName; // the last bare name seen before the rule's ':'
  bool inRule = false;
  for (size_t i = 0; i < g.size(); ++i) {
    char c = g[i];
    if (c == '/' && i + 1 < g.size() && g[i + 1] == '/') { // line comment
      while (i < g.size() && g[i] != '\n')
        ++i;
      continue;
    }
    if (c == '/' && i + 1 < g.size() && g[i + 1] == '*') { // block comment
      size_t end = g.find("*/", i + 2);
      i = end == std::string::npos ? g.size() : end + 1;
      continue;
    }
    if (c == '\'') { // a literal: up to the closing quote, skipping escapes
      std::string lit;
      for (++i; i < g.size() && g[i] != '\''; ++i) {
        if (g[i] == '\\' && i + 1 < g.size()) ++i;
        lit += g[i];
      }
      if (inRule && !rule.empty() && std::isupper(static_cast<unsigned char>(rule[0])) &&
          isWord(lit))
        out.insert(lit);
      continue;
    }
    if (c == '[') { // a character set such as [a-zA-Z_]: no literals inside
      while (i < g.size() && g[i] != ']')
        i += g[i] == '\\' ? 2 : 1;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t start = i;
      while (i + 1 < g.size() &&
             (std::isalnum(static_cast<unsigned char>(g[i + 1])) || g[i + 1] == '_'))
        ++i;
      if (!inRule) lastName = g.substr(start, i - start + 1);
      continue;
    }
    if (c == ':' && !inRule) {
      inRule = true;
      rule = lastName;
    } else if (c == ';') {
      inRule = false;
      rule.clear();
      lastName.clear();
    }
  }
  return out;
}

bool backticked(const std::string& doc, const std::string& name) {
  return doc.find("`" + name + "`") != std::string::npos;
}

} // namespace

TEST_CASE("the grammar scan finds the keywords", "[docs]") {
  std::set<std::string> keywords = grammarKeywords(readSource("grammar/Epl.g4"));
  for (const char* k : {"import", "let", "def", "model", "return", "replicate", "split", "repeat",
                        "auto", "policy", "train", "true", "false", "none"}) {
    INFO("keyword " << k);
    CHECK(keywords.count(k) == 1);
  }
  // Parser-rule punctuation is not a keyword.
  CHECK(keywords.count("->") == 0);
}

TEST_CASE("docs/language.md names every builtin op", "[docs]") {
  const std::string doc = readSource("docs/language.md");
  REQUIRE_FALSE(doc.empty());
  int builtins = 0;
  for (const auto& op : epl::ir::allOps()) {
    if (!op.builtin) continue;
    ++builtins;
    INFO("builtin `" << op.name << "` is missing from docs/language.md");
    CHECK(backticked(doc, op.name));
  }
  CHECK(builtins > 0);
}

TEST_CASE("docs/language.md names every policy key, train key and setting call", "[docs]") {
  const std::string doc = readSource("docs/language.md");
  REQUIRE_FALSE(doc.empty());
  for (const auto& k : epl::frontend::policyKeys()) {
    INFO("policy key `" << k.name << "` is missing from docs/language.md");
    CHECK(backticked(doc, k.name));
  }
  for (const auto& k : epl::frontend::trainKeys()) {
    INFO("train key `" << k.name << "` is missing from docs/language.md");
    CHECK(backticked(doc, k.name));
  }
  for (const auto& c : epl::frontend::settingCalls()) {
    INFO("setting call `" << c.name << "` (" << c.type << ") is missing from docs/language.md");
    CHECK(backticked(doc, c.name));
  }
}

TEST_CASE("docs/language.md names every keyword of the grammar", "[docs]") {
  const std::string doc = readSource("docs/language.md");
  REQUIRE_FALSE(doc.empty());
  std::set<std::string> keywords = grammarKeywords(readSource("grammar/Epl.g4"));
  REQUIRE_FALSE(keywords.empty());
  for (const auto& k : keywords) {
    INFO("grammar literal `" << k << "` is missing from docs/language.md");
    CHECK(backticked(doc, k));
  }
}
