// Source text storage and line lookup for diagnostics.
#include "support/SourceManager.h"

#include <cassert>

namespace epl {

uint32_t SourceManager::add(std::string path, std::string text) {
  File f{std::move(path), std::move(text), {0}};
  for (size_t i = 0; i < f.text.size(); ++i)
    if (f.text[i] == '\n') f.lineStarts.push_back(i + 1);
  files_.push_back(std::move(f));
  return static_cast<uint32_t>(files_.size());
}

const std::string& SourceManager::path(uint32_t file) const {
  assert(file >= 1 && file <= files_.size());
  return files_[file - 1].path;
}

const std::string& SourceManager::text(uint32_t file) const {
  assert(file >= 1 && file <= files_.size());
  return files_[file - 1].text;
}

std::string_view SourceManager::line(uint32_t file, uint32_t line) const {
  if (file < 1 || file > files_.size()) return {};
  const File& f = files_[file - 1];
  if (line < 1 || line > f.lineStarts.size()) return {};
  size_t begin = f.lineStarts[line - 1];
  size_t end = line < f.lineStarts.size() ? f.lineStarts[line] - 1 : f.text.size();
  std::string_view s(f.text.data() + begin, end - begin);
  if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
  return s;
}

} // namespace epl
