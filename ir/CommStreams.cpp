// Constructors of communication events and streams.
#include "ir/CommStreams.h"
#include "support/Assert.h"

#include <algorithm>

namespace epl::ir {

const char* collectiveName(CollectiveKind k) {
  switch (k) {
  case CollectiveKind::AllReduce:
    return "all-reduce";
  case CollectiveKind::ReduceScatter:
    return "reduce-scatter";
  case CollectiveKind::AllGather:
    return "all-gather";
  case CollectiveKind::Broadcast:
    return "broadcast";
  case CollectiveKind::AllToAll:
    return "all-to-all";
  case CollectiveKind::Barrier:
    return "barrier";
  }
  return "?";
}

namespace {

CommEvent pointToPoint(CommOp op, bool async, int peer, int tag, int64_t bytes, DType dtype,
                       std::string label) {
  CommEvent e;
  e.op = op;
  e.async = async;
  e.peer = peer;
  e.tag = tag;
  e.bytes = bytes;
  e.dtype = dtype;
  e.label = std::move(label);
  return e;
}

CommEvent collectiveEvent(CollectiveKind kind, bool async, int group, int root, int64_t bytes,
                          DType dtype, std::string label) {
  CommEvent e;
  e.op = CommOp::Collective;
  e.async = async;
  e.collective = kind;
  e.group = group;
  e.root = root;
  e.bytes = bytes;
  e.dtype = dtype;
  e.label = std::move(label);
  return e;
}

} // namespace

CommEvent CommEvent::send(int peer, int tag, int64_t bytes, DType dtype, std::string label) {
  return pointToPoint(CommOp::Send, false, peer, tag, bytes, dtype, std::move(label));
}
CommEvent CommEvent::recv(int peer, int tag, int64_t bytes, DType dtype, std::string label) {
  return pointToPoint(CommOp::Recv, false, peer, tag, bytes, dtype, std::move(label));
}
CommEvent CommEvent::isend(int peer, int tag, int64_t bytes, DType dtype, std::string label) {
  return pointToPoint(CommOp::Send, true, peer, tag, bytes, dtype, std::move(label));
}
CommEvent CommEvent::irecv(int peer, int tag, int64_t bytes, DType dtype, std::string label) {
  return pointToPoint(CommOp::Recv, true, peer, tag, bytes, dtype, std::move(label));
}
CommEvent CommEvent::collectiveOp(CollectiveKind kind, int group, int64_t bytes, DType dtype,
                                  std::string label) {
  return collectiveEvent(kind, false, group, -1, bytes, dtype, std::move(label));
}
CommEvent CommEvent::icollective(CollectiveKind kind, int group, int64_t bytes, DType dtype,
                                 std::string label) {
  return collectiveEvent(kind, true, group, -1, bytes, dtype, std::move(label));
}
CommEvent CommEvent::broadcast(int group, int root, int64_t bytes, DType dtype, std::string label,
                               bool async) {
  return collectiveEvent(CollectiveKind::Broadcast, async, group, root, bytes, dtype,
                         std::move(label));
}
CommEvent CommEvent::wait(int request, std::string label) {
  CommEvent e;
  e.op = CommOp::Wait;
  e.request = request;
  e.label = std::move(label);
  return e;
}

int CommStreams::addGroup(std::vector<int> members) {
  std::sort(members.begin(), members.end());
  groups.push_back(std::move(members));
  return static_cast<int>(groups.size()) - 1;
}

int CommStreams::add(int rank, CommEvent e) {
  EPL_ASSERT(rank >= 0, "a stream of a negative rank");
  if (static_cast<size_t>(rank) >= ranks.size()) ranks.resize(rank + 1);
  ranks[rank].push_back(std::move(e));
  return static_cast<int>(ranks[rank].size()) - 1;
}

} // namespace epl::ir
