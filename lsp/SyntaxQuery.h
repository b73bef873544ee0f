// Questions about the syntax of the editor's script: which expression, function or block is
// at a place, and where blocks begin and end in its text (the AST keeps only starts).
#pragma once
#include "frontend/Ast.h"
#include "lsp/TextPositions.h"

#include <functional>

namespace epl::lsp {

bool sameLoc(SourceLoc a, SourceLoc b);

// Calls `fn` on every expression of a file, outer before inner: let values, parameter
// defaults and dims, statement values, block widths and repeat counts, settings.
void forEachExpr(const ast::File& f, const std::function<void(const ast::Expr&)>& fn);
// Calls `fn` on every statement of a body, including those inside parallel blocks.
void forEachStmt(const std::vector<ast::Stmt>& body,
                 const std::function<void(const ast::Stmt&)>& fn);

// A construct's extent in the text: from its keyword to just after its closing brace.
struct Span {
  size_t begin = 0, end = 0;
  bool contains(size_t offset) const { return offset >= begin && offset < end; }
};
// The span of a def or model whose name is at `nameLoc`, of a block whose keyword is at
// `keywordLoc`. Without a closing brace the span ends with the line.
Span functionSpan(const LineIndex& text, const ast::Function& fn);
Span blockSpan(const LineIndex& text, SourceLoc keywordLoc);

// The call written at `offset` in a file: a call whose name starts at `nameStart`, or a
// `repeat(k) name(…)` whose name it is. Null when none.
const ast::Expr* callAt(const ast::File& f, const LineIndex& text, size_t nameStart,
                        const std::string& name);
// The arithmetic expression whose operator is at `offset`, or null.
const ast::Expr* binaryAt(const ast::File& f, const LineIndex& text, size_t offset);

} // namespace epl::lsp
