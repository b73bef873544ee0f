// The communication check: all ranks' streams run together on a deterministic scheduler.
//
//   1. Check every event on its own: peers, groups, roots and waits in range.
//   2. Run each rank until it blocks: on a blocking operation, or a Wait, whose request has
//      not completed. Starting a send or receive queues it on its channel (src, dst, tag),
//      or matches the oldest queued operation of the other side, which completes both.
//      Starting a collective enters the group's next instance for that rank (a sequence
//      number per rank and group); the instance completes once every member entered it.
//      A completion wakes the rank blocked on it.
//   3. When no rank can run: if some rank is blocked, the operation it waits for needs a
//      rank that has finished (report it) or every blocked rank waits for another blocked
//      one, and following those edges finds a cycle (report it). Otherwise every rank
//      finished: report an operation never matched, then a request never waited.
// Each event is started, matched and waited once, so the whole costs
// O(events + collectives x group size).
#include "ir/StreamCheck.h"
#include "support/Assert.h"
#include "support/Text.h"

#include <algorithm>
#include <deque>
#include <fmt/format.h>
#include <unordered_map>

namespace epl::ir {

std::string StreamError::str() const {
  std::string s = message;
  for (const auto& n : notes)
    s += "\n  = note: " + n;
  for (const auto& h : helps)
    s += "\n  = help: " + h;
  return s;
}

namespace {

// An event: rank and index in that rank's events.
struct Ref {
  int rank = -1;
  int index = -1;
};

std::string ordinal(int64_t n) {
  int64_t tens = n % 100, ones = n % 10;
  const char* suffix = (tens >= 11 && tens <= 13) ? "th"
                       : ones == 1                ? "st"
                       : ones == 2                ? "nd"
                       : ones == 3                ? "rd"
                                                  : "th";
  return fmt::format("{}{}", n, suffix);
}

// "[0, 1, 2, 3]"; a long group as "[0, 1, 2, 3, ..., 63] (64 ranks)".
std::string groupText(const std::vector<int>& g) {
  if (g.size() <= 8) return fmt::format("[{}]", fmt::join(g, ", "));
  return fmt::format("[{}, {}, {}, {}, ..., {}] ({} ranks)", g[0], g[1], g[2], g[3], g.back(),
                     g.size());
}

std::string sizeText(const CommEvent& e) {
  return fmt::format("{} bytes of {}", withCommas(e.bytes), dtypeName(e.dtype));
}

// "all-reduce of 4,096 bytes of f32", "broadcast from rank 2 of …", "barrier".
std::string collectiveText(const CommEvent& e) {
  if (e.collective == CollectiveKind::Barrier) return "barrier";
  if (e.collective == CollectiveKind::Broadcast)
    return fmt::format("broadcast from rank {} of {}", e.root, sizeText(e));
  return fmt::format("{} of {}", collectiveName(e.collective), sizeText(e));
}

bool sameCollective(const CommEvent& a, const CommEvent& b) {
  if (a.collective != b.collective) return false;
  if (a.collective == CollectiveKind::Barrier) return true;
  if (a.collective == CollectiveKind::Broadcast && a.root != b.root) return false;
  return a.bytes == b.bytes && a.dtype == b.dtype;
}

struct ChannelKey {
  int src, dst, tag;
  bool operator==(const ChannelKey& o) const {
    return src == o.src && dst == o.dst && tag == o.tag;
  }
};
struct ChannelHash {
  size_t operator()(const ChannelKey& k) const {
    uint64_t h = static_cast<uint32_t>(k.src);
    h = h * 0x9E3779B97F4A7C15ull + static_cast<uint32_t>(k.dst);
    h = h * 0x9E3779B97F4A7C15ull + static_cast<uint32_t>(k.tag);
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

// The operations of one (src, dst, tag) posted and not matched yet, oldest first. They are
// all sends or all receives, since a new operation first matches the oldest of the other
// side. A drained channel is erased, so the table holds only messages in flight.
struct Channel {
  std::vector<Ref> queue;
  size_t head = 0;
  bool sends = false;
  bool empty() const { return head == queue.size(); }
};

// One collective of a group, as its members enter it.
struct Instance {
  Ref first;                // the first member to enter: the others must agree with it
  std::vector<Ref> entered; // cleared once the instance completed
};

struct GroupState {
  std::vector<Instance> instances;
  std::vector<int> started; // per member (in group order): collectives it started
};

enum Flag : uint8_t { Started = 1, Complete = 2, Waited = 4 };

struct RankState {
  size_t pc = 0;      // the next event to run
  int blockedOn = -1; // the request (event index) it waits for; -1 while it can run
  bool done = false;
  std::vector<uint8_t> flags; // per event
  std::vector<int> instance;  // per collective event: its sequence number in the group
};

class Simulation {
public:
  explicit Simulation(const CommStreams& s) : streams_(s) {}
  std::optional<StreamError> run();

private:
  const CommEvent& event(Ref r) const { return streams_.ranks[r.rank][r.index]; }
  std::string at(Ref r) const;
  std::string waitsAt(Ref r) const;
  int memberIndex(int group, int rank) const;
  std::vector<int> missingMembers(Ref r) const;

  std::optional<StreamError> advance(int rank);
  std::optional<StreamError> start(Ref r);
  std::optional<StreamError> match(Ref send, Ref recv);
  std::optional<StreamError> enter(Ref r);
  void complete(Ref r);

  std::optional<StreamError> blocked() const;
  StreamError neverServed(Ref waiting, int other) const;
  StreamError deadlock(const std::vector<int>& cycle) const;
  std::optional<StreamError> leftovers() const;
  std::string need(Ref waiting, int other) const;

  const CommStreams& streams_;
  std::vector<RankState> ranks_;
  std::vector<GroupState> groups_;
  std::unordered_map<ChannelKey, Channel, ChannelHash> channels_;
  std::deque<int> runnable_;
};

// "instruction 12 (recv activation of micro-batch 3 from rank 1)"
std::string where(const CommEvent& e, int index) {
  int position = e.position >= 0 ? e.position : index;
  if (e.label.empty()) return fmt::format("instruction {}", position);
  return fmt::format("instruction {} ({})", position, e.label);
}

// "rank 0 at instruction 12 (…)"
std::string Simulation::at(Ref r) const {
  return fmt::format("rank {} at {}", r.rank, where(event(r), r.index));
}

// "rank 0 waits at instruction 12 (…)"; for a Wait, also the instruction that started it.
std::string Simulation::waitsAt(Ref r) const {
  const CommEvent& e = event(r);
  std::string text = fmt::format("rank {} waits at {}", r.rank, where(e, r.index));
  if (e.op != CommOp::Wait) return text;
  return text + " for " + where(event({r.rank, e.request}), e.request);
}

int Simulation::memberIndex(int group, int rank) const {
  const auto& g = streams_.groups[group];
  auto it = std::lower_bound(g.begin(), g.end(), rank);
  if (it == g.end() || *it != rank) return -1;
  return static_cast<int>(it - g.begin());
}

// The members of a started collective's group that have not entered its instance yet.
std::vector<int> Simulation::missingMembers(Ref r) const {
  const CommEvent& e = event(r);
  int k = ranks_[r.rank].instance[r.index];
  const auto& members = streams_.groups[e.group];
  std::vector<int> missing;
  for (size_t m = 0; m < members.size(); ++m)
    if (groups_[e.group].started[m] <= k) missing.push_back(members[m]);
  return missing;
}

// What is wrong with event i of rank r on its own, or "" when nothing is.
std::string badEvent(const CommStreams& s, int r, int i) {
  int n = static_cast<int>(s.ranks.size());
  const auto& events = s.ranks[r];
  const CommEvent& e = events[i];
  bool p2p = e.op == CommOp::Send || e.op == CommOp::Recv;
  if (p2p && (e.peer < 0 || e.peer >= n))
    return fmt::format("names rank {}, but the job has {} ranks", e.peer, n);
  if ((p2p || e.op == CommOp::Collective) && e.bytes < 0)
    return fmt::format("moves {} bytes", e.bytes);
  if (e.op == CommOp::Collective) {
    if (e.group < 0 || e.group >= static_cast<int>(s.groups.size()))
      return fmt::format("names group {}, which does not exist", e.group);
    const auto& g = s.groups[e.group];
    if (!std::binary_search(g.begin(), g.end(), r))
      return fmt::format("starts a collective of group {}, which rank {} is not in", groupText(g),
                         r);
    bool broadcast = e.collective == CollectiveKind::Broadcast;
    if (broadcast && !std::binary_search(g.begin(), g.end(), e.root))
      return fmt::format("broadcasts from rank {}, which is not in group {}", e.root, groupText(g));
  }
  if (e.op == CommOp::Wait && (e.request < 0 || e.request >= i ||
                               events[e.request].op == CommOp::Wait || !events[e.request].async))
    return fmt::format("waits for event {}, which is not an earlier asynchronous operation of "
                       "rank {}",
                       e.request, r);
  return "";
}

// 1. Every group and event on its own: what the simulation indexes must be in range.
std::optional<StreamError> malformed(const CommStreams& s) {
  int n = static_cast<int>(s.ranks.size());
  for (const auto& g : s.groups)
    for (size_t m = 0; m < g.size(); ++m) {
      if (g[m] < 0 || g[m] >= n)
        return StreamError{
            fmt::format("group {} names rank {}, but the job has {} ranks", groupText(g), g[m], n),
            {},
            {}};
      if (m > 0 && g[m] == g[m - 1])
        return StreamError{fmt::format("group {} names rank {} twice", groupText(g), g[m]), {}, {}};
    }
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < static_cast<int>(s.ranks[r].size()); ++i) {
      std::string what = badEvent(s, r, i);
      if (!what.empty())
        return StreamError{
            fmt::format("rank {} at {} {}", r, where(s.ranks[r][i], i), what), {}, {}};
    }
  return std::nullopt;
}

std::optional<StreamError> Simulation::run() {
  if (auto e = malformed(streams_)) return e;
  int n = static_cast<int>(streams_.ranks.size());
  ranks_.resize(n);
  for (int r = 0; r < n; ++r) {
    ranks_[r].flags.assign(streams_.ranks[r].size(), 0);
    ranks_[r].instance.assign(streams_.ranks[r].size(), -1);
    runnable_.push_back(r);
  }
  groups_.resize(streams_.groups.size());
  for (size_t g = 0; g < groups_.size(); ++g)
    groups_[g].started.assign(streams_.groups[g].size(), 0);
  // 2. Run ranks until none can.
  while (!runnable_.empty()) {
    int r = runnable_.front();
    runnable_.pop_front();
    if (auto e = advance(r)) return e;
  }
  // 3. Why they stopped.
  if (auto e = blocked()) return e;
  return leftovers();
}

// Runs a rank until it blocks or finishes its stream.
std::optional<StreamError> Simulation::advance(int rank) {
  RankState& s = ranks_[rank];
  const auto& events = streams_.ranks[rank];
  while (s.pc < events.size()) {
    int i = static_cast<int>(s.pc);
    const CommEvent& e = events[i];
    int request = i;
    if (e.op == CommOp::Wait) {
      request = e.request;
      if (s.flags[request] & Waited)
        return StreamError{fmt::format("{} waits a second time for {}", at({rank, i}),
                                       where(events[request], request)),
                           {"each request is waited exactly once"},
                           {}};
    } else if (!(s.flags[i] & Started)) {
      if (auto err = start({rank, i})) return err;
    }
    if (e.op == CommOp::Wait || !e.async) {
      if (!(s.flags[request] & Complete)) {
        s.blockedOn = request; // resumes here, at the same event, once it completes
        return std::nullopt;
      }
      s.flags[request] |= Waited;
    }
    ++s.pc;
  }
  s.done = true;
  return std::nullopt;
}

std::optional<StreamError> Simulation::start(Ref r) {
  ranks_[r.rank].flags[r.index] |= Started;
  const CommEvent& e = event(r);
  if (e.op == CommOp::Collective) return enter(r);
  bool sends = e.op == CommOp::Send;
  ChannelKey key = sends ? ChannelKey{r.rank, e.peer, e.tag} : ChannelKey{e.peer, r.rank, e.tag};
  auto it = channels_.try_emplace(key).first;
  Channel& c = it->second;
  if (c.empty() || c.sends == sends) {
    c.sends = sends;
    c.queue.push_back(r);
    return std::nullopt;
  }
  Ref other = c.queue[c.head++];
  if (c.empty()) channels_.erase(it);
  return match(sends ? r : other, sends ? other : r);
}

// The n-th send of its channel, counted in the sender's stream (only for messages).
int64_t messageNumber(const CommStreams& s, Ref send) {
  const CommEvent& e = s.ranks[send.rank][send.index];
  int64_t n = 0;
  for (int i = 0; i <= send.index; ++i) {
    const CommEvent& o = s.ranks[send.rank][i];
    n += o.op == CommOp::Send && o.peer == e.peer && o.tag == e.tag;
  }
  return n;
}

// A send and the receive it met: they must agree on the size and the element type.
std::optional<StreamError> Simulation::match(Ref send, Ref recv) {
  const CommEvent &se = event(send), &re = event(recv);
  if (se.bytes != re.bytes || se.dtype != re.dtype)
    return StreamError{
        fmt::format("send and receive disagree: {} sends {}, {} receives {}", at(send),
                    sizeText(se), at(recv), sizeText(re)),
        {fmt::format("a receive matches the sends from its peer with its tag in the order they "
                     "were posted: this is the {} message from rank {} to rank {} with tag {}",
                     ordinal(messageNumber(streams_, send)), send.rank, recv.rank, se.tag)},
        {}};
  complete(send);
  complete(recv);
  return std::nullopt;
}

// Enters the rank's next collective of the group; the last member to enter completes it.
std::optional<StreamError> Simulation::enter(Ref r) {
  const CommEvent& e = event(r);
  GroupState& g = groups_[e.group];
  int k = g.started[memberIndex(e.group, r.rank)]++;
  ranks_[r.rank].instance[r.index] = k;
  if (k == static_cast<int>(g.instances.size())) g.instances.push_back(Instance{r, {}});
  Instance& inst = g.instances[k];
  if (!sameCollective(event(inst.first), e))
    return StreamError{
        fmt::format("ranks {} and {} disagree on the {} collective of group {}: {} starts {}, "
                    "{} starts {}",
                    inst.first.rank, r.rank, ordinal(k + 1), groupText(streams_.groups[e.group]),
                    at(inst.first), collectiveText(event(inst.first)), at(r), collectiveText(e)),
        {"every rank of a group starts the group's collectives in the same order, with the "
         "same kind, size, element type and root"},
        {}};
  inst.entered.push_back(r);
  if (inst.entered.size() == streams_.groups[e.group].size()) {
    for (Ref m : inst.entered)
      complete(m);
    std::vector<Ref>().swap(inst.entered);
  }
  return std::nullopt;
}

void Simulation::complete(Ref r) {
  RankState& s = ranks_[r.rank];
  s.flags[r.index] |= Complete;
  if (s.blockedOn == r.index) {
    s.blockedOn = -1;
    runnable_.push_back(r.rank);
  }
}

// What a blocked operation waits for from rank `other`.
std::string Simulation::need(Ref waiting, int other) const {
  Ref request{waiting.rank, waiting.index};
  const CommEvent& w = event(waiting);
  if (w.op == CommOp::Wait) request.index = w.request;
  const CommEvent& e = event(request);
  if (e.op == CommOp::Send)
    return fmt::format("rank {} needs rank {} to receive from it with tag {}", waiting.rank, other,
                       e.tag);
  if (e.op == CommOp::Recv)
    return fmt::format("rank {} needs rank {} to send to it with tag {}", waiting.rank, other,
                       e.tag);
  return fmt::format("rank {} needs rank {} to start the {} collective of group {}", waiting.rank,
                     other, ordinal(ranks_[request.rank].instance[request.index] + 1),
                     groupText(streams_.groups[e.group]));
}

// 3. Some rank is blocked: name a rank that will never serve it, or a cycle of waiting.
std::optional<StreamError> Simulation::blocked() const {
  int n = static_cast<int>(ranks_.size());
  // The ranks each blocked rank waits for (the first one not finished, or any finished one).
  std::vector<int> next(n, -1);
  for (int r = 0; r < n; ++r) {
    if (ranks_[r].done) continue;
    Ref w{r, static_cast<int>(ranks_[r].pc)};
    EPL_ASSERT(ranks_[r].blockedOn >= 0, "a rank neither finished nor blocked");
    Ref request{r, ranks_[r].blockedOn};
    const CommEvent& e = event(request);
    std::vector<int> others =
        e.op == CommOp::Collective ? missingMembers(request) : std::vector<int>{e.peer};
    for (int o : others)
      if (ranks_[o].done) return neverServed(w, o);
    EPL_ASSERT(!others.empty(), "a blocked rank waits for nobody");
    next[r] = others.front();
  }
  int first = 0;
  while (first < n && next[first] < 0)
    ++first;
  if (first == n) return std::nullopt;
  // Every blocked rank waits for another blocked rank: walking those edges must cycle.
  std::vector<int> seenAt(n, -1), path;
  int r = first;
  while (seenAt[r] < 0) {
    seenAt[r] = static_cast<int>(path.size());
    path.push_back(r);
    r = next[r];
  }
  return deadlock(std::vector<int>(path.begin() + seenAt[r], path.end()));
}

// A blocked rank whose operation needs rank `other`, which finished its stream.
StreamError Simulation::neverServed(Ref waiting, int other) const {
  const CommEvent& w = event(waiting);
  Ref request{waiting.rank, w.op == CommOp::Wait ? w.request : waiting.index};
  const CommEvent& e = event(request);
  StreamError err;
  if (e.op == CommOp::Recv) {
    err.message = fmt::format("{}, but rank {} never sends it", waitsAt(waiting), other);
    err.notes.push_back(fmt::format("rank {} finished its stream without another send to rank {} "
                                    "with tag {}",
                                    other, waiting.rank, e.tag));
  } else if (e.op == CommOp::Send) {
    err.message = fmt::format("{}, but rank {} never receives it", waitsAt(waiting), other);
    err.notes.push_back(fmt::format("rank {} finished its stream without another receive from "
                                    "rank {} with tag {}",
                                    other, waiting.rank, e.tag));
  } else {
    int k = ranks_[request.rank].instance[request.index];
    err.message =
        fmt::format("{}, the {} collective of group {}, but rank {} never starts it",
                    waitsAt(waiting), ordinal(k + 1), groupText(streams_.groups[e.group]), other);
    int started = groups_[e.group].started[memberIndex(e.group, other)];
    err.notes.push_back(fmt::format("rank {} finished its stream after {} collective{} of that "
                                    "group",
                                    other, started, started == 1 ? "" : "s"));
  }
  return err;
}

StreamError Simulation::deadlock(const std::vector<int>& cycle) const {
  StreamError err;
  std::vector<std::string> parts;
  bool blockingSend = false;
  for (size_t k = 0; k < cycle.size(); ++k) {
    int r = cycle[k];
    Ref w{r, static_cast<int>(ranks_[r].pc)};
    parts.push_back(waitsAt(w));
    err.notes.push_back(need(w, cycle[(k + 1) % cycle.size()]));
    const CommEvent& e = event(w);
    blockingSend = blockingSend || (e.op == CommOp::Send && !e.async);
  }
  err.message = fmt::format("deadlock: {}", fmt::join(parts, " while "));
  if (blockingSend)
    err.helps.push_back("a blocking send waits until its receive is posted (no eager "
                        "buffering is assumed): post the receive first, or start the send with "
                        "isend and wait for it later");
  return err;
}

// Every rank finished: an operation never matched, else a request never waited.
std::optional<StreamError> Simulation::leftovers() const {
  for (size_t r = 0; r < ranks_.size(); ++r)
    for (size_t i = 0; i < ranks_[r].flags.size(); ++i) {
      if (!(ranks_[r].flags[i] & Started) || (ranks_[r].flags[i] & Complete)) continue;
      Ref ref{static_cast<int>(r), static_cast<int>(i)};
      const CommEvent& e = event(ref);
      if (e.op == CommOp::Send)
        return StreamError{
            fmt::format("{} sends a message that rank {} never receives", at(ref), e.peer),
            {fmt::format("no receive from rank {} with tag {} is left", r, e.tag)},
            {}};
      if (e.op == CommOp::Recv)
        return StreamError{
            fmt::format("{} receives a message that rank {} never sends", at(ref), e.peer),
            {fmt::format("no send to rank {} with tag {} is left", r, e.tag)},
            {}};
      int k = ranks_[r].instance[i];
      return StreamError{fmt::format("{} starts the {} collective of group {}, which rank {} "
                                     "never starts",
                                     at(ref), ordinal(k + 1), groupText(streams_.groups[e.group]),
                                     missingMembers(ref).front()),
                         {},
                         {}};
    }
  for (size_t r = 0; r < ranks_.size(); ++r)
    for (size_t i = 0; i < ranks_[r].flags.size(); ++i)
      if ((ranks_[r].flags[i] & Started) && !(ranks_[r].flags[i] & Waited))
        return StreamError{fmt::format("{} starts an operation that is never waited for",
                                       at({static_cast<int>(r), static_cast<int>(i)})),
                           {"each started operation is waited exactly once: its buffer stays in "
                            "use until then"},
                           {}};
  return std::nullopt;
}

} // namespace

std::optional<StreamError> checkStreams(const CommStreams& streams) {
  return Simulation(streams).run();
}

} // namespace epl::ir
