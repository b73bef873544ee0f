// Syntax errors for the parser (frontend/Parser.cpp): ANTLR's error reports turned into
// one rustc-style diagnostic, and checks on the token stream before parsing.
#pragma once
#include "EplParser.h"
#include "antlr4-runtime.h"
#include "support/Diagnostics.h"

namespace epl::frontend {

SourceLoc locOf(uint32_t file, const antlr4::Token* t);
uint32_t lengthOf(const antlr4::Token* t); // characters the token spans, at least 1

// Reports the first syntax error of a file (one mistake, one error) and ignores the rest.
class ErrorListener : public antlr4::BaseErrorListener {
public:
  ErrorListener(uint32_t file, Diagnostics& diags) : file_(file), diags_(diags) {}
  bool failed = false;
  void syntaxError(antlr4::Recognizer* recognizer, antlr4::Token* offending, size_t line,
                   size_t col, const std::string& msg, std::exception_ptr) override;

private:
  uint32_t file_;
  Diagnostics& diags_;
};

// Lexical problems the grammar lets through as tokens: stray characters, open strings,
// and nesting deeper than kMaxNesting. Reports the first and returns false.
bool checkTokens(uint32_t file, antlr4::CommonTokenStream& tokens, Diagnostics& diags);

} // namespace epl::frontend
