// Replacing a file atomically: readers (and a restarted run) see the old file or the whole
// new one, never a part, even if the process or the machine dies mid-write.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>

namespace epl::checkpoint {

// A checkpoint file that cannot be written, or read back: the message names the file and
// what is wrong, in EPL's style (lower case, no trailing period, names in backticks).
struct CheckpointError : std::runtime_error {
  explicit CheckpointError(const std::string& message, std::string help = {},
                           std::string key = "checkpoint")
      : std::runtime_error(message), help(std::move(help)), key(std::move(key)) {}
  std::string help; // what would fix it, when that can be said
  std::string key;  // the script's setting a diagnostic points at
};

// Writes to a temporary file beside `path`, then commit() makes it `path`:
//  1. a temporary `.NAME.tmp-XXXXXX` in the same folder (rename is atomic only within one
//     file system), 2. write, 3. fsync it, 4. rename over `path`, 5. fsync the folder so
// the rename itself survives a crash. Destroyed without commit(), it removes the temporary.
class AtomicFileWriter {
public:
  explicit AtomicFileWriter(std::string path); // throws CheckpointError
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  void write(const void* data, size_t bytes);
  void commit();

private:
  [[noreturn]] void fail(const char* what, int err);
  std::string path_, tempPath_;
  int fd_ = -1;
};

// The whole of `bytes` as `path`, atomically. Throws CheckpointError.
void writeFileAtomic(const std::string& path, const std::string& bytes);

} // namespace epl::checkpoint
