// Ring reductions (all-reduce and reduce-scatter) on MPI point-to-point messages, driven by
// the communication thread. A ring rather than MPI_Iallreduce because (1) every element's
// full sum is computed on exactly one rank and then copied, so every rank gets the same
// bits whatever the wire type and MPI's choice of algorithm; (2) a 16-bit wire type rounds
// each partial sum, hop by hop; (3) it moves 2(p-1)/p of the data per rank, and is as fast
// as MPI_Allreduce on large buffers (bench/allreduce.cpp).
//
// Legend: p ranks, r this rank, k step, s segment, S segments per block, g = k*S + s a
// unit of work (one segment of one step), G units in all.
//
// The data splits into p blocks, each cut into S segments so that adding one segment
// overlaps the transfer of the next. Reduce-scatter runs p-1 steps: at step k a rank sends
// block r-k-1 to its right neighbour and receives block r-k-2 from its left one, adding its
// own contribution; after step p-2 it holds the full sum of block r. All-reduce then runs
// p-1 all-gather steps: at step j it sends block r-j and receives block r-j-1 (mod p).
// Sends and receives are posted in unit order with one tag per reduction, so MPI's
// in-order matching pairs them.
#include "backend/comm/Mpi.h"
#include "backend/comm/Wire.h"

#include "support/RingScratch.h"

#include <algorithm>
#include <cstring>
#include <fmt/format.h>

namespace epl::backend::mpi {

namespace {

// Segments of 1 MiB (support/RingScratch.h, which the memory plan counts too): small
// enough that a received segment is added while it is still in cache, large enough that
// per-message costs do not show (256 KiB to 2 MiB measured within noise of each other on 2
// ranks; 4 MiB and unsegmented blocks were slower).
using ring::kWindow;         // receive buffers of reduce steps in flight
constexpr int kTags = 32768; // MPI guarantees tags up to 32767

class RingOp final : public Op {
public:
  // Block b is elements [starts[b], starts[b + 1]) of the data (size + 1 starts).
  RingOp(const Comm* owner, std::string description, bool allReduce, const float* in, float* out,
         std::vector<int64_t> starts, WireType w, float scale)
      : Op(owner, std::move(description)), allReduce_(allReduce), in_(in), out_(out),
        starts_(std::move(starts)), wire_(w), scale_(scale) {}

  void start(Context& c) override;
  bool progress(Context& c) override;

private:
  struct Segment {
    int64_t offset, length; // elements
  };

  int mod(int64_t x) const { return static_cast<int>(((x % p_) + p_) % p_); }
  int64_t blockStart(int b) const { return starts_[b]; }
  Segment segment(int block, int64_t s) const;
  bool reduceStep(int64_t k) const { return k < p_ - 1; }
  int recvBlock(int64_t k) const {
    return reduceStep(k) ? mod(r_ - k - 2) : mod(r_ - (k - p_ + 1) - 1);
  }
  int sendBlock(int64_t k) const {
    return reduceStep(k) ? mod(r_ - k - 1) : mod(r_ - (k - p_ + 1));
  }
  unsigned char* slot(int64_t g) const {
    return scratchR_.data.get() + static_cast<size_t>((g % kWindow) * segElems_) * eb_;
  }

  bool canPostRecv(int64_t g) const;
  bool canSend(int64_t g) const;
  void postRecv(Context& c, int64_t g);
  void postSend(Context& c, int64_t g);
  bool testRecv(int64_t g);
  bool testSend(int64_t g);
  void complete(Context& c);

  // What the caller asked for.
  bool allReduce_;
  const float* in_;
  float* out_;
  std::vector<int64_t> starts_;
  WireType wire_;
  float scale_;

  // The plan, set by start.
  int p_ = 1, r_ = 0, tag_ = 0;
  size_t eb_ = 4; // bytes per element on the wire
  MPI_Datatype type_ = MPI_FLOAT;
  int64_t segElems_ = 0, S_ = 0, G_ = 0;
  const unsigned char* own_ = nullptr; // this rank's contributions, in the wire type
  unsigned char* acc_ = nullptr;       // partial and full sums, in the wire type
  Scratch scratchAcc_, scratchR_;
  std::vector<MPI_Request> recvs_, sends_;
  int64_t posted_ = 0, handled_ = 0, sent_ = 0, sendsDone_ = 0; // units, in order
};

RingOp::Segment RingOp::segment(int block, int64_t s) const {
  int64_t end = blockStart(block + 1);
  int64_t offset = std::min(end, blockStart(block) + s * segElems_);
  return {offset, std::min(end, offset + segElems_) - offset};
}

// Steps: 1. one rank: nothing travels (a reduce-scatter copies); 2. choose segments;
// 3. put this rank's contributions in the wire type (in place for f32 all-reduce);
// 4. post what can be posted.
void RingOp::start(Context& c) {
  p_ = c.size;
  r_ = c.rank;
  tag_ = c.nextRingTag;
  c.nextRingTag = (c.nextRingTag + 1) % kTags;
  int64_t total = starts_.back();
  if (p_ == 1 || total == 0) {
    if (!allReduce_ && out_ != in_) std::memmove(out_, in_, static_cast<size_t>(total) * 4);
    return finish();
  }
  eb_ = wire::elementBytes(wire_);
  type_ = wire_ == WireType::F32 ? MPI_FLOAT : MPI_UINT16_T;
  int64_t largestBlock = 1;
  for (int b = 0; b < p_; ++b)
    largestBlock = std::max(largestBlock, blockStart(b + 1) - blockStart(b));
  segElems_ = ring::segmentElements(largestBlock, static_cast<int64_t>(eb_));
  S_ = (largestBlock + segElems_ - 1) / segElems_;
  G_ = (allReduce_ ? 2 : 1) * (p_ - 1) * S_;

  // f32 sums in place: an all-reduce's, and a reduce-scatter's received into this rank's
  // own block of its input (Comm::ireduceScatterBlocks lets it overwrite the rest).
  bool inPlace = allReduce_ || out_ == in_ + blockStart(r_);
  if (wire_ == WireType::F32 && inPlace) {
    acc_ = reinterpret_cast<unsigned char*>(const_cast<float*>(in_));
    own_ = acc_;
  } else {
    scratchAcc_ = c.takeScratch(static_cast<size_t>(total) * eb_);
    acc_ = scratchAcc_.data.get();
    own_ = acc_;
    if (wire_ == WireType::F32)
      own_ = reinterpret_cast<const unsigned char*>(in_); // reduce-scatter reads its input
    else
      wire::encode(wire_, in_, acc_, total, scale_);
  }
  scratchR_ = c.takeScratch(static_cast<size_t>(kWindow * segElems_) * eb_);
  recvs_.assign(static_cast<size_t>(G_), MPI_REQUEST_NULL);
  sends_.assign(static_cast<size_t>(G_), MPI_REQUEST_NULL);
  progress(c);
}

// A reduce step receives into a window slot, free once the unit kWindow earlier was added.
// An all-gather step receives straight into the sums, over the segment this rank sent at
// reduce step j, so that send must have completed.
bool RingOp::canPostRecv(int64_t g) const {
  if (reduceStep(g / S_)) return g < kWindow || handled_ > g - kWindow;
  return sendsDone_ > g - (p_ - 1) * S_;
}

// Step 0 sends this rank's own contributions; step k > 0 sends the segment received (and
// added to) at step k-1.
bool RingOp::canSend(int64_t g) const {
  return g < S_ || handled_ > g - S_;
}

void RingOp::postRecv(Context& c, int64_t g) {
  int64_t k = g / S_;
  Segment seg = segment(recvBlock(k), g % S_);
  void* into = reduceStep(k) ? slot(g) : acc_ + seg.offset * eb_;
  EPL_MPI(
      MPI_Irecv(into, static_cast<int>(seg.length), type_, mod(r_ - 1), tag_, c.ring, &recvs_[g]));
}

void RingOp::postSend(Context& c, int64_t g) {
  int64_t k = g / S_;
  Segment seg = segment(sendBlock(k), g % S_);
  const unsigned char* from = (k == 0 ? own_ : acc_) + seg.offset * eb_;
  EPL_MPI(
      MPI_Isend(from, static_cast<int>(seg.length), type_, mod(r_ + 1), tag_, c.ring, &sends_[g]));
}

// Whether unit g's message arrived; on a reduce step, adds this rank's contribution.
bool RingOp::testRecv(int64_t g) {
  int flag = 0;
  MPI_Status status;
  int rc = MPI_Test(&recvs_[g], &flag, &status);
  if (rc != MPI_SUCCESS && isTruncation(rc))
    throw CommError("ranks disagree on the size of the reduction (a message was too long)");
  EPL_MPI(rc);
  if (!flag) return false;
  int64_t k = g / S_;
  Segment seg = segment(recvBlock(k), g % S_);
  int got = 0;
  EPL_MPI(MPI_Get_count(&status, type_, &got));
  if (got != seg.length)
    throw CommError("ranks disagree on the size of the reduction (a message was too short)");
  if (reduceStep(k)) {
    size_t at = static_cast<size_t>(seg.offset) * eb_;
    wire::add(wire_, acc_ + at, own_ + at, slot(g), seg.length);
  }
  return true;
}

bool RingOp::testSend(int64_t g) {
  int flag = 0;
  EPL_MPI(MPI_Test(&sends_[g], &flag, MPI_STATUS_IGNORE));
  return flag != 0;
}

// Each pass posts sends before receives: a receive may match a message that already
// arrived and copy it at once (the copy runs inside MPI_Irecv or MPI_Test), and the
// neighbour should not wait for this rank's send during that copy.
bool RingOp::progress(Context& c) {
  bool moved = false, again;
  do {
    again = false;
    for (; sent_ < G_ && canSend(sent_); again = true)
      postSend(c, sent_++);
    for (; posted_ < G_ && canPostRecv(posted_); again = true)
      postRecv(c, posted_++);
    for (; handled_ < posted_ && testRecv(handled_); again = true)
      ++handled_;
    for (; sendsDone_ < sent_ && testSend(sendsDone_); again = true)
      ++sendsDone_;
    moved |= again;
  } while (again);
  if (handled_ == G_ && sendsDone_ == G_ && !finished()) complete(c);
  return moved;
}

// The sums are final: every rank holds the same bits; convert them back to f32.
void RingOp::complete(Context& c) {
  if (allReduce_)
    wire::decode(wire_, acc_, out_, starts_.back(), scale_);
  else
    wire::decode(wire_, acc_ + blockStart(r_) * eb_, out_, blockStart(r_ + 1) - blockStart(r_),
                 scale_);
  c.giveScratch(std::move(scratchAcc_));
  c.giveScratch(std::move(scratchR_));
  finish();
}

} // namespace

std::shared_ptr<Op> makeRingAllReduce(const Comm* owner, float* data, int64_t count, WireType w,
                                      float scale) {
  int p = owner->size();
  std::vector<int64_t> starts(p + 1);
  for (int b = 0; b <= p; ++b)
    starts[b] = count * b / p;
  return std::make_shared<RingOp>(owner, detail::describeReduction("all-reduce", count, w), true,
                                  data, data, std::move(starts), w, scale);
}

std::shared_ptr<Op> makeRingReduceScatter(const Comm* owner, const float* send, float* recv,
                                          const std::vector<int64_t>& counts, WireType w,
                                          float scale) {
  std::vector<int64_t> starts(counts.size() + 1, 0);
  for (size_t b = 0; b < counts.size(); ++b)
    starts[b + 1] = starts[b] + counts[b];
  return std::make_shared<RingOp>(owner,
                                  detail::describeReduction("reduce-scatter", starts.back(), w),
                                  false, send, recv, std::move(starts), w, scale);
}

} // namespace epl::backend::mpi
