// Reading source files from disk: never more than a caller's limit (`/dev/zero` and a
// FIFO have no end), and a reason for every failure rather than an empty text. Writing all
// of a buffer to a file descriptor.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

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

// Writes all of `bytes` to `fd`, going on after short writes and interruptions: 0, or the
// errno of the write that failed (ENOSPC on a full disk).
int writeAll(int fd, std::string_view bytes);

// strerror's text in the diagnostics' style: lower case ("no such file or directory").
std::string errorText(int err);

} // namespace epl
