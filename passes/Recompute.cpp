// recompute: activations dropped after the forward and made again before their backward.
//
//   1. The blocks: with `recompute = every`, each call of a `def` in the model body (the
//      first part of an op's path name, `transformer_block.3`); with a list of defs, each
//      call of a listed def at any depth (`transformer_block.3/attention_block`). A block
//      is its forward ops on one stage; send/recv ops belong to none.
//   2. With `sequence_parallel`, each all-gather of a sequence slice that a split op's
//      backward reads is its own block, as Megatron-LM gathers again in the backward: only
//      the slice (1 / w of the tensor) is kept.
//   3. In a block, the tensors its backward ops read that the block makes are made again:
//      the block's forward ops that produce them, and the block's ops these read in turn,
//      run again as Recompute ops just before the block's first backward op, and its
//      backward ops read their outputs. What the block reads from outside (its input,
//      parameters) is kept: that is the checkpoint. The forward's own tensors then live
//      only through the forward.
//   4. A recomputed dropout draws the mask of the op it repeats (Executor: same seed key),
//      so results are bit for bit those without recompute. Blocks with experts (moe's
//      all-to-all keeps host state per micro-batch) or batch_norm (its forward updates
//      the running statistics) are not recomputed.
//   5. `recompute = auto` chooses among the model body's def calls (chooseBlocks).
#include "ir/Rewrite.h"
#include "passes/Passes.h"

#include <algorithm>
#include <map>
#include <set>

namespace epl::passes {

namespace {

// The name of a def call without its repeat index: `transformer_block.3` -> `transformer_block`.
std::string defOf(const std::string& part) {
  size_t dot = part.rfind('.');
  if (dot == std::string::npos || dot + 1 == part.size()) return part;
  bool digits = std::all_of(part.begin() + static_cast<long>(dot) + 1, part.end(),
                            [](char c) { return c >= '0' && c <= '9'; });
  return digits ? part.substr(0, dot) : part;
}

// A block: its forward ops, the backward ops that read what they make (in program order),
// and its stage.
struct Block {
  std::set<int> ops;
  std::vector<int> readers;
  int stage = 0;
};

class Recompute : public Pass {
public:
  const char* name() const override { return "recompute"; }

  bool run(ir::Module& m, PassContext& ctx) override {
    m.autoRecompute = {};
    if (!m.train.present || m.lossGrad < 0) return false;
    ir::Recompute how = m.policy.recompute;
    std::vector<Block> blocks;
    if (how == ir::Recompute::Every || how == ir::Recompute::Listed)
      blocks = defBlocks(m, m.policy);
    else if (how == ir::Recompute::Auto)
      blocks = chooseBlocks(m, ctx);
    return apply(m, blocks);
  }

private:
  // The blocks' Recompute ops, and sequence parallelism's gathers (step 2) outside them.
  static bool apply(ir::Module& m, const std::vector<Block>& blocks) {
    std::vector<bool> inBlock(m.ops.size(), false);
    for (const Block& b : blocks)
      for (int i : b.ops)
        inBlock[i] = true;
    std::vector<std::pair<int, ir::Op>> inserted;
    for (const Block& b : blocks)
      recompute(m, b, inserted);
    for (size_t g = 0; m.policy.sequenceParallel && g < m.ops.size(); ++g) {
      if (m.ops[g].phase != ir::Phase::Forward || !ir::reduceScattersBackward(m.ops[g]) ||
          inBlock[g])
        continue;
      Block gather{{static_cast<int>(g)}, {}, m.ops[g].stage};
      for (size_t i = 0; i < m.ops.size(); ++i) {
        const std::vector<int>& in = m.ops[i].inputs;
        if (m.ops[i].phase == ir::Phase::Backward &&
            std::find(in.begin(), in.end(), m.ops[g].outputs[0]) != in.end())
          gather.readers.push_back(static_cast<int>(i));
      }
      recompute(m, gather, inserted);
    }
    if (inserted.empty()) return false;
    ir::insertOps(m, std::move(inserted));
    return true;
  }

  // Step 1: the blocks of `pol` (every def call in the model body, or the listed defs'
  // calls), in program order, with their readers: the block's backward ops.
  static std::vector<Block> defBlocks(const ir::Module& m, const ir::Policy& pol) {
    std::map<std::pair<std::string, int>, size_t> byKey;
    std::vector<Block> out;
    for (size_t i = 0; i < m.ops.size(); ++i) {
      const ir::Op& op = m.ops[i];
      if (op.phase != ir::Phase::Forward || op.kind == ir::OpKind::SendRecv) continue;
      std::string key = blockKey(pol, op.name);
      if (key.empty()) continue;
      auto k = std::make_pair(key, op.stage);
      if (!byKey.count(k)) {
        byKey[k] = out.size();
        out.push_back(Block{{}, {}, op.stage});
      }
      out[byKey[k]].ops.insert(static_cast<int>(i));
    }
    std::vector<int> blockOf(m.ops.size(), -1);
    for (size_t b = 0; b < out.size(); ++b)
      for (int i : out[b].ops)
        blockOf[i] = static_cast<int>(b);
    for (size_t i = 0; i < m.ops.size(); ++i)
      if (m.ops[i].phase == ir::Phase::Backward && blockOf[m.ops[i].forward] >= 0)
        out[blockOf[m.ops[i].forward]].readers.push_back(static_cast<int>(i));
    return out;
  }

  // The block an op's path name puts it in, or "" for none.
  static std::string blockKey(const ir::Policy& pol, const std::string& name) {
    size_t end = name.find('/');
    if (end == std::string::npos) return "";
    if (pol.recompute != ir::Recompute::Listed) return name.substr(0, end);
    // The outermost listed def on the path (a listed def inside another is part of it).
    size_t begin = 0;
    while (end != std::string::npos) {
      const std::string part = name.substr(begin, end - begin);
      if (std::find(pol.recomputeBlocks.begin(), pol.recomputeBlocks.end(), defOf(part)) !=
          pol.recomputeBlocks.end())
        return name.substr(0, end);
      begin = end + 1;
      end = name.find('/', begin);
    }
    return "";
  }

  // Step 5, `recompute = auto`: the fewest of the model body's def calls to recompute so
  // that every rank's memory plan fits `device_memory`. A rank's memory plan depends on the
  // blocks recomputed on its own pipeline position alone (every chunk of an interleaved
  // schedule), so each position's blocks, of all its chunks, are taken in the order of what
  // recomputing them saves (their tensors the backward reads, largest first), and each
  // position's count is bisected on trial plans (the data-parallel, schedule and
  // memory-plan passes on a copy), all positions in the same trials. Without
  // `device_memory`, nothing.
  static std::vector<Block> chooseBlocks(ir::Module& m, PassContext& ctx) {
    ir::Module::AutoRecompute& choice = m.autoRecompute;
    choice.ran = true;
    choice.budget = m.policy.deviceMemoryBytes;
    ir::Policy every = m.policy;
    every.recompute = ir::Recompute::Every;
    std::vector<Block> all = defBlocks(m, every);
    choice.blocks = static_cast<int>(all.size());
    if (choice.budget <= 0 || all.empty()) return {};
    size_t depth = static_cast<size_t>(std::max(m.mesh.depth(), 1));
    std::vector<std::vector<size_t>> byPosition(depth); // indices into `all`, best first
    std::vector<int64_t> saves(all.size(), 0);
    for (size_t b = 0; b < all.size(); ++b) {
      for (int r : all[b].readers)
        for (int t : m.ops[r].inputs)
          if (t >= 0 && all[b].ops.count(m.tensors[t].producer))
            saves[b] += m.bytesOf(t).value_or(0);
      byPosition[static_cast<size_t>(all[b].stage) % depth].push_back(b);
    }
    for (auto& list : byPosition)
      std::stable_sort(list.begin(), list.end(),
                       [&](size_t a, size_t b) { return saves[a] > saves[b]; });
    // The peak of each position's ranks with its first k[p] blocks recomputed, each
    // (position, count) planned once: a trial of a cost-only plan makes the positions whose
    // peak it needs and does not know yet (`need`, by position; empty: all), and every
    // position is planned in it (no stop at one that does not fit).
    std::map<std::pair<size_t, size_t>, int64_t> known;
    PassContext trials = ctx;
    trials.overMemory = nullptr;
    auto peaks = [&](const std::vector<size_t>& k, const std::vector<bool>& need) {
      std::vector<char> missing(depth, 0);
      bool any = false;
      for (size_t p = 0; p < depth; ++p)
        if ((need.empty() || need[p]) && !known.count({p, k[p]})) {
          missing[p] = 1;
          any = true;
        }
      if (any) {
        std::vector<Block> chosen = pick(all, byPosition, k);
        ir::Module trial = m;
        apply(trial, chosen);
        trials.positions = ctx.costOnly ? missing : std::vector<char>{};
        for (auto make : {createDataParallelPass, createSchedulePass, createMemoryPlanPass})
          make()->run(trial, trials);
        std::vector<int64_t> made(depth, 0);
        std::vector<char> seen(depth, 0);
        for (const ir::Program& p : trial.programs) {
          size_t at = static_cast<size_t>(p.stage);
          made[at] = std::max(made[at], p.peakBytes());
          seen[at] = 1;
        }
        for (size_t p = 0; p < depth; ++p)
          if (seen[p]) known[{p, k[p]}] = made[p];
      }
      std::vector<int64_t> out(depth, 0);
      for (size_t p = 0; p < depth; ++p) {
        auto at = known.find({p, k[p]});
        if (at != known.end()) out[p] = at->second;
      }
      return out;
    };
    std::vector<size_t> lo(depth, 0), hi(depth);
    for (size_t p = 0; p < depth; ++p)
      hi[p] = byPosition[p].size();
    // Recomputing no block, and every block, are the plans with none and every: the same
    // passes on the same module (nothing after this pass reads the policy's recompute).
    for (auto [given, k] : {std::make_pair(&ctx.peaksWithoutRecompute, &lo),
                            std::make_pair(&ctx.peaksRecomputingEvery, &hi)})
      if (given->size() == depth)
        for (size_t p = 0; p < depth; ++p)
          known[{p, (*k)[p]}] = (*given)[p];
    std::vector<int64_t> none = peaks(lo, {}), most = peaks(hi, {});
    if (std::all_of(none.begin(), none.end(), [](int64_t v) { return v == 0; }))
      return {}; // no rank programs to measure (a plan that does not run)
    choice.peakWithout = *std::max_element(none.begin(), none.end());
    // Position p fits with lo[p] blocks once lo[p] = hi[p]. A position that does not fit
    // even with all of them recomputes all where that lowers its peak, else none (a
    // position of one block peaks in that block's backward either way).
    for (size_t p = 0; p < depth; ++p) {
      if (none[p] <= choice.budget || (most[p] > choice.budget && most[p] >= none[p])) hi[p] = 0;
      if (most[p] > choice.budget) lo[p] = hi[p];
      if (lo[p] < hi[p]) ++lo[p]; // 0 does not fit: at least one
    }
    while (true) {
      std::vector<size_t> mid(depth);
      bool open = false;
      for (size_t p = 0; p < depth; ++p) {
        mid[p] = lo[p] + (hi[p] - lo[p]) / 2;
        open = open || lo[p] < hi[p];
      }
      if (!open) break;
      std::vector<bool> need(depth);
      for (size_t p = 0; p < depth; ++p)
        need[p] = lo[p] < hi[p];
      std::vector<int64_t> at = peaks(mid, need);
      for (size_t p = 0; p < depth; ++p) {
        if (lo[p] >= hi[p]) continue;
        if (at[p] <= choice.budget)
          hi[p] = mid[p];
        else
          lo[p] = mid[p] + 1;
      }
    }
    std::vector<int64_t> with = peaks(hi, {});
    choice.peakWith = *std::max_element(with.begin(), with.end());
    std::vector<Block> chosen = pick(all, byPosition, hi);
    choice.chosen = static_cast<int>(chosen.size());
    for (const Block& b : chosen)
      choice.names.push_back(blockKey(every, m.ops[*b.ops.begin()].name));
    return chosen;
  }

  // The first k[p] blocks of each position's list, in program order.
  static std::vector<Block> pick(const std::vector<Block>& all,
                                 const std::vector<std::vector<size_t>>& byPosition,
                                 const std::vector<size_t>& k) {
    std::vector<size_t> ids;
    for (size_t p = 0; p < byPosition.size(); ++p)
      ids.insert(ids.end(), byPosition[p].begin(),
                 byPosition[p].begin() + static_cast<long>(k[p]));
    std::sort(ids.begin(), ids.end());
    std::vector<Block> out;
    for (size_t b : ids)
      out.push_back(all[b]);
    return out;
  }

  // Steps 3 and 4 for one block: its Recompute ops into `inserted`, before its first
  // reader (in program order), and the readers rewired to read their outputs.
  static void recompute(ir::Module& m, const Block& block,
                        std::vector<std::pair<int, ir::Op>>& inserted) {
    const std::set<int>& mine = block.ops;
    const std::vector<int>& backward = block.readers;
    for (int i : mine)
      if (!recomputable(m.ops[i].kind)) return;
    if (backward.empty()) return;
    auto made = [&](int t) { return t >= 0 && mine.count(m.tensors[t].producer) > 0; };
    // The block's ops that make what its backward reads, and what those read in turn.
    std::set<int> again;
    std::vector<int> work;
    for (int b : backward)
      for (int t : m.ops[b].inputs)
        if (made(t)) work.push_back(m.tensors[t].producer);
    while (!work.empty()) {
      int i = work.back();
      work.pop_back();
      if (!again.insert(i).second) continue;
      for (int t : m.ops[i].inputs)
        if (made(t)) work.push_back(m.tensors[t].producer);
    }
    if (again.empty()) return;
    std::map<int, int> remade; // tensor -> its recomputed copy
    for (int i : again) {      // std::set: program order
      ir::Op op = m.ops[i];
      op.phase = ir::Phase::Recompute;
      op.forward = i;
      for (int& t : op.inputs) {
        auto r = remade.find(t);
        if (r != remade.end()) t = r->second;
      }
      for (int& t : op.outputs) {
        int copy = m.addTensor(m.tensors[t].name + ".recomputed", m.tensors[t].type, -1);
        m.tensors[copy].layout = m.tensors[t].layout;
        if (!m.stored.empty()) m.stored[copy] = m.storedDtype(t); // amp: stored alike
        remade[t] = copy;
        t = copy;
      }
      inserted.emplace_back(backward.front(), std::move(op));
    }
    for (int b : backward)
      for (int& t : m.ops[b].inputs) {
        auto r = remade.find(t);
        if (r != remade.end()) t = r->second;
      }
  }

  static bool recomputable(ir::OpKind k) {
    return k != ir::OpKind::MoeRouter && k != ir::OpKind::MoeDispatch &&
           k != ir::OpKind::MoeExperts && k != ir::OpKind::MoeCombine &&
           k != ir::OpKind::AllToAll && k != ir::OpKind::Next &&
           k != ir::OpKind::BatchNorm; // its forward updates the running statistics
  }
};

} // namespace

std::unique_ptr<Pass> createRecomputePass() {
  return std::make_unique<Recompute>();
}

} // namespace epl::passes
