// The communication of every rank's instruction stream, one event per communicating
// instruction, with the semantics of backend/comm/Comm.h: what ir/StreamCheck.h checks
// before a job starts. The stream builder makes one from the ranks' programs.
#pragma once
#include "ir/Types.h"

#include <cstdint>
#include <string>
#include <vector>

namespace epl::ir {

enum class CommOp { Send, Recv, Collective, Wait };
enum class CollectiveKind { AllReduce, ReduceScatter, AllGather, Broadcast, AllToAll, Barrier };
const char* collectiveName(CollectiveKind k); // "all-reduce", …

// One communicating instruction of a rank's stream.
struct CommEvent {
  CommOp op = CommOp::Send;
  // isend, irecv, icollective: the operation starts here and completes at a later Wait.
  // Otherwise the instruction starts it and waits for it.
  bool async = false;
  int peer = -1; // Send, Recv: the other rank
  int tag = 0;
  CollectiveKind collective = CollectiveKind::AllReduce;
  int group = -1;    // Collective: index into CommStreams::groups
  int root = -1;     // Broadcast: the global rank whose data every member gets
  int64_t bytes = 0; // the size argument of the Comm.h call (Barrier: 0)
  DType dtype = DType::F32;
  int request = -1; // Wait: index, in this rank's events, of the async operation it waits for
  // Where the instruction sits in the rank's program, for messages; -1: the event's index.
  int position = -1;
  std::string label; // what it moves, for messages: "send activation of micro-batch 3 to rank 1"

  static CommEvent send(int peer, int tag, int64_t bytes, DType dtype, std::string label);
  static CommEvent recv(int peer, int tag, int64_t bytes, DType dtype, std::string label);
  static CommEvent isend(int peer, int tag, int64_t bytes, DType dtype, std::string label);
  static CommEvent irecv(int peer, int tag, int64_t bytes, DType dtype, std::string label);
  // A collective other than a broadcast; `icollective` starts it without waiting.
  static CommEvent collectiveOp(CollectiveKind kind, int group, int64_t bytes, DType dtype,
                                std::string label);
  static CommEvent icollective(CollectiveKind kind, int group, int64_t bytes, DType dtype,
                               std::string label);
  static CommEvent broadcast(int group, int root, int64_t bytes, DType dtype, std::string label,
                             bool async = false);
  static CommEvent wait(int request, std::string label = "");
};

// Every rank's events, and the groups collectives run over.
struct CommStreams {
  std::vector<std::vector<int>> groups; // sorted global ranks, each group a communicator
  // One stream per rank of the job, rank r's events in program order (none for a rank
  // that does not communicate).
  std::vector<std::vector<CommEvent>> ranks;
  int addGroup(std::vector<int> members); // sorts them; returns the group's index
  // Appends to rank r's stream; returns the event's index (what a Wait names).
  int add(int rank, CommEvent e);
};

} // namespace epl::ir
