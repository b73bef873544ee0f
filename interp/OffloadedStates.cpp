#include "interp/OffloadedStates.h"

#include "support/Assert.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace epl::interp {

namespace {

std::string reason(int error) {
  return std::strerror(error);
}

} // namespace

OffloadedStates::OffloadedStates(const std::string& dir, int states, int64_t bytesPerState,
                                 std::vector<unsigned char*> staging, int64_t chunkBytes)
    : dir_(dir), states_(states), bytesPerState_(bytesPerState), staging_(std::move(staging)),
      chunkBytes_(chunkBytes) {
  EPL_ASSERT(states_ > 0 && chunkBytes_ > 0 && chunkBytes_ % 4 == 0 && staging_.size() >= 3,
             "offloaded states need a chunk of each state in each of three staging buffers");
  std::string path = dir + "/epl-optimizer-states-XXXXXX";
  fd_ = mkstemp(path.data());
  if (fd_ < 0)
    throw OffloadError(fmt::format(
        "cannot create a file for the offloaded optimizer states in {}: {}", dir, reason(errno)));
  // Gone from the directory at once: the file lives as long as this process holds it.
  unlink(path.c_str());
  // The whole size now, so that a disk too small fails before the first step, not in one.
  int64_t total = states_ * bytesPerState_;
  if (int e = posix_fallocate(fd_, 0, total); e != 0) {
    close(fd_);
    fd_ = -1;
    throw OffloadError(
        fmt::format("cannot reserve {} bytes for the offloaded optimizer states in {}: {}", total,
                    dir, reason(e)));
  }
  worker_ = std::thread([this] { work(); });
}

OffloadedStates::OffloadedStates(unsigned char* memory, int states, int64_t bytesPerState,
                                 std::vector<unsigned char*> staging, int64_t chunkBytes)
    : dir_("host memory"), memory_(memory), states_(states), bytesPerState_(bytesPerState),
      staging_(std::move(staging)), chunkBytes_(chunkBytes) {
  EPL_ASSERT(memory_ && states_ > 0 && chunkBytes_ > 0 && chunkBytes_ % 4 == 0 &&
                 staging_.size() >= 3,
             "offloaded states need their memory and a chunk of each state in each of three "
             "staging buffers");
  worker_ = std::thread([this] { work(); });
}

OffloadedStates::~OffloadedStates() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (fd_ >= 0) close(fd_);
}

void OffloadedStates::read(int k, int64_t offset, int64_t bytes, void* to) const {
  EPL_ASSERT(k < states_ && offset >= 0 && offset + bytes <= bytesPerState_,
             "a read inside one offloaded state");
  auto* out = static_cast<unsigned char*>(to);
  int64_t at = k * bytesPerState_ + offset;
  if (memory_) {
    std::memcpy(out, memory_ + at, static_cast<size_t>(bytes));
    return;
  }
  while (bytes > 0) {
    ssize_t n = pread(fd_, out, static_cast<size_t>(bytes), at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw OffloadError(fmt::format("reading the offloaded optimizer states in {}: {}", dir_,
                                     n < 0 ? reason(errno) : std::string("the file ended early")));
    out += n;
    at += n;
    bytes -= n;
  }
}

void OffloadedStates::write(int k, int64_t offset, int64_t bytes, const void* from) {
  EPL_ASSERT(k < states_ && offset >= 0 && offset + bytes <= bytesPerState_,
             "a write inside one offloaded state");
  auto* in = static_cast<const unsigned char*>(from);
  int64_t at = k * bytesPerState_ + offset;
  if (memory_) {
    std::memcpy(memory_ + at, in, static_cast<size_t>(bytes));
    return;
  }
  while (bytes > 0) {
    ssize_t n = pwrite(fd_, in, static_cast<size_t>(bytes), at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw OffloadError(fmt::format("writing the offloaded optimizer states to {}: {}", dir_,
                                     n < 0 ? reason(errno) : "nothing was written"));
    in += n;
    at += n;
    bytes -= n;
  }
}

void OffloadedStates::beginStep() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    EPL_ASSERT(jobs_.empty() && partJobs_.empty() && !busy_,
               "the previous step's chunks were written back");
    readsDone_ = partsDone_ = 0;
  }
  if (!parts_.empty()) enqueue({false, 0, true});
  // Every buffer but the one the last chunk is written back from: read ahead.
  for (size_t i = 0; i + 1 < staging_.size() && i < chunks_.size(); ++i)
    enqueue({false, i});
}

void OffloadedStates::acquire(size_t i) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return readsDone_ > i || error_; });
  if (error_) rethrow();
}

void OffloadedStates::release(size_t i) {
  enqueue({true, i});
  // The buffer chunk i - 1 was written back from: its write is queued before this read.
  size_t ahead = i + staging_.size() - 1;
  if (ahead < chunks_.size()) enqueue({false, ahead});
}

void OffloadedStates::setParts(int block, std::vector<Part> parts, unsigned char* buffer) {
  EPL_ASSERT(block < states_, "the parameters' slice is a block of the file");
  partBlock_ = block;
  parts_ = std::move(parts);
  partBuffer_ = buffer;
}

const unsigned char* OffloadedStates::acquirePart(size_t j) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return partsDone_ > j || error_; });
  if (error_) rethrow();
  return partBuffer_;
}

void OffloadedStates::releasePart(size_t j) {
  if (j + 1 < parts_.size()) enqueue({false, j + 1, true});
}

void OffloadedStates::endStep() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return (jobs_.empty() && partJobs_.empty() && !busy_) || error_; });
  if (error_) rethrow();
}

void OffloadedStates::rethrow() {
  // The step failed: what was queued behind the failure is dropped with it.
  std::exception_ptr e = error_;
  jobs_.clear();
  partJobs_.clear();
  std::rethrow_exception(e);
}

void OffloadedStates::enqueue(Job job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    (job.part ? partJobs_ : jobs_).push_back(job);
  }
  changed_.notify_all();
}

void OffloadedStates::transfer(const Job& job) {
  if (job.part) {
    const Part& p = parts_[job.chunk];
    read(partBlock_, p.offset, p.bytes, partBuffer_);
    return;
  }
  const Chunk& c = chunks_[job.chunk];
  EPL_ASSERT(c.bytes <= chunkBytes_, "a chunk fits its staging buffer");
  for (int k = 0; k < states_; ++k) {
    if (job.write)
      write(k, c.offset, c.bytes, stateOf(job.chunk, k));
    else
      read(k, c.offset, c.bytes, stateOf(job.chunk, k));
  }
}

void OffloadedStates::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock,
                  [&] { return stop_ || ((!jobs_.empty() || !partJobs_.empty()) && !error_); });
    if (stop_) return;
    std::deque<Job>& queue = partJobs_.empty() ? jobs_ : partJobs_;
    Job job = queue.front();
    queue.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr failed;
    try {
      transfer(job);
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    if (failed)
      error_ = failed;
    else if (job.part)
      ++partsDone_;
    else if (!job.write)
      ++readsDone_;
    changed_.notify_all();
  }
}

} // namespace epl::interp
