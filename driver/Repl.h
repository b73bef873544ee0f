// `epl repl SCRIPT`: inspect the partitioned plan and re-plan it with other settings, at a
// prompt (line editing, history kept across sessions, tab completion) or from commands
// given with `-c "mesh; mem"` or on standard input. docs/language.md lists the commands.
#pragma once
#include "lib/Epl.h"

#include <istream>
#include <ostream>
#include <string>

namespace epl::driver {

struct ReplOptions {
  std::string script;
  PlanOptions plan;     // the settings the session starts from (np, --set, imports)
  std::string commands; // -c: `;`-separated commands, run instead of a prompt
};

// Runs the session; 0 when every command of -c (or of standard input) succeeded, 1 when
// one failed (the session goes on after a failure either way).
int runRepl(const ReplOptions& options, std::istream& in, std::ostream& out, std::ostream& err);

} // namespace epl::driver
