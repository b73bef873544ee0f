// The rank programs of a pipeline (stages of one or several devices, model chunks,
// data-parallel copies), and the communication of every rank's program for the stream
// check.
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
//   6. Stage groups and data-parallel copies: a stage of g devices in each of d replicas
//      has d x g ranks, each running the stage's program on its own share of every
//      micro-batch (rank (r, s, i) holds the replica's samples [i M/g, (i+1) M/g) of a
//      micro-batch of M); its gradient buckets are summed over those ranks, started after
//      the backward op that readies them in the last micro-batch and waited for before the
//      gradient norm and the optimizer. Between stages of different group sizes a
//      micro-batch is re-cut: each rank sends each rank of the next group the samples their
//      shares have in common (and the gradients of them back), within its replica.
//   7. Chunks (`chunks = v`, interleaved): rank position s runs stage blocks s, s + p, …,
//      s + (v - 1)·p of a pipeline of p = blocks / v positions; the schedule's item of
//      chunk c is block c·p + s. A micro-batch is loaded by its first chunk's forward and
//      holds one slot (every chunk's activations) until its last item.
#include "passes/PipelinePrograms.h"

#include "ir/PipelineSchedule.h"
#include "support/Assert.h"

#include <algorithm>
#include <fmt/format.h>
#include <limits>
#include <map>
#include <unordered_map>

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

// Where rank `local` of a stage group of `group` devices starts and ends in a micro-batch
// of `micro` samples.
struct Share {
  int64_t begin, end;
};
Share shareOf(int64_t micro, int group, int local) {
  return {micro / group * local, micro / group * (local + 1)};
}

// The program of one rank: the stage blocks on its device group (one, or `chunks` of them
// under an interleaved schedule), each method working on one block.
class StageProgram {
public:
  explicit StageProgram(const ir::Module& m) : m_(m) {
    int k = 0;
    for (size_t i = 0; i < m.ops.size(); ++i)
      if (m.ops[i].kind == ir::OpKind::SendRecv && m.ops[i].phase == ir::Phase::Forward)
        boundary_[static_cast<int>(i)] = k++;
    lossStage_ = m.ops[m.tensors[m.outputs[0]].producer].stage;
    // Each block's ops of the forward and of the backward pass, in program order.
    size_t blocks = m.mesh.stages.size();
    ops_[0].resize(blocks);
    ops_[1].resize(blocks);
    for (size_t i = 0; i < m.ops.size(); ++i) {
      const ir::Op& op = m.ops[i];
      if (op.phase == ir::Phase::Optimizer) continue;
      auto& byBlock = ops_[ir::inBackwardPass(op.phase) ? 1 : 0];
      auto add = [&](int64_t b) {
        if (b >= 0 && b < static_cast<int64_t>(blocks))
          byBlock[static_cast<size_t>(b)].push_back(static_cast<int>(i));
      };
      if (op.kind != ir::OpKind::SendRecv) {
        add(op.stage);
        continue;
      }
      int64_t from = ir::intAttr(op.attrs, "from_stage"), to = ir::intAttr(op.attrs, "to_stage");
      add(from); // its sending block and its receiving one (roleOn)
      if (to != from) add(to);
    }
  }

  // Micro-batch `micro`'s forward on stage block `block`, into `out`: its first chunk loads
  // the micro-batch (every input this rank's blocks read); `seed` adds the loss gradient.
  void forward(int block, int micro, bool seed, std::vector<ir::Instr>& out) const {
    if (block < m_.mesh.depth()) out.push_back({ir::InstrKind::Load, -1, micro, -1});
    appendPhase(ir::Phase::Forward, block, micro, out);
    if (seed && block == lossStage_) out.push_back({ir::InstrKind::SeedGrad, -1, micro, -1});
  }
  void backward(int block, int micro, std::vector<ir::Instr>& out) const {
    appendPhase(ir::Phase::Backward, block, micro, out);
  }
  // One part of a split backward: Inputs keeps the transfers, the recomputations and the
  // ops that write an input gradient; Params only the ops that write a parameter gradient.
  void backwardPart(ir::BackwardPart part, int block, int micro,
                    std::vector<ir::Instr>& out) const {
    std::vector<ir::Instr> whole;
    appendPhase(ir::Phase::Backward, block, micro, whole);
    for (ir::Instr in : whole) {
      bool run = in.kind == ir::InstrKind::Run;
      if (run && m_.ops[in.op].phase == ir::Phase::Recompute) {
        if (part == ir::BackwardPart::Inputs) out.push_back(in);
        continue;
      }
      if (run ? !writesAny(m_, m_.ops[in.op], part) : part != ir::BackwardPart::Inputs) continue;
      if (run) in.part = part;
      out.push_back(in);
    }
  }
  // The gradient norm and the optimizer ops of the parameters of the blocks at `position`.
  void optimizer(int position, std::vector<ir::Instr>& out) const {
    for (size_t i = 0; i < m_.ops.size(); ++i) {
      const ir::Op& op = m_.ops[i];
      if (op.phase == ir::Phase::Optimizer &&
          (op.kind == ir::OpKind::GradNorm || op.stage % m_.mesh.depth() == position))
        out.push_back({ir::InstrKind::Run, static_cast<int>(i), 0, -1});
    }
  }
  int lossStage() const { return lossStage_; }
  // The rank of the programs that follow: rank `local` of its stage group in `replica`.
  void at(int replica, int local) {
    replica_ = replica;
    local_ = local;
  }
  // About how many instructions one micro-batch's forward and backward on `block` add.
  size_t perMicro(int block) const { return 2 + ops_[0][block].size() + ops_[1][block].size(); }

private:
  // The ops of `phase` on `block` (the backward's recomputations with the backward).
  void appendPhase(ir::Phase phase, int block, int micro, std::vector<ir::Instr>& out) const {
    for (int id : ops_[phase == ir::Phase::Forward ? 0 : 1][block]) {
      const ir::Op& op = m_.ops[id];
      switch (roleOn(op, block)) {
      case Role::None:
        break;
      case Role::Run:
        out.push_back({ir::InstrKind::Run, id, micro, -1});
        break;
      case Role::Send:
        transfers(ir::InstrKind::Send, block, id, micro, op.inputs.at(0), "to_stage", out);
        break;
      case Role::Recv:
        EPL_ASSERT(op.outputs.at(0) >= 0, "a received gradient has no buffer");
        transfers(ir::InstrKind::Recv, block, id, micro, op.outputs[0], "from_stage", out);
        break;
      }
    }
  }

  // Op `op`'s transfers of `tensor` with the ranks of the stage named by `peerKey` in this
  // replica: the one of the same index when the groups are alike, else every rank whose
  // share of the micro-batch overlaps this rank's (step 6). A whole tensor (out of a split
  // region, or into a stage of split regions alone) is held alike by every device of a
  // split group, for the group's copy's share of the micro-batch: the shares are the
  // copies', and every device of a receiving copy receives, from the sending copy's device
  // of its index modulo that copy's width. So the sends are spread over the sending copy's
  // devices (one each between split groups of one width), not all made by its first.
  void transfers(ir::InstrKind kind, int block, int op, int micro, int tensor, const char* peerKey,
                 std::vector<ir::Instr>& out) const {
    const ir::Op& o = m_.ops[op];
    bool back = o.phase == ir::Phase::Backward;
    int k = boundary_.at(back ? o.forward : op);
    int micros = static_cast<int>(m_.policy.microBatches);
    int peerStage = static_cast<int>(ir::intAttr(o.attrs, peerKey));
    const ir::StagePlan &here = m_.mesh.stages[block], &there = m_.mesh.stages[peerStage];
    // Whole or not is the transfer's: its forward op's output says (the tensor sent from a
    // stage without split regions is data-parallel there, which is the same as whole).
    const ir::Op& fwdOp = back ? m_.ops[o.forward] : o;
    bool whole = m_.tensors[fwdOp.outputs[0]].layout.kind != ir::LayoutKind::DataParallel;
    // Devices of one copy of the data on each side, and the copies.
    int myWidth = whole ? here.splitWidth : 1, theirWidth = whole ? there.splitWidth : 1;
    int mine = here.group / myWidth, theirs = there.group / theirWidth;
    int myUnit = local_ / myWidth, myDevice = local_ % myWidth;
    bool sends = kind == ir::InstrKind::Send;
    // The peers of copy j: when this rank sends, the devices whose index is this one's
    // modulo this copy's width; when it receives, the one device it receives from.
    auto peers = [&](int j) {
      std::vector<int> ranks;
      if (!sends)
        ranks.push_back(m_.mesh.rank(replica_, peerStage, j * theirWidth + myDevice % theirWidth));
      else
        for (int s = myDevice; s < theirWidth; s += myWidth)
          ranks.push_back(m_.mesh.rank(replica_, peerStage, j * theirWidth + s));
      return ranks;
    };
    ir::Instr in{kind, op, micro, -1};
    in.tensor = tensor;
    in.tag = (2 * k + (back ? 1 : 0)) * micros + micro;
    in.accumulate = kind == ir::InstrKind::Recv && !o.accumulate.empty() && o.accumulate[0];
    if (mine == theirs) {
      for (int peer : peers(myUnit)) {
        in.peer = peer;
        out.push_back(in);
      }
      return;
    }
    EPL_ASSERT(!m_.tensors[tensor].type.shape.empty() &&
                   m_.tensors[tensor].type.shape[0] == ir::Dim::symbol(m_.batchSymbol),
               "a tensor re-cut between stage groups is batch-first");
    int64_t micro0 = m_.mesh.microBatch;
    Share me = shareOf(micro0, mine, myUnit);
    for (int j = 0; j < theirs; ++j) {
      Share peer = shareOf(micro0, theirs, j);
      int64_t begin = std::max(me.begin, peer.begin), end = std::min(me.end, peer.end);
      if (begin >= end) continue;
      in.firstRow = static_cast<int>(begin - me.begin); // samples of one micro-batch
      in.rows = static_cast<int>(end - begin);
      for (int rank : peers(j)) {
        in.peer = rank;
        out.push_back(in);
      }
    }
  }

  const ir::Module& m_;
  int replica_ = 0, local_ = 0;
  int lossStage_ = 0;
  std::map<int, int> boundary_;          // forward send/recv op -> its index among them
  std::vector<std::vector<int>> ops_[2]; // [forward, backward pass][block] -> op ids
};

// The most micro-batches whose activations a stage holds over its order: from the first
// item of a micro-batch (its first chunk's forward) to its last (its first chunk's whole
// backward or W).
int peakInFlight(const std::vector<ir::WorkItem>& order, int micros) {
  std::vector<int> last(micros, -1);
  for (size_t i = 0; i < order.size(); ++i)
    last[order[i].micro] = static_cast<int>(i);
  std::vector<bool> started(micros, false);
  int now = 0, peak = 1;
  for (size_t i = 0; i < order.size(); ++i) {
    int micro = order[i].micro;
    if (!started[micro]) {
      started[micro] = true;
      peak = std::max(peak, ++now);
    }
    if (last[micro] == static_cast<int>(i)) --now;
  }
  return peak;
}

std::string transferLabel(const ir::Module& m, const ir::Instr& in) {
  bool grad = m.ops[in.op].phase == ir::Phase::Backward;
  bool send = in.kind == ir::InstrKind::Send;
  return fmt::format("{} {} %{}{} of micro-batch {} {} rank {}", send ? "send" : "recv",
                     grad ? "gradient" : "activation", m.tensors[in.tensor].name,
                     in.rows < 0 ? ""
                                 : fmt::format(" rows {}..{}", in.firstRow, in.firstRow + in.rows),
                     in.micro, send ? "to" : "from", in.peer);
}

} // namespace

namespace {

// By instruction of `step`, the buckets of pipeline position `position` whose reduction
// starts right after it, in bucket order: after the last instruction that writes one of a
// bucket's gradients (in each micro-batch under ZeRO stage 2, whose every micro-batch
// reduce-scatters its own; in the step otherwise, the micro-batches adding into one
// gradient), and not before the run of its ready op (GradBucket::readyOp: with
// `overlap_comm = false` the stage's last backward op, a tied weight's too) in that
// micro-batch (the last one without ZeRO). Zero-bubble schedules run parameter gradients
// (the W parts) after a later op's input gradients (its B part): a bucket is ready only
// after the last of them, whichever op readies it.
// Whether bucket b is reduced by the ranks of pipeline position `position` (its stage runs
// there).
bool reducedAt(const ir::Module& m, const ir::GradBucket& b, int position) {
  return b.stage % m.mesh.depth() == position;
}

std::vector<std::vector<int>> reductionStarts(const ir::Module& m, int position,
                                              const std::vector<ir::Instr>& step) {
  bool perMicro = m.zeroShardsGradients();
  int last = static_cast<int>(m.policy.microBatches) - 1;
  // The position's buckets, in order; below, a bucket is its index in `mine`.
  std::vector<int> mine;
  std::vector<int> bucketOfGrad(m.tensors.size(), -1);
  std::vector<std::vector<int>> readyAfter(m.ops.size()); // by op, the buckets it readies
  for (size_t b = 0; b < m.buckets.size(); ++b) {
    const ir::GradBucket& g = m.buckets[b];
    if (!reducedAt(m, g, position)) continue;
    int local = static_cast<int>(mine.size());
    mine.push_back(static_cast<int>(b));
    readyAfter[g.readyOp].push_back(local);
    for (int q = g.firstParam; q < g.endParam; ++q)
      if (m.params[q].grad >= 0) bucketOfGrad[m.params[q].grad] = local;
  }
  // A ready op's B part readies nothing where the op has parameters (their gradients come
  // in its W part); an op without any runs only its B part.
  auto readies = [&](const ir::Instr& in) {
    return in.part != ir::BackwardPart::Inputs || m.ops[m.ops[in.op].forward].params.empty();
  };
  // By micro-batch (or 0) and bucket, the last instruction that readies it (kNone: none):
  // a table, not a map, for its lookup at every instruction that writes a gradient.
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  size_t nb = mine.size();
  std::vector<size_t> at((perMicro ? static_cast<size_t>(last) + 1 : 1) * nb, kNone);
  auto ready = [&](int micro, int b, size_t i) {
    EPL_ASSERT(micro >= 0 && micro <= last, "a backward instruction of a micro-batch");
    size_t& where = at[static_cast<size_t>(micro) * nb + static_cast<size_t>(b)];
    where = where == kNone ? i : std::max(where, i);
  };
  for (size_t i = 0; i < step.size(); ++i) {
    const ir::Instr& in = step[i];
    if (in.kind != ir::InstrKind::Run) continue;
    const ir::Op& op = m.ops[in.op];
    if (op.phase == ir::Phase::Optimizer) continue;
    // Without ZeRO stage 2 only the last micro-batch's writes count: every schedule runs the
    // micro-batches' backward ops (and W parts) in increasing micro-batch order, each
    // micro-batch all of them, so the last write of a gradient is the last micro-batch's.
    if (!perMicro && in.micro != last) continue;
    int micro = perMicro ? in.micro : 0;
    if (readies(in))
      for (int b : readyAfter[in.op])
        ready(micro, b, i);
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      int t = op.outputs[k];
      if (t >= 0 && bucketOfGrad[t] >= 0 && m.runWrites(in, k)) ready(micro, bucketOfGrad[t], i);
    }
  }
  std::vector<std::vector<int>> after(step.size());
  for (size_t k = 0; k < at.size(); ++k)
    if (at[k] != kNone) after[at[k]].push_back(mine[k % nb]);
  for (std::vector<int>& list : after)
    std::sort(list.begin(), list.end());
  return after;
}

} // namespace

// Data-parallel copies (step 6): the stage's buckets start right after the last instruction
// that readies them in the last micro-batch's backward (reductionStarts), and are waited
// for, in the order they started, before the first optimizer op (the gradient norm reads
// them). With ZeRO stage 2 every micro-batch's start there, each waited for once the next
// has started, and the last at once, inside the backward that wrote them (the schedule
// pass's data-parallel plans too).
void addGradientReductions(const ir::Module& m, int position, std::vector<ir::Instr>& step) {
  int last = static_cast<int>(m.policy.microBatches) - 1;
  std::vector<std::vector<int>> after = reductionStarts(m, position, step);
  size_t buckets = 0;
  for (const ir::GradBucket& b : m.buckets)
    buckets += reducedAt(m, b, position);
  if (buckets == 0) return;
  std::vector<ir::Instr> out;
  if (m.zeroShardsGradients()) {
    out.reserve(step.size() + 3 * buckets * static_cast<size_t>(last + 1));
    // By model chunk (a stage block of the position): its buckets; by micro-batch and
    // chunk, those started, in order. A chunk's last is waited for inside its backward, so
    // that a micro-batch's buckets of one chunk are done before the next micro-batch's of
    // the same chunk start (under `interleaved`, the other chunk's backward comes later).
    std::map<int, size_t> perChunk;
    for (const ir::GradBucket& b : m.buckets)
      if (reducedAt(m, b, position)) ++perChunk[b.stage];
    std::map<std::pair<int, int>, std::vector<int>> started;
    for (size_t i = 0; i < step.size(); ++i) {
      const ir::Instr& in = step[i];
      out.push_back(in);
      for (int b : after[i]) {
        int chunk = m.buckets[b].stage;
        std::vector<int>& mine = started[{in.micro, chunk}];
        out.push_back({ir::InstrKind::ReduceStart, -1, in.micro, b});
        mine.push_back(b);
        if (mine.size() > 1)
          out.push_back({ir::InstrKind::ReduceWait, -1, in.micro, mine[mine.size() - 2]});
        if (mine.size() == perChunk[chunk])
          out.push_back({ir::InstrKind::ReduceWait, -1, in.micro, mine.back()});
      }
    }
    EPL_ASSERT(started.size() == static_cast<size_t>(last + 1) * perChunk.size(),
               "every micro-batch reduces its gradient buckets");
    // A tied weight's slices: summed over the stages holding it once every micro-batch's
    // reduce-scatter is done, before the gradient norm and the optimizer read them. Every
    // such stage starts its sums in the weights' order, so the collectives meet.
    std::vector<int> tied;
    for (size_t b = 0; b < m.buckets.size(); ++b)
      if (m.buckets[b].tied && reducedAt(m, m.buckets[b], position))
        tied.push_back(static_cast<int>(b));
    std::sort(tied.begin(), tied.end(),
              [&](int a, int b) { return m.buckets[a].firstParam < m.buckets[b].firstParam; });
    auto optimizer = std::find_if(out.begin(), out.end(), [&](const ir::Instr& in) {
      return in.kind == ir::InstrKind::Run && m.ops[in.op].phase == ir::Phase::Optimizer;
    });
    std::vector<ir::Instr> sums;
    for (ir::InstrKind kind : {ir::InstrKind::ReduceStart, ir::InstrKind::ReduceWait})
      for (int b : tied) {
        ir::Instr in{kind, -1, last, b};
        in.tie = true;
        sums.push_back(in);
      }
    out.insert(optimizer, sums.begin(), sums.end());
    step = std::move(out);
    return;
  }
  auto optimizer = [&](const ir::Instr& in) {
    return in.kind == ir::InstrKind::Run && m.ops[in.op].phase == ir::Phase::Optimizer;
  };
  // Only the instructions from the first that readies a bucket on move (the last
  // micro-batch's backward, near the step's end).
  size_t from = 0;
  while (from < step.size() && after[from].empty() && !optimizer(step[from]))
    ++from;
  out.reserve(step.size() - from + 3 * buckets);
  std::vector<int> started;
  bool waited = false;
  for (size_t i = from; i < step.size(); ++i) {
    const ir::Instr& in = step[i];
    if (optimizer(in) && !waited) {
      for (int b : started)
        out.push_back({ir::InstrKind::ReduceWait, -1, last, b});
      waited = true;
    }
    out.push_back(in);
    for (int b : after[i]) {
      out.push_back({ir::InstrKind::ReduceStart, -1, last, b});
      started.push_back(b);
    }
  }
  // A stage none of whose parameters reaches the loss has no optimizer op (Autodiff warns):
  // its bucket of zeros is waited for at the step's end.
  if (!waited)
    for (int b : started)
      out.push_back({ir::InstrKind::ReduceWait, -1, last, b});
  EPL_ASSERT(started.size() == buckets,
             "every gradient bucket of a stage starts after one of its backward ops");
  step.resize(from);
  step.insert(step.end(), out.begin(), out.end());
}

void placeReceives(const ir::Module& m, ir::Program& p) {
  p.recvBytes = m.receivePlan(p, p.step, p.recvRing).bytes + m.receivePlan(p, p.eval, 0).bytes;
}

namespace {

// The parameters with gradients a program of pipeline position p.stage holds.
void holdParams(const ir::Module& m, ir::Program& p) {
  for (size_t q = 0; q < m.params.size(); ++q)
    if (m.params[q].grad >= 0 && m.holdsParam(p, static_cast<int>(q)))
      p.params.push_back(static_cast<int>(q));
}

} // namespace

std::vector<ir::Program> costOnlyOutlines(const ir::Module& m) {
  std::vector<ir::Program> out(static_cast<size_t>(m.mesh.depth()));
  for (size_t s = 0; s < out.size(); ++s) {
    ir::Program& p = out[s];
    p.stage = static_cast<int>(s);
    p.stages = m.mesh.depth();
    p.dataRanks = m.mesh.dataParallel * m.mesh.stages[s].group;
    holdParams(m, p);
  }
  return out;
}

std::vector<ir::Program> pipelinePrograms(const ir::Module& m,
                                          const std::function<bool(ir::Program&)>& made,
                                          const std::function<bool(int)>& want) {
  const ir::Mesh& mesh = m.mesh;
  int depth = mesh.depth();
  int micros = static_cast<int>(m.policy.microBatches);
  ir::PipelineShape shape{depth, micros, mesh.chunks};
  ir::Schedule schedule = m.policy.schedule;
  EPL_ASSERT(ir::scheduleRequirement(schedule, shape).empty(),
             "mesh-assignment accepted a schedule that cannot order this pipeline");
  EPL_ASSERT(!want || m.costOnly, "only a cost-only plan leaves positions out");
  std::vector<ir::Program> out;
  StageProgram stage(m);
  for (int r = 0; r < (m.costOnly ? 1 : mesh.dataParallel); ++r)
    for (int s = 0; s < depth; ++s)
      for (int local = 0; local < (m.costOnly ? 1 : mesh.stages[s].group) && (!want || want(s));
           ++local) {
        stage.at(r, local);
        int group = mesh.stages[s].group; // every chunk's block of this position has it
        int rank = mesh.rank(r, s, local);
        EPL_ASSERT(m.costOnly || rank == static_cast<int>(out.size()),
                   "programs are in rank order");
        // The loss's stage computes it on each of its ranks; the others name the first.
        int lossBlock = stage.lossStage();
        auto place = [&](ir::Program& p) {
          p.rank = rank;
          p.replica = r;
          p.dataRanks = mesh.dataParallel * group;
          p.dataRank = r * group + local;
          mesh.placeBatch(p);
          p.lossRank = lossBlock % depth == s ? p.rank : mesh.rank(r, lossBlock, 0);
        };
        // Another replica runs replica 0's program of its place on its own ranks: the same
        // instructions, the peers moved by whole replicas (replica r holds ranks r x
        // replicaSize on).
        if (r > 0) {
          EPL_ASSERT(rank - r * mesh.replicaSize == mesh.rank(0, s, local),
                     "a replica's ranks follow replica 0's");
          ir::Program p = out[mesh.rank(0, s, local)];
          place(p);
          for (std::vector<ir::Instr>* list : {&p.step, &p.eval})
            for (ir::Instr& in : *list)
              if (in.peer >= 0) in.peer += r * mesh.replicaSize;
          out.push_back(std::move(p));
          if (made && made(out.back())) return out;
          continue;
        }
        ir::Program p;
        p.stage = s;
        p.stages = depth;
        p.local = local;
        p.splitWidth = mesh.stages[s].splitWidth;
        place(p);
        p.splitRank = local % p.splitWidth;
        p.microBatches = micros;
        p.commDtype = m.policy.commDtype;
        holdParams(m, p);
        std::vector<ir::WorkItem> order = ir::stageOrder(schedule, s, shape);
        p.slots = peakInFlight(order, micros);
        size_t size = 0;
        for (int c = 0; c < mesh.chunks; ++c)
          size += stage.perMicro(c * depth + s);
        p.step.reserve(size * static_cast<size_t>(micros) + m.ops.size() / depth + 16);
        p.step.push_back({ir::InstrKind::ZeroGrads, -1, 0, -1});
        for (const ir::WorkItem& w : order) {
          int block = w.chunk * depth + s; // chunk c of this position is virtual stage c·p + s
          if (w.kind == ir::WorkKind::Forward)
            stage.forward(block, w.micro, true, p.step);
          else if (w.kind == ir::WorkKind::Backward)
            stage.backward(block, w.micro, p.step);
          else
            stage.backwardPart(w.kind == ir::WorkKind::BackwardInput ? ir::BackwardPart::Inputs
                                                                     : ir::BackwardPart::Params,
                               block, w.micro, p.step);
        }
        stage.optimizer(s, p.step);
        addGradientReductions(m, s, p.step);
        for (int c = 0; c < mesh.chunks; ++c)
          stage.forward(c * depth + s, 0, false, p.eval);
        addParamGathers(m, p, p.step, &p.keepsGather);
        addParamGathers(m, p, p.eval);
        // The step's receives in a ring of buffers: those of the micro-batches a slot can
        // hold, and one more micro-batch's, so each is posted well before it is waited for.
        int receives = 0;
        for (const ir::Instr& in : p.step)
          receives += in.kind == ir::InstrKind::Recv;
        int perMicro = (receives + micros - 1) / micros;
        p.recvRing = std::min(receives, perMicro * (p.slots + 1));
        placeReceives(m, p);
        out.push_back(std::move(p));
        if (made && made(out.back())) return out;
      }
  return out;
}

// ZeRO stage 3: for each micro-batch, direction (the forward; the backward with its
// recomputation) and model chunk (a stage block; under `interleaved` a micro-batch's
// chunks run apart, other micro-batches' work between them), the buckets in the order its
// ops first read their parameters. Before the first reader of the k-th, its gather is
// waited for and the (k+1)-th's started, so one gather is in flight while a block
// computes; the first starts where it is waited for.
void addParamGathers(const ir::Module& m, const ir::Program& p, std::vector<ir::Instr>& list,
                     std::vector<char>* keep) {
  if (!m.zeroShardsParams()) return;
  std::vector<int> bucketOf = m.paramBuckets(p);
  // A key (micro-batch, use, chunk) as a dense number: (micro x 2 + use) x chunks + the
  // chunk's index among the stage blocks the list reads.
  std::vector<int> chunkIndex;
  int chunks = 0, micros = 0;
  auto reads = [&](const ir::Instr& in) {
    return in.kind == ir::InstrKind::Run && m.ops[in.op].phase != ir::Phase::Optimizer;
  };
  for (const ir::Instr& in : list) {
    if (!reads(in)) continue;
    EPL_ASSERT(in.micro >= 0, "a run instruction belongs to a micro-batch");
    int stage = m.ops[in.op].stage;
    if (chunkIndex.size() <= static_cast<size_t>(stage)) chunkIndex.resize(stage + 1, -1);
    if (chunkIndex[stage] < 0) chunkIndex[stage] = chunks++;
    micros = std::max(micros, in.micro + 1);
  }
  auto keyOf = [&](const ir::Instr& in) {
    int use = m.ops[in.op].phase == ir::Phase::Forward ? 0 : 1;
    return (static_cast<int64_t>(in.micro) * 2 + use) * chunks + chunkIndex[m.ops[in.op].stage];
  };
  auto microOf = [&](int64_t key) { return static_cast<int>(key / chunks / 2); };
  auto useOf = [&](int64_t key) { return static_cast<int>(key / chunks % 2); };
  size_t keys = static_cast<size_t>(micros) * 2 * static_cast<size_t>(chunks);
  // By key, its buckets in first-read order, and each one's first and last reader. A
  // bucket's reads come in runs under one key, so the last key each bucket was read under
  // answers most lookups; the hash map only those where its key changes.
  int64_t nb = static_cast<int64_t>(m.buckets.size());
  std::vector<std::vector<int>> order(keys);
  std::vector<std::vector<std::pair<size_t, size_t>>> span(keys);
  std::vector<int64_t> lastKey(m.buckets.size(), -1);
  std::vector<size_t> lastIndex(m.buckets.size(), 0);
  std::unordered_map<int64_t, size_t> indexOf; // key x buckets + bucket -> index in order[key]
  struct FirstUse {
    size_t at;   // the instruction
    int64_t key; // its key's k-th bucket
    size_t k;
  };
  std::vector<FirstUse> firstUses; // in instruction order
  for (size_t i = 0; i < list.size(); ++i) {
    const ir::Instr& in = list[i];
    if (!reads(in)) continue;
    int64_t key = keyOf(in);
    for (int q : m.ops[in.op].params) {
      int b = bucketOf[q];
      EPL_ASSERT(b >= 0, "ZeRO stage 3 gathers every parameter with its bucket");
      if (lastKey[b] != key) {
        auto [it, fresh] = indexOf.try_emplace(key * nb + b, order[key].size());
        if (fresh) {
          firstUses.push_back({i, key, it->second});
          order[key].push_back(b);
          span[key].push_back({i, i});
        }
        lastKey[b] = key;
        lastIndex[b] = it->second;
      }
      span[key][lastIndex[b]].second = i;
    }
  }
  // The buckets whose backward keeps the forward's block: in every micro-batch (and chunk)
  // that reads it both ways, the forward's last bucket and the backward's first, with no
  // other micro-batch's instruction between their readers.
  std::map<int, std::pair<int, int>> kept; // bucket -> (micro-batches keeping, reading both)
  std::vector<char> skipFirst(keys, 0);    // backward keys whose first bucket is kept
  if (keep) {
    for (size_t key = 0; key < keys; ++key) {
      const std::vector<int>& buckets = order[key];
      if (useOf(static_cast<int64_t>(key)) != 0 || buckets.empty()) continue;
      size_t back = key + static_cast<size_t>(chunks);
      if (order[back].empty()) continue;
      int b = buckets.back();
      std::pair<int, int>& count = kept[b];
      ++count.second;
      if (order[back].front() != b) continue;
      size_t from = span[key].back().second, to = span[back].front().first;
      bool adjacent = true;
      for (size_t i = from + 1; i < to && adjacent; ++i)
        adjacent = list[i].micro == microOf(static_cast<int64_t>(key)) ||
                   list[i].kind != ir::InstrKind::Run;
      if (adjacent) ++count.first;
    }
    keep->assign(m.buckets.size(), 0);
    for (const auto& [b, count] : kept)
      (*keep)[b] = count.first == count.second;
    for (size_t key = 0; key < keys; ++key)
      if (useOf(static_cast<int64_t>(key)) == 1 && !order[key].empty() &&
          (*keep)[order[key].front()])
        skipFirst[key] = 1;
  }
  std::vector<ir::Instr> out;
  out.reserve(list.size() + 3 * firstUses.size());
  auto gather = [&](ir::InstrKind kind, int64_t key, size_t k) {
    ir::Instr g{kind, -1, microOf(key), order[key][k]};
    g.use = static_cast<uint8_t>(useOf(key));
    out.push_back(g);
  };
  size_t next = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    for (; next < firstUses.size() && firstUses[next].at == i; ++next) {
      const FirstUse& u = firstUses[next];
      bool kept = u.k == 0 && skipFirst[u.key]; // reads the forward's block
      if (u.k == 0 && !kept) gather(ir::InstrKind::GatherStart, u.key, 0);
      if (!kept) gather(ir::InstrKind::GatherWait, u.key, u.k);
      if (u.k + 1 < order[u.key].size()) gather(ir::InstrKind::GatherStart, u.key, u.k + 1);
    }
    out.push_back(list[i]);
  }
  list = std::move(out);
}

ir::CommStreams programStreams(const ir::Module& m, bool eval, bool oneReplica) {
  EPL_ASSERT(!oneReplica || !m.zeroShardsParams(), "ZeRO-3's gathers span the replicas");
  ir::CommStreams streams;
  streams.ranks.resize(m.programs.size());
  // The ranks whose streams are built: [0, ranks).
  int ranks = static_cast<int>(m.programs.size());
  if (oneReplica) ranks = std::min(ranks, m.mesh.replicaSize);
  auto addGroup = [&](std::vector<int> members) {
    members.erase(std::remove_if(members.begin(), members.end(), [&](int r) { return r >= ranks; }),
                  members.end());
    return streams.addGroup(std::move(members));
  };
  std::vector<int> all;
  for (int r = 0; r < ranks; ++r)
    all.push_back(r);
  int world = addGroup(all);
  // A pipeline of more ranks than stages (stage groups, data-parallel copies): each
  // stage's ranks sum its gradients; each replica's ranks sum the squared gradient norm
  // (Executor::splitCommunicators).
  const ir::Mesh& mesh = m.mesh;
  int stages = m.programs.empty() ? 1 : m.programs[0].stages;
  bool grouped = stages > 1 && static_cast<int>(m.programs.size()) > stages;
  std::vector<int> stageGroup, replicaGroup;
  // A weight tied across stages: the ranks of its stages (holding the same pieces) sum it.
  std::map<std::pair<int, int>, int> tiedGroup; // (weight, split rank) -> its group
  auto tiedGroupOf = [&](int q, int rank) {
    int k = m.reducedOverPieces(q) ? m.programs[rank].splitRank : 0;
    auto it = tiedGroup.find({q, k});
    return it != tiedGroup.end() ? it->second : tiedGroup[{q, k}] = addGroup(m.tiedRanks(q, k));
  };
  for (int s = 0; grouped && s < stages; ++s)
    stageGroup.push_back(addGroup(mesh.stageRanks(s)));
  for (int r = 0; grouped && r < mesh.dataParallel; ++r)
    replicaGroup.push_back(addGroup(mesh.replicaRanks(r)));
  // A stage with split regions: each split group (consecutive ranks) runs the regions'
  // collectives; the ranks of one split rank of a stage in every copy and replica sum the
  // gradients of its pieces (Executor::splitCommunicators).
  std::map<int, int> splitGroup; // first rank of a split group -> its group
  auto splitGroupOf = [&](int rank, int width) {
    int first = rank - m.programs[rank].splitRank;
    auto it = splitGroup.find(first);
    if (it != splitGroup.end()) return it->second;
    std::vector<int> members;
    for (int k = 0; k < width; ++k)
      members.push_back(first + k);
    return splitGroup[first] = addGroup(members);
  };
  std::map<std::pair<int, int>, int> piecesGroup; // (stage, split rank) -> its group
  auto piecesGroupOf = [&](int rank) {
    const ir::Program& me = m.programs[rank];
    auto key = std::make_pair(me.stage, me.splitRank);
    auto it = piecesGroup.find(key);
    if (it != piecesGroup.end()) return it->second;
    std::vector<int> members;
    for (const ir::Program& q : m.programs)
      if (q.stage == me.stage && q.splitRank == me.splitRank) members.push_back(q.rank);
    return piecesGroup[key] = addGroup(members);
  };
  // ZeRO: the global rank of rank k of a stage's data-parallel group (its data rank k).
  auto zeroRankOf = [&](int stage, int k) {
    for (const ir::Program& q : m.programs)
      if (q.stage == stage && q.dataRank == k) return q.rank;
    EPL_ASSERT(false, "every data rank of a stage has a program");
    return -1;
  };
  // The global rank of the k-th rank (in rank order) holding the same split pieces as p.
  auto pieceRankOf = [&](const ir::Program& p, int k) {
    for (const ir::Program& q : m.programs)
      if (q.stage == p.stage && q.splitRank == p.splitRank && k-- == 0) return q.rank;
    EPL_ASSERT(false, "every rank of a pieces group has a program");
    return -1;
  };
  int lossRanks = m.lossRanks();
  bool hasMoe = std::any_of(m.ops.begin(), m.ops.end(),
                            [](const ir::Op& op) { return op.kind == ir::OpKind::MoeDispatch; });
  for (int r = 0; r < ranks; ++r) {
    const ir::Program& p = m.programs[r];
    const std::vector<ir::Instr>& list = eval ? p.eval : p.step;
    int rank = static_cast<int>(r);
    std::vector<std::vector<ir::Module::SlicePiece>> pieces;
    if (m.zeroShardsParams()) pieces = m.bucketPieces(p);
    auto add = [&](ir::CommEvent e, size_t position) {
      e.position = static_cast<int>(position);
      return streams.add(rank, std::move(e));
    };
    // 1. The receives posted when the program starts; the others once the receive before
    // them in their buffer was waited for (Module::receivePlan).
    ir::Module::ReceivePlan receives = m.receivePlan(p, list, eval ? 0 : p.recvRing);
    std::map<size_t, int> posted;
    std::multimap<int, size_t> postAfter; // receive -> the receives posted once it is waited
    auto post = [&](size_t i) {
      posted[i] = add(ir::CommEvent::irecv(list[i].peer, list[i].tag, m.transferBytes(p, list[i]),
                                           ir::DType::F32, transferLabel(m, list[i])),
                      i);
    };
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].kind != ir::InstrKind::Recv) continue;
      if (receives.postedAfter[i] < 0)
        post(i);
      else
        postAfter.emplace(receives.postedAfter[i], i);
    }
    // 2. In program order: sends start, receives waited, collectives. An evaluation's send
    // is waited at once; a step's before the next micro-batch takes its slot, or at the
    // step's end (Executor::send).
    std::map<int, int> reduces;                              // bucket -> its started all-reduce
    std::map<std::pair<int, int>, std::vector<int>> gathers; // (bucket, use) -> broadcasts
    std::vector<std::vector<int>> sending(p.slots);          // by slot: sends not yet waited
    std::vector<int> takesSlot(list.size(), -1); // instruction -> the micro-batch it starts
    if (!eval) {
      ir::Module::SlotUse use = m.slotUse(p);
      for (size_t micro = 0; micro < use.first.size(); ++micro)
        if (use.first[micro] >= 0) takesSlot[use.first[micro]] = static_cast<int>(micro);
    }
    auto finishSends = [&](int slot, size_t position) {
      for (int e : sending[slot])
        add(ir::CommEvent::wait(e), position);
      sending[slot].clear();
    };
    for (size_t i = 0; i < list.size(); ++i) {
      const ir::Instr& in = list[i];
      if (takesSlot[i] >= 0) finishSends(takesSlot[i] % p.slots, i);
      switch (in.kind) {
      case ir::InstrKind::Send: {
        int e = add(ir::CommEvent::isend(in.peer, in.tag, m.transferBytes(p, in), ir::DType::F32,
                                         transferLabel(m, in)),
                    i);
        if (eval)
          add(ir::CommEvent::wait(e), i);
        else
          sending[in.micro % p.slots].push_back(e);
        break;
      }
      case ir::InstrKind::Recv: {
        add(ir::CommEvent::wait(posted.at(i)), i);
        auto [first, last] = postAfter.equal_range(static_cast<int>(i));
        for (auto it = first; it != last; ++it)
          post(it->second);
        break;
      }
      case ir::InstrKind::ReduceStart: {
        // A tied weight's bucket is summed over every stage holding it: once a step, of
        // the whole bucket (zero 0 and 1) or of its slices (zero 2: `tie`, after each
        // micro-batch's reduce-scatter over the stage's ranks).
        const ir::GradBucket& b = m.buckets.at(in.bucket);
        bool scatter = m.zeroShardsGradients() && !in.tie;
        bool tie = b.tied && !scatter;
        reduces[in.bucket] =
            add(ir::CommEvent::icollective(
                    scatter ? ir::CollectiveKind::ReduceScatter : ir::CollectiveKind::AllReduce,
                    tie        ? tiedGroupOf(b.firstParam, rank)
                    : b.pieces ? piecesGroupOf(rank)
                    : grouped  ? stageGroup.at(p.stage)
                               : world,
                    b.bytes, ir::DType::F32,
                    tie ? fmt::format("reduce-start tied @{}", m.params[b.firstParam].name)
                        : fmt::format("reduce-start bucket {}", in.bucket)),
                i);
        break;
      }
      case ir::InstrKind::ReduceWait:
        add(ir::CommEvent::wait(reduces.at(in.bucket)), i);
        break;
      case ir::InstrKind::GatherStart: {
        // One broadcast from each rank whose slice holds part of the bucket.
        // A bucket of split pieces: over the ranks holding the same pieces (Module::
        // zeroSlices), the k-th of them in rank order.
        std::vector<int>& started = gathers[{in.bucket, in.use}];
        bool inPieces = m.buckets.at(in.bucket).pieces;
        for (const ir::Module::SlicePiece& piece : pieces.at(in.bucket))
          started.push_back(
              add(ir::CommEvent::broadcast(inPieces  ? piecesGroupOf(rank)
                                           : grouped ? stageGroup.at(p.stage)
                                                     : world,
                                           inPieces ? pieceRankOf(p, piece.rank)
                                                    : zeroRankOf(p.stage, piece.rank),
                                           piece.end - piece.begin, ir::DType::F32,
                                           fmt::format("gather-start bucket {}", in.bucket), true),
                  i));
        break;
      }
      case ir::InstrKind::GatherWait:
        for (int e : gathers.at({in.bucket, in.use}))
          add(ir::CommEvent::wait(e), i);
        gathers.erase({in.bucket, in.use});
        break;
      case ir::InstrKind::Run:
        if (auto c = m.splitCollective(p, in.op))
          add(ir::CommEvent::collectiveOp(
                  c->kind, splitGroupOf(rank, p.splitWidth), c->bytes, ir::DType::F32,
                  fmt::format("{} {}",
                              m.ops[in.op].phase == ir::Phase::Backward    ? "bwd"
                              : m.ops[in.op].phase == ir::Phase::Recompute ? "recompute"
                                                                           : "fwd",
                              m.ops[in.op].name)),
              i);
        if (p.stages == 1 && p.splitWidth > 1 && !m.zeroShardsGradients() &&
            m.ops[in.op].kind == ir::OpKind::GradNorm)
          add(ir::CommEvent::collectiveOp(ir::CollectiveKind::AllReduce,
                                          splitGroupOf(rank, p.splitWidth), 4, ir::DType::F32,
                                          "all-reduce the squared gradient norm"),
              i);
        if (m.zeroShardsGradients() && m.ops[in.op].kind == ir::OpKind::GradNorm)
          add(ir::CommEvent::collectiveOp(ir::CollectiveKind::AllReduce, world, 4, ir::DType::F32,
                                          "all-reduce the squared gradient norm"),
              i);
        if (p.stages > 1 && !m.zeroShardsGradients() && m.ops[in.op].kind == ir::OpKind::GradNorm)
          add(ir::CommEvent::collectiveOp(ir::CollectiveKind::AllReduce,
                                          grouped ? replicaGroup.at(p.replica) : world, 4,
                                          ir::DType::F32, "all-reduce the squared gradient norm"),
              i);
        break;
      default:
        break;
      }
    }
    for (int slot = 0; slot < p.slots; ++slot)
      finishSends(slot, list.size());
    // A vocabulary-parallel loss's evaluation gathers the logits (Executor::runEval).
    int loss = m.tensors[m.outputs[0]].producer;
    if (eval && p.splitWidth > 1 && p.lossRank == rank &&
        m.ops[loss].splitForm == ir::SplitForm::Vocab)
      add(ir::CommEvent::collectiveOp(ir::CollectiveKind::AllGather,
                                      splitGroupOf(rank, p.splitWidth),
                                      m.bytesOn(p, m.ops[loss].inputs[0]), ir::DType::F32,
                                      "all-gather the evaluation's logits"),
          list.size());
    // 3. The step's loss reaches every rank: from the one rank that computes it, or
    // gathered from every rank when several do (Executor::runStep).
    if (eval || m.programs.size() == 1) continue;
    if (lossRanks == 1 && p.stages > 1)
      add(ir::CommEvent::broadcast(world, p.lossRank, 8, ir::DType::F32, "broadcast the loss"),
          list.size());
    else if (lossRanks > 1)
      add(ir::CommEvent::collectiveOp(ir::CollectiveKind::AllGather, world, 24, ir::DType::F32,
                                      "all-gather the loss"),
          list.size());
    // 4. A model with moe: every rank's statistics of its experts' routing.
    if (hasMoe)
      add(ir::CommEvent::collectiveOp(ir::CollectiveKind::AllGather, world, 32, ir::DType::F32,
                                      "all-gather the moe statistics"),
          list.size());
  }
  return streams;
}

} // namespace epl::passes
