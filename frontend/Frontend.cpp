// compileFile / compileText: read the text, then hand it to the elaborator.
#include "frontend/Frontend.h"

#include "frontend/Elaborator.h"
#include "frontend/Parser.h"
#include "support/Files.h"

#include <fmt/format.h>

namespace epl::frontend {

std::optional<ir::Module> compileText(const std::string& name, std::string text, Diagnostics& diags,
                                      const FrontendOptions& options) {
  uint32_t id = diags.sources().add(name, std::move(text));
  return Elaborator(diags, options).run(id);
}

// The script may be any readable file (a FIFO, /dev/stdin); reading stops one byte past
// the size limit, so `epl check /dev/zero` ends with the parser's "larger than" error.
std::optional<ir::Module> compileFile(const std::string& path, Diagnostics& diags,
                                      const FrontendOptions& options) {
  FileText text = readFilePrefix(path, kMaxSourceBytes + 1);
  if (!text.error.empty()) {
    diags.error(SourceLoc{}, fmt::format("cannot read `{}`: {}", path, text.error));
    return std::nullopt;
  }
  return compileText(path, std::move(text.text), diags, options);
}

} // namespace epl::frontend
