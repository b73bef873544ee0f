// The communication interface the interpreter runs on, beside a Device: which rank this
// is among how many, and the collectives. Only the one-rank communicator exists so far;
// the MPI one (all-reduce, reduce-scatter, all-gather, broadcast, all-to-all, send/recv,
// non-blocking variants) comes with multi-rank streams.
#pragma once
#include <memory>

namespace epl::backend {

class Comm {
public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums `count` floats (in host or device memory the device can reach) over every rank,
  // in place.
  virtual void allReduceSum(float* data, long count) = 0;
  virtual void barrier() = 0;
};

// A communicator of one rank: every collective is the identity.
std::unique_ptr<Comm> makeSelfComm();

} // namespace epl::backend
