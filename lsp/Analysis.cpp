// Runs libepl's planner on an editor buffer (lsp/Analysis.h).
#include "lsp/Analysis.h"

#include <filesystem>

namespace epl::lsp {

const ast::File* Analysis::mainSyntax() const {
  if (syntax.empty() || syntax.back()->fileId != mainFile) return nullptr;
  return syntax.back().get();
}

const ast::File* Analysis::syntaxOf(uint32_t file) const {
  for (const auto& f : syntax)
    if (f->fileId == file) return f.get();
  return nullptr;
}

std::string Analysis::pathOf(uint32_t file) const {
  std::error_code ec;
  auto p = std::filesystem::absolute(session->sources.path(file), ec);
  return ec ? session->sources.path(file) : p.lexically_normal().string();
}

namespace {

std::string canonicalPath(const std::filesystem::path& p) {
  std::error_code ec;
  auto c = std::filesystem::weakly_canonical(p, ec);
  return ec ? p.string() : c.string();
}

} // namespace

// Resolves as frontend/Loader.cpp does: the importing file's folder, then each import
// folder (the last is the standard library); the first file that exists wins.
uint32_t Analysis::importedFile(uint32_t from, const std::string& path) const {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates{fs::path(pathOf(from)).parent_path() / path};
  for (const auto& d : importDirs)
    candidates.push_back(fs::path(d) / path);
  for (const auto& c : candidates) {
    std::error_code ec;
    if (!fs::is_regular_file(c, ec)) continue;
    std::string want = canonicalPath(c);
    for (uint32_t f = 1; f <= session->sources.fileCount(); ++f)
      if (canonicalPath(pathOf(f)) == want) return f;
    return 0;
  }
  return 0;
}

std::unique_ptr<Analysis> analyze(const std::string& path, const std::string& text,
                                  const AnalysisOptions& options) {
  auto a = std::make_unique<Analysis>();
  a->session = std::make_unique<Session>();
  a->np = options.np;
  a->importDirs = options.importPath;
  a->importDirs.push_back(stdlibDir());
  PlanOptions plan;
  plan.np = options.np;
  plan.importPath = options.importPath;
  plan.syntax = &a->syntax;
  a->module = planText(path, text, *a->session, plan);
  // planText adds the text first, so it is the first file of the session.
  a->mainFile = 1;
  return a;
}

} // namespace epl::lsp
