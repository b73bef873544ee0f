// Checks a loaded program and expands its model into IR: evaluates `let`s, inlines `def`
// calls and `repeat`, infers symbolic shapes, and records parallel scopes.
// One class, its parts in Loader.cpp, Elaborator.cpp, Expressions.cpp, Calls.cpp and
// Settings.cpp.
#pragma once
#include "frontend/Ast.h"
#include "frontend/Frontend.h"
#include "frontend/Value.h"

#include <map>
#include <set>

namespace epl::frontend {

class Elaborator {
public:
  Elaborator(Diagnostics& diags, const FrontendOptions& options)
      : diags_(diags), options_(options) {}
  std::optional<ir::Module> run(uint32_t mainFile);

private:
  struct Frame {
    std::map<std::string, Value> vars;
  };
  // Where ops go while a body is expanded.
  struct Context {
    ir::Module* module = nullptr;
    int scope = 0;
    bool topLevel = false; // directly in the model body
    // Directly in a top-level block that runs once (not `repeat(n) replicate`): its scope.
    int onceBlock = -1;
    std::string namePrefix; // "transformer_block.0/"
    SourceLoc site;         // the model-body call being expanded, if inside a def
    std::vector<const ast::Function*> callStack;
  };

  // Loader.cpp: parse files and follow imports.
  bool load(uint32_t file, std::vector<uint32_t>& stack);
  bool loadImport(const ast::Import& imp, uint32_t file, std::vector<uint32_t>& stack);
  std::vector<std::string> importCandidates(const std::string& from, const std::string& path) const;
  std::string resolveImport(const std::string& from, const std::string& path) const;
  // The import path (`std/nn.epl`) of a file in the import folders that defines `def name`,
  // or "": what a script that calls it without importing it is missing.
  std::string importDefining(const std::string& name) const;
  void unresolvedImport(const ast::Import& imp, const std::string& from);
  // Elaborator.cpp: globals, functions and statements.
  void declareGlobals();
  void defineGlobal(const std::string& name, SourceLoc loc, const char* what);
  std::optional<ir::Module> elaborateModel(const ast::Function& model);
  void bindModelInputs(const ast::Function& model, ir::Module& m, Frame& frame);
  ir::Shape inputShape(const ast::Param& p, Frame& frame);
  void checkTrainedInputs(const ast::Function& model, const ir::Module& m);
  Value runBody(const std::vector<ast::Stmt>& body, Frame& frame, Context& ctx);
  void runParallel(const ast::ParallelBlock& b, Frame& frame, Context& ctx, bool& returned,
                   Value& result);
  int64_t blockWidth(const ast::ParallelBlock& b, Frame& frame, Context& ctx);
  // Records `e` (a block's repeat count or split width) as a layout knob where it is a
  // literal of the main script or names a `let` of it bound to one.
  void noteLayoutKnob(const ast::Expr& e, ir::LayoutKnob::Kind kind, const Frame& frame,
                      ir::Module& m);
  void checkModelResult(const ast::Function& model, const Value& v, ir::Module& m);
  void checkIgnoredClass(const ir::Module& m);
  // Expressions.cpp: expressions and calls.
  Value eval(const ast::Expr& e, Frame& frame, Context* ctx);
  Value evalBinary(const ast::Expr& e, Frame& frame, Context* ctx);
  Value evalInts(const ast::Expr& e, const Value& a, const Value& b);
  Value evalNumbers(const ast::Expr& e, double x, double y);
  Value evalCall(const ast::Expr& e, Frame& frame, Context* ctx, bool inRepeat);
  Value evalRepeat(const ast::Expr& e, Frame& frame, Context* ctx);
  void noteLayers(const ast::Expr& e, Context& ctx, size_t firstOp, int64_t count);
  void chainLayers(ir::Module& m);
  Value callBuiltin(const ir::OpInfo& info, const ast::Expr& call, std::vector<Value> args,
                    Context& ctx, bool inRepeat);
  Value callDef(const ast::Function& def, const ast::Expr& call, std::vector<Value> args,
                Context& ctx, bool inRepeat);
  std::vector<Value> bindArgs(const ast::Expr& call, const std::vector<std::string>& names,
                              const std::vector<bool>& required, const std::vector<bool>& wordArgs,
                              Frame& frame, Context* ctx, const std::string& what,
                              std::vector<const ast::Expr*>& argExprs);
  void bindParam(const ast::Param& p, const Value& v, const ast::Expr* argExpr,
                 const ast::Expr& call, Frame& callee, const ast::Function& def, Context& ctx);
  Value defaultValue(const ast::Param& p, Frame& callee);
  void checkBatchFirst(const ast::Expr& at, const ir::Module& m, const std::string& op,
                       const std::vector<ir::TensorType>& out);
  // Why mean, select or narrow may not take this dim (dim 0, the batch), or "".
  static std::string batchTaken(const ir::Module& m, ir::OpKind kind,
                                const std::vector<ir::TensorType>& in, const ir::Attrs& attrs);
  void checkSignature(const ast::Function& fn);
  [[noreturn]] void unknownType(const ast::TypeRef& type, const std::vector<std::string>& names);
  [[noreturn]] void failInOp(const ast::Expr& at, const Context& ctx, const std::string& message);
  void checkTensorSizes(const ast::Expr& at, const Context& ctx, ir::OpKind kind,
                        const std::vector<ir::TensorType>& in, const ir::Attrs& attrs,
                        const std::vector<ir::TensorType>& out,
                        const std::vector<ir::ParamSpec>& params);
  // An op named after `name` (made unique), or exactly `fixedName` when one is given, whose
  // parameters are named after the op, or after `paramOwner` when one is given.
  Value emitOp(ir::OpKind kind, const ast::Expr& at, std::vector<int> inputs, ir::Attrs attrs,
               Context& ctx, const std::string& name, bool inRepeat,
               const std::string& fixedName = "", const std::string& paramOwner = "");
  Value emitMoe(const ast::Expr& at, int x, const ir::Attrs& attrs, Context& ctx, bool inRepeat);
  std::string uniqueName(Context& ctx, const std::string& base, bool inRepeat);
  static int tiedWeight(const ir::Module& m, const std::string& layer);
  void checkTie(const ast::Expr& at, const std::string& layer, Context& ctx);
  void checkTiedWeight(const ast::Expr& at, const Context& ctx, const ir::Op& op, int tied,
                       const ir::TensorType& want);
  Value lookup(const ast::Expr& e, Frame& frame);
  // A bare name bound neither in `frame` nor globally: a new dim symbol, or a word.
  bool unbound(const ast::Expr& e, const Frame& frame) const;
  int64_t expectInt(const ast::Expr& e, Frame& frame, Context* ctx, const std::string& what);
  [[noreturn]] void fail(const ast::Expr& e, std::string message);
  // Settings.cpp: policy and train blocks.
  void checkSettings(ir::Module& m);
  void applyPolicy(const ast::SettingsBlock& b, ir::Policy& p);
  void applyTrain(const ast::SettingsBlock& b, ir::TrainConfig& t);
  void applyOverride(const std::string& text, ir::Module& m);

  Diagnostics& diags_;
  const FrontendOptions& options_;
  std::vector<std::shared_ptr<const ast::File>> files_; // in load order, imports first
  std::map<uint32_t, bool> loaded_;                     // file id -> finished
  std::map<std::string, uint32_t> fileIds_;             // canonical path -> file id
  Frame globals_;
  std::map<std::string, const ast::Function*> defs_;
  std::vector<const ast::Function*> models_;
  std::map<std::string, SourceLoc> globalLocs_;
  std::map<std::string, int> nameCounts_;
  size_t opBudget_ = 0;
  uint32_t mainFile_ = 0;
};

} // namespace epl::frontend
