// Syntax errors: ANTLR's reports turned into one rustc-style diagnostic, and the checks
// made on the token stream before parsing (stray characters, open strings, nesting depth).
#include "frontend/SyntaxErrors.h"

#include "EplLexer.h"
#include "frontend/Parser.h"

#include <fmt/format.h>

namespace epl::frontend {

using G = grammar::EplParser;
using Lx = grammar::EplLexer;

SourceLoc locOf(uint32_t file, const antlr4::Token* t) {
  return SourceLoc{file, static_cast<uint32_t>(t->getLine()),
                   static_cast<uint32_t>(t->getCharPositionInLine() + 1)};
}

uint32_t lengthOf(const antlr4::Token* t) {
  return static_cast<uint32_t>(std::max<size_t>(1, t->getText().size()));
}

namespace {

// How a token type reads in an error message.
std::string tokenName(const antlr4::dfa::Vocabulary& vocab, size_t type) {
  switch (type) {
  case antlr4::Token::EOF:
    return "end of file";
  case Lx::ID:
    return "a name";
  case Lx::INT:
    return "an integer";
  case Lx::FLOAT:
    return "a number";
  case Lx::STRING:
    return "a string";
  case Lx::SIZE:
    return "a size";
  case Lx::WORD:
    return "a word";
  case Lx::DTYPE:
    return "a dtype";
  default: {
    std::string n = vocab.getLiteralName(type);
    if (n.size() >= 2 && n.front() == '\'') n = n.substr(1, n.size() - 2);
    return n.empty() ? vocab.getDisplayName(type) : "`" + n + "`";
  }
  }
}

std::string found(const antlr4::Token* t) {
  if (t->getType() == antlr4::Token::EOF) return "end of file";
  return "`" + t->getText() + "`";
}

bool isKeyword(size_t type) {
  switch (type) {
  case Lx::IMPORT:
  case Lx::LET:
  case Lx::DEF:
  case Lx::MODEL:
  case Lx::RETURN:
  case Lx::REPLICATE:
  case Lx::SPLIT:
  case Lx::REPEAT:
  case Lx::AUTO:
  case Lx::POLICY:
  case Lx::TRAIN:
  case Lx::TRUE:
  case Lx::FALSE:
  case Lx::NONE:
  case Lx::DTYPE:
    return true;
  default:
    return false;
  }
}

// Tokens that begin a top-level item: where a forgotten `}` or `)` is usually noticed.
bool startsItem(const antlr4::Token* t) {
  switch (t->getType()) {
  case antlr4::Token::EOF:
  case Lx::IMPORT:
  case Lx::LET:
  case Lx::DEF:
  case Lx::MODEL:
  case Lx::POLICY:
  case Lx::TRAIN:
    return true;
  default:
    return false;
  }
}

// A keyword where a name belongs: `let model = 4`, `def split(…)`, or `split = relu(x)`
// (read as the start of a block, so the parser trips on the `=` after the keyword). Not
// `k: f32 = 1.0`, where the keyword is a type.
const antlr4::Token* misusedKeyword(antlr4::TokenStream& tokens, const antlr4::Token* offending,
                                    const antlr4::misc::IntervalSet& expected) {
  size_t i = offending->getTokenIndex();
  auto isBinder = [](const antlr4::Token* t) { return t->getText() == "=" || t->getText() == ":"; };
  if (isKeyword(offending->getType()) && expected.contains(static_cast<size_t>(Lx::ID)) &&
      (expected.size() == 1 || (i + 1 < tokens.size() && isBinder(tokens.get(i + 1)))))
    return offending;
  if (isBinder(offending) && i > 0 && isKeyword(tokens.get(i - 1)->getType()) &&
      !(i > 1 && tokens.get(i - 2)->getText() == ":"))
    return tokens.get(i - 1);
  return nullptr;
}

// The innermost bracket still open where `offending` stands, or null.
const antlr4::Token* unclosedBracket(antlr4::TokenStream& tokens, const antlr4::Token* offending) {
  std::vector<const antlr4::Token*> open;
  for (size_t i = 0; i < offending->getTokenIndex() && i < tokens.size(); ++i) {
    const std::string& s = tokens.get(i)->getText();
    if (s == "(" || s == "[" || s == "{")
      open.push_back(tokens.get(i));
    else if (!open.empty() && (s == ")" || s == "]" || s == "}"))
      open.pop_back();
  }
  return open.empty() ? nullptr : open.back();
}

std::string closerOf(const antlr4::Token* open) {
  const std::string& s = open->getText();
  return s == "(" ? ")" : s == "[" ? "]" : "}";
}

} // namespace

void ErrorListener::syntaxError(antlr4::Recognizer* recognizer, antlr4::Token* offending,
                                size_t line, size_t col, const std::string& msg,
                                std::exception_ptr) {
  if (failed) return;
  failed = true;
  SourceLoc loc{file_, static_cast<uint32_t>(line), static_cast<uint32_t>(col + 1)};
  auto* parser = dynamic_cast<antlr4::Parser*>(recognizer);
  if (!parser || !offending) {
    diags_.error(loc, "syntax error: " + msg);
    return;
  }
  antlr4::TokenStream& tokens = *parser->getTokenStream();
  antlr4::misc::IntervalSet expectedSet = parser->getExpectedTokens();
  if (const antlr4::Token* kw = misusedKeyword(tokens, offending, expectedSet)) {
    diags_
        .error(locOf(file_, kw), fmt::format("expected a name, found keyword `{}`", kw->getText()))
        .length(lengthOf(kw))
        .help(fmt::format("`{}` is a keyword; choose another name", kw->getText()));
    return;
  }
  std::vector<std::string> expected;
  if (expectedSet.contains(static_cast<size_t>(Lx::INT)))
    expected.push_back("an expression"); // only expressions start with one
  else
    for (size_t t : expectedSet.toList())
      expected.push_back(tokenName(parser->getVocabulary(), t));
  // A forgotten closing bracket: name it, and point at the bracket it would close.
  const antlr4::Token* open = unclosedBracket(tokens, offending);
  bool closes = open && std::find(expected.begin(), expected.end(), "`" + closerOf(open) + "`") !=
                            expected.end();
  bool missingCloser = closes && (expected.size() <= 4 || startsItem(offending));
  std::string what = missingCloser && expected.size() > 4 ? "expected `" + closerOf(open) + "`"
                     : expected.size() == 1               ? "expected " + expected[0]
                     : expected.size() <= 4 && !expected.empty()
                         ? "expected one of " + fmt::format("{}", fmt::join(expected, ", "))
                         : "unexpected " + found(offending);
  if ((expected.size() <= 4 && !expected.empty()) || missingCloser)
    what += ", found " + found(offending);
  auto d = diags_.error(loc, what);
  d.length(lengthOf(offending));
  if (missingCloser)
    d.noteAt(locOf(file_, open), fmt::format("to match this `{}`", open->getText()));
  // `train net { data = …, batch = 10 }`: the habit of other languages.
  if (offending->getText() == "," && open && open->getText() == "{")
    d.help("the entries of a `{ }` block are not separated by commas: put each on its own line, "
           "or separate them with spaces");
}

// Lexical problems the grammar lets through as tokens: stray characters, open strings,
// and nesting deep enough to exhaust the parser's stack.
bool checkTokens(uint32_t file, antlr4::CommonTokenStream& tokens, Diagnostics& diags) {
  int depth = 0;
  int minusRun = 0; // `- - - x`: the parser recurses once per prefix minus
  for (antlr4::Token* t : tokens.getTokens()) {
    minusRun = t->getText() == "-" ? minusRun + 1 : 0;
    if (minusRun > kMaxNesting) {
      diags.error(locOf(file, t), fmt::format("nesting deeper than {} levels", kMaxNesting))
          .note("EPL limits the depth of brackets, blocks and expressions to keep compilation "
                "bounded");
      return false;
    }
    switch (t->getType()) {
    case Lx::BAD_CHAR:
      diags.error(locOf(file, t), fmt::format("unexpected character `{}`", t->getText()));
      return false;
    case Lx::UNTERMINATED_STRING:
      diags.error(locOf(file, t), "unterminated string")
          .length(lengthOf(t))
          .help("close the string with `\"` on the same line");
      return false;
    default:
      break;
    }
    const std::string& s = t->getText();
    if (s == "(" || s == "[" || s == "{") {
      if (++depth > kMaxNesting) {
        diags.error(locOf(file, t), fmt::format("nesting deeper than {} levels", kMaxNesting))
            .note("EPL limits the depth of brackets, blocks and expressions to keep compilation "
                  "bounded");
        return false;
      }
    } else if (s == ")" || s == "]" || s == "}") {
      --depth;
    }
  }
  return true;
}

} // namespace epl::frontend
