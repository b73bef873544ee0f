// The lexer's token stream as plain data, for editor tooling (the highlighting tests).
#include "frontend/Frontend.h"
#include "frontend/Parser.h"
#include "frontend/SyntaxErrors.h"
#include "support/Utf8.h"

#include "EplLexer.h"
#include "antlr4-runtime.h"

namespace epl::frontend {

std::optional<std::vector<LexToken>> lexTokens(const std::string& text) {
  if (findInvalidUtf8(text)) return std::nullopt;
  std::lock_guard<std::mutex> one(antlrMutex());
  antlr4::ANTLRInputStream input(text);
  grammar::EplLexer lexer(&input);
  lexer.removeErrorListeners();
  antlr4::CommonTokenStream tokens(&lexer);
  tokens.fill();
  const antlr4::dfa::Vocabulary& vocab = lexer.getVocabulary();
  std::vector<LexToken> out;
  for (antlr4::Token* t : tokens.getTokens()) {
    if (t->getType() == antlr4::Token::EOF) break;
    std::string kind(vocab.getSymbolicName(t->getType()));
    if (kind.empty()) kind = vocab.getLiteralName(t->getType());
    SourceLoc loc = locOf(1, t);
    out.push_back(LexToken{kind, t->getText(), loc.line, loc.col});
  }
  return out;
}

} // namespace epl::frontend
