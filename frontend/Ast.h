// The syntax tree of one .epl file, with a source location on every node.
// Built from the ANTLR parse tree by frontend/Parser.cpp; nothing else sees ANTLR.
#pragma once
#include "support/SourceManager.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace epl::ast {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Arg {
  std::string keyword; // empty for positional
  SourceLoc keywordLoc;
  ExprPtr value;
};

struct Setting {
  std::string key;
  SourceLoc loc;
  ExprPtr value;
};

enum class ExprKind {
  Int,
  Float,
  Size,
  String,
  Word,
  Bool,
  Auto,
  None, // literals
  Name,
  Neg,
  Binary,
  Call,
  Repeat,
  Record,
  List,
};

struct Expr {
  ExprKind kind = ExprKind::Int;
  SourceLoc loc;
  uint32_t length = 1; // characters the node's first token spans, for carets
  // The whole expression's text: where it begins and its characters, when it is on one
  // line (span 0: across lines). A Binary's `loc` is its operator; its `begin`, its left.
  SourceLoc begin;
  uint32_t span = 0;
  int64_t intValue = 0;  // Int, Size (bytes), Bool
  double floatValue = 0; // Float
  std::string text;      // Name, String (unquoted), Word, callee of Call/Repeat, op of Binary
  std::vector<ExprPtr> operands; // Neg: 1, Binary: 2, Repeat: count, List: items
  std::vector<Arg> args;         // Call and Repeat
  std::vector<Setting> fields;   // Record
};

struct TypeRef {
  bool isTensor = false;
  std::string name; // dtype (f32) or scalar type (int, float, bool, str)
  std::vector<ExprPtr> dims;
  SourceLoc loc;
};

struct Param {
  std::string name;
  SourceLoc loc;
  TypeRef type;
  ExprPtr defaultValue;
};

enum class BlockKind { Replicate, Split };

struct Stmt;
struct ParallelBlock {
  BlockKind kind = BlockKind::Replicate;
  ExprPtr repeat; // repeat(k) before the block, or null
  bool isAuto = false;
  ExprPtr width; // null when left out or auto
  std::vector<Stmt> body;
  SourceLoc loc;     // the replicate or split keyword
  SourceLoc autoLoc; // split(auto): the auto
};

enum class StmtKind { Assign, Parallel, Return };

struct Stmt {
  StmtKind kind = StmtKind::Assign;
  SourceLoc loc;
  std::vector<std::string> targets;
  std::vector<SourceLoc> targetLocs;
  std::vector<ExprPtr> values; // Assign: 1, Return: 1+
  std::unique_ptr<ParallelBlock> block;
};

// A `def` block or the `model`: parameters and a body of statements.
struct Function {
  bool isModel = false;
  std::string name;
  SourceLoc loc;
  std::vector<Param> params;
  std::unique_ptr<TypeRef> result;
  std::vector<Stmt> body;
  uint32_t fileId = 0;
};

struct Binding {
  std::string name;
  SourceLoc loc;
  ExprPtr value;
};

struct Import {
  std::string path;
  SourceLoc loc;
};

// `policy { … }` or `train model { … }`.
struct SettingsBlock {
  SourceLoc loc;
  std::string target; // model name for `train`
  SourceLoc targetLoc;
  std::vector<Setting> settings;
};

struct File {
  uint32_t fileId = 0;
  std::vector<Import> imports;
  std::vector<Binding> lets;
  std::vector<Function> functions; // defs and models, in order
  std::vector<SettingsBlock> policies;
  std::vector<SettingsBlock> trains;
};

} // namespace epl::ast
