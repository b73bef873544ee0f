// The front end's entry point: a script (and what it imports) in, checked IR out.
#pragma once
#include "ir/Module.h"
#include "support/Diagnostics.h"

#include <optional>
#include <string>
#include <vector>

namespace epl::frontend {

struct FrontendOptions {
  // Folders searched for imports after the importing script's own folder.
  std::vector<std::string> importPath;
  // Settings from the command line, `policy.zero=1` or `train.steps=20`, applied after the
  // script's own with the same checks (errors point into the override's text).
  std::vector<std::string> overrides;
};

// Loads `path`, parses and checks it, and lowers its model (the one `train` names, or the
// only one) to IR. Every model in the script is checked. Errors go to `diags`.
std::optional<ir::Module> compileFile(const std::string& path, Diagnostics& diags,
                                      const FrontendOptions& options);
// The same, for text that did not come from a file (tests, the language server).
std::optional<ir::Module> compileText(const std::string& name, std::string text, Diagnostics& diags,
                                      const FrontendOptions& options);

} // namespace epl::frontend
