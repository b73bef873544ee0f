// Optimizer states that live in a file (`offload = optimizer`, `offload_to = disk`): one
// file per rank, removed from its directory as soon as it is open, so that nothing is left
// behind however the run ends. Or in host memory (`offload_to = cpu`, on a device whose
// memory is not the host's), streamed the same way. Each state k is one block of `bytesPerState`
// bytes, laid out as the in-memory states would be (starting at zero, like fresh states).
//
// The optimizer step streams them: the executor names the step's chunks in the order its
// optimizer ops update them, and a background thread reads each chunk into a staging
// buffer ahead of its use and writes it back behind (docs/architecture.md, "Memory
// policies"). Checkpoints and broadcasts read and write the file directly.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace epl::interp {

// The file could not be created, reserved, read or written; the message names its folder.
class OffloadError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

class OffloadedStates {
public:
  // One chunk of the step: `bytes` bytes at `offset` of every state.
  struct Chunk {
    int64_t offset = 0, bytes = 0;
  };
  // Creates the file in `dir` (throws OffloadError naming the directory when it
  // cannot). `staging[b]` are the kBuffers staging buffers (host-addressable memory), each
  // `states` blocks of `chunkBytes`.
  OffloadedStates(const std::string& dir, int states, int64_t bytesPerState,
                  std::vector<unsigned char*> staging, int64_t chunkBytes);
  // The states in host memory instead of a file (`offload_to = cpu` on a device whose memory
  // is not the host's): `memory`, states x bytesPerState bytes, zeroed, outliving this.
  OffloadedStates(unsigned char* memory, int states, int64_t bytesPerState,
                  std::vector<unsigned char*> staging, int64_t chunkBytes);
  ~OffloadedStates();
  OffloadedStates(const OffloadedStates&) = delete;
  OffloadedStates& operator=(const OffloadedStates&) = delete;

  const std::string& dir() const { return dir_; }
  int64_t chunkBytes() const { return chunkBytes_; }

  // Blocking reads and writes of state k (checkpoints, broadcasts). Not while a step
  // streams.
  void read(int k, int64_t offset, int64_t bytes, void* to) const;
  void write(int k, int64_t offset, int64_t bytes, const void* from);

  // The chunks every step streams, in order of use; each at most chunkBytes().
  void setChunks(std::vector<Chunk> chunks) { chunks_ = std::move(chunks); }
  const Chunk& chunk(size_t i) const { return chunks_[i]; }
  // Starts reading the step's first chunks.
  void beginStep();
  // Waits until chunk i (the next in order) is in memory; state k of it is at
  // stateOf(i, k) until release(i).
  void acquire(size_t i);
  unsigned char* stateOf(size_t i, int k) const {
    return staging_[i % staging_.size()] + k * chunkBytes_;
  }
  // Chunk i was updated: it is written back in the background.
  void release(size_t i);

  // The reads of the step's ZeRO-3 gathers with `offload = params`: `bytes` bytes at
  // `offset` of state `block` (the parameters' slice) each, in the order the gathers
  // start. The next is read ahead into `buffer`, before the chunks' reads: the gathers come
  // first in the step. Nothing writes the block until the optimizer updates it, after the
  // step's last gather.
  struct Part {
    int64_t offset = 0, bytes = 0;
  };
  void setParts(int block, std::vector<Part> parts, unsigned char* buffer);
  // Waits until part j (the next in order) is read; it is at the address returned until
  // releasePart(j), which reads part j + 1 into the buffer.
  const unsigned char* acquirePart(size_t j);
  void releasePart(size_t j);
  // Waits until every chunk of the step is written back. Rethrows a failed read or write.
  void endStep();

private:
  struct Job {
    bool write = false;
    size_t chunk = 0;
    bool part = false; // parts_[chunk] into its buffer
  };
  void enqueue(Job job);
  void work();
  void transfer(const Job& job);
  void rethrow();

  std::string dir_;
  int fd_ = -1;
  unsigned char* memory_ = nullptr; // the states in host memory, else in the file
  int states_ = 0;
  int64_t bytesPerState_ = 0;
  std::vector<unsigned char*> staging_;
  int64_t chunkBytes_ = 0;
  std::vector<Chunk> chunks_;
  int partBlock_ = 0;
  std::vector<Part> parts_;
  unsigned char* partBuffer_ = nullptr;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> jobs_, partJobs_; // the worker takes the parts' reads first
  size_t readsDone_ = 0;            // chunks of this step read so far (they are read in order)
  size_t partsDone_ = 0;            // and parts
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

} // namespace epl::interp
