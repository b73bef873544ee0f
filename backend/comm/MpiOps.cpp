// The MPI operations that are one MPI request each: point to point, and MPI's own
// nonblocking collectives (all-gather, broadcast, all-to-all, barrier); the check of MPI
// calls; the communication thread's scratch memory and byte datatypes.
#include "backend/comm/Mpi.h"

#include <climits>
#include <fmt/format.h>
#include <functional>

namespace epl::backend::mpi {

std::string errorText(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(text, static_cast<size_t>(length));
}

bool isTruncation(int rc) {
  int cls = 0;
  return MPI_Error_class(rc, &cls) == MPI_SUCCESS && cls == MPI_ERR_TRUNCATE;
}

void check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw CommError(
      fmt::format("{} failed on rank {} at {}:{}: {}", call, rank, file, line, errorText(rc)));
}

Scratch Context::takeScratch(size_t bytes) {
  // The smallest free buffer that is large enough, else a new one.
  size_t best = free_.size();
  for (size_t i = 0; i < free_.size(); ++i)
    if (free_[i].bytes >= bytes && (best == free_.size() || free_[i].bytes < free_[best].bytes))
      best = i;
  if (best == free_.size()) return {std::make_unique<unsigned char[]>(bytes), bytes};
  Scratch s = std::move(free_[best]);
  free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
  return s;
}

void Context::giveScratch(Scratch s) {
  if (s.data) free_.push_back(std::move(s));
}

std::pair<MPI_Datatype, int> Context::bytesType(int64_t bytes) {
  if (bytes <= INT_MAX) return {MPI_BYTE, static_cast<int>(bytes)};
  // Above 2 GiB: count in contiguous units of 2^k bytes (k <= 20).
  for (int64_t unit = int64_t(1) << 20; unit >= 2; unit /= 2) {
    if (bytes % unit != 0 || bytes / unit > INT_MAX) continue;
    auto it = units_.find(unit);
    if (it == units_.end()) {
      MPI_Datatype t;
      EPL_MPI(MPI_Type_contiguous(static_cast<int>(unit), MPI_BYTE, &t));
      EPL_MPI(MPI_Type_commit(&t));
      it = units_.emplace(unit, t).first;
    }
    return {it->second, static_cast<int>(bytes / unit)};
  }
  throw CommError(fmt::format("a message of {} bytes is too large for MPI: above 2 GiB its size "
                              "must be a multiple of 2^k bytes with fewer than 2^31 units "
                              "(k <= 20)",
                              bytes));
}

void Context::freeComms() {
  for (MPI_Comm* c : {&collectives, &ring, &pointToPoint})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

void Context::freeTypes() {
  for (auto& [unit, t] : units_)
    MPI_Type_free(&t);
  units_.clear();
}

namespace {

// An operation that is one MPI request: `post` starts it, MPI_Test finishes it. A recv
// checks that the message had the size it expected.
class RequestOp final : public Op {
public:
  using Post = std::function<void(Context&, MPI_Request*)>;
  RequestOp(const Comm* owner, std::string description, Post post, bool cancellable,
            int64_t expectedBytes = -1)
      : Op(owner, std::move(description)), post_(std::move(post)), cancellable_(cancellable),
        expectedBytes_(expectedBytes) {}

  void start(Context& c) override { post_(c, &request_); }

  bool progress(Context&) override {
    int flag = 0;
    MPI_Status status;
    int rc = MPI_Test(&request_, &flag, &status);
    if (rc != MPI_SUCCESS && isTruncation(rc))
      throw CommError(fmt::format("the matching message is longer than {} bytes", expectedBytes_));
    EPL_MPI(rc);
    if (!flag) return false;
    int cancelled = 0;
    MPI_Test_cancelled(&status, &cancelled);
    if (cancelled)
      finish("cancelled");
    else if (expectedBytes_ >= 0)
      checkReceived(status);
    else
      finish();
    return true;
  }

  bool cancellable() const override { return cancellable_; }
  void cancel(Context&) override {
    if (cancellable_ && request_ != MPI_REQUEST_NULL) EPL_MPI(MPI_Cancel(&request_));
  }

private:
  void checkReceived(const MPI_Status& status) {
    MPI_Count got = 0;
    EPL_MPI(MPI_Get_elements_x(&status, MPI_BYTE, &got));
    if (got == expectedBytes_) return finish();
    finish(fmt::format("the matching send had {} bytes, not {}", static_cast<int64_t>(got),
                       expectedBytes_));
  }

  Post post_;
  bool cancellable_;
  int64_t expectedBytes_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

std::string pointToPointText(const char* kind, int64_t bytes, const char* direction, int peer,
                             int tag) {
  return fmt::format("{} {} rank {} (tag {})", detail::describeBytes(kind, bytes), direction, peer,
                     tag);
}

} // namespace

std::shared_ptr<Op> makeSend(const Comm* owner, const void* data, int64_t bytes, int peer,
                             int tag) {
  auto post = [=](Context& c, MPI_Request* r) {
    auto [type, count] = c.bytesType(bytes);
    EPL_MPI(MPI_Isend(data, count, type, peer, tag, c.pointToPoint, r));
  };
  return std::make_shared<RequestOp>(owner, pointToPointText("send", bytes, "to", peer, tag), post,
                                     true);
}

std::shared_ptr<Op> makeRecv(const Comm* owner, void* data, int64_t bytes, int peer, int tag) {
  auto post = [=](Context& c, MPI_Request* r) {
    auto [type, count] = c.bytesType(bytes);
    EPL_MPI(MPI_Irecv(data, count, type, peer, tag, c.pointToPoint, r));
  };
  return std::make_shared<RequestOp>(owner, pointToPointText("recv", bytes, "from", peer, tag),
                                     post, true, bytes);
}

std::shared_ptr<Op> makeAllGather(const Comm* owner, const void* send, void* recv, int64_t bytes) {
  auto post = [=](Context& c, MPI_Request* r) {
    auto [type, count] = c.bytesType(bytes);
    // A rank's own block already in place must be passed as MPI_IN_PLACE (MPI forbids
    // aliased buffers).
    const void* own = static_cast<const char*>(recv) + bytes * c.rank;
    const void* from = send == own ? MPI_IN_PLACE : send;
    EPL_MPI(MPI_Iallgather(from, count, type, recv, count, type, c.collectives, r));
  };
  return std::make_shared<RequestOp>(
      owner, detail::describeBytes("all-gather", bytes * owner->size()), post, false);
}

std::shared_ptr<Op> makeBroadcast(const Comm* owner, void* data, int64_t bytes, int root) {
  auto post = [=](Context& c, MPI_Request* r) {
    auto [type, count] = c.bytesType(bytes);
    EPL_MPI(MPI_Ibcast(data, count, type, root, c.collectives, r));
  };
  return std::make_shared<RequestOp>(
      owner, fmt::format("{} from rank {}", detail::describeBytes("broadcast", bytes), root), post,
      false);
}

std::shared_ptr<Op> makeAllToAll(const Comm* owner, const void* send, void* recv, int64_t bytes) {
  auto post = [=](Context& c, MPI_Request* r) {
    auto [type, count] = c.bytesType(bytes);
    EPL_MPI(MPI_Ialltoall(send, count, type, recv, count, type, c.collectives, r));
  };
  return std::make_shared<RequestOp>(
      owner, detail::describeBytes("all-to-all", bytes * owner->size()), post, false);
}

std::shared_ptr<Op> makeBarrier(const Comm* owner) {
  auto post = [](Context& c, MPI_Request* r) { EPL_MPI(MPI_Ibarrier(c.collectives, r)); };
  return std::make_shared<RequestOp>(owner, "barrier", post, false);
}

} // namespace epl::backend::mpi
