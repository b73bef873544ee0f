// memory-plan: place every activation and activation gradient of a rank in one arena.
//
//   1. Liveness over one micro-batch (later micro-batches reuse the same places) and the
//      optimizer phase: a tensor lives from the instruction that writes it first (model
//      inputs and `next` targets from the load) to the last one that reads or adds into
//      it. The loss lives to the end: the step reads it after the last micro-batch.
//   2. Offsets by a sweep in time order: at each instruction the tensors that died give
//      their blocks back (coalesced), then the ones born there, largest first, take the
//      smallest free block that holds them, else the top of the arena. O(n log n).
//   3. When the lifetimes overlap in few enough pairs (models of ordinary depth), also
//      largest tensor first at the lowest 64-byte-aligned offset free for its lifetime
//      (greedy by size), and keep the smaller arena. Its cost is the number of
//      overlapping pairs, quadratic in the depth of a model, so deep ones get step 2 only.
//   4. The arena is the highest end; parameters, their gradients and the optimizer
//      states are counted beside it. Evaluation runs a prefix of the forward ops, so its
//      lifetimes sit inside the step's and the same offsets serve it. Ranks that run the
//      same stream share one plan.
//   5. A pipeline stage interleaves micro-batches: the plan of its micro-batch 0 is one
//      slot, and the schedule pass decided how many slots the rank holds (Program::slots).
//      With a split backward (zb), micro-batch 0's W comes after its B in the stream: the
//      tensors W reads (activations, and gradients B wrote, such as a linear's dy) live
//      until it. A sent tensor lives to the end of the step: the transfer goes on in the
//      background until the slot's next micro-batch starts, or the step ends.
//   6. With several slots, what lives inside one run of its micro-batch's instructions
//      (sharedTensors) moves to one region after the slots, which the micro-batches use in
//      turn, when slots x the rest + that region is smaller than slots x the whole plan.
//   7. ZeRO stage 2 (Module::zeroShardsGradients): each gradient bucket is one more block
//      of the arena, written by the backward ops of its parameters and read by its
//      reduction, which ends at its reduce-wait; the rank's slice of the gradients is
//      counted beside the arena.
//   8. ZeRO stage 3 (Module::zeroShardsParams): each bucket's gathered parameters are two
//      blocks of the arena, one for the forward and one for the backward (with the
//      recomputation), each live from its gather's start to the last op that reads it; the
//      rank's slice of the parameters is counted beside the arena.
//   9. A kernel's workspace (Module::workspaceBytes, and with amp the CPU device's f32
//      copies of the half-precision operands, Module::ampStagingBytes) is one more block
//      for each op and backward part that takes one, live for its instruction alone.
#include "passes/Passes.h"

#include "support/Assert.h"
#include "support/RingScratch.h"

#include <algorithm>
#include <map>
#include <queue>
#include <set>

namespace epl::passes {

namespace {

constexpr int64_t kAlign = 64;
// Greedy by size costs about 25 ns a pair of overlapping lifetimes: 2M pairs, 50 ms.
constexpr int64_t kGreedyPairs = int64_t{1} << 21;

struct Interval {
  int tensor;
  int first, last;
  int64_t bytes;
};

struct Placement {
  std::vector<int64_t> offset; // by tensor, -1 outside the arena
  int64_t arenaBytes = 0;
};

int64_t aligned(int64_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// The free blocks below the top of the arena's used part, coalesced. A request takes the
// smallest block that holds it (at its start, the lowest such block on a tie), else the top.
class FreeList {
public:
  int64_t take(int64_t bytes) {
    auto fit = bySize_.lower_bound({bytes, 0});
    if (fit == bySize_.end()) {
      top_ += bytes;
      return top_ - bytes;
    }
    auto [size, at] = *fit;
    bySize_.erase(fit);
    byOffset_.erase(at);
    if (size > bytes) insert(at + bytes, size - bytes);
    return at;
  }

  void give(int64_t at, int64_t bytes) {
    auto next = byOffset_.lower_bound(at);
    if (next != byOffset_.end() && at + bytes == next->first) {
      bytes += next->second;
      next = erase(next);
    }
    if (next != byOffset_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        at = prev->first;
        bytes += prev->second;
        erase(prev);
      }
    }
    // A block that reaches the top lowers it, so that a request no block holds starts
    // there rather than above it.
    if (at + bytes == top_)
      top_ = at;
    else
      insert(at, bytes);
  }

private:
  using Blocks = std::map<int64_t, int64_t>; // offset -> size

  void insert(int64_t at, int64_t bytes) {
    byOffset_[at] = bytes;
    bySize_.insert({bytes, at});
  }
  Blocks::iterator erase(Blocks::iterator it) {
    bySize_.erase({it->second, it->first});
    return byOffset_.erase(it);
  }

  Blocks byOffset_;
  std::set<std::pair<int64_t, int64_t>> bySize_; // (size, offset)
  int64_t top_ = 0;
};

Placement sweep(std::vector<Interval> live, size_t tensors) {
  std::sort(live.begin(), live.end(), [](const Interval& a, const Interval& b) {
    if (a.first != b.first) return a.first < b.first;
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.tensor < b.tensor;
  });
  Placement out{std::vector<int64_t>(tensors, -1), 0};
  FreeList arena;
  using Ending = std::pair<int, size_t>; // (last use, index into live), soonest on top
  std::priority_queue<Ending, std::vector<Ending>, std::greater<Ending>> placed;
  for (size_t i = 0; i < live.size(); ++i) {
    const Interval& iv = live[i];
    for (; !placed.empty() && placed.top().first < iv.first; placed.pop()) {
      const Interval& dead = live[placed.top().second];
      arena.give(out.offset[dead.tensor], aligned(dead.bytes));
    }
    int64_t at = arena.take(aligned(iv.bytes));
    out.offset[iv.tensor] = at;
    placed.push({iv.last, i});
    out.arenaBytes = std::max(out.arenaBytes, at + iv.bytes);
  }
  return out;
}

// Pairs of lifetimes that overlap: the work of greedy by size.
int64_t overlappingPairs(const std::vector<Interval>& live) {
  std::vector<int> firsts;
  for (const Interval& iv : live)
    firsts.push_back(iv.first);
  std::sort(firsts.begin(), firsts.end());
  int64_t pairs = 0;
  for (const Interval& iv : live) // the others that start within this one's lifetime
    pairs += std::upper_bound(firsts.begin(), firsts.end(), iv.last) -
             std::upper_bound(firsts.begin(), firsts.end(), iv.first);
  return pairs;
}

int64_t lowestFit(const Interval& iv, const std::vector<const Interval*>& placed,
                  const std::vector<int64_t>& offset) {
  std::vector<std::pair<int64_t, int64_t>> busy; // [begin, end) of overlapping lifetimes
  for (const Interval* o : placed)
    if (o->first <= iv.last && iv.first <= o->last)
      busy.push_back({offset[o->tensor], offset[o->tensor] + o->bytes});
  std::sort(busy.begin(), busy.end());
  int64_t at = 0;
  for (auto [b, e] : busy) {
    if (at + iv.bytes <= b) break;
    at = std::max(at, aligned(e));
  }
  return at;
}

Placement greedyBySize(std::vector<Interval> live, size_t tensors) {
  std::sort(live.begin(), live.end(), [](const Interval& a, const Interval& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.tensor < b.tensor;
  });
  Placement out{std::vector<int64_t>(tensors, -1), 0};
  std::vector<const Interval*> placed;
  for (const Interval& iv : live) {
    int64_t at = lowestFit(iv, placed, out.offset);
    out.offset[iv.tensor] = at;
    placed.push_back(&iv);
    out.arenaBytes = std::max(out.arenaBytes, at + iv.bytes);
  }
  return out;
}

class MemoryPlan : public Pass {
public:
  const char* name() const override { return "memory-plan"; }

  bool run(ir::Module& m, PassContext& ctx) override {
    // The schedule planned each program as it made it (PassContext::plansMemoryAsMade).
    if (!ctx.plansMemoryAsMade())
      for (size_t r = 0; r < m.programs.size(); ++r)
        planOne(m, m.programs[r], r > 0 ? &m.programs[r - 1] : nullptr);
    return !m.programs.empty();
  }

  static void planOne(const ir::Module& m, ir::Program& p, const ir::Program* previous) {
    if (previous && sameStream(p, *previous))
      copyPlan(*previous, p);
    else
      plan(m, p);
  }

private:
  static bool sameStream(const ir::Program& a, const ir::Program& b) {
    auto same = [](const ir::Instr& x, const ir::Instr& y) {
      return x.kind == y.kind && x.op == y.op && x.micro == y.micro && x.bucket == y.bucket &&
             x.tensor == y.tensor && x.part == y.part;
    };
    return a.localBatch == b.localBatch && a.wholeBatch == b.wholeBatch &&
           std::equal(a.step.begin(), a.step.end(), b.step.begin(), b.step.end(), same);
  }

  static void copyPlan(const ir::Program& from, ir::Program& to) {
    to.offset = from.offset;
    to.arenaBytes = from.arenaBytes;
    to.paramBytes = from.paramBytes;
    to.gradBytes = from.gradBytes;
    to.optimizerBytes = from.optimizerBytes;
    to.offloadedBytes = from.offloadedBytes;
    to.stagingBytes = from.stagingBytes;
    to.partStagingBytes = from.partStagingBytes;
    to.commBytes = from.commBytes;
    to.inputBytes = from.inputBytes;
    to.shared = from.shared;
    to.sharedBytes = from.sharedBytes;
    to.bucketOffset = from.bucketOffset;
    to.bucketBytes = from.bucketBytes;
    to.gatherOffset = from.gatherOffset;
    to.workspaces = from.workspaces;
  }

  static void plan(const ir::Module& m, ir::Program& p) {
    // The state layout (Module::paramLayout): the arena's buckets, the states, the
    // reductions' scratch.
    const ir::Module::ParamLayout at = m.paramLayout(p);
    Arena arena(m, p, at);
    std::vector<Interval> live = lifetimes(m, p, arena);
    Placement best = place(live, arena.ids);
    p.shared.clear();
    p.sharedBytes = 0;
    if (p.slots > 1) {
      // Slots for what outlives a run of its micro-batch's instructions, one shared region
      // for the rest, when that is smaller than whole slots.
      std::vector<char> shared = sharedTensors(m, p, arena);
      std::vector<Interval> held, passing;
      for (const Interval& iv : live)
        (shared[iv.tensor] ? passing : held).push_back(iv);
      Placement slot = place(held, arena.ids);
      Placement region = place(passing, arena.ids);
      if (!passing.empty() && p.slots * aligned(slot.arenaBytes) + region.arenaBytes <
                                  p.slots * aligned(best.arenaBytes)) {
        for (const Interval& iv : passing)
          slot.offset[iv.tensor] = region.offset[iv.tensor];
        best = std::move(slot);
        p.shared = std::move(shared);
        p.sharedBytes = region.arenaBytes;
      }
    }
    p.bucketOffset.assign(best.offset.begin() + static_cast<ptrdiff_t>(m.tensors.size()),
                          best.offset.begin() + static_cast<ptrdiff_t>(arena.gatherBase));
    p.gatherOffset.assign(best.offset.begin() + static_cast<ptrdiff_t>(arena.gatherBase),
                          best.offset.begin() + static_cast<ptrdiff_t>(arena.workBase));
    p.bucketBytes = arena.bucketBytes;
    p.workspaces = arena.workspaces;
    for (size_t w = 0; w < p.workspaces.size(); ++w) {
      size_t id = arena.workBase + w;
      p.workspaces[w].offset = best.offset[id];
      p.workspaces[w].shared = !p.shared.empty() && p.shared[id];
    }
    best.offset.resize(arena.workBase);
    p.offset = std::move(best.offset);
    p.arenaBytes = best.arenaBytes;
    countStates(m, p, at);
    p.commBytes = commScratch(m, p, at);
    p.inputBytes = inputStaging(m, p);
  }

  // The executor's host copies of each micro-batch: every model input and one `next`
  // target, at this rank's size.
  static int64_t inputStaging(const ir::Module& m, const ir::Program& p) {
    int64_t bytes = 0;
    for (int t : m.inputs)
      bytes += m.bytesOn(p, t);
    for (const ir::Op& op : m.ops)
      if (op.kind == ir::OpKind::Next && op.phase == ir::Phase::Forward) {
        bytes += m.bytesOn(p, op.outputs[0]);
        break;
      }
    return bytes * p.microBatches;
  }

  // The ring reductions' scratch (support/RingScratch.h): the most the gradient buckets'
  // reductions in flight at once take (from reduce-start to reduce-wait), plus the largest
  // of the split regions' all-reduces and reduce-scatters (one at a time, on f32 copies;
  // a reduce-scatter's sums land outside its input).
  static int64_t commScratch(const ir::Module& m, const ir::Program& p,
                             const ir::Module::ParamLayout& at) {
    int64_t wire = ir::dtypeBytes(m.policy.commDtype);
    bool f32 = m.policy.commDtype == ir::DType::F32;
    std::vector<std::vector<ir::Module::SlicePiece>> pieces;
    if (m.zeroShardsGradients()) pieces = m.bucketPieces(p);
    auto floats = [&](const ir::GradBucket& g) {
      return (at.spanEnd(g.endParam) - at.spanBegin(g.firstParam)) / 4;
    };
    auto scratchOf = [&](size_t b) {
      const ir::GradBucket& g = m.buckets[b];
      int64_t n = floats(g), largest = 0;
      if (!pieces.empty()) { // reduce-scattered where the slices cut it, in place
        for (const ir::Module::SlicePiece& piece : pieces[b])
          largest = std::max(largest, (piece.end - piece.begin) / 4);
      } else {
        largest = (n + g.ranks - 1) / g.ranks;
      }
      return ring::scratchBytes(g.ranks, n, largest, wire, f32);
    };
    // A tied weight's sum over its stages (Instr::tie): the whole bucket in f32, in place.
    auto tieScratchOf = [&](size_t b) {
      const ir::GradBucket& g = m.buckets[b];
      int64_t n = floats(g);
      return ring::scratchBytes(g.ranks, n, (n + g.ranks - 1) / g.ranks, 4, true);
    };
    std::vector<int64_t> scratch, tieScratch;
    for (size_t b = 0; b < m.buckets.size(); ++b) {
      scratch.push_back(scratchOf(b));
      tieScratch.push_back(!pieces.empty() && m.buckets[b].tied && m.holdsBucket(p, m.buckets[b])
                               ? tieScratchOf(b)
                               : 0);
    }
    int64_t now = 0, most = 0, split = 0;
    std::vector<char> seen(p.splitWidth > 1 ? m.ops.size() : 0, 0); // every micro-batch alike
    for (const ir::Instr& in : p.step) {
      const std::vector<int64_t>& by = in.tie ? tieScratch : scratch;
      if (in.kind == ir::InstrKind::ReduceStart) now += by[in.bucket];
      if (in.kind == ir::InstrKind::ReduceWait) now -= by[in.bucket];
      most = std::max(most, now);
      if (in.kind != ir::InstrKind::Run || seen.empty() || seen[in.op]) continue;
      seen[in.op] = 1;
      auto c = m.splitCollective(p, in.op);
      if (!c || (c->kind != ir::CollectiveKind::AllReduce &&
                 c->kind != ir::CollectiveKind::ReduceScatter))
        continue;
      bool scatter = c->kind == ir::CollectiveKind::ReduceScatter;
      int64_t n = c->bytes / ir::dtypeBytes(m.storedDtype(m.ops[in.op].inputs[0])),
              w = p.splitWidth;
      split = std::max(split, ring::scratchBytes(p.splitWidth, n, (n + w - 1) / w, 4, !scatter));
    }
    return most + split;
  }

  static Placement place(const std::vector<Interval>& live, size_t tensors) {
    Placement best = sweep(live, tensors);
    if (overlappingPairs(live) <= kGreedyPairs) {
      Placement greedy = greedyBySize(live, tensors);
      if (greedy.arenaBytes <= best.arenaBytes) best = std::move(greedy);
    }
    return best;
  }

  // Which tensors an instruction touches in the arena. With ZeRO stage 2 the gradient
  // buckets are in it too, as ids past the tensors': bucket b is tensors + b; with stage 3
  // the gathered parameters, bucket b's for use u (0 forward, 1 backward) gatherBase + 2 b + u.
  struct Arena {
    std::vector<bool> paramGrad; // own buffers, not the arena
    std::vector<int> loaded;     // what a load writes
    std::vector<int> bucketOf;   // ZeRO stage 2: by tensor, the bucket of a gradient, else -1
    std::vector<int64_t> bucketBytes;
    // Kernel workspaces: ids from workBase, one per (op, part) in `workspaces`; workId by
    // op x 3 + part, -1 for none.
    std::vector<ir::Program::Workspace> workspaces;
    std::vector<int> workId;
    std::vector<int> paramBucket;  // ZeRO stage 3: by parameter, its bucket
    std::vector<char> keepsGather; // and by bucket, whether the backward keeps its forward's
    // The ids a run touches: by op x 3 + part an index k (-1: not in the step), its ids
    // runTouched[runStart[k] .. runStart[k + 1]).
    std::vector<int> runIndex, runTouched;
    std::vector<size_t> runStart;
    size_t tensors = 0, ids = 0, gatherBase = 0, workBase = 0;
    Arena(const ir::Module& m, const ir::Program& p, const ir::Module::ParamLayout& at)
        : paramGrad(m.tensors.size(), false), tensors(m.tensors.size()), ids(m.tensors.size()) {
      for (const ir::Param& prm : m.params)
        if (prm.grad >= 0) paramGrad[prm.grad] = true;
      if (m.zeroShardsGradients()) {
        // The state layout: the rank's parameters side by side, each 64-byte aligned.
        bucketOf.assign(m.tensors.size(), -1);
        std::vector<int> bucketOfParam = m.paramBuckets(p);
        for (size_t q = 0; q < m.params.size(); ++q)
          if (m.params[q].grad >= 0) bucketOf[m.params[q].grad] = bucketOfParam[q];
        for (const ir::GradBucket& g : m.buckets)
          bucketBytes.push_back(
              m.holdsBucket(p, g) ? at.spanEnd(g.endParam) - at.spanBegin(g.firstParam) : 0);
        ids += m.buckets.size();
      }
      gatherBase = ids;
      if (m.zeroShardsParams()) {
        paramBucket = m.paramBuckets(p);
        keepsGather = p.keepsGather;
        ids += 2 * m.buckets.size();
      }
      workBase = ids;
      // Each (op, part) the step runs, once (every micro-batch runs it alike): its kernel
      // workspace, the inputs it reads, and what it touches.
      workId.assign(3 * m.ops.size(), -1);
      runIndex.assign(3 * m.ops.size(), -1);
      runStart.push_back(0);
      std::vector<bool> read(m.tensors.size(), false);
      for (const ir::Instr& in : p.step) {
        if (in.kind != ir::InstrKind::Run) continue;
        size_t key = 3 * static_cast<size_t>(in.op) + static_cast<size_t>(in.part);
        if (runIndex[key] >= 0) continue;
        int64_t staging = m.ampStagingBytes(p, in.op);
        int64_t bytes = m.workspaceBytes(p, in.op) + staging;
        if (bytes > 0) {
          workId[key] = static_cast<int>(ids++);
          workspaces.push_back({in.op, in.part, 0, bytes, false, staging});
        }
        for (int t : m.ops[in.op].inputs)
          if (t >= 0) read[t] = true;
        runIndex[key] = static_cast<int>(runStart.size()) - 1;
        touchesOnce(m, in, [&](int t) { runTouched.push_back(t); });
        runStart.push_back(runTouched.size());
      }
      // A load writes the model inputs and `next` targets this rank's ops read (a pipeline
      // stage reads some of them).
      for (int t : m.inputs)
        if (read[t]) loaded.push_back(t);
      for (const ir::Op& o : m.ops)
        if (o.kind == ir::OpKind::Next && read[o.outputs[0]]) loaded.push_back(o.outputs[0]);
    }
    template <typename F> void touches(const ir::Module& m, const ir::Instr& in, F&& f) const {
      if (in.kind == ir::InstrKind::Run) {
        int k = runIndex[3 * static_cast<size_t>(in.op) + static_cast<size_t>(in.part)];
        if (k >= 0) {
          for (size_t i = runStart[k]; i < runStart[k + 1]; ++i)
            f(runTouched[i]);
          return;
        }
      }
      touchesOnce(m, in, f);
    }
    // Whether the instruction touches anything in the arena.
    bool touchesAny(const ir::Module& m, const ir::Instr& in) const {
      if (in.kind == ir::InstrKind::Run) {
        int k = runIndex[3 * static_cast<size_t>(in.op) + static_cast<size_t>(in.part)];
        if (k >= 0) return runStart[k + 1] > runStart[k];
      }
      bool any = false;
      touchesOnce(m, in, [&](int) { any = true; });
      return any;
    }
    template <typename F> void touchesOnce(const ir::Module& m, const ir::Instr& in, F&& f) const {
      // The optimizer ops read the gradients' slice, not the buckets.
      bool buckets = !bucketOf.empty() &&
                     !(in.kind == ir::InstrKind::Run && m.ops[in.op].phase == ir::Phase::Optimizer);
      auto touch = [&](int t) {
        if (t < 0) return;
        if (!paramGrad[t])
          f(t);
        else if (buckets && bucketOf[t] >= 0)
          f(static_cast<int>(tensors) + bucketOf[t]);
      };
      if (buckets && !in.tie && // a tie's sum is in the gradients' memory (countStates)
          (in.kind == ir::InstrKind::ReduceStart || in.kind == ir::InstrKind::ReduceWait))
        f(static_cast<int>(tensors) + in.bucket);
      if (in.kind == ir::InstrKind::GatherStart || in.kind == ir::InstrKind::GatherWait)
        f(gatherId(in.bucket, in.use));
      if (in.kind == ir::InstrKind::Load)
        for (int t : loaded)
          touch(t);
      if (in.kind == ir::InstrKind::SeedGrad) touch(m.lossGrad);
      if (in.kind == ir::InstrKind::Send || in.kind == ir::InstrKind::Recv) touch(in.tensor);
      if (in.kind != ir::InstrKind::Run) return;
      int work = workId[3 * static_cast<size_t>(in.op) + static_cast<size_t>(in.part)];
      if (work >= 0) f(work);
      const ir::Op& op = m.ops[in.op];
      for (int t : op.inputs)
        touch(t);
      for (size_t k = 0; k < op.outputs.size(); ++k)
        if (m.runWrites(in, k)) touch(op.outputs[k]); // W reads the activations: they live on
      if (!paramBucket.empty() && op.phase != ir::Phase::Optimizer)
        for (int q : op.params)
          f(gatherId(paramBucket[q], gatherUse(paramBucket[q], op.phase)));
    }
    int gatherId(int bucket, int use) const {
      return static_cast<int>(gatherBase) + 2 * bucket + use;
    }
    // The block an op of `phase` reads bucket b from (Program::keepsGather).
    int gatherUse(int b, ir::Phase phase) const {
      bool kept = !keepsGather.empty() && keepsGather[b];
      return phase == ir::Phase::Forward || kept ? 0 : 1;
    }
  };

  // A tensor is shared when, for every micro-batch, no instruction of another micro-batch
  // that touches the arena falls between its first and last touch: then the lives of the
  // shared tensors of different micro-batches never overlap, and one region serves them
  // all, placed by micro-batch 0's lifetimes (every micro-batch runs the same ops in the
  // same order). What is sent (waited for later), the loss (read after the step) and what
  // the optimizer ops touch keep a slot.
  //
  // A tensor's touches are counted by their ordinal among its micro-batch's instructions
  // that touch the arena. A micro-batch whose instructions are micro-batch 0's (the usual
  // case) touches each tensor at micro-batch 0's ordinals, so only micro-batch 0's touches
  // are listed; another micro-batch's are listed for it alone. With `all` (arena-touching
  // instructions before a position), each check is O(1), and the whole O(steps + micros x
  // tensors of micro-batch 0).
  static std::vector<char> sharedTensors(const ir::Module& m, const ir::Program& p,
                                         const Arena& arena) {
    size_t tensors = arena.ids, n = p.step.size();
    int micros = p.microBatches;
    std::vector<int> all(n + 1, 0);
    std::vector<std::vector<int>> at(micros); // by micro-batch, its arena-touching positions
    for (std::vector<int>& positions : at)    // about an equal share each, grown once at most
      positions.reserve(n / static_cast<size_t>(std::max(micros, 1)) + 8);
    std::vector<char> pinned(tensors, 0);
    for (size_t i = 0; i < n; ++i) {
      const ir::Instr& in = p.step[i];
      bool optimizer = in.kind == ir::InstrKind::Run && m.ops[in.op].phase == ir::Phase::Optimizer;
      int micro = optimizer || in.micro < 0 || in.micro >= micros ? -1 : in.micro;
      bool touched = false;
      if (micro < 0)
        arena.touches(m, in, [&](int t) { pinned[t] = 1; });
      else
        touched = arena.touchesAny(m, in);
      if (in.kind == ir::InstrKind::Send) pinned[in.tensor] = 1;
      all[i + 1] = all[i] + touched;
      if (touched) at[micro].push_back(static_cast<int>(i));
    }
    if (!m.outputs.empty()) pinned[m.outputs[0]] = 1;
    // By tensor, the ordinals of its first and last touch in micro-batch k, and the tensors
    // touched.
    struct Touches {
      std::vector<int> first, last, list;
    };
    auto listTouches = [&](int k, Touches& out) {
      for (int t : out.list)
        out.first[t] = -1;
      out.list.clear();
      out.first.resize(tensors, -1);
      out.last.resize(tensors, -1);
      for (size_t j = 0; j < at[k].size(); ++j)
        arena.touches(m, p.step[at[k][j]], [&](int t) {
          if (out.first[t] < 0) {
            out.first[t] = static_cast<int>(j);
            out.list.push_back(t);
          }
          out.last[t] = static_cast<int>(j);
        });
    };
    auto sameAsFirst = [&](int k) {
      if (at[k].size() != at[0].size()) return false;
      for (size_t j = 0; j < at[k].size(); ++j) {
        const ir::Instr &a = p.step[at[k][j]], &b = p.step[at[0][j]];
        if (a.kind != b.kind || a.op != b.op || a.part != b.part || a.bucket != b.bucket ||
            a.use != b.use || a.tensor != b.tensor)
          return false;
      }
      return true;
    };
    Touches first, other;
    listTouches(0, first);
    std::vector<char> shared(tensors, 0);
    for (int t : first.list)
      shared[t] = !pinned[t];
    for (int k = 0; k < micros; ++k) {
      const Touches* own = &first;
      if (k > 0 && !sameAsFirst(k)) {
        listTouches(k, other);
        own = &other;
      }
      for (int t : own->list) {
        if (!shared[t]) continue;
        int a = at[k][own->first[t]], b = at[k][own->last[t]];
        shared[t] = all[b + 1] - all[a] == own->last[t] + 1 - own->first[t];
      }
    }
    return shared;
  }

  static std::vector<Interval> lifetimes(const ir::Module& m, const ir::Program& p,
                                         const Arena& arena) {
    std::vector<int> first(arena.ids, -1), last(arena.ids, -1);
    int pos = 0;
    auto touch = [&](int t) {
      if (first[t] < 0) first[t] = pos;
      last[t] = std::max(last[t], pos);
    };
    std::vector<int> sent; // a send may be waited for at the step's end
    for (const ir::Instr& in : p.step) {
      if (in.micro != 0 && in.kind != ir::InstrKind::Run) continue;
      const ir::Op* op = in.kind == ir::InstrKind::Run ? &m.ops[in.op] : nullptr;
      if (op && op->phase != ir::Phase::Optimizer && in.micro != 0) continue;
      arena.touches(m, in, touch);
      if (in.kind == ir::InstrKind::Send) sent.push_back(in.tensor);
      ++pos;
    }
    // The loss lives to the end of the step on the rank that computes it, and so does a sent
    // tensor: the last micro-batch's sends are waited for after the optimizer.
    for (int t : sent)
      touch(t);
    if (!m.outputs.empty() && first[m.outputs[0]] >= 0) touch(m.outputs[0]);
    std::vector<Interval> out;
    for (size_t t = 0; t < arena.ids; ++t) {
      if (first[t] < 0) continue;
      int64_t bytes = t < arena.tensors      ? m.bytesOn(p, static_cast<int>(t))
                      : t < arena.gatherBase ? arena.bucketBytes[t - arena.tensors]
                      : t < arena.workBase   ? arena.bucketBytes[(t - arena.gatherBase) / 2]
                                             : arena.workspaces[t - arena.workBase].bytes;
      out.push_back({static_cast<int>(t), first[t], last[t], std::max<int64_t>(bytes, 1)});
    }
    return out;
  }

  static void countStates(const ir::Module& m, ir::Program& p, const ir::Module::ParamLayout& at) {
    // What the executor holds (the state layout, Module::paramLayout): the parameters of
    // the rank's stages, each its own piece, 64-byte aligned; gradients and each optimizer
    // state laid out alike.
    int states = m.optimizerStates();
    p.paramBytes = p.gradBytes = at.total;
    // ZeRO stage 1: each rank's slice of the states of its stage's parameters.
    int64_t largest = 0;
    for (int q : p.params)
      largest = std::max(largest, at.bytes[q]);
    int64_t perState = at.total;
    if (m.zeroApplies()) {
      perState = 0;
      for (const ir::Module::ZeroSlice& z : m.zeroSlices(p))
        perState += z.bytes;
    }
    p.optimizerBytes = states * perState;
    // The slice (the buckets are in the arena), and a tied weight's bucket whole for its sum.
    if (m.zeroShardsGradients()) p.gradBytes = perState + m.tieBytes(p);
    if (m.zeroShardsParams()) p.paramBytes = perState; // and the gathered parameters
    p.offloadedBytes = p.stagingBytes = p.partStagingBytes = 0;
    if (!m.offloadApplies() || p.params.empty()) return;
    // Offloaded to disk: a chunk of at most kOffloadChunk bytes of each state per staging
    // buffer (no larger than the largest run the optimizer updates at once), in 64-byte
    // units as the executor's buffers are.
    int64_t chunk = std::min({kOffloadChunk, perState, largest});
    chunk = std::max<int64_t>((chunk + 63) / 64 * 64, 64);
    p.offloadedBytes = p.optimizerBytes;
    p.optimizerBytes = 0;
    int blocks = states;
    if (m.offloadsParams()) { // the parameters' slice is one more block of the file
      p.offloadedBytes += p.paramBytes;
      p.paramBytes = 0;
      ++blocks;
    }
    p.stagingBytes = ir::Program::kStagingBuffers * blocks * chunk;
    if (!m.offloadsParams()) return;
    // The gathers' reads: the largest piece of a bucket any rank of the domain holds (the
    // ranks that run this stream share its plan).
    int64_t part = 0;
    for (const std::vector<ir::Module::SlicePiece>& pieces : m.bucketPieces(p))
      for (const ir::Module::SlicePiece& piece : pieces)
        part = std::max(part, piece.end - piece.begin);
    p.partStagingBytes = aligned(part);
    p.stagingBytes += p.partStagingBytes;
  }

  // The most bytes of one optimizer state an offloaded step holds in one staging buffer.
  static constexpr int64_t kOffloadChunk = int64_t{1} << 20;
};

} // namespace

std::unique_ptr<Pass> createMemoryPlanPass() {
  return std::make_unique<MemoryPlan>();
}

void planMemory(const ir::Module& m, ir::Program& p, const ir::Program* previous) {
  MemoryPlan::planOne(m, p, previous);
}

} // namespace epl::passes
