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
//      all-to-all keeps host state per micro-batch) are not recomputed.
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

class Recompute : public Pass {
public:
  const char* name() const override { return "recompute"; }

  bool run(ir::Module& m, PassContext&) override {
    if (!m.train.present || m.lossGrad < 0) return false;
    std::vector<std::vector<int>> blocks = blocksOf(m);
    std::vector<bool> inBlock(m.ops.size(), false);
    for (const auto& b : blocks)
      for (int i : b)
        inBlock[i] = true;
    std::vector<std::pair<int, ir::Op>> inserted;
    for (const auto& b : blocks) {
      std::set<int> mine(b.begin(), b.end());
      std::vector<int> readers; // the block's backward ops
      for (size_t i = 0; i < m.ops.size(); ++i)
        if (m.ops[i].phase == ir::Phase::Backward && mine.count(m.ops[i].forward))
          readers.push_back(static_cast<int>(i));
      recompute(m, mine, readers, inserted);
    }
    // Step 2: the backward ops reading a sequence-parallel gather are its readers.
    for (size_t g = 0; m.policy.sequenceParallel && g < m.ops.size(); ++g) {
      if (m.ops[g].phase != ir::Phase::Forward || !ir::reduceScattersBackward(m.ops[g]) ||
          inBlock[g])
        continue;
      std::vector<int> readers;
      for (size_t i = 0; i < m.ops.size(); ++i) {
        const std::vector<int>& in = m.ops[i].inputs;
        if (m.ops[i].phase == ir::Phase::Backward &&
            std::find(in.begin(), in.end(), m.ops[g].outputs[0]) != in.end())
          readers.push_back(static_cast<int>(i));
      }
      recompute(m, {static_cast<int>(g)}, readers, inserted);
    }
    if (inserted.empty()) return false;
    ir::insertOps(m, std::move(inserted));
    return true;
  }

private:
  // Step 1: the forward ops of each block, in program order.
  static std::vector<std::vector<int>> blocksOf(const ir::Module& m) {
    const ir::Policy& pol = m.policy;
    if (pol.recompute != ir::Recompute::Every && pol.recompute != ir::Recompute::Listed) return {};
    std::map<std::pair<std::string, int>, std::vector<int>> byKey;
    std::vector<std::pair<std::string, int>> order;
    for (size_t i = 0; i < m.ops.size(); ++i) {
      const ir::Op& op = m.ops[i];
      if (op.phase != ir::Phase::Forward || op.kind == ir::OpKind::SendRecv) continue;
      std::string key = blockKey(pol, op.name);
      if (key.empty()) continue;
      auto k = std::make_pair(key, op.stage);
      if (!byKey.count(k)) order.push_back(k);
      byKey[k].push_back(static_cast<int>(i));
    }
    std::vector<std::vector<int>> out;
    for (const auto& k : order)
      out.push_back(byKey[k]);
    return out;
  }

  // The block an op's path name puts it in, or "" for none.
  static std::string blockKey(const ir::Policy& pol, const std::string& name) {
    size_t end = name.find('/');
    if (end == std::string::npos) return "";
    if (pol.recompute == ir::Recompute::Every) return name.substr(0, end);
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

  // Steps 3 and 4 for the forward ops `mine` of one block: its Recompute ops into
  // `inserted`, before the first of the backward ops `backward` (in program order), which
  // then read their outputs.
  static void recompute(ir::Module& m, const std::set<int>& mine, const std::vector<int>& backward,
                        std::vector<std::pair<int, ir::Op>>& inserted) {
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
           k != ir::OpKind::AllToAll && k != ir::OpKind::Next;
  }
};

} // namespace

std::unique_ptr<Pass> createRecomputePass() {
  return std::make_unique<Recompute>();
}

} // namespace epl::passes
