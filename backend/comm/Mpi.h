// The MPI side of MpiComm, private to backend/comm: the check every MPI call goes through,
// the state the communication thread owns (Context), and the operations it drives (Op).
// After MpiComm's constructor, only the communication thread calls MPI (and abort).
#pragma once
#include "backend/comm/Pending.h"

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <mpi.h>
#include <utility>
#include <vector>

// Checks an MPI call: a failure throws CommError naming the call, file:line and the rank.
#define EPL_MPI(call) ::epl::backend::mpi::check((call), #call, __FILE__, __LINE__)

namespace epl::backend::mpi {

void check(int rc, const char* call, const char* file, int line);
// MPI's name and text for an error code: "MPI_ERR_TRUNCATE: message truncated".
std::string errorText(int rc);
bool isTruncation(int rc);

// A block of scratch memory the communication thread reuses between operations: a fresh
// buffer of megabytes would cost a page fault per 4 KiB every time.
struct Scratch {
  std::unique_ptr<unsigned char[]> data;
  size_t bytes = 0;
};

// What the communication thread owns for one communicator (the world, or one split from
// it): its MPI communicators, scratch memory and datatypes.
struct Context {
  MPI_Comm collectives = MPI_COMM_NULL;  // MPI's own nonblocking collectives
  MPI_Comm ring = MPI_COMM_NULL;         // the messages of the ring reductions (MpiRing.cpp)
  MPI_Comm pointToPoint = MPI_COMM_NULL; // isend / irecv
  int rank = 0;
  int size = 1;
  int nextRingTag = 0; // ring reductions, numbered in start order (the same on every rank)
  int inFlight = 0;    // its operations posted and not yet finished (the thread's count)

  // MPI_Comm_free of the three communicators.
  void freeComms();

  // Scratch of at least `bytes`, and its return once no MPI call uses it any more.
  Scratch takeScratch(size_t bytes);
  void giveScratch(Scratch s);

  // MPI counts are ints: a datatype and count covering `bytes` contiguous bytes.
  std::pair<MPI_Datatype, int> bytesType(int64_t bytes);
  // Frees the datatypes bytesType made; the communication thread calls it last.
  void freeTypes();

private:
  std::vector<Scratch> free_;
  std::map<int64_t, MPI_Datatype> units_; // contiguous types of 2^k bytes
};

// One started operation as the communication thread sees it; every call runs on that thread.
struct Op : detail::Pending, std::enable_shared_from_this<Op> {
  using Pending::Pending;
  // The communicator's state it runs in, set when it is submitted; the thread passes it to
  // start, progress and cancel.
  std::shared_ptr<Context> context;
  // A caller waits for it (set by the caller): the thread polls without sleeping until it
  // finishes.
  std::atomic<bool> waited{false};
  // Posts the operation; called once per operation, in the order they were started.
  virtual void start(Context& c) = 0;
  // Drives it without blocking; returns whether anything moved. Calls finish() when done.
  virtual bool progress(Context& c) = 0;
  // Whether MPI can cancel it (a send or recv). A collective cannot be: once a wait gave
  // up on one, or it failed, the communicator stops (MpiComm.cpp).
  virtual bool cancellable() const { return false; }
  // A wait gave up on it: asks MPI to cancel it. It still finishes (cancelled, or done
  // after all) through progress().
  virtual void cancel(Context&) {}
};

// Point to point on Context::pointToPoint.
std::shared_ptr<Op> makeSend(const Comm* owner, const void* data, int64_t bytes, int peer, int tag);
std::shared_ptr<Op> makeRecv(const Comm* owner, void* data, int64_t bytes, int peer, int tag);
// MPI's nonblocking collectives on Context::collectives, on bytes.
std::shared_ptr<Op> makeAllGather(const Comm* owner, const void* send, void* recv, int64_t bytes);
std::shared_ptr<Op> makeBroadcast(const Comm* owner, void* data, int64_t bytes, int root);
std::shared_ptr<Op> makeAllToAll(const Comm* owner, const void* send, void* recv, int64_t bytes);
std::shared_ptr<Op> makeBarrier(const Comm* owner);

// Ring reductions over point-to-point messages (MpiRing.cpp): all-reduce in place of
// `count` floats, or reduce-scatter of size blocks of counts[r] floats.
std::shared_ptr<Op> makeRingAllReduce(const Comm* owner, float* data, int64_t count, WireType w,
                                      float scale);
std::shared_ptr<Op> makeRingReduceScatter(const Comm* owner, const float* send, float* recv,
                                          const std::vector<int64_t>& counts, WireType w,
                                          float scale);

} // namespace epl::backend::mpi
