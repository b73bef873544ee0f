// memory-plan: place every activation and activation gradient of a rank in one arena.
//
//   1. Liveness over one micro-batch (later micro-batches reuse the same places) and the
//      optimizer phase: a tensor lives from the instruction that writes it first (model
//      inputs and `next` targets from the load) to the last one that reads or adds into
//      it. The loss lives to the end: the step reads it after the last micro-batch.
//   2. Offsets, largest tensor first: the lowest 64-byte-aligned offset that overlaps no
//      placed tensor whose lifetime meets this one's (greedy best fit).
//   3. The arena is the highest end; parameters, their gradients and the optimizer
//      states are counted beside it. Evaluation runs a prefix of the forward ops, so its
//      lifetimes sit inside the step's and the same offsets serve it.
#include "passes/Passes.h"

#include "support/Assert.h"

#include <algorithm>

namespace epl::passes {

namespace {

constexpr int64_t kAlign = 64;

struct Interval {
  int tensor;
  int first, last;
  int64_t bytes;
};

class MemoryPlan : public Pass {
public:
  const char* name() const override { return "memory-plan"; }

  bool run(ir::Module& m, PassContext&) override {
    for (ir::Program& p : m.programs)
      plan(m, p);
    return !m.programs.empty();
  }

private:
  static void plan(const ir::Module& m, ir::Program& p) {
    std::vector<Interval> live = lifetimes(m, p);
    std::sort(live.begin(), live.end(), [](const Interval& a, const Interval& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.tensor < b.tensor;
    });
    p.offset.assign(m.tensors.size(), -1);
    std::vector<const Interval*> placed;
    p.arenaBytes = 0;
    for (const Interval& iv : live) {
      int64_t at = lowestFit(iv, placed, p.offset);
      p.offset[iv.tensor] = at;
      placed.push_back(&iv);
      p.arenaBytes = std::max(p.arenaBytes, at + iv.bytes);
    }
    countStates(m, p);
  }

  static int64_t lowestFit(const Interval& iv, const std::vector<const Interval*>& placed,
                           const std::vector<int64_t>& offset) {
    std::vector<std::pair<int64_t, int64_t>> busy; // [begin, end) of overlapping lifetimes
    for (const Interval* o : placed)
      if (o->first <= iv.last && iv.first <= o->last)
        busy.push_back({offset[o->tensor], offset[o->tensor] + o->bytes});
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (auto [b, e] : busy) {
      if (at + iv.bytes <= b) break;
      at = std::max(at, (e + kAlign - 1) / kAlign * kAlign);
    }
    return at;
  }

  static std::vector<Interval> lifetimes(const ir::Module& m, const ir::Program& p) {
    std::vector<int> first(m.tensors.size(), -1), last(m.tensors.size(), -1);
    std::vector<bool> paramGrad(m.tensors.size(), false); // own buffers, not the arena
    for (const ir::Param& prm : m.params)
      if (prm.grad >= 0) paramGrad[prm.grad] = true;
    auto touch = [&](int t, int pos) {
      if (t < 0 || paramGrad[t]) return;
      if (first[t] < 0) first[t] = pos;
      last[t] = std::max(last[t], pos);
    };
    int pos = 0;
    for (const ir::Instr& in : p.step) {
      if (in.micro != 0 && in.kind != ir::InstrKind::Run) continue;
      const ir::Op* op = in.kind == ir::InstrKind::Run ? &m.ops[in.op] : nullptr;
      if (op && op->phase != ir::Phase::Optimizer && in.micro != 0) continue;
      if (in.kind == ir::InstrKind::Load) {
        for (int t : m.inputs)
          touch(t, pos);
        for (const ir::Op& o : m.ops)
          if (o.kind == ir::OpKind::Next) touch(o.outputs[0], pos);
      }
      if (in.kind == ir::InstrKind::SeedGrad) touch(m.lossGrad, pos);
      if (op) {
        for (int t : op->inputs)
          touch(t, pos);
        for (int t : op->outputs)
          touch(t, pos);
      }
      ++pos;
    }
    if (!m.outputs.empty()) touch(m.outputs[0], pos);
    std::vector<Interval> out;
    for (size_t t = 0; t < m.tensors.size(); ++t) {
      if (first[t] < 0) continue;
      auto bytes = m.bytesOf(static_cast<int>(t));
      EPL_ASSERT(bytes.has_value(), "a planned tensor has an unbound dim");
      out.push_back({static_cast<int>(t), first[t], last[t], std::max<int64_t>(*bytes, 1)});
    }
    return out;
  }

  static void countStates(const ir::Module& m, ir::Program& p) {
    int64_t params = 0, grads = 0;
    for (const ir::Param& prm : m.params) {
      int64_t n = ir::numElements(prm.type.shape, m.bindings).value_or(0);
      params += 4 * n;
      if (prm.grad >= 0) grads += 4 * n;
    }
    const ir::CallSpec& opt = m.train.optimizer;
    int states =
        opt.kind == "sgd" ? (opt.numbers.count("momentum") && opt.numbers.at("momentum") > 0) : 2;
    p.paramBytes = params;
    p.gradBytes = grads;
    p.optimizerBytes = states * grads;
  }
};

} // namespace

std::unique_ptr<Pass> createMemoryPlanPass() {
  return std::make_unique<MemoryPlan>();
}

} // namespace epl::passes
