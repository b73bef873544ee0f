// compileFile / compileText: read the text, then hand it to the elaborator.
#include "frontend/Frontend.h"

#include "frontend/Elaborator.h"

#include <fmt/format.h>
#include <fstream>
#include <sstream>

namespace epl::frontend {

std::optional<ir::Module> compileText(const std::string& name, std::string text, Diagnostics& diags,
                                      const FrontendOptions& options) {
  uint32_t id = diags.sources().add(name, std::move(text));
  return Elaborator(diags, options).run(id);
}

std::optional<ir::Module> compileFile(const std::string& path, Diagnostics& diags,
                                      const FrontendOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    diags.error(SourceLoc{}, fmt::format("cannot read `{}`", path));
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  return compileText(path, text.str(), diags, options);
}

} // namespace epl::frontend
