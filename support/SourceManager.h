// Owns the text of every file the compiler reads and maps locations to lines.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace epl {

// A position in a source file: file id, 1-based line and column. file 0 is "no file".
struct SourceLoc {
  uint32_t file = 0;
  uint32_t line = 0;
  uint32_t col = 0;
  bool valid() const { return file != 0 && line != 0; }
};

class SourceManager {
public:
  // Adds a file's text and returns its id (never 0).
  uint32_t add(std::string path, std::string text);
  const std::string& path(uint32_t file) const;
  const std::string& text(uint32_t file) const;
  // The text of one line without its newline; empty if out of range.
  std::string_view line(uint32_t file, uint32_t line) const;
  size_t fileCount() const { return files_.size(); }

private:
  struct File {
    std::string path;
    std::string text;
    std::vector<size_t> lineStarts;
  };
  std::vector<File> files_;
};

} // namespace epl
