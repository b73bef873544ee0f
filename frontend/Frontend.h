// The front end's entry point: a script (and what it imports) in, checked IR out.
#pragma once
#include "frontend/Ast.h"
#include "ir/Module.h"
#include "support/Diagnostics.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace epl::frontend {

class ParseCache;

struct FrontendOptions {
  // Folders searched for imports after the importing script's own folder.
  std::vector<std::string> importPath;
  // Settings from the command line, `policy.zero=1` or `train.steps=20`, applied after the
  // script's own with the same checks (errors point into the override's text).
  std::vector<std::string> overrides;
  // When set, receives the syntax tree of every file that parsed, imports first and the
  // main script last, whether or not the script has errors (editors: symbols, definitions).
  std::vector<std::shared_ptr<const ast::File>>* syntax = nullptr;
  // When set, files parse through it: trees kept from earlier compilations (ParseCache).
  ParseCache* parseCache = nullptr;
  // Integer literals of the main script read as other values, by (line, col), and widths
  // for its `split(auto)` (at the auto) and `split` (at the keyword) blocks: the layout
  // search's candidates (ir::LayoutKnob).
  std::map<std::pair<uint32_t, uint32_t>, int64_t> literalValues;
};

// Loads `path`, parses and checks it, and lowers its model (the one `train` names, or the
// only one) to IR. Every model in the script is checked. Errors go to `diags`.
std::optional<ir::Module> compileFile(const std::string& path, Diagnostics& diags,
                                      const FrontendOptions& options);
// The same, for text that did not come from a file (tests, the language server).
std::optional<ir::Module> compileText(const std::string& name, std::string text, Diagnostics& diags,
                                      const FrontendOptions& options);

// One token of the real lexer (comments and whitespace are skipped, as for the parser).
// `kind` is the lexer rule (`ID`, `SIZE`, `IMPORT`) or the quoted literal (`'{'`); `line`
// and `col` are 1-based, `col` in code points as in SourceLoc. For editor tooling tests.
struct LexToken {
  std::string kind;
  std::string text;
  uint32_t line = 0, col = 0;
};
// nullopt when the text is not valid UTF-8.
std::optional<std::vector<LexToken>> lexTokens(const std::string& text);

// The scalar type names a parameter may have (`int`, `float`, `bool`, `str`).
const std::set<std::string>& scalarTypes();

} // namespace epl::frontend
