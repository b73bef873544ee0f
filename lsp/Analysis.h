// One run of the real front end and planner over an editor's text, and what the language
// server reads from it: diagnostics, the planned module, and the syntax of every file.
#pragma once
#include "frontend/Ast.h"
#include "lib/Epl.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace epl::lsp {

struct AnalysisOptions {
  int np = 0;                          // devices to plan for; 0 means one model replica
  std::vector<std::string> importPath; // as `epl -I`
};

struct Analysis {
  std::unique_ptr<Session> session; // owns the sources every location points into
  std::optional<ir::Module> module; // the plan, when the script has no errors
  // The files that parsed, imports first, the main script last.
  std::vector<std::shared_ptr<const ast::File>> syntax;
  uint32_t mainFile = 0; // the editor's text in session->sources
  int np = 0;
  std::vector<std::string> importDirs; // searched after the importing file's folder

  // The main script's syntax, or null when it did not parse.
  const ast::File* mainSyntax() const;
  // Every file's syntax, by file id (null when absent).
  const ast::File* syntaxOf(uint32_t file) const;
  // The absolute path of a source file (imported files are read from disk).
  std::string pathOf(uint32_t file) const;
  // The file an `import "path"` in file `from` loaded, or 0.
  uint32_t importedFile(uint32_t from, const std::string& path) const;
};

// Checks and plans `text` as the script at `path` (imports resolve from its folder),
// exactly as `epl plan` would.
std::unique_ptr<Analysis> analyze(const std::string& path, const std::string& text,
                                  const AnalysisOptions& options);

} // namespace epl::lsp
