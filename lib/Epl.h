// libepl: load a script, check it, and plan it. The `epl` CLI is a thin layer over this.
#pragma once
#include "ir/Module.h"
#include "support/Diagnostics.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace epl {

namespace ast {
struct File;
}
namespace frontend {
class ParseCache;
}

struct PlanOptions {
  int np = 0;                       // devices; 0 means one model replica
  std::set<std::string> printAfter; // pass names whose IR to print, or "all"
  bool timePasses = false;
#ifdef NDEBUG
  bool verifyEach = false; // verify the IR after every pass (on in debug and test builds)
#else
  bool verifyEach = true;
#endif
  std::vector<std::string> importPath; // searched after the script's folder; stdlib/ is added
  std::vector<std::string> overrides;  // `policy.zero=1`, `train.steps=20` (--set)
  // Plan for a prediction only (Module::costOnly): one rank program per stage, so a plan
  // for thousands of devices costs what one replica's stages cost (`epl plan --search`).
  bool costOnly = false;
  // Whether the devices use the host's memory (the CPU device: true), or memory of their
  // own (GPUs, a cluster file's devices, the guarded CPU device): `offload_to = cpu` applies
  // only then (Module::deviceMemoryIsHost).
  bool deviceMemoryIsHost = true;
  // Integer literals of the main script read as other values, by (line, col)
  // (ir::LayoutKnob): how the search tries another layout.
  std::map<std::pair<uint32_t, uint32_t>, int64_t> literalValues;
  // recompute = auto: each stage's peak planned already with no block recomputed and with
  // every block (the search's plans with none and with every), which its trials need not
  // plan again (passes/Recompute.cpp). Empty: they plan them.
  std::vector<int64_t> peaksWithoutRecompute, peaksRecomputingEvery;
  // A cost-only plan stops at the first stage whose program does not fit its devices, as
  // this says (Module::stoppedOver): the search's plans that do not fit cost a stage's
  // program, not every stage's. Unset: every stage is planned.
  std::function<bool(const ir::Module&, const ir::Program&)> overMemory;
  std::ostream* passOutput = nullptr; // where --print-after / --time-passes write
  // When set, receives the syntax of every file that parsed (editors: symbols, definitions).
  std::vector<std::shared_ptr<const ast::File>>* syntax = nullptr;
  // When set, the script and its imports parse through it (frontend::ParseCache): the
  // search's plans parse them once.
  frontend::ParseCache* parseCache = nullptr;
};

// Owns the sources and diagnostics of one compilation.
class Session {
public:
  Session() : diags(sources) {}
  SourceManager sources;
  Diagnostics diags;
};

// The names of the passes, in pipeline order (for --print-after).
std::vector<std::string> passNames();

// The folder `import "std/…"` resolves in: $EPL_STDLIB, else the install or source tree.
std::string stdlibDir();

// Front end and passes on a file (or on text named `name`). nullopt when an error was
// reported to session.diags. Runs on a thread with a large stack (runWithLargeStack).
std::optional<ir::Module> planFile(const std::string& path, Session& session,
                                   const PlanOptions& options);
std::optional<ir::Module> planText(const std::string& name, const std::string& text,
                                   Session& session, const PlanOptions& options);

// Runs `fn` on a thread with a large stack, so deep but legal input cannot overflow it.
void runWithLargeStack(const std::function<void()>& fn);

} // namespace epl
