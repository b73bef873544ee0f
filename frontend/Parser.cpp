// ANTLR parse tree -> AST. One function per grammar rule, named after it.
#include "frontend/Parser.h"

#include "frontend/Literals.h"
#include "frontend/SyntaxErrors.h"
#include "support/Utf8.h"

#include "EplLexer.h"
#include "EplParser.h"
#include "antlr4-runtime.h"

#include <algorithm>
#include <fmt/format.h>

namespace epl::frontend {

using G = grammar::EplParser;
using Lx = grammar::EplLexer;

namespace {
class Builder {
public:
  Builder(uint32_t file, Diagnostics& diags) : file_(file), diags_(diags) {}

  // file : item* EOF
  ast::File file(G::FileContext* ctx) {
    ast::File f;
    f.fileId = file_;
    for (auto* item : ctx->item()) {
      if (auto* c = item->importDecl())
        f.imports.push_back(importDecl(c));
      else if (auto* c = item->letDecl())
        letDecl(c, f.lets);
      else if (auto* c = item->defDecl())
        f.functions.push_back(defDecl(c));
      else if (auto* c = item->modelDecl())
        f.functions.push_back(modelDecl(c));
      else if (auto* c = item->policyDecl())
        f.policies.push_back(settingsBlock(c->POLICY()->getSymbol(), nullptr, c->setting()));
      else if (auto* c = item->trainDecl())
        f.trains.push_back(
            settingsBlock(c->TRAIN()->getSymbol(), c->ID()->getSymbol(), c->setting()));
    }
    return f;
  }

private:
  SourceLoc loc(const antlr4::Token* t) const { return locOf(file_, t); }
  SourceLoc loc(antlr4::ParserRuleContext* c) const { return locOf(file_, c->getStart()); }

  // importDecl : IMPORT STRING
  ast::Import importDecl(G::ImportDeclContext* c) {
    return ast::Import{unquote(c->STRING()->getText()), loc(c->STRING()->getSymbol())};
  }

  // letDecl : LET binding (',' binding)*
  void letDecl(G::LetDeclContext* c, std::vector<ast::Binding>& out) {
    for (auto* b : c->binding())
      out.push_back(ast::Binding{b->ID()->getText(), loc(b->ID()->getSymbol()), expr(b->expr())});
  }

  // defDecl : DEF ID '(' params? ')' ('->' type)? block
  ast::Function defDecl(G::DefDeclContext* c) {
    ast::Function f = function(c->ID()->getSymbol(), c->params(), c->block());
    if (c->type()) f.result = std::make_unique<ast::TypeRef>(type(c->type()));
    return f;
  }

  // modelDecl : MODEL ID '(' params? ')' block
  ast::Function modelDecl(G::ModelDeclContext* c) {
    ast::Function f = function(c->ID()->getSymbol(), c->params(), c->block());
    f.isModel = true;
    return f;
  }

  ast::Function function(antlr4::Token* name, G::ParamsContext* ps, G::BlockContext* body) {
    ast::Function f;
    f.name = name->getText();
    f.loc = loc(name);
    f.fileId = file_;
    if (ps)
      for (auto* p : ps->param()) {
        ast::Param param{p->ID()->getText(), loc(p->ID()->getSymbol()), type(p->type()), nullptr};
        if (p->expr()) param.defaultValue = expr(p->expr());
        f.params.push_back(std::move(param));
      }
    f.body = block(body);
    return f;
  }

  // type : DTYPE '[' dimList? ']' | ID
  ast::TypeRef type(G::TypeContext* c) {
    ast::TypeRef t;
    t.loc = loc(c);
    if (auto* tt = dynamic_cast<G::TensorTypeContext*>(c)) {
      t.isTensor = true;
      t.name = tt->DTYPE()->getText();
      if (tt->dimList())
        for (auto* e : tt->dimList()->expr())
          t.dims.push_back(expr(e));
    } else {
      t.name = dynamic_cast<G::ScalarTypeContext*>(c)->ID()->getText();
    }
    return t;
  }

  // block : '{' stmt* '}'
  std::vector<ast::Stmt> block(G::BlockContext* c) {
    std::vector<ast::Stmt> out;
    for (auto* s : c->stmt())
      out.push_back(stmt(s));
    return out;
  }

  // stmt : targets '=' expr | parallelBlock | RETURN expr (',' expr)*
  ast::Stmt stmt(G::StmtContext* c) {
    ast::Stmt s;
    s.loc = loc(c);
    if (auto* a = dynamic_cast<G::AssignStmtContext*>(c)) {
      s.kind = ast::StmtKind::Assign;
      for (auto* id : a->targets()->ID()) {
        s.targets.push_back(id->getText());
        s.targetLocs.push_back(loc(id->getSymbol()));
      }
      s.values.push_back(expr(a->expr()));
    } else if (auto* p = dynamic_cast<G::ParallelStmtContext*>(c)) {
      s.kind = ast::StmtKind::Parallel;
      s.block = parallelBlock(p->parallelBlock());
    } else {
      auto* r = dynamic_cast<G::ReturnStmtContext*>(c);
      s.kind = ast::StmtKind::Return;
      for (auto* e : r->expr())
        s.values.push_back(expr(e));
    }
    return s;
  }

  // parallelBlock : (REPEAT '(' expr ')')? kind=(REPLICATE | SPLIT) ('(' width ')')? block
  std::unique_ptr<ast::ParallelBlock> parallelBlock(G::ParallelBlockContext* c) {
    auto b = std::make_unique<ast::ParallelBlock>();
    b->kind = c->kind->getType() == Lx::SPLIT ? ast::BlockKind::Split : ast::BlockKind::Replicate;
    b->loc = loc(c->kind);
    if (c->REPEAT()) b->repeat = expr(c->expr());
    if (auto* w = c->width()) {
      if (w->AUTO()) {
        b->isAuto = true;
        b->autoLoc = loc(w->AUTO()->getSymbol());
      } else
        b->width = expr(w->expr());
    }
    b->body = block(c->block());
    return b;
  }

  ast::ExprPtr node(ast::ExprKind kind, antlr4::Token* t) {
    auto e = std::make_unique<ast::Expr>();
    e->kind = kind;
    e->loc = loc(t);
    e->length = lengthOf(t);
    return e;
  }

  // Every later stage walks expressions recursively, so their depth is bounded here
  // (`1 + 1 + …` nests one level per operator).
  ast::ExprPtr expr(G::ExprContext* c) {
    if (++exprDepth_ > kMaxNesting) {
      diags_.error(loc(c), fmt::format("expression nested deeper than {} levels", kMaxNesting))
          .note("split it into steps with `let` or intermediate names");
      throw CompileAborted{};
    }
    ast::ExprPtr e = exprBody(c);
    --exprDepth_;
    const antlr4::Token *first = c->getStart(), *last = c->getStop();
    e->begin = loc(first);
    if (last && last->getLine() == first->getLine() &&
        last->getCharPositionInLine() >= first->getCharPositionInLine())
      e->span =
          static_cast<uint32_t>(last->getCharPositionInLine() - first->getCharPositionInLine()) +
          lengthOf(last);
    return e;
  }

  ast::ExprPtr exprBody(G::ExprContext* c) {
    if (auto* n = dynamic_cast<G::NegExprContext*>(c)) {
      auto e = node(ast::ExprKind::Neg, n->getStart());
      e->operands.push_back(expr(n->expr()));
      return e;
    }
    if (auto* m = dynamic_cast<G::MulExprContext*>(c)) return binary(m->op, m->expr(0), m->expr(1));
    if (auto* a = dynamic_cast<G::AddExprContext*>(c)) return binary(a->op, a->expr(0), a->expr(1));
    if (auto* r = dynamic_cast<G::RepeatExprContext*>(c)) {
      auto e = call(r->call());
      e->kind = ast::ExprKind::Repeat;
      e->loc = loc(r->REPEAT()->getSymbol());
      e->operands.push_back(expr(r->expr()));
      return e;
    }
    if (auto* cl = dynamic_cast<G::CallExprContext*>(c)) return call(cl->call());
    if (auto* p = dynamic_cast<G::ParenExprContext*>(c)) return expr(p->expr());
    if (auto* rec = dynamic_cast<G::RecordExprContext*>(c)) {
      auto e = node(ast::ExprKind::Record, rec->getStart());
      for (auto* s : rec->setting())
        e->fields.push_back(setting(s));
      return e;
    }
    if (auto* l = dynamic_cast<G::ListExprContext*>(c)) {
      auto e = node(ast::ExprKind::List, l->getStart());
      for (auto* item : l->expr())
        e->operands.push_back(expr(item));
      return e;
    }
    if (auto* lit = dynamic_cast<G::LiteralExprContext*>(c)) return literal(lit->literal());
    auto* name = dynamic_cast<G::NameExprContext*>(c);
    auto e = node(ast::ExprKind::Name, name->ID()->getSymbol());
    e->text = name->ID()->getText();
    return e;
  }

  ast::ExprPtr binary(antlr4::Token* op, G::ExprContext* l, G::ExprContext* r) {
    auto e = node(ast::ExprKind::Binary, op);
    e->text = op->getText();
    e->operands.push_back(expr(l));
    e->operands.push_back(expr(r));
    return e;
  }

  // call : ID '(' (arg (',' arg)*)? ')'
  ast::ExprPtr call(G::CallContext* c) {
    auto e = node(ast::ExprKind::Call, c->ID()->getSymbol());
    e->text = c->ID()->getText();
    for (auto* a : c->arg()) {
      ast::Arg arg;
      if (a->ID()) {
        arg.keyword = a->ID()->getText();
        arg.keywordLoc = loc(a->ID()->getSymbol());
      }
      arg.value = expr(a->expr());
      e->args.push_back(std::move(arg));
    }
    return e;
  }

  // literal : INT | FLOAT | SIZE | STRING | WORD | TRUE | FALSE | AUTO | NONE
  ast::ExprPtr literal(G::LiteralContext* c) {
    antlr4::Token* t = c->getStart();
    const std::string text = t->getText();
    switch (t->getType()) {
    case Lx::INT: {
      auto e = node(ast::ExprKind::Int, t);
      check(parseIntLiteral(text, e->intValue), t);
      return e;
    }
    case Lx::FLOAT: {
      auto e = node(ast::ExprKind::Float, t);
      check(parseFloatLiteral(text, e->floatValue), t);
      return e;
    }
    case Lx::SIZE: {
      auto e = node(ast::ExprKind::Size, t);
      check(parseSizeLiteral(text, e->intValue), t);
      e->text = text;
      return e;
    }
    case Lx::STRING: {
      auto e = node(ast::ExprKind::String, t);
      e->text = unquote(text);
      return e;
    }
    case Lx::TRUE:
    case Lx::FALSE: {
      auto e = node(ast::ExprKind::Bool, t);
      e->intValue = t->getType() == Lx::TRUE;
      return e;
    }
    case Lx::AUTO:
      return node(ast::ExprKind::Auto, t);
    case Lx::NONE:
      return node(ast::ExprKind::None, t);
    default: {
      auto e = node(ast::ExprKind::Word, t);
      e->text = text;
      return e;
    }
    }
  }

  ast::Setting setting(G::SettingContext* s) {
    return ast::Setting{s->ID()->getText(), loc(s->ID()->getSymbol()), expr(s->expr())};
  }

  ast::SettingsBlock settingsBlock(antlr4::Token* kw, antlr4::Token* target,
                                   const std::vector<G::SettingContext*>& settings) {
    ast::SettingsBlock b;
    b.loc = loc(kw);
    if (target) {
      b.target = target->getText();
      b.targetLoc = loc(target);
    }
    for (auto* s : settings)
      b.settings.push_back(setting(s));
    return b;
  }

  // A literal without a value is reported at the literal, and ends the file's parse.
  void check(const std::optional<LiteralProblem>& problem, antlr4::Token* t) {
    if (!problem) return;
    auto d = diags_.error(loc(t), problem->message);
    d.length(lengthOf(t));
    if (!problem->note.empty()) d.note(problem->note);
    throw CompileAborted{};
  }

  static std::string unquote(const std::string& s) {
    std::string out;
    for (size_t i = 1; i + 1 < s.size(); ++i) {
      if (s[i] == '\\' && i + 2 < s.size()) {
        char n = s[++i];
        out += n == 'n' ? '\n' : n == 't' ? '\t' : n;
      } else {
        out += s[i];
      }
    }
    return out;
  }

  uint32_t file_;
  Diagnostics& diags_;
  int exprDepth_ = 0;
};

} // namespace

std::optional<ast::File> parseFile(uint32_t fileId, Diagnostics& diags) {
  const std::string& text = diags.sources().text(fileId);
  if (text.size() > kMaxSourceBytes) {
    diags
        .error(SourceLoc{fileId, 1, 1},
               fmt::format("this file is larger than {} bytes", kMaxSourceBytes))
        .note("EPL scripts are small; the limit keeps the parser's memory and stack bounded");
    return std::nullopt;
  }
  // Before anything else reads the text: ANTLR's input stream throws on malformed UTF-8.
  if (std::optional<Utf8Error> bad = findInvalidUtf8(text)) {
    diags.error(SourceLoc{fileId, bad->line, bad->col}, "this file is not valid UTF-8")
        .note(bad->reason)
        .note("EPL scripts are UTF-8 text");
    return std::nullopt;
  }
  std::lock_guard<std::mutex> one(antlrMutex());
  antlr4::ANTLRInputStream input(text);
  Lx lexer(&input);
  lexer.removeErrorListeners();
  antlr4::CommonTokenStream tokens(&lexer);
  tokens.fill();
  if (!checkTokens(fileId, tokens, diags)) return std::nullopt;
  G parser(&tokens);
  ErrorListener listener(fileId, diags);
  parser.removeErrorListeners();
  parser.addErrorListener(&listener);
  G::FileContext* tree = parser.file();
  if (listener.failed) return std::nullopt;
  try {
    return Builder(fileId, diags).file(tree);
  } catch (const CompileAborted&) {
    return std::nullopt;
  }
}

std::mutex& antlrMutex() {
  static std::mutex m;
  return m;
}

std::shared_ptr<const ast::File> ParseCache::find(uint32_t fileId, const std::string& text) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = files_.find({fileId, text});
  return it == files_.end() ? nullptr : it->second;
}

void ParseCache::add(uint32_t fileId, const std::string& text,
                     std::shared_ptr<const ast::File> file) {
  std::lock_guard<std::mutex> lock(mutex_);
  files_.emplace(std::make_pair(fileId, text), std::move(file));
}

std::shared_ptr<const ast::File> parseShared(uint32_t fileId, Diagnostics& diags,
                                             ParseCache* cache) {
  const std::string& text = diags.sources().text(fileId);
  if (cache)
    if (std::shared_ptr<const ast::File> kept = cache->find(fileId, text)) return kept;
  std::optional<ast::File> parsed = parseFile(fileId, diags);
  if (!parsed) return nullptr;
  auto file = std::make_shared<const ast::File>(std::move(*parsed));
  if (cache) cache->add(fileId, text, file);
  return file;
}

} // namespace epl::frontend
