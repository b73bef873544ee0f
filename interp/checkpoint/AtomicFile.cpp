// Atomic file replacement with POSIX calls: mkstemp, write, fsync, rename, fsync the folder.
#include "interp/checkpoint/AtomicFile.h"

#include "support/Files.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace epl::checkpoint {

namespace {

std::string folderOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

} // namespace

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  size_t slash = path_.rfind('/');
  std::string name = slash == std::string::npos ? path_ : path_.substr(slash + 1);
  if (name.empty()) throw CheckpointError(fmt::format("`{}` names a folder, not a file", path_));
  tempPath_ =
      (slash == std::string::npos ? "" : path_.substr(0, slash + 1)) + "." + name + ".tmp-XXXXXX";
  std::vector<char> buf(tempPath_.begin(), tempPath_.end());
  buf.push_back('\0');
  fd_ = mkostemp(buf.data(), O_CLOEXEC);
  if (fd_ < 0) {
    int err = errno;
    tempPath_.clear();
    fail("create a temporary file for", err);
  }
  tempPath_ = buf.data();
  fchmod(fd_, 0644); // mkstemp creates 0600; checkpoints are ordinary files
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!tempPath_.empty()) ::unlink(tempPath_.c_str());
}

void AtomicFileWriter::fail(const char* what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tempPath_.empty()) ::unlink(tempPath_.c_str());
  tempPath_.clear();
  throw CheckpointError(fmt::format("cannot {} `{}`: {}", what, path_, errorText(err)));
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  if (fd_ < 0) throw CheckpointError(fmt::format("`{}` was already committed", path_));
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write", errno);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) throw CheckpointError(fmt::format("`{}` was already committed", path_));
  if (::fsync(fd_) != 0) fail("sync", errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail("write", errno);
  }
  fd_ = -1;
  if (::rename(tempPath_.c_str(), path_.c_str()) != 0) fail("replace", errno);
  tempPath_.clear();
  // The rename is durable only once the folder's entry is on disk.
  int dir = ::open(folderOf(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void writeFileAtomic(const std::string& path, const std::string& bytes) {
  AtomicFileWriter out(path);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

} // namespace epl::checkpoint
