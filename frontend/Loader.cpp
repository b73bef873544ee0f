// Reads the main script and its imports. Search order for `import "p"`: the importing
// file's folder, then each folder of FrontendOptions::importPath (stdlib/ by default).
#include "frontend/Elaborator.h"

#include "frontend/Parser.h"
#include "support/Files.h"

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <regex>

namespace epl::frontend {

namespace fs = std::filesystem;

std::vector<std::string> Elaborator::importCandidates(const std::string& from,
                                                      const std::string& path) const {
  std::vector<std::string> candidates{(fs::path(from).parent_path() / path).string()};
  for (const auto& dir : options_.importPath)
    candidates.push_back((fs::path(dir) / path).string());
  return candidates;
}

std::string Elaborator::resolveImport(const std::string& from, const std::string& path) const {
  for (const auto& c : importCandidates(from, path)) {
    std::error_code ec;
    if (fileKind(c) == FileKind::Regular) return fs::weakly_canonical(c, ec).string();
  }
  return "";
}

std::string Elaborator::importDefining(const std::string& name) const {
  const std::regex def("^\\s*def\\s+" + name + "\\s*\\(");
  for (const auto& dir : options_.importPath) {
    std::error_code ec;
    std::vector<fs::path> files;
    for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->is_regular_file(ec) && it->path().extension() == ".epl") files.push_back(it->path());
    std::sort(files.begin(), files.end()); // the same answer on every file system
    for (const fs::path& f : files) {
      std::ifstream in(f);
      for (std::string line; std::getline(in, line);)
        if (std::regex_search(line, def)) return f.lexically_relative(dir).generic_string();
    }
  }
  return "";
}

// No candidate is a regular file: name the first that is something else (`import "/usr"`
// names a folder, `import "/dev/zero"` a device), else list the folders searched.
void Elaborator::unresolvedImport(const ast::Import& imp, const std::string& from) {
  auto length = static_cast<uint32_t>(imp.path.size() + 2);
  for (const auto& c : importCandidates(from, imp.path)) {
    FileKind kind = fileKind(c);
    if (kind == FileKind::Missing) continue;
    std::string what = c == imp.path ? "it" : fmt::format("`{}`", c);
    diags_
        .error(imp.loc, fmt::format("cannot import `{}`: {} is {}", imp.path, what,
                                    kind == FileKind::Folder ? "a folder" : "not a regular file"))
        .length(length)
        .help("import an `.epl` file");
    return;
  }
  auto d = diags_.error(imp.loc, fmt::format("cannot find import `{}`", imp.path));
  d.length(length);
  std::string where = fs::path(from).parent_path().string();
  d.note(fmt::format("searched `{}`", where.empty() ? "." : where));
  for (const auto& dir : options_.importPath)
    d.note(fmt::format("searched `{}`", dir));
}

// Parses `file`, then loads each import depth first. `stack` holds the files being loaded,
// so an import back into it is a cycle.
bool Elaborator::load(uint32_t file, std::vector<uint32_t>& stack) {
  std::shared_ptr<const ast::File> parsed = parseShared(file, diags_, options_.parseCache);
  if (!parsed) return false;
  stack.push_back(file);
  bool ok = true;
  for (const ast::Import& imp : parsed->imports)
    ok = loadImport(imp, file, stack) && ok;
  stack.pop_back();
  loaded_[file] = true;
  files_.push_back(std::move(parsed));
  return ok;
}

bool Elaborator::loadImport(const ast::Import& imp, uint32_t file, std::vector<uint32_t>& stack) {
  std::string from = diags_.sources().path(file);
  std::string path = resolveImport(from, imp.path);
  if (path.empty()) {
    unresolvedImport(imp, from);
    return false;
  }
  auto length = static_cast<uint32_t>(imp.path.size() + 2);
  auto known = fileIds_.find(path);
  if (known != fileIds_.end()) {
    if (loaded_[known->second]) return true; // already loaded: a diamond, not a cycle
    std::string chain;
    for (uint32_t f : stack)
      chain += fs::path(diags_.sources().path(f)).filename().string() + " -> ";
    bool self = known->second == file;
    diags_
        .error(imp.loc, self
                            ? fmt::format("import cycle: `{}` imports itself", imp.path)
                            : fmt::format("import cycle: `{}` is already being imported", imp.path))
        .length(length)
        .note(chain + fs::path(path).filename().string());
    return false;
  }
  // One byte past the limit is enough for the parser to report a file that is too long.
  FileText text = readFilePrefix(path, kMaxSourceBytes + 1);
  if (!text.error.empty()) {
    diags_.error(imp.loc, fmt::format("cannot read import `{}`: {}", imp.path, text.error))
        .length(length);
    return false;
  }
  // Shown in diagnostics relative to the working folder when it lies below it.
  std::error_code ec;
  std::string shown = fs::proximate(path, ec).string();
  if (ec || shown.rfind("..", 0) == 0) shown = path;
  uint32_t id = diags_.sources().add(shown, std::move(text.text));
  fileIds_[path] = id;
  loaded_[id] = false;
  return load(id, stack);
}

} // namespace epl::frontend
