// Reading source files from disk: never more than a caller's limit (`/dev/zero` and a
// FIFO have no end), and a reason for every failure rather than an empty text.
#pragma once
#include <cstddef>
#include <string>

namespace epl {

// What a path names, following symbolic links.
enum class FileKind { Missing, Regular, Folder, Other };
FileKind fileKind(const std::string& path);

struct FileText {
  std::string text;
  std::string error; // empty on success, else why: "it is a folder", "input/output error"
};

// At most `limit` bytes of `path`. A caller that accepts n bytes passes n + 1 and learns
// that the file is too long without reading the rest.
FileText readFilePrefix(const std::string& path, size_t limit);

} // namespace epl
