// ANTLR parse tree -> AST. One function per grammar rule, named after it.
#include "frontend/Parser.h"

#include "EplLexer.h"
#include "EplParser.h"
#include "antlr4-runtime.h"

#include <algorithm>
#include <charconv>
#include <fmt/format.h>

namespace epl::frontend {

using G = grammar::EplParser;
using Lx = grammar::EplLexer;

namespace {

SourceLoc locOf(uint32_t file, const antlr4::Token* t) {
  return SourceLoc{file, static_cast<uint32_t>(t->getLine()),
                   static_cast<uint32_t>(t->getCharPositionInLine() + 1)};
}

uint32_t lengthOf(const antlr4::Token* t) {
  return static_cast<uint32_t>(std::max<size_t>(1, t->getText().size()));
}

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

// Turns ANTLR's syntax errors into one diagnostic: the first error of the file.
class ErrorListener : public antlr4::BaseErrorListener {
public:
  ErrorListener(uint32_t file, Diagnostics& diags) : file_(file), diags_(diags) {}
  bool failed = false;

  void syntaxError(antlr4::Recognizer* recognizer, antlr4::Token* offending, size_t line,
                   size_t col, const std::string& msg, std::exception_ptr) override {
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
          .error(locOf(file_, kw),
                 fmt::format("expected a name, found keyword `{}`", kw->getText()))
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
  }

private:
  uint32_t file_;
  Diagnostics& diags_;
};

// Lexical problems the grammar lets through as tokens: stray characters, open strings,
// and nesting deep enough to exhaust the parser's stack.
bool checkTokens(uint32_t file, antlr4::CommonTokenStream& tokens, Diagnostics& diags) {
  int depth = 0;
  for (antlr4::Token* t : tokens.getTokens()) {
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
            .note("EPL limits the depth of brackets and blocks to keep compilation bounded");
        return false;
      }
    } else if (s == ")" || s == "]" || s == "}") {
      --depth;
    }
  }
  return true;
}

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
      if (w->AUTO())
        b->isAuto = true;
      else
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

  ast::ExprPtr expr(G::ExprContext* c) {
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
      e->intValue = parseInt(text, t);
      return e;
    }
    case Lx::FLOAT: {
      auto e = node(ast::ExprKind::Float, t);
      e->floatValue = std::stod(text);
      return e;
    }
    case Lx::SIZE: {
      auto e = node(ast::ExprKind::Size, t);
      e->intValue = parseSize(text, t);
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

  int64_t parseInt(const std::string& text, antlr4::Token* t) {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || p != text.data() + text.size()) {
      diags_.error(loc(t), fmt::format("integer `{}` is too large", text))
          .length(lengthOf(t))
          .note("integers must be at most 2^63 - 1 (9223372036854775807)");
      throw CompileAborted{};
    }
    return v;
  }

  int64_t parseSize(const std::string& text, antlr4::Token* t) {
    size_t unit = text.find_first_not_of("0123456789.");
    double v = std::stod(text.substr(0, unit));
    std::string u = text.substr(unit);
    double scale = u == "KB"    ? 1e3
                   : u == "MB"  ? 1e6
                   : u == "GB"  ? 1e9
                   : u == "TB"  ? 1e12
                   : u == "KiB" ? 1024.0
                   : u == "MiB" ? 1048576.0
                   : u == "GiB" ? 1073741824.0
                                : 1099511627776.0;
    double bytes = v * scale;
    if (!(bytes < 9.2e18)) {
      diags_.error(loc(t), fmt::format("size `{}` is too large", text)).length(lengthOf(t));
      throw CompileAborted{};
    }
    return static_cast<int64_t>(bytes);
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
};

} // namespace

// The location of the first byte that is not valid UTF-8 (ANTLR's input stream throws on
// those), or an invalid location when the text is clean.
SourceLoc firstInvalidUtf8(uint32_t file, const std::string& text) {
  uint32_t line = 1, col = 1;
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n != 0 && i + n <= text.size();
    for (size_t k = 1; ok && k < n; ++k)
      ok = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    if (ok && n == 2) ok = c >= 0xc2;
    if (!ok) return SourceLoc{file, line, col};
    if (c == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
    i += n;
  }
  return SourceLoc{};
}

std::optional<ast::File> parseFile(uint32_t fileId, Diagnostics& diags) {
  const std::string& text = diags.sources().text(fileId);
  if (text.size() > kMaxSourceBytes) {
    diags
        .error(SourceLoc{fileId, 1, 1},
               fmt::format("this file is larger than {} bytes", kMaxSourceBytes))
        .note("EPL scripts are small; the limit keeps the parser's memory and stack bounded");
    return std::nullopt;
  }
  SourceLoc bad = firstInvalidUtf8(fileId, text);
  if (bad.valid()) {
    diags.error(bad, "this file is not valid UTF-8").note("EPL scripts are UTF-8 text");
    return std::nullopt;
  }
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

} // namespace epl::frontend
