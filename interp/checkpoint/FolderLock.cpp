// Locking a checkpoint folder with flock(2) on a file inside it (FolderLock.h). The kernel
// drops the lock when the process ends, however it ends, so a lock is never left stale.
#include "interp/checkpoint/FolderLock.h"

#include "interp/checkpoint/AtomicFile.h"
#include "support/Files.h"
#include "support/Text.h"

#include <fmt/format.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <sys/file.h>
#include <unistd.h>

namespace epl::checkpoint {

namespace {

[[noreturn]] void unwritable(const std::string& dir, const std::string& why) {
  throw CheckpointError(fmt::format("cannot write checkpoints into `{}`: {}", dir, lowerFirst(why)),
                        "choose a checkpoint `dir` this run can write, or make it writable");
}

// A checkpoint is written as a new folder, so that is what is tried: permissions, a
// read-only file system and a full inode table all show here rather than at the first save.
void checkWritable(const std::string& dir) {
  std::string probe = dir + "/.epl-probe-XXXXXX";
  if (!::mkdtemp(probe.data())) unwritable(dir, std::strerror(errno));
  ::rmdir(probe.c_str());
}

// "pid 1234 on host" from the lock file of the run that holds it.
std::string holderOf(int fd) {
  char text[512] = {};
  ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  long pid = 0;
  char host[256] = {};
  if (n > 0 && std::sscanf(text, "%ld %255s", &pid, host) == 2)
    return fmt::format("pid {} on {}", pid, host);
  return "its pid and host are not recorded yet";
}

std::string thisRun() {
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof host - 1);
  return fmt::format("{} {}\n", ::getpid(), host);
}

} // namespace

FolderLock::FolderLock(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) unwritable(dir, ec.message());
  checkWritable(dir);
  std::string path = dir + "/.epl-lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) unwritable(dir, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    std::string holder = holderOf(fd_);
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      throw CheckpointError(fmt::format("cannot lock `{}`: {}", path, errorText(err)));
    throw CheckpointError(fmt::format("`{}` is in use by another run ({})", dir, holder),
                          "wait for that run to end, or choose another checkpoint `dir`");
  }
  std::string me = thisRun();
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    unwritable(dir, std::strerror(errno));
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_); // closing the last descriptor drops the lock
}

} // namespace epl::checkpoint
