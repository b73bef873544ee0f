// Reads one .epl file into an AST. Syntax errors go through the diagnostics engine.
#pragma once
#include "frontend/Ast.h"
#include "support/Diagnostics.h"

#include <optional>

namespace epl::frontend {

// Deepest bracket nesting accepted; deeper input gets an error, never a stack overflow.
constexpr int kMaxNesting = 256;
// Largest source file accepted (1 MiB), which bounds the parser's memory.
constexpr size_t kMaxSourceBytes = size_t{1} << 20;

// Parses the file `fileId` of diags.sources(). Reports the first syntax error (one mistake,
// one error) and returns nullopt; otherwise the file's AST.
std::optional<ast::File> parseFile(uint32_t fileId, Diagnostics& diags);

} // namespace epl::frontend
