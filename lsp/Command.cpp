// `epl lsp` on the command line (lsp/Command.h).
#include "lsp/Command.h"

#include "lsp/Server.h"
#include "lsp/Vocabulary.h"

#include <CLI/CLI.hpp>
#include <iostream>

namespace epl::lsp {

Command::Command(CLI::App& app) {
  cmd_ = app.add_subcommand("lsp", "serve the Language Server Protocol on stdin/stdout (editors)");
  cmd_->add_option("--np,-n", np_, "devices the hover's plan is for (as `epl plan -np N`)")
      ->check(CLI::Range(1, 1 << 24));
  cmd_->add_option("-I,--import-path", importPath_,
                   "extra folder for imports (searched before stdlib/)");
  // For the editor tests: what the front end knows, and the real lexer's tokens.
  cmd_->add_flag("--vocabulary", vocabulary_, "print the builtins, keys and types as JSON")
      ->group("");
  cmd_->add_option("--tokens", tokenFiles_, "print the lexer's tokens of files as JSON")->group("");
}

bool Command::chosen() const {
  return cmd_->parsed();
}

int Command::run() {
  if (vocabulary_) {
    printVocabulary(std::cout);
    return 0;
  }
  if (!tokenFiles_.empty()) return printTokens(tokenFiles_, std::cout) ? 0 : 1;
  std::ios::sync_with_stdio(false);
  Server server(std::cin, std::cout, std::cerr, ServerOptions{np_, importPath_});
  return server.run();
}

} // namespace epl::lsp
