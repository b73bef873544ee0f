// Reads the main script and its imports. Search order for `import "p"`: the importing
// file's folder, then each folder of FrontendOptions::importPath (stdlib/ by default).
#include "frontend/Elaborator.h"

#include "frontend/Parser.h"

#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <sstream>

namespace epl::frontend {

namespace fs = std::filesystem;

std::string Elaborator::resolveImport(const std::string& from, const std::string& path) const {
  std::vector<fs::path> candidates{fs::path(from).parent_path() / path};
  for (const auto& dir : options_.importPath)
    candidates.push_back(fs::path(dir) / path);
  for (const auto& c : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) return fs::weakly_canonical(c, ec).string();
  }
  return "";
}

// Parses `file`, then loads each import depth first. `stack` holds the files being loaded,
// so an import back into it is a cycle.
bool Elaborator::load(uint32_t file, std::vector<uint32_t>& stack) {
  std::optional<ast::File> parsed = parseFile(file, diags_);
  if (!parsed) return false;
  stack.push_back(file);
  bool ok = true;
  for (const ast::Import& imp : parsed->imports) {
    std::string from = diags_.sources().path(file);
    std::string path = resolveImport(from, imp.path);
    if (path.empty()) {
      auto d = diags_.error(imp.loc, fmt::format("cannot find import `{}`", imp.path));
      d.length(static_cast<uint32_t>(imp.path.size() + 2));
      std::string where = fs::path(from).parent_path().string();
      d.note(fmt::format("searched `{}`", where.empty() ? "." : where));
      for (const auto& dir : options_.importPath)
        d.note(fmt::format("searched `{}`", dir));
      ok = false;
      continue;
    }
    auto known = fileIds_.find(path);
    if (known != fileIds_.end()) {
      if (!loaded_[known->second]) {
        std::string chain;
        for (uint32_t f : stack)
          chain += fs::path(diags_.sources().path(f)).filename().string() + " -> ";
        bool self = known->second == file;
        diags_
            .error(imp.loc,
                   self ? fmt::format("import cycle: `{}` imports itself", imp.path)
                        : fmt::format("import cycle: `{}` is already being imported", imp.path))
            .length(static_cast<uint32_t>(imp.path.size() + 2))
            .note(chain + fs::path(path).filename().string());
        ok = false;
      }
      continue; // already loaded: a diamond, not a cycle
    }
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    // Shown in diagnostics relative to the working folder when it lies below it.
    std::error_code ec;
    std::string shown = fs::proximate(path, ec).string();
    if (ec || shown.rfind("..", 0) == 0) shown = path;
    uint32_t id = diags_.sources().add(shown, text.str());
    fileIds_[path] = id;
    loaded_[id] = false;
    ok = load(id, stack) && ok;
  }
  stack.pop_back();
  loaded_[file] = true;
  files_.push_back(std::move(*parsed));
  return ok;
}

} // namespace epl::frontend
