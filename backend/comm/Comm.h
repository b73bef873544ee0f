// The communication interface the interpreter runs on, beside a Device (DESIGN.md §2):
// which rank this is among how many, and the collectives and point-to-point transfers
// between ranks. Implementations: MPI (one process per rank, MpiComm.cpp) and in-process
// (one thread per rank, LocalComm.cpp: fast unit tests, and the one-rank communicator).
//
// Every operation starts at once and returns a Request; `wait` blocks until it finished.
// Communication progresses in the background between the start and the wait, so a rank
// can compute while its gradients travel. Rules, as in MPI:
//   - every rank starts the same collectives in the same order;
//   - a buffer passed to an operation stays valid and untouched until its wait returns;
//   - requests may be waited in any order; each is waited exactly once.
// Buffers are host memory (or device memory the host can address); the communicators of a
// GPU's ranks (makeDeviceComm in backend/Device.h) take its device memory too, and an
// operation they start on it reads it as the device's work queued before the start left
// it (ordered after the device's compute stream, not after a host synchronisation); what
// the device queues after the wait sees what the operation wrote.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace epl::backend {

// The element type a reduction travels in. Values are converted to it before they leave a
// rank and partial sums are rounded to it at every hop, as a real 16-bit reduction does;
// the result is converted back to f32. F16 multiplies by `scale` before converting and
// divides after, so small gradients do not underflow. Every rank gets the same bits.
enum class WireType { F32, BF16, F16 };
const char* wireTypeName(WireType w);

// A collective that failed, or did not finish within the communicator's timeout. The
// message names the rank and what waited (the caller's `what`).
class CommError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

namespace detail {
struct Pending; // the implementation's state of one started operation
}

// A started operation. Move-only; an empty Request is already complete.
class Request {
public:
  Request() = default;
  explicit Request(std::shared_ptr<detail::Pending> p) : pending_(std::move(p)) {}
  bool empty() const { return pending_ == nullptr; }
  detail::Pending* get() const { return pending_.get(); }
  void reset() { pending_.reset(); }

private:
  std::shared_ptr<detail::Pending> pending_;
};

class Comm {
public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0; // "mpi", "local"

  // Sums `count` floats over every rank, in place.
  virtual Request iallReduce(float* data, int64_t count, WireType wire = WireType::F32,
                             float scale = 1.f) = 0;
  // send holds size() blocks of recvCount floats; rank r receives the sum of block r.
  Request ireduceScatter(const float* send, float* recv, int64_t recvCount,
                         WireType wire = WireType::F32, float scale = 1.f);
  // The same with blocks of their own sizes: send holds size() blocks side by side, block r
  // of counts[r] floats (0 is allowed), and rank r receives the sum of block r into recv.
  // recv may be this rank's own block of send (in place: the other blocks of send may then
  // be overwritten with partial sums). Every rank passes the same counts.
  virtual Request ireduceScatterBlocks(const float* send, float* recv,
                                       const std::vector<int64_t>& counts,
                                       WireType wire = WireType::F32, float scale = 1.f) = 0;
  // recv gets every rank's `bytes` of send, in rank order (size() * bytes in all). send may
  // be this rank's own block of recv (in place).
  virtual Request iallGather(const void* send, void* recv, int64_t bytes) = 0;
  // root's `bytes` of data are copied into every rank's data.
  virtual Request ibroadcast(void* data, int64_t bytes, int root) = 0;
  // send and recv hold size() blocks of `bytes`: block r of send goes to rank r, and
  // block r of recv comes from rank r.
  virtual Request iallToAll(const void* send, void* recv, int64_t bytes) = 0;
  // Point to point; a send matches the recv of the same peer and tag, in order.
  virtual Request isend(const void* data, int64_t bytes, int peer, int tag) = 0;
  virtual Request irecv(void* data, int64_t bytes, int peer, int tag) = 0;
  virtual Request ibarrier() = 0;

  // A sub-communicator: the ranks that pass the same `color` (>= 0) form one, ranked by
  // `key`, ties by their rank here. Collective over this communicator: every rank calls it,
  // in the same order as its other collectives, and blocks until every rank did. The new
  // communicator starts with this one's timeout and must be destroyed before this one;
  // its collectives run beside those of other groups and of this communicator.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;

  // Blocks until `r` finished and empties it. Throws CommError when it takes longer than
  // timeout() (or the operation failed); `what` names the instruction that waited.
  virtual void wait(Request& r, const std::string& what) = 0;
  // Whether `r` has finished (it still needs its wait).
  virtual bool test(Request& r) = 0;

  // Seconds a wait may take before it throws; 0 waits forever.
  void setTimeout(double seconds) { timeout_ = seconds; }
  double timeout() const { return timeout_; }

  // Ends the whole job now: every rank of it exits with a non-zero code. For a rank that
  // cannot go on (an error, a timeout), after it printed why.
  [[noreturn]] virtual void abort(int code) = 0;

  // Blocking forms: start, then wait.
  void allReduce(float* data, int64_t count, const std::string& what, WireType wire = WireType::F32,
                 float scale = 1.f);
  void reduceScatter(const float* send, float* recv, int64_t recvCount, const std::string& what);
  void allGather(const void* send, void* recv, int64_t bytes, const std::string& what);
  void broadcast(void* data, int64_t bytes, int root, const std::string& what);
  void barrier(const std::string& what);

private:
  double timeout_ = 0;
};

// A communicator of one rank: every collective copies or is the identity.
std::unique_ptr<Comm> makeSelfComm();

// n communicators that talk to each other in this process, one per thread (rank i uses
// element i from its own thread).
std::vector<std::unique_ptr<Comm>> makeLocalComms(int n);

// Whether this process was started as a rank of an MPI job (mpirun's environment).
bool insideMpiJob();
// The communicator of the MPI job this process belongs to (MPI_COMM_WORLD); initialises MPI
// on first use and finalises it when the communicator is destroyed.
std::unique_ptr<Comm> makeMpiComm();

} // namespace epl::backend
