// Communication streams of pipeline-parallel training steps, built by hand for the stream
// check's tests and benchmark until the compiler emits them: each rank is one stage of one
// replica, sends activations forward and gradients backward, and all-reduces its stage's
// gradients over the replicas at the end.
#pragma once
#include "ir/StreamCheck.h"

#include <algorithm>
#include <fmt/format.h>
#include <string>
#include <vector>

namespace epl::testing {

enum class PipelineSchedule {
  GPipe,         // every forward, then every backward (in reverse micro-batch order)
  OneFOneB,      // warm-up forwards, then one forward one backward, as Megatron-LM does
  NaiveOneFOneB, // the same order with blocking sends: works only with eager buffering
};

struct PipelineShape {
  int stages = 2;
  int replicas = 1;
  int microBatches = 4;
  PipelineSchedule schedule = PipelineSchedule::GPipe;
  int64_t activationBytes = 4096;  // per micro-batch, as gradients
  int64_t gradientBytes = 1 << 20; // a stage's parameter gradients
};

// The events of one rank, with a position per instruction: transfers and a compute
// instruction for each forward and backward.
class StageStream {
public:
  StageStream(ir::CommStreams& streams, const PipelineShape& p, int replica, int stage)
      : s_(streams), p_(p), stage_(stage), rank_(replica * p.stages + stage) {}

  void forward() { ++position_; }
  void backward() { ++position_; }

  void recvForward(int micro) {
    if (!first())
      add(ir::CommEvent::recv(rank_ - 1, tag(micro, 0), p_.activationBytes, ir::DType::F32,
                              activation("recv", micro, rank_ - 1)));
  }
  void sendForward(int micro) {
    if (!last())
      add(ir::CommEvent::send(rank_ + 1, tag(micro, 0), p_.activationBytes, ir::DType::F32,
                              activation("send", micro, rank_ + 1)));
  }
  void recvBackward(int micro) {
    if (!last())
      add(ir::CommEvent::recv(rank_ + 1, tag(micro, 1), p_.activationBytes, ir::DType::F32,
                              gradient("recv", micro, rank_ + 1)));
  }
  void sendBackward(int micro) {
    if (!first())
      add(ir::CommEvent::send(rank_ - 1, tag(micro, 1), p_.activationBytes, ir::DType::F32,
                              gradient("send", micro, rank_ - 1)));
  }
  // Both started before either is waited: the neighbour does the mirror image.
  void sendForwardRecvBackward(int sent, int received) {
    if (last()) return;
    int a = add(ir::CommEvent::isend(rank_ + 1, tag(sent, 0), p_.activationBytes, ir::DType::F32,
                                     activation("isend", sent, rank_ + 1)));
    int b = add(ir::CommEvent::irecv(rank_ + 1, tag(received, 1), p_.activationBytes,
                                     ir::DType::F32, gradient("irecv", received, rank_ + 1)));
    add(ir::CommEvent::wait(a));
    add(ir::CommEvent::wait(b));
  }
  void sendBackwardRecvForward(int sent, int received) {
    if (first()) return;
    int a = add(ir::CommEvent::isend(rank_ - 1, tag(sent, 1), p_.activationBytes, ir::DType::F32,
                                     gradient("isend", sent, rank_ - 1)));
    int b = add(ir::CommEvent::irecv(rank_ - 1, tag(received, 0), p_.activationBytes,
                                     ir::DType::F32, activation("irecv", received, rank_ - 1)));
    add(ir::CommEvent::wait(a));
    add(ir::CommEvent::wait(b));
  }
  // Starts the stage's gradient all-reduce over the replicas, then waits for it after the
  // optimizer's first instruction.
  void reduceGradients(int group) {
    int r = add(ir::CommEvent::icollective(
        ir::CollectiveKind::AllReduce, group, p_.gradientBytes, ir::DType::F32,
        fmt::format("all-reduce gradients of stage {}", stage_)));
    ++position_;
    add(ir::CommEvent::wait(r));
  }
  void barrier(int group) {
    add(ir::CommEvent::collectiveOp(ir::CollectiveKind::Barrier, group, 0, ir::DType::F32,
                                    "barrier at the end of the step"));
  }

  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == p_.stages - 1; }
  int stage() const { return stage_; }

private:
  // A tag per micro-batch and direction, so a message cannot match another micro-batch's.
  static int tag(int micro, int backward) { return 2 * micro + backward; }
  static std::string activation(const std::string& verb, int micro, int peer) {
    return label(verb, "activation", micro, peer);
  }
  static std::string gradient(const std::string& verb, int micro, int peer) {
    return label(verb, "gradient", micro, peer);
  }
  // "isend activation of micro-batch 3 to rank 1", "recv gradient of … from rank 2"
  static std::string label(const std::string& verb, const char* what, int micro, int peer) {
    bool sends = verb.find("send") != std::string::npos;
    return fmt::format("{} {} of micro-batch {} {} rank {}", verb, what, micro,
                       sends ? "to" : "from", peer);
  }
  int add(ir::CommEvent e) {
    e.position = position_++;
    return s_.add(rank_, std::move(e));
  }

  ir::CommStreams& s_;
  const PipelineShape& p_;
  int stage_, rank_;
  int position_ = 1; // instruction 0 zeroes the gradients
};

inline void gpipe(StageStream& s, int micro) {
  for (int m = 0; m < micro; ++m) {
    s.recvForward(m);
    s.forward();
    s.sendForward(m);
  }
  for (int m = micro - 1; m >= 0; --m) {
    s.recvBackward(m);
    s.backward();
    s.sendBackward(m);
  }
}

// Megatron-LM's 1F1B: warm-up forwards, the steady state pairs each send with the receive
// the neighbour sends back, then the cool-down backwards. The naive form sends and receives
// one after the other, blocking.
inline void oneFOneB(StageStream& s, int stages, int micro, bool naive) {
  int warmup = std::min(stages - s.stage() - 1, micro);
  int steady = micro - warmup;
  for (int m = 0; m < warmup; ++m) {
    s.recvForward(m);
    s.forward();
    s.sendForward(m);
  }
  if (steady > 0) s.recvForward(warmup);
  for (int i = 0; i < steady; ++i) {
    int m = warmup + i; // the forward of this step; micro-batch i goes backward
    s.forward();
    if (naive) {
      s.sendForward(m);
      s.recvBackward(i);
    } else {
      s.sendForwardRecvBackward(m, i);
    }
    s.backward();
    if (i == steady - 1) {
      s.sendBackward(i);
    } else if (naive) {
      s.sendBackward(i);
      s.recvForward(m + 1);
    } else {
      s.sendBackwardRecvForward(i, m + 1);
    }
  }
  for (int i = steady; i < micro; ++i) {
    s.recvBackward(i);
    s.backward();
    s.sendBackward(i);
  }
}

// Every rank's stream for one training step of the pipeline.
inline ir::CommStreams pipelineStreams(const PipelineShape& p) {
  ir::CommStreams streams;
  int ranks = p.stages * p.replicas;
  streams.ranks.resize(ranks);
  std::vector<int> all;
  for (int r = 0; r < ranks; ++r)
    all.push_back(r);
  int world = streams.addGroup(all);
  std::vector<int> stageGroups;
  for (int s = 0; s < p.stages; ++s) {
    std::vector<int> group;
    for (int d = 0; d < p.replicas; ++d)
      group.push_back(d * p.stages + s);
    stageGroups.push_back(streams.addGroup(group));
  }
  for (int d = 0; d < p.replicas; ++d)
    for (int s = 0; s < p.stages; ++s) {
      StageStream stream(streams, p, d, s);
      if (p.schedule == PipelineSchedule::GPipe)
        gpipe(stream, p.microBatches);
      else
        oneFOneB(stream, p.stages, p.microBatches, p.schedule == PipelineSchedule::NaiveOneFOneB);
      if (p.replicas > 1) stream.reduceGradients(stageGroups[s]);
      stream.barrier(world);
    }
  return streams;
}

} // namespace epl::testing
