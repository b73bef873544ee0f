// Walks and spans over the AST of the editor's script (lsp/SyntaxQuery.h).
#include "lsp/SyntaxQuery.h"

namespace epl::lsp {

bool sameLoc(SourceLoc a, SourceLoc b) {
  return a.file == b.file && a.line == b.line && a.col == b.col;
}

namespace {

void walk(const ast::Expr* e, const std::function<void(const ast::Expr&)>& fn) {
  if (!e) return;
  fn(*e);
  for (const auto& o : e->operands)
    walk(o.get(), fn);
  for (const auto& a : e->args)
    walk(a.value.get(), fn);
  for (const auto& s : e->fields)
    walk(s.value.get(), fn);
}

void walkType(const ast::TypeRef* t, const std::function<void(const ast::Expr&)>& fn) {
  if (!t) return;
  for (const auto& d : t->dims)
    walk(d.get(), fn);
}

} // namespace

void forEachStmt(const std::vector<ast::Stmt>& body,
                 const std::function<void(const ast::Stmt&)>& fn) {
  for (const ast::Stmt& s : body) {
    fn(s);
    if (s.block) forEachStmt(s.block->body, fn);
  }
}

void forEachExpr(const ast::File& f, const std::function<void(const ast::Expr&)>& fn) {
  for (const auto& b : f.lets)
    walk(b.value.get(), fn);
  for (const auto& func : f.functions) {
    for (const auto& p : func.params) {
      walkType(&p.type, fn);
      walk(p.defaultValue.get(), fn);
    }
    walkType(func.result.get(), fn);
    forEachStmt(func.body, [&](const ast::Stmt& s) {
      for (const auto& v : s.values)
        walk(v.get(), fn);
      if (s.block) {
        walk(s.block->repeat.get(), fn);
        walk(s.block->width.get(), fn);
      }
    });
  }
  for (const auto* blocks : {&f.policies, &f.trains})
    for (const auto& b : *blocks)
      for (const auto& s : b.settings)
        walk(s.value.get(), fn);
}

namespace {

// From the `{` after `from` to just after its `}`; to the end of the line without one.
size_t braceEnd(const LineIndex& text, size_t from) {
  const std::string& t = text.text();
  size_t open = findCode(t, from, '{');
  size_t close = open == std::string::npos ? std::string::npos : matchingBracket(t, open, '{', '}');
  if (close != std::string::npos) return close + 1;
  size_t eol = t.find('\n', from);
  return eol == std::string::npos ? t.size() : eol;
}

} // namespace

Span functionSpan(const LineIndex& text, const ast::Function& fn) {
  size_t name = text.offsetOf(fn.loc.line, fn.loc.col);
  size_t lineStart = text.offsetOf(fn.loc.line, 1);
  std::string_view before(text.text().data() + lineStart, name - lineStart);
  size_t kw = before.rfind(fn.isModel ? "model" : "def");
  size_t begin = kw == std::string_view::npos ? name : lineStart + kw;
  return Span{begin, braceEnd(text, name)};
}

Span blockSpan(const LineIndex& text, SourceLoc keywordLoc) {
  size_t begin = text.offsetOf(keywordLoc.line, keywordLoc.col);
  return Span{begin, braceEnd(text, begin)};
}

const ast::Expr* callAt(const ast::File& f, const LineIndex& text, size_t nameStart,
                        const std::string& name) {
  // Plain variables: a C++17 lambda cannot capture structured bindings (clang refuses).
  const uint32_t line = text.locOf(nameStart).first, col = text.locOf(nameStart).second;
  const ast::Expr* found = nullptr;
  const ast::Expr* repeat = nullptr; // the nearest `repeat` before the name on its line
  forEachExpr(f, [&](const ast::Expr& e) {
    if (e.kind == ast::ExprKind::Call && e.loc.line == line && e.loc.col == col) found = &e;
    if (e.kind == ast::ExprKind::Repeat && e.text == name && e.loc.line == line &&
        e.loc.col < col && (!repeat || repeat->loc.col < e.loc.col))
      repeat = &e;
  });
  return found ? found : repeat;
}

const ast::Expr* binaryAt(const ast::File& f, const LineIndex& text, size_t offset) {
  const uint32_t line = text.locOf(offset).first, col = text.locOf(offset).second;
  const ast::Expr* found = nullptr;
  forEachExpr(f, [&](const ast::Expr& e) {
    if ((e.kind == ast::ExprKind::Binary || e.kind == ast::ExprKind::Neg) && e.loc.line == line &&
        e.loc.col <= col && col < e.loc.col + e.length)
      found = &e;
  });
  return found;
}

} // namespace epl::lsp
