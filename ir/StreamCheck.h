// Checks, before a job starts, that the ranks' communication fits together: every send
// meets its receive, every collective is started by its whole group in the same order, and
// no rank waits forever. A plan that could hang is an error instead of a stuck job.
//
// Each rank's stream is described by its communicating instructions only (CommEvent),
// with the semantics of backend/comm/Comm.h: an operation starts at once and completes at
// its wait; a receive matches the sends of the same (peer, tag) in the order they were
// posted (MPI's non-overtaking rule); every rank of a group starts the group's collectives
// in the same order. A blocking send completes only once its receive is posted
// (rendezvous, the worst case), so a stream that works only with eager buffering is
// rejected. The check costs O(events + collectives x group size) time and memory.
#pragma once
#include "ir/CommStreams.h"

#include <optional>
#include <string>
#include <vector>

namespace epl::ir {

// Why the streams do not fit: one line naming the instructions that disagree (rank,
// position, label), and notes saying which rule they break.
struct StreamError {
  std::string message;
  std::vector<std::string> notes;
  std::vector<std::string> helps;
  std::string str() const; // the message, then `= note:` and `= help:` lines
};

// Simulates all ranks together; nullopt when every operation completes and is waited.
// Reports the first problem found: a malformed event (a peer, group or wait out of range),
// a send and receive or a collective whose members disagree on size, element type, kind
// or root, a rank blocked forever (a message never sent or received, a collective a member
// never starts, a cycle of waiting ranks), or a request never waited.
std::optional<StreamError> checkStreams(const CommStreams& streams);

} // namespace epl::ir
