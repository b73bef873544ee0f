// File reading with POSIX calls: they report why a read failed (errno), where a stream
// would only turn bad, or read a file such as /proc/self/mem as empty.
#include "support/Files.h"

#include "support/Text.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace epl {

std::string errorText(int err) {
  return lowerFirst(std::strerror(err));
}

namespace {

// Reads up to `limit` bytes of the open file `fd` into `out`; false with errno on failure.
bool readUpTo(int fd, size_t limit, std::string& out) {
  char buf[65536];
  while (out.size() < limit) {
    size_t want = std::min(sizeof buf, limit - out.size());
    ssize_t n = ::read(fd, buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return true;
}

} // namespace

FileKind fileKind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return FileKind::Missing;
  if (S_ISREG(st.st_mode)) return FileKind::Regular;
  if (S_ISDIR(st.st_mode)) return FileKind::Folder;
  return FileKind::Other;
}

FileText readFilePrefix(const std::string& path, size_t limit) {
  FileText result;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    result.error = errorText(errno);
    return result;
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode))
    result.error = "it is a folder";
  else if (!readUpTo(fd, limit, result.text))
    result.error = errorText(errno);
  ::close(fd);
  if (!result.error.empty()) result.text.clear();
  return result;
}

int writeAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

} // namespace epl
