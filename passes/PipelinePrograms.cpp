// The rank programs of a pipeline whose stages are one device each, and the communication
// of every rank's program for the stream check.
//
//   1. Each op plays a role on each stage: the ops of a stage run there; a send/recv op
//      between stages is a Send on the stage it leaves and a Recv on the one it enters (its
//      backward, autodiff's transfer of the gradient back, the same the other way).
//   2. A stage's work items come from ir::PipelineSchedule: the forward of micro-batch m is
//      a load and the stage's forward roles in program order (the last stage then seeds the
//      loss gradient); its backward, the stage's backward roles in program order. zb splits
//      the backward: B is those roles writing only input gradients (ops with none left
//      out), the gradient sent upstream at once; W, later, the ops with parameters writing
//      only their gradients. Every schedule adds micro-batches into the parameter gradients
//      in increasing order, as one device does, so their losses are bit-identical.
//   3. Then the gradient norm (every rank: its share, summed over its pipeline's ranks)
//      and the optimizer ops of the stage's own parameters.
//   4. Slots: the most micro-batches whose forward ran and whose backward (zb: its W) has
//      not, over the stage's order. Forwards and backwards both go in increasing micro-batch
//      order, so micro-batch m can use slot m % slots: m + slots starts after m's backward.
//   5. Tags: (2 x boundary + direction) x micro-batches + micro-batch, one per transfer of
//      a step; evaluation uses micro-batch 0's.
//   6. Data-parallel copies of the pipeline: replica r's ranks run the same programs on the
//      r-th share of each micro-batch, their transfers between ranks of replica r. Each
//      rank starts its stage's gradient buckets after the backward op that readies them in
//      the last micro-batch, summed over the stage's ranks in every replica, and waits for
//      them before the gradient norm and the optimizer.
#include "passes/PipelinePrograms.h"

#include "ir/PipelineSchedule.h"
#include "support/Assert.h"

#include <algorithm>
#include <fmt/format.h>
#include <map>

namespace epl::passes {

namespace {

enum class Role { None, Run, Send, Recv };

Role roleOn(const ir::Op& op, int stage) {
  if (op.kind != ir::OpKind::SendRecv) return op.stage == stage ? Role::Run : Role::None;
  if (ir::intAttr(op.attrs, "from_stage") == stage) return Role::Send;
  if (ir::intAttr(op.attrs, "to_stage") == stage) return Role::Recv;
  return Role::None;
}

// Whether backward op `op` has an output that `part` writes.
bool writesAny(const ir::Module& m, const ir::Op& op, ir::BackwardPart part) {
  size_t n = m.ops[op.forward].inputs.size();
  for (size_t k = 0; k < op.outputs.size(); ++k)
    if (op.outputs[k] >= 0 && ir::writesOutput(part, k, n)) return true;
  return false;
}

class StageProgram {
public:
  StageProgram(const ir::Module& m, int stage, int replica)
      : m_(m), stage_(stage), replica_(replica) {
    int k = 0;
    for (size_t i = 0; i < m.ops.size(); ++i)
      if (m.ops[i].kind == ir::OpKind::SendRecv && m.ops[i].phase == ir::Phase::Forward)
        boundary_[static_cast<int>(i)] = k++;
    lossStage_ = m.ops[m.tensors[m.outputs[0]].producer].stage;
  }

  // Micro-batch `micro`'s forward on this stage, into `out`; `seed` adds the loss gradient.
  void forward(int micro, bool seed, std::vector<ir::Instr>& out) const {
    out.push_back({ir::InstrKind::Load, -1, micro, -1});
    appendPhase(ir::Phase::Forward, micro, out);
    if (seed && stage_ == lossStage_) out.push_back({ir::InstrKind::SeedGrad, -1, micro, -1});
  }
  void backward(int micro, std::vector<ir::Instr>& out) const {
    appendPhase(ir::Phase::Backward, micro, out);
  }
  // One part of a split backward: Inputs keeps the transfers and the ops that write an
  // input gradient; Params only the ops that write a parameter gradient.
  void backwardPart(ir::BackwardPart part, int micro, std::vector<ir::Instr>& out) const {
    std::vector<ir::Instr> whole;
    appendPhase(ir::Phase::Backward, micro, whole);
    for (ir::Instr in : whole) {
      bool run = in.kind == ir::InstrKind::Run;
      if (run ? !writesAny(m_, m_.ops[in.op], part) : part != ir::BackwardPart::Inputs) continue;
      if (run) in.part = part;
      out.push_back(in);
    }
  }
  void optimizer(std::vector<ir::Instr>& out) const {
    for (size_t i = 0; i < m_.ops.size(); ++i) {
      const ir::Op& op = m_.ops[i];
      if (op.phase == ir::Phase::Optimizer &&
          (op.kind == ir::OpKind::GradNorm || op.stage == stage_))
        out.push_back({ir::InstrKind::Run, static_cast<int>(i), 0, -1});
    }
  }
  int lossStage() const { return lossStage_; }

private:
  void appendPhase(ir::Phase phase, int micro, std::vector<ir::Instr>& out) const {
    for (size_t i = 0; i < m_.ops.size(); ++i) {
      const ir::Op& op = m_.ops[i];
      if (op.phase != phase) continue;
      int id = static_cast<int>(i);
      switch (roleOn(op, stage_)) {
      case Role::None:
        break;
      case Role::Run:
        out.push_back({ir::InstrKind::Run, id, micro, -1});
        break;
      case Role::Send:
        out.push_back(transfer(ir::InstrKind::Send, id, micro, op.inputs.at(0), "to_stage"));
        break;
      case Role::Recv:
        EPL_ASSERT(op.outputs.at(0) >= 0, "a received gradient has no buffer");
        out.push_back(transfer(ir::InstrKind::Recv, id, micro, op.outputs[0], "from_stage"));
        out.back().accumulate = !op.accumulate.empty() && op.accumulate[0];
        break;
      }
    }
  }

  ir::Instr transfer(ir::InstrKind kind, int op, int micro, int tensor, const char* peerKey) const {
    const ir::Op& o = m_.ops[op];
    bool back = o.phase == ir::Phase::Backward;
    int k = boundary_.at(back ? o.forward : op);
    int micros = static_cast<int>(m_.policy.microBatches);
    ir::Instr in{kind, op, micro, -1};
    in.tensor = tensor;
    in.peer = m_.mesh.rank(replica_, static_cast<int>(ir::intAttr(o.attrs, peerKey)), 0);
    in.tag = (2 * k + (back ? 1 : 0)) * micros + micro;
    return in;
  }

  const ir::Module& m_;
  int stage_, replica_;
  int lossStage_ = 0;
  std::map<int, int> boundary_; // forward send/recv op -> its index among them
};

// The most micro-batches whose activations a stage holds (forward done, the whole backward
// or W not) over its order.
int peakInFlight(const std::vector<ir::WorkItem>& order) {
  int now = 0, peak = 0;
  for (const ir::WorkItem& w : order) {
    now += w.kind == ir::WorkKind::Forward ? 1 : w.kind == ir::WorkKind::BackwardInput ? 0 : -1;
    peak = std::max(peak, now);
  }
  return std::max(peak, 1);
}

int64_t bytesOf(const ir::Module& m, int t) {
  auto b = m.bytesOf(t);
  EPL_ASSERT(b.has_value(), "a transferred tensor has an unbound dim");
  return *b;
}

std::string transferLabel(const ir::Module& m, const ir::Instr& in) {
  bool grad = m.ops[in.op].phase == ir::Phase::Backward;
  bool send = in.kind == ir::InstrKind::Send;
  return fmt::format("{} {} %{} of micro-batch {} {} rank {}", send ? "send" : "recv",
                     grad ? "gradient" : "activation", m.tensors[in.tensor].name, in.micro,
                     send ? "to" : "from", in.peer);
}

// Data-parallel copies (step 6): the stage's buckets start right after the op that readies
// them in the last micro-batch's backward, and are waited for, in the order they started,
// before the first optimizer op (the gradient norm reads them).
void addGradientReductions(const ir::Module& m, int stage, std::vector<ir::Instr>& step) {
  std::multimap<int, int> readyAfter; // ready op -> bucket
  for (size_t b = 0; b < m.buckets.size(); ++b)
    if (m.buckets[b].stage == stage) readyAfter.emplace(m.buckets[b].readyOp, static_cast<int>(b));
  if (readyAfter.empty()) return;
  int last = static_cast<int>(m.policy.microBatches) - 1;
  std::vector<ir::Instr> out;
  std::vector<int> started;
  bool waited = false;
  for (const ir::Instr& in : step) {
    bool optimizer = in.kind == ir::InstrKind::Run && m.ops[in.op].phase == ir::Phase::Optimizer;
    if (optimizer && !waited) {
      for (int b : started)
        out.push_back({ir::InstrKind::ReduceWait, -1, last, b});
      waited = true;
    }
    out.push_back(in);
    // A bucket is ready once its op wrote the parameter gradients: zb's B part writes none.
    if (in.kind != ir::InstrKind::Run || in.micro != last || in.part == ir::BackwardPart::Inputs)
      continue;
    auto [begin, end] = readyAfter.equal_range(in.op);
    for (auto it = begin; it != end; ++it) {
      out.push_back({ir::InstrKind::ReduceStart, -1, last, it->second});
      started.push_back(it->second);
    }
  }
  EPL_ASSERT(waited && started.size() == readyAfter.size(),
             "every gradient bucket of a stage starts after one of its backward ops");
  step = std::move(out);
}

} // namespace

std::vector<ir::Program> pipelinePrograms(const ir::Module& m) {
  int stages = static_cast<int>(m.mesh.stages.size());
  int micros = static_cast<int>(m.policy.microBatches);
  ir::PipelineShape shape{stages, micros, 1};
  ir::Schedule schedule = m.policy.schedule;
  EPL_ASSERT(ir::scheduleRequirement(schedule, shape).empty(),
             "mesh-assignment accepted a schedule that cannot order this pipeline");
  std::vector<ir::Program> out;
  for (int r = 0; r < m.mesh.dataParallel; ++r)
    for (int s = 0; s < stages; ++s) {
      StageProgram stage(m, s, r);
      ir::Program p;
      p.rank = m.mesh.rank(r, s, 0);
      EPL_ASSERT(p.rank == static_cast<int>(out.size()), "programs are in rank order");
      p.stage = s;
      p.stages = stages;
      p.dataRank = r;
      p.lossRank = m.mesh.rank(r, stage.lossStage(), 0);
      for (size_t q = 0; q < m.params.size(); ++q)
        if (m.params[q].grad >= 0 && m.ops[m.params[q].op].stage == s)
          p.params.push_back(static_cast<int>(q));
      std::vector<ir::WorkItem> order = ir::stageOrder(schedule, s, shape);
      p.slots = peakInFlight(order);
      p.step.push_back({ir::InstrKind::ZeroGrads, -1, 0, -1});
      for (const ir::WorkItem& w : order) {
        if (w.kind == ir::WorkKind::Forward)
          stage.forward(w.micro, true, p.step);
        else if (w.kind == ir::WorkKind::Backward)
          stage.backward(w.micro, p.step);
        else
          stage.backwardPart(w.kind == ir::WorkKind::BackwardInput ? ir::BackwardPart::Inputs
                                                                   : ir::BackwardPart::Params,
                             w.micro, p.step);
      }
      stage.optimizer(p.step);
      addGradientReductions(m, s, p.step);
      stage.forward(0, false, p.eval);
      for (const auto* list : {&p.step, &p.eval})
        for (const ir::Instr& in : *list)
          if (in.kind == ir::InstrKind::Recv) p.recvBytes += (bytesOf(m, in.tensor) + 63) / 64 * 64;
      out.push_back(std::move(p));
    }
  return out;
}

ir::CommStreams programStreams(const ir::Module& m, bool eval) {
  ir::CommStreams streams;
  streams.ranks.resize(m.programs.size());
  std::vector<int> all;
  for (size_t r = 0; r < m.programs.size(); ++r)
    all.push_back(static_cast<int>(r));
  int world = streams.addGroup(all);
  // Data-parallel copies of a pipeline: each stage's ranks across the replicas sum its
  // gradients; each replica's ranks sum the squared gradient norm.
  const ir::Mesh& mesh = m.mesh;
  bool copies = m.programs.size() > 1 && m.programs[0].stages > 1 && m.reduceRanks > 1;
  std::vector<int> stageGroup, pipelineGroup;
  for (size_t s = 0; copies && s < mesh.stages.size(); ++s)
    stageGroup.push_back(streams.addGroup(mesh.stageReplicaRanks(static_cast<int>(s))));
  for (int r = 0; copies && r < mesh.dataParallel; ++r)
    pipelineGroup.push_back(streams.addGroup(mesh.pipelineRanks(r)));
  for (size_t r = 0; r < m.programs.size(); ++r) {
    const ir::Program& p = m.programs[r];
    const std::vector<ir::Instr>& list = eval ? p.eval : p.step;
    int rank = static_cast<int>(r);
    auto add = [&](ir::CommEvent e, size_t position) {
      e.position = static_cast<int>(position);
      return streams.add(rank, std::move(e));
    };
    // 1. Every receive is posted when the program starts.
    std::map<size_t, int> posted;
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].kind == ir::InstrKind::Recv)
        posted[i] = add(ir::CommEvent::irecv(list[i].peer, list[i].tag, bytesOf(m, list[i].tensor),
                                             ir::DType::F32, transferLabel(m, list[i])),
                        i);
    // 2. In program order: sends start and are waited, receives waited, collectives.
    std::map<int, int> reduces; // bucket -> its started all-reduce
    for (size_t i = 0; i < list.size(); ++i) {
      const ir::Instr& in = list[i];
      switch (in.kind) {
      case ir::InstrKind::Send: {
        int e = add(ir::CommEvent::isend(in.peer, in.tag, bytesOf(m, in.tensor), ir::DType::F32,
                                         transferLabel(m, in)),
                    i);
        add(ir::CommEvent::wait(e), i);
        break;
      }
      case ir::InstrKind::Recv:
        add(ir::CommEvent::wait(posted.at(i)), i);
        break;
      case ir::InstrKind::ReduceStart:
        reduces[in.bucket] =
            add(ir::CommEvent::icollective(ir::CollectiveKind::AllReduce,
                                           copies ? stageGroup.at(p.stage) : world,
                                           m.buckets.at(in.bucket).bytes, ir::DType::F32,
                                           fmt::format("reduce-start bucket {}", in.bucket)),
                i);
        break;
      case ir::InstrKind::ReduceWait:
        add(ir::CommEvent::wait(reduces.at(in.bucket)), i);
        break;
      case ir::InstrKind::Run:
        if (p.stages > 1 && m.ops[in.op].kind == ir::OpKind::GradNorm)
          add(ir::CommEvent::collectiveOp(ir::CollectiveKind::AllReduce,
                                          copies ? pipelineGroup.at(p.dataRank) : world, 4,
                                          ir::DType::F32, "all-reduce the squared gradient norm"),
              i);
        break;
      default:
        break;
      }
    }
    // 3. The step's loss reaches every rank: a pipeline's from its last stage; with data
    // parallelism, every rank's is gathered (Executor::runStep).
    if (eval || m.programs.size() == 1) continue;
    if (p.stages > 1 && !copies)
      add(ir::CommEvent::broadcast(world, p.lossRank, 8, ir::DType::F32, "broadcast the loss"),
          list.size());
    else
      add(ir::CommEvent::collectiveOp(ir::CollectiveKind::AllGather, world, 24, ir::DType::F32,
                                      "all-gather the loss"),
          list.size());
  }
  return streams;
}

} // namespace epl::passes
