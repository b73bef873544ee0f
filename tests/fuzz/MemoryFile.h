// Fuzz input as a file: the readers under test take paths, so each input is written to an
// in-memory file (memfd) and read back through /proc/self/fd, with no disk in the loop.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace epl::fuzz {

class MemoryFile {
public:
  MemoryFile() : fd_(memfd_create("epl-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort(); // the harness cannot run at all
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  // Replaces the content with data[0, size).
  void write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0) std::abort();
    for (size_t at = 0; at < size;) {
      ssize_t n = pwrite(fd_, data + at, size - at, static_cast<off_t>(at));
      if (n <= 0) std::abort();
      at += static_cast<size_t>(n);
    }
  }
  const std::string& path() const { return path_; }

private:
  int fd_;
  std::string path_;
};

} // namespace epl::fuzz
