// The pass interface and the pass manager that runs a linear list of passes.
#pragma once
#include "ir/Module.h"
#include "support/Diagnostics.h"

#include <functional>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace epl::passes {

struct PassContext {
  Diagnostics& diags;
  int np = 0; // devices requested; 0 means "one model replica"
  // Build one program per stage and skip the communication check (Module::costOnly).
  bool costOnly = false;
  // recompute = auto: each stage's peak without recomputation and recomputing every
  // block, where the caller planned them already (PlanOptions); empty: the trials plan them.
  std::vector<int64_t> peaksWithoutRecompute = {}, peaksRecomputingEvery = {};
  // A cost-only plan: whether a program, its memory planned, does not fit its devices.
  // When set, the schedule pass plans each program's memory as it makes it and stops at the
  // first that does not fit (Module::stoppedOver). Not for recompute = auto's trials, whose
  // every stage's peak counts.
  std::function<bool(const ir::Module&, const ir::Program&)> overMemory = {};
  // A cost-only plan: the pipeline positions whose programs to make, by position (empty:
  // every one). recompute = auto's trials make those whose peak they do not know yet.
  std::vector<char> positions = {};
  // Whether the schedule pass plans each program's memory as it makes it (the memory-plan
  // pass's work): a cost-only plan that stops (overMemory) or makes some positions alone.
  bool plansMemoryAsMade() const { return costOnly && (overMemory || !positions.empty()); }
};

class Pass {
public:
  virtual ~Pass() = default;
  virtual const char* name() const = 0; // kebab-case, as in --print-after
  // Rewrites or annotates the module; returns whether it changed anything. User mistakes
  // go to ctx.diags; the manager stops after a pass that reported an error.
  virtual bool run(ir::Module& m, PassContext& ctx) = 0;
};

struct PassManagerOptions {
  std::set<std::string> printAfter; // pass names, or "all"
  bool timePasses = false;
  bool verifyEach = false;     // run the IR verifier after every pass (test builds turn it on)
  std::ostream* out = nullptr; // where --print-after and --time-passes write
};

class PassManager {
public:
  explicit PassManager(PassManagerOptions options) : options_(std::move(options)) {}
  void add(std::unique_ptr<Pass> pass) { passes_.push_back(std::move(pass)); }
  // Runs every pass in order; false when one reported an error.
  bool run(ir::Module& m, PassContext& ctx);
  std::vector<std::string> names() const;
  // Milliseconds each pass took in the last run, in order.
  const std::vector<std::pair<std::string, double>>& timings() const { return times_; }

private:
  PassManagerOptions options_;
  std::vector<std::pair<std::string, double>> times_;
  std::vector<std::unique_ptr<Pass>> passes_;
};

} // namespace epl::passes
