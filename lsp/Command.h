// `epl lsp`: the language server subcommand, registered on the `epl` command line.
#pragma once
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace epl::lsp {

class Command {
public:
  // Adds `lsp` (with -np, -I and the hidden test options) to `app`.
  explicit Command(CLI::App& app);
  bool chosen() const;
  // Serves LSP on stdin/stdout, or prints what a hidden option asks for; the exit status.
  int run();

private:
  CLI::App* cmd_;
  int np_ = 0;
  std::vector<std::string> importPath_;
  bool vocabulary_ = false;
  std::vector<std::string> tokenFiles_;
};

} // namespace epl::lsp
