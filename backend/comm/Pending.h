// The state of one started operation, shared by the Request its starter holds and the
// communicator that completes it, and the wait every implementation does on it. Private to
// backend/comm.
#pragma once
#include "backend/comm/Comm.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace epl::backend::detail {

struct Pending {
  Pending(const Comm* owner, std::string description)
      : owner(owner), description(std::move(description)) {}
  virtual ~Pending() = default;
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;

  const Comm* const owner;       // the communicator that started it
  const std::string description; // "all-reduce of 1,024 floats", for messages

  // Marks it finished (empty error) or failed, and wakes its waiter. Only the first call
  // counts.
  void finish(std::string error = {});
  bool finished() const { return done_.load(std::memory_order_acquire); }
  // Blocks until finished or until `seconds` passed (0: no limit); returns finished().
  bool waitFor(double seconds);
  // Why it failed; empty when it succeeded. Read it once finished().
  const std::string& error() const { return error_; }

private:
  std::atomic<bool> done_{false};
  std::string error_;
  std::mutex m_;
  std::condition_variable cv_;
};

// Comm::wait for every implementation: waits up to comm.timeout(), empties `r`, and throws
// CommError when the operation failed or took too long. On a timeout it first calls
// `giveUp`, which cancels or abandons the operation and returns false when it turned out
// to have finished after all (then the wait succeeds).
void waitRequest(const Comm& comm, Request& r, const std::string& what,
                 const std::function<bool(Pending&)>& giveUp);

// What an operation is, for messages: "all-reduce of 1,024 floats as bf16".
std::string describeReduction(const char* kind, int64_t count, WireType w);
std::string describeBytes(const char* kind, int64_t bytes);

// Throws CommError for a misuse the starting call can see: "rank 0: send to rank 5, but the
// communicator has 2 ranks".
[[noreturn]] void misuse(const Comm& comm, const std::string& message);
void checkPeer(const Comm& comm, int peer, const char* role);
void checkSize(const Comm& comm, int64_t n, const char* what);
// Whether [inner, inner + innerBytes) lies inside [outer, outer + outerBytes): a buffer of an
// operation in place, which a communicator that copies buffers keeps in one copy.
inline bool liesWithin(const void* inner, int64_t innerBytes, const void* outer,
                       int64_t outerBytes) {
  auto i = reinterpret_cast<uintptr_t>(inner), o = reinterpret_cast<uintptr_t>(outer);
  return inner && outer && i >= o &&
         i + static_cast<uintptr_t>(innerBytes) <= o + static_cast<uintptr_t>(outerBytes);
}

// An f16 reduction's scale must be positive and finite.
void checkScale(const Comm& comm, WireType wire, float scale);
// A reduce-scatter's block sizes: one per rank, none negative. Returns their sum.
int64_t checkBlocks(const Comm& comm, const std::vector<int64_t>& counts);

} // namespace epl::backend::detail
