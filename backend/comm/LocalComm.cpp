// In-process communicators: n ranks in one process, rank i driven from its own thread (fast
// unit tests), and the one-rank communicator. The last rank to start a collective computes
// it for every rank, so all of them read the same result; point-to-point transfers match
// in order per (sender, receiver, tag), as in MPI.
#include "backend/comm/Pending.h"
#include "backend/comm/Wire.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fmt/format.h>
#include <map>
#include <mutex>
#include <tuple>

namespace epl::backend {

namespace {

enum class Kind { AllReduce, ReduceScatter, AllGather, Broadcast, AllToAll, Barrier };

// What every rank must agree on for a collective to match.
struct Signature {
  Kind kind = Kind::Barrier;
  int64_t size = 0; // floats for reductions (all blocks for reduce-scatter), else bytes
  int root = 0;
  WireType wire = WireType::F32;
  float scale = 1.f;
  std::vector<int64_t> counts = {}; // reduce-scatter: floats of each rank's block

  // Scale matters to f16 only: other wire types ignore it, so ranks need not agree on it.
  float effectiveScale() const { return wire == WireType::F16 ? scale : 1.f; }
  bool operator==(const Signature& o) const {
    return kind == o.kind && size == o.size && root == o.root && wire == o.wire &&
           effectiveScale() == o.effectiveScale() && counts == o.counts;
  }
};

using Key = std::tuple<int, int, int>; // sender, receiver, tag

struct LocalOp : detail::Pending {
  LocalOp(const Comm* owner, std::string description) : Pending(owner, std::move(description)) {}
  bool collective = false;
  uint64_t sequence = 0; // of a collective: the how-many-th this rank started
  Key key{};             // of a send or recv
  bool isSend = false;
};

// One rank's part in a collective.
struct Part {
  const void* send = nullptr;
  void* recv = nullptr;
  std::shared_ptr<LocalOp> op;
};

struct Collective {
  Signature signature;
  std::string description; // as the first rank to start it described it
  int firstRank = 0;
  std::vector<Part> parts; // by rank; op is null until that rank started it
  int arrived = 0;
  std::string failure; // once set, the collective failed; later ranks get this error
};

struct Message {
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t bytes = 0;
  std::shared_ptr<LocalOp> op;
};

struct Group;

// A group that split() is making: the first member to get there creates it, the last one
// to take it removes the entry.
struct Forming {
  std::shared_ptr<Group> group;
  size_t pending = 0; // members that have not taken it yet
};

// What the n communicators of one makeLocalComms call (or one split) share.
struct Group {
  explicit Group(int n) : n(n), nextSequence(n, 0) {}
  const int n;
  std::mutex m;
  std::vector<uint64_t> nextSequence;                 // per rank: its next collective
  std::map<uint64_t, Collective> collectives;         // started by some rank, not yet by all
  std::map<Key, std::deque<Message>> sends, recvs;    // not yet matched, in start order
  std::map<std::pair<uint64_t, int>, Forming> splits; // by (split number, color)
};

// Sums the float buffers `in[r] + offset` over ranks in rank order, rounding every partial
// sum to the wire type, into `out`.
void reduceRanks(const std::vector<Part>& parts, int64_t offset, int64_t count, WireType w,
                 float scale, float* out) {
  size_t bytes = static_cast<size_t>(count) * wire::elementBytes(w);
  std::vector<unsigned char> acc(bytes), next(bytes);
  auto input = [&](size_t r) { return static_cast<const float*>(parts[r].send) + offset; };
  wire::encode(w, input(0), acc.data(), count, scale);
  for (size_t r = 1; r < parts.size(); ++r) {
    wire::encode(w, input(r), next.data(), count, scale);
    wire::add(w, acc.data(), acc.data(), next.data(), count);
  }
  wire::decode(w, acc.data(), out, count, scale);
}

// Runs a collective every rank started; the parts' buffers are all valid.
void compute(const Signature& s, std::vector<Part>& parts) {
  const size_t n = parts.size();
  const size_t size = static_cast<size_t>(s.size); // floats or bytes, as the kind says
  if (size == 0) return; // (buffers may be null; a barrier has size 0 too)
  auto at = [](const void* p, size_t offset) { return static_cast<const char*>(p) + offset; };
  auto to = [](void* p, size_t offset) { return static_cast<char*>(p) + offset; };
  switch (s.kind) {
  case Kind::AllReduce: {
    if (n == 1) return; // nothing travels, so nothing is rounded
    std::vector<float> sum(size);
    reduceRanks(parts, 0, s.size, s.wire, s.scale, sum.data());
    for (Part& p : parts)
      std::memcpy(p.recv, sum.data(), size * 4);
    return;
  }
  case Kind::ReduceScatter: {
    if (n == 1) {
      std::memmove(parts[0].recv, parts[0].send, size * 4);
      return;
    }
    int64_t offset = 0;
    for (size_t b = 0; b < n; offset += s.counts[b++])
      if (s.counts[b] > 0)
        reduceRanks(parts, offset, s.counts[b], s.wire, s.scale,
                    static_cast<float*>(parts[b].recv));
    return;
  }
  case Kind::AllGather:
    for (size_t q = 0; q < n; ++q)
      for (size_t r = 0; r < n; ++r)
        std::memmove(to(parts[q].recv, r * size), parts[r].send, size);
    return;
  case Kind::Broadcast:
    for (size_t q = 0; q < n; ++q)
      if (q != static_cast<size_t>(s.root)) std::memcpy(parts[q].recv, parts[s.root].recv, size);
    return;
  case Kind::AllToAll:
    for (size_t q = 0; q < n; ++q)
      for (size_t r = 0; r < n; ++r)
        std::memcpy(to(parts[q].recv, r * size), at(parts[r].send, q * size), size);
    return;
  case Kind::Barrier:
    return;
  }
}

void failArrived(Collective& c, const std::string& error) {
  c.failure = error;
  for (Part& p : c.parts) {
    if (p.op) p.op->finish(error);
    p.send = nullptr;
    p.recv = nullptr;
  }
}

class LocalComm final : public Comm {
public:
  LocalComm(std::shared_ptr<Group> group, int rank, std::string name)
      : group_(std::move(group)), rank_(rank), name_(std::move(name)) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->n; }
  std::string name() const override { return name_; }

  Request iallReduce(float* data, int64_t count, WireType wire, float scale) override {
    detail::checkSize(*this, count, "count");
    checkScale(wire, scale);
    return collective({Kind::AllReduce, count, 0, wire, scale}, data, data,
                      detail::describeReduction("all-reduce", count, wire));
  }

  Request ireduceScatterBlocks(const float* send, float* recv, const std::vector<int64_t>& counts,
                               WireType wire, float scale) override {
    int64_t total = detail::checkBlocks(*this, counts);
    checkScale(wire, scale);
    return collective({Kind::ReduceScatter, total, 0, wire, scale, counts}, send, recv,
                      detail::describeReduction("reduce-scatter", total, wire));
  }

  Request iallGather(const void* send, void* recv, int64_t bytes) override {
    detail::checkSize(*this, bytes, "byte count");
    return collective({Kind::AllGather, bytes}, send, recv,
                      detail::describeBytes("all-gather", bytes * size()));
  }

  Request ibroadcast(void* data, int64_t bytes, int root) override {
    detail::checkSize(*this, bytes, "byte count");
    detail::checkPeer(*this, root, "broadcast from");
    return collective(
        {Kind::Broadcast, bytes, root}, data, data,
        fmt::format("{} from rank {}", detail::describeBytes("broadcast", bytes), root));
  }

  Request iallToAll(const void* send, void* recv, int64_t bytes) override {
    detail::checkSize(*this, bytes, "byte count");
    if (send == recv && bytes > 0 && size() > 1)
      detail::misuse(*this, "all-to-all needs separate send and recv buffers");
    return collective({Kind::AllToAll, bytes}, send, recv,
                      detail::describeBytes("all-to-all", bytes * size()));
  }

  Request ibarrier() override { return collective({Kind::Barrier}, nullptr, nullptr, "barrier"); }

  Request isend(const void* data, int64_t bytes, int peer, int tag) override {
    return pointToPoint(true, const_cast<void*>(data), bytes, peer, tag);
  }

  Request irecv(void* data, int64_t bytes, int peer, int tag) override {
    return pointToPoint(false, data, bytes, peer, tag);
  }

  void wait(Request& r, const std::string& what) override {
    detail::waitRequest(*this, r, what,
                        [&](detail::Pending& p) { return giveUp(static_cast<LocalOp&>(p)); });
  }

  bool test(Request& r) override {
    if (r.empty()) return true;
    if (r.get()->owner != this)
      detail::misuse(
          *this, fmt::format("test of a {} started by another communicator", r.get()->description));
    return r.get()->finished();
  }

  std::unique_ptr<Comm> split(int color, int key) override;

  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code != 0 ? code : 1);
  }

private:
  void checkScale(WireType wire, float scale) const { detail::checkScale(*this, wire, scale); }

  Request collective(const Signature& s, const void* send, void* recv, std::string description);
  Request pointToPoint(bool isSend, void* data, int64_t bytes, int peer, int tag);
  bool giveUp(LocalOp& op);

  std::shared_ptr<Group> group_;
  int rank_;
  std::string name_;
  uint64_t splits_ = 0; // split() calls so far: the same count on every rank
};

// Steps: 1. all-gather every rank's (color, key); 2. the members of this rank's color,
// ordered by key, then rank; 3. the first member to get here creates their Group, keyed
// by this split's number and the color, and the others join it.
std::unique_ptr<Comm> LocalComm::split(int color, int key) {
  if (color < 0) detail::misuse(*this, fmt::format("split with negative color {}", color));
  int mine[2] = {color, key};
  std::vector<int> all(2 * static_cast<size_t>(size()));
  allGather(mine, all.data(), sizeof mine, fmt::format("split into color {}", color));
  std::vector<int> members;
  for (int r = 0; r < size(); ++r)
    if (all[2 * r] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  int rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  std::shared_ptr<Group> group;
  {
    std::lock_guard<std::mutex> lock(group_->m);
    auto id = std::make_pair(splits_++, color);
    Forming& f = group_->splits[id];
    if (!f.group) f = {std::make_shared<Group>(static_cast<int>(members.size())), members.size()};
    group = f.group;
    if (--f.pending == 0) group_->splits.erase(id);
  }
  auto comm = std::make_unique<LocalComm>(std::move(group), rank, name_);
  comm->setTimeout(timeout());
  return comm;
}

// Steps: 1. join the collective of this rank's next sequence number (the first rank to
// start it creates it); 2. a rank whose signature differs fails it for everyone; 3. the
// last rank to join computes it and finishes every rank's request.
Request LocalComm::collective(const Signature& s, const void* send, void* recv,
                              std::string description) {
  auto op = std::make_shared<LocalOp>(this, std::move(description));
  op->collective = true;
  std::lock_guard<std::mutex> lock(group_->m);
  Group& g = *group_;
  op->sequence = g.nextSequence[rank_]++;
  auto [it, created] = g.collectives.try_emplace(op->sequence);
  Collective& c = it->second;
  if (created) {
    c.signature = s;
    c.description = op->description;
    c.firstRank = rank_;
    c.parts.resize(g.n);
  }
  c.parts[rank_] = {send, recv, op};
  ++c.arrived;
  if (!c.failure.empty()) {
    op->finish(c.failure);
  } else if (!(s == c.signature)) {
    // Lower rank first, so that every rank reads the same message.
    bool firstIsLower = c.firstRank < rank_;
    failArrived(c, fmt::format("ranks disagree: rank {} started {}, rank {} started {}",
                               firstIsLower ? c.firstRank : rank_,
                               firstIsLower ? c.description : op->description,
                               firstIsLower ? rank_ : c.firstRank,
                               firstIsLower ? op->description : c.description));
  } else if (c.arrived == g.n) {
    compute(s, c.parts);
    for (Part& p : c.parts)
      p.op->finish();
  }
  if (c.arrived == g.n) g.collectives.erase(it);
  return Request(op);
}

// Matches the oldest opposite operation of the same (sender, receiver, tag), or queues.
Request LocalComm::pointToPoint(bool isSend, void* data, int64_t bytes, int peer, int tag) {
  detail::checkSize(*this, bytes, "byte count");
  detail::checkPeer(*this, peer, isSend ? "send to" : "recv from");
  if (tag < 0) detail::misuse(*this, fmt::format("negative tag {}", tag));
  std::string description =
      fmt::format("{} {} rank {} (tag {})", detail::describeBytes(isSend ? "send" : "recv", bytes),
                  isSend ? "to" : "from", peer, tag);
  auto op = std::make_shared<LocalOp>(this, std::move(description));
  op->key = isSend ? Key{rank_, peer, tag} : Key{peer, rank_, tag};
  op->isSend = isSend;
  Message mine{isSend ? data : nullptr, isSend ? nullptr : data, bytes, op};

  std::lock_guard<std::mutex> lock(group_->m);
  auto& waiting = isSend ? group_->recvs[op->key] : group_->sends[op->key];
  if (waiting.empty()) {
    (isSend ? group_->sends : group_->recvs)[op->key].push_back(std::move(mine));
    return Request(op);
  }
  Message other = std::move(waiting.front());
  waiting.pop_front();
  const Message& send = isSend ? mine : other;
  const Message& recv = isSend ? other : mine;
  if (send.bytes != recv.bytes) {
    std::string error =
        fmt::format("a send of {} bytes met a recv of {} bytes (rank {} to rank "
                    "{}, tag {})",
                    send.bytes, recv.bytes, std::get<0>(op->key), std::get<1>(op->key), tag);
    send.op->finish(error);
    recv.op->finish(error);
  } else {
    if (send.bytes > 0) std::memcpy(recv.recv, send.send, static_cast<size_t>(send.bytes));
    send.op->finish();
    recv.op->finish();
  }
  return Request(op);
}

// A wait on `op` timed out: withdraw it so that no other rank touches its buffers again,
// and fail the other ranks' part of a collective (they would wait for this rank forever).
bool LocalComm::giveUp(LocalOp& op) {
  std::lock_guard<std::mutex> lock(group_->m);
  if (op.finished()) return false;
  std::string error = fmt::format("rank {} gave up waiting for it after {:g} s", rank_, timeout());
  if (op.collective) {
    auto it = group_->collectives.find(op.sequence);
    if (it != group_->collectives.end()) failArrived(it->second, error);
  } else {
    auto& queue = (op.isSend ? group_->sends : group_->recvs)[op.key];
    for (auto it = queue.begin(); it != queue.end(); ++it)
      if (it->op.get() == &op) {
        queue.erase(it);
        break;
      }
  }
  op.finish(error);
  return true;
}

} // namespace

std::vector<std::unique_ptr<Comm>> makeLocalComms(int n) {
  if (n < 1)
    throw CommError(fmt::format("a local communicator needs at least one rank, not {}", n));
  auto group = std::make_shared<Group>(n);
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < n; ++r)
    comms.push_back(std::make_unique<LocalComm>(group, r, "local"));
  return comms;
}

// The one-rank communicator is a local group of one: collectives copy or are the identity,
// and a rank may still send to itself.
std::unique_ptr<Comm> makeSelfComm() {
  return std::make_unique<LocalComm>(std::make_shared<Group>(1), 0, "self");
}

} // namespace epl::backend
