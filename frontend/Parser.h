// Reads one .epl file into an AST. Syntax errors go through the diagnostics engine.
#pragma once
#include "frontend/Ast.h"
#include "support/Diagnostics.h"

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace epl::frontend {

// Deepest bracket nesting accepted; deeper input gets an error, never a stack overflow.
constexpr int kMaxNesting = 256;
// Largest source file accepted (1 MiB), which bounds the parser's memory.
constexpr size_t kMaxSourceBytes = size_t{1} << 20;

// ANTLR's runtime shares the lexer's and the parser's caches (their DFA states) between
// instances and does not lock them: one thread at a time lexes or parses (parseFile,
// lexTokens). The rest of the front end runs on any number of threads at once.
std::mutex& antlrMutex();

// Parses the file `fileId` of diags.sources(). Reports the first syntax error (one mistake,
// one error) and returns nullopt; otherwise the file's AST.
std::optional<ast::File> parseFile(uint32_t fileId, Diagnostics& diags);

// Syntax trees kept from one compilation for the next (the layout search compiles one
// script and its imports hundreds of times, and parsing was half of that). A file's tree
// depends on its text and its id, which its locations carry; sessions that add the same
// sources in the same order give them the same ids. Safe to share between threads.
class ParseCache {
public:
  std::shared_ptr<const ast::File> find(uint32_t fileId, const std::string& text) const;
  void add(uint32_t fileId, const std::string& text, std::shared_ptr<const ast::File> file);

private:
  mutable std::mutex mutex_;
  std::map<std::pair<uint32_t, std::string>, std::shared_ptr<const ast::File>> files_;
};

// parseFile, through `cache` when there is one: a tree that parsed before, else the parse
// (kept there when it succeeds). nullptr after a syntax error.
std::shared_ptr<const ast::File> parseShared(uint32_t fileId, Diagnostics& diags,
                                             ParseCache* cache);

} // namespace epl::frontend
