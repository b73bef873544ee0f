// bridge-insertion: make every op's inputs arrive in the layout and stage it needs.
//
// Walking ops in program order, for each input:
//   1. produced in another stage: send/recv it to this stage (regrouping the batch when
//      the groups differ). It crosses data-parallel, or whole when it comes out of a
//      split region (each device sends its copy's piece, as Megatron-LM does); partial
//      sums are reduced and cut dims gathered first;
//   2. convert it to the layout the op needs (table below), reusing a conversion an
//      earlier op of the same stage already made.
// Conversions: partial -> all-reduce; data-parallel -> whole: all-gather the batch over
// the split group; cut -> whole: all-gather that dim; whole -> cut or data-parallel: a
// local slice (no transfer); partial -> cut: reduce-scatter. Experts add an all-to-all
// before and after. Model inputs are read by the data loader on each device as its share
// of the batch, gathered where a split op wants them whole. A whole input of a split op
// that cuts its output enters through an identity whose backward all-reduces (enterSplit);
// under sequence parallelism a sequence slice entering such an op is all-gathered by a
// gather whose backward reduce-scatters instead (gatherEntering).
#include "passes/Passes.h"

#include "support/Assert.h"
#include "support/Checked.h"

#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <tuple>

namespace epl::passes {

namespace {

using ir::Layout;
using ir::LayoutKind;

class BridgeInsertion : public Pass {
public:
  const char* name() const override { return "bridge-insertion"; }

  bool run(ir::Module& m, PassContext&) override {
    m_ = &m;
    std::vector<ir::Op> old = std::move(m.ops);
    m.ops.clear();
    m.bridges.clear();
    cache_.clear();
    rename_.clear();
    learned_.clear();
    std::vector<int> newId(old.size(), -1), owner;
    for (const ir::Param& p : m.params)
      owner.push_back(p.op);
    for (size_t i = 0; i < old.size(); ++i) {
      ir::Op op = std::move(old[i]);
      for (size_t k = 0; k < op.inputs.size(); ++k)
        op.inputs[k] = arrive(op.inputs[k], op, k);
      if (!op.inputs.empty()) op.inputs[0] = enterSplit(op.inputs[0], op);
      bool experts = op.splitForm == ir::SplitForm::Experts;
      int counts = experts ? op.inputs[1] : -1;
      if (experts) {
        auto [rows, local] = exchange(op.inputs[0], counts, op, "dispatch");
        op.inputs[0] = rows;
        op.inputs[1] = local;
      }
      newId[i] = static_cast<int>(m.ops.size());
      bool vocabLoss = op.kind == ir::OpKind::CrossEntropy && op.splitForm == ir::SplitForm::Vocab;
      for (int t : op.outputs)
        m.tensors[t].producer = newId[i];
      for (int p : op.params)
        if (owner[p] == static_cast<int>(i)) m.params[p].op = newId[i]; // not a tied use
      int out = op.outputs[0];
      m.ops.push_back(std::move(op));
      // Both may append ops, so no reference into m.ops is held across them.
      if (experts) rename_[out] = exchange(out, counts, m.ops[newId[i]], "combine").first;
      if (vocabLoss) recordVocabLoss(newId[i]);
    }
    return !m.bridges.empty();
  }

private:
  // Bytes of `tensor` on one device when the batch symbol counts `samples` samples.
  int64_t bytesWith(int tensor, int64_t samples) const {
    if (!m_->bindings.count(m_->batchSymbol)) return -1;
    auto b = m_->bindings;
    b[m_->batchSymbol] = samples;
    auto n = ir::numElements(m_->tensors[tensor].type.shape, b);
    return n ? bounded(checkedMul(*n, ir::dtypeBytes(m_->tensors[tensor].type.dtype))) : -1;
  }
  // mesh-assignment keeps every op's bytes, a moe's top_k copies of its tokens included,
  // below 2^62: a bridge's figure derived from them cannot overflow.
  static int64_t bounded(std::optional<int64_t> bytes) {
    EPL_ASSERT(bytes.has_value(), "bridge bytes past 2^63 - 1 after mesh-assignment");
    return *bytes;
  }
  int64_t micro() const { return m_->mesh.microBatch; }
  const ir::StagePlan& stage(int s) const { return m_->mesh.stages[s]; }

  int emit(ir::OpKind kind, int input, int stage, int scope, SourceLoc loc, ir::Attrs attrs,
           const std::string& suffix, const std::string& what, int64_t bytes, int fromStage) {
    ir::Op op;
    op.kind = kind;
    op.name = m_->tensors[input].name + "." + suffix;
    op.inputs = {input};
    op.attrs = std::move(attrs);
    op.scope = scope;
    op.stage = stage;
    op.loc = loc;
    op.site = loc;
    op.inputLayouts = {m_->tensors[input].layout};
    int id = static_cast<int>(m_->ops.size());
    int out = m_->addTensor(op.name, m_->tensors[input].type, id);
    op.outputs = {out};
    m_->ops.push_back(std::move(op));
    m_->bridges.push_back(ir::Bridge{id, what, fromStage, stage, bytes});
    return out;
  }

  // Whether `t` has the batch in dim 0 (scalars and position tables do not).
  bool hasBatch(int t) const {
    const ir::Shape& shape = m_->tensors[t].type.shape;
    return !shape.empty() &&
           std::count(shape[0].syms.begin(), shape[0].syms.end(), m_->batchSymbol) > 0;
  }

  // Data-parallel and whole are one layout where there is nothing to gather: in a stage
  // without split regions (each copy is one device), or for a tensor without a batch.
  bool sameAs(int t, Layout from, Layout to, int s) const {
    if (from == to) return true;
    auto batchOnly = [](Layout l) {
      return l.kind == LayoutKind::DataParallel || l.kind == LayoutKind::Replicated;
    };
    return batchOnly(from) && batchOnly(to) && (stage(s).splitWidth == 1 || !hasBatch(t));
  }

  // Converts `t` (in stage `s`, region scope `scope`) to layout `to`.
  int convert(int t, Layout to, int s, int scope, SourceLoc loc) {
    Layout from = m_->tensors[t].layout;
    if (sameAs(t, from, to, s)) return t;
    auto key = std::make_tuple(t, static_cast<int>(to.kind), to.dim, s);
    auto hit = cache_.find(key);
    if (hit != cache_.end()) return hit->second;
    int64_t copyBytes = micro() ? bytesWith(t, micro() / stage(s).copies()) : -1;
    int out = -1;
    auto dimName = [](int d) { return d < 0 ? std::string("batch") : "dim " + std::to_string(d); };
    const Layout whole{LayoutKind::Replicated, -1};
    bool direct = from.kind == LayoutKind::Replicated || to == whole ||
                  (from.kind == LayoutKind::Partial && to.kind == LayoutKind::Sharded);
    if (!direct) { // through the whole tensor, which other readers may share
      out = convert(convert(t, whole, s, scope, loc), to, s, scope, loc);
      cache_[key] = out;
      return out;
    }
    if (from.kind == LayoutKind::Partial && to.kind == LayoutKind::Sharded) {
      out =
          emit(ir::OpKind::ReduceScatter, t, s, scope, loc, {{"dim", std::string(dimName(to.dim))}},
               "scattered", "reduce-scatter " + dimName(to.dim),
               copyBytes < 0 ? -1 : copyBytes / stage(s).splitWidth, s);
      m_->tensors[out].layout = to;
    } else if (from.kind == LayoutKind::Partial) {
      out =
          emit(ir::OpKind::AllReduce, t, s, scope, loc, {}, "reduced", "all-reduce", copyBytes, s);
      m_->tensors[out].layout = Layout{LayoutKind::Replicated, -1};
    } else if (from.kind == LayoutKind::Replicated) {
      int d = to.kind == LayoutKind::Sharded ? to.dim : -1;
      out = emit(ir::OpKind::Slice, t, s, scope, loc, {{"dim", std::string(dimName(d))}}, "slice",
                 "slice " + dimName(d), 0, s);
      m_->tensors[out].layout = to;
      cache_[key] = out;
      return out;
    } else {
      int d = from.kind == LayoutKind::Sharded ? from.dim : -1;
      out = emit(ir::OpKind::AllGather, t, s, scope, loc, {{"dim", std::string(dimName(d))}},
                 "gathered", "all-gather " + dimName(d), copyBytes, s);
      m_->tensors[out].layout = Layout{LayoutKind::Replicated, -1};
    }
    out = convert(out, to, s, scope, loc);
    cache_[key] = out;
    return out;
  }

  // The tensor op `op` reads as its input `k`: renamed, moved across stages, converted.
  int arrive(int t, const ir::Op& op, size_t k) {
    auto r = rename_.find(t);
    if (r != rename_.end()) t = r->second;
    int producer = m_->tensors[t].producer;
    // Model inputs (and `next`'s targets) come from the data loader, which reads on each
    // device its share of the batch; an op of a split region that wants them whole gets
    // them gathered. In a stage whose micro-batch does not divide over its devices the
    // loader reads them whole.
    bool loaded = producer < 0 || (m_->ops[producer].kind == ir::OpKind::Next &&
                                   m_->ops[producer].stage == op.stage);
    if (loaded) {
      Layout want = k < op.inputLayouts.size() ? op.inputLayouts[k] : Layout{};
      if (micro() > 0 && micro() % stage(op.stage).group != 0) return t;
      return convert(t, want, op.stage, op.scope, op.site);
    }
    int from = m_->ops[producer].stage;
    if (from != op.stage) {
      auto key = std::make_tuple(t, -1, -1, op.stage);
      auto hit = cache_.find(key);
      if (hit != cache_.end()) {
        t = hit->second;
      } else {
        const ir::Op& prod = m_->ops[producer];
        // A stage of split regions only holds whole tensors (its micro-batch need not
        // divide over all its devices).
        bool whole =
            m_->tensors[t].layout.kind != LayoutKind::DataParallel || stage(op.stage).allSplit;
        Layout crossing = whole ? Layout{LayoutKind::Replicated, -1} : Layout{};
        int sent = convert(t, crossing, from, prod.scope, prod.site);
        // Pieces per group: data-parallel spreads the micro-batch over all devices,
        // whole tensors over the copies of the split region.
        int srcPieces = whole ? stage(from).copies() : stage(from).group;
        int dstPieces = whole ? stage(op.stage).copies() : stage(op.stage).group;
        std::string what = srcPieces == dstPieces ? "send/recv"
                                                  : fmt::format("send/recv, batch split {} -> {}",
                                                                srcPieces, dstPieces);
        int64_t bytes = micro() ? bytesWith(sent, micro() / dstPieces) : -1;
        t = emit(ir::OpKind::SendRecv, sent, op.stage, 0, op.site,
                 {{"from_stage", int64_t{from}}, {"to_stage", int64_t{op.stage}}},
                 "to_stage" + std::to_string(op.stage), what, bytes, from);
        m_->tensors[t].layout = crossing;
        cache_[key] = t;
      }
    }
    Layout want = k < op.inputLayouts.size() ? op.inputLayouts[k] : Layout{};
    if (k == 0 && m_->policy.sequenceParallel && cutsOutput(op) &&
        want.kind == LayoutKind::Replicated && m_->tensors[t].layout.kind == LayoutKind::Sharded &&
        learned(t))
      return gatherEntering(t, op);
    return convert(t, want, op.stage, op.scope, op.site);
  }

  static bool cutsOutput(const ir::Op& op) {
    return op.splitForm == ir::SplitForm::Column || op.splitForm == ir::SplitForm::Heads ||
           op.splitForm == ir::SplitForm::Hidden;
  }

  // Sequence parallelism: a slice entering a split op that cuts its output is gathered
  // whole, and the op leaves each device a partial gradient of the whole; the gather's
  // backward reduce-scatters them (one collective, where an identity's all-reduce and the
  // gather's slice would be two). Ops of one region share it.
  int gatherEntering(int t, const ir::Op& op) {
    auto key = std::make_tuple(t, -3, m_->splitScopeOf(op.scope), op.stage);
    auto hit = cache_.find(key);
    if (hit != cache_.end()) return hit->second;
    int d = m_->tensors[t].layout.dim;
    int64_t bytes = micro() ? bytesWith(t, micro() / stage(op.stage).copies()) : -1;
    std::string dim = "dim " + std::to_string(d);
    int out = emit(ir::OpKind::AllGather, t, op.stage, op.scope, op.site,
                   {{"dim", dim}, {"backward", std::string("reduce-scatter")}}, "gathered",
                   "all-gather " + dim + "; reduce-scatter backward", bytes, op.stage);
    m_->tensors[out].layout = Layout{LayoutKind::Replicated, -1};
    cache_[key] = out;
    return out;
  }

  // A split op that cuts its output (column, heads, hidden) on a whole input leaves each
  // device a partial gradient of that input: the input enters through an identity whose
  // backward sums them (Megatron-LM's pairing: this all-reduce in the backward, the one
  // after the row-parallel half in the forward). Ops of one region share it.
  int enterSplit(int t, const ir::Op& op) {
    if (!cutsOutput(op) || m_->tensors[t].layout.kind != LayoutKind::Replicated || !learned(t))
      return t;
    int producer = m_->tensors[t].producer;
    if (producer >= 0 && ir::reduceScattersBackward(m_->ops[producer])) return t;
    auto key = std::make_tuple(t, -2, m_->splitScopeOf(op.scope), op.stage);
    auto hit = cache_.find(key);
    if (hit != cache_.end()) return hit->second;
    int64_t bytes = micro() ? bytesWith(t, micro() / stage(op.stage).copies()) : -1;
    int out = emit(ir::OpKind::Identity, t, op.stage, op.scope, op.site, {}, "entered",
                   "identity; all-reduce backward", bytes, op.stage);
    m_->tensors[out].layout = m_->tensors[t].layout;
    cache_[key] = out;
    return out;
  }

  // Split experts: the all-to-all that brings each device the rows of its experts from
  // every device of the group, with their counts (dispatch: rows and counts in, the
  // gathered rows, whole, and this device's experts' counts, cut, out), or takes the
  // experts' outputs back to the devices of their tokens (combine: one output, as
  // dispatched). Listed with the most a device can get: every row of its copy's tokens.
  // `op` is copied: emit() grows m.ops, which may move it.
  std::pair<int, int> exchange(int rows, int counts, ir::Op op, const char* phase) {
    bool dispatch = std::string(phase) == "dispatch";
    int64_t bytes = micro() ? bytesWith(rows, micro() / stage(op.stage).copies()) : -1;
    int out = emit(ir::OpKind::AllToAll, rows, op.stage, op.scope, op.site,
                   {{"phase", std::string(phase)}}, phase, std::string("all-to-all ") + phase,
                   bytes, op.stage);
    ir::Op& a2a = m_->ops.back();
    a2a.inputs.push_back(counts);
    a2a.inputLayouts.push_back(m_->tensors[counts].layout);
    m_->tensors[out].layout = dispatch ? Layout{LayoutKind::Replicated, -1} : Layout{};
    if (!dispatch) return {out, -1};
    int id = static_cast<int>(m_->ops.size()) - 1;
    int local = m_->addTensor(a2a.name + ".counts", m_->tensors[counts].type, id);
    m_->tensors[local].layout = Layout{LayoutKind::Sharded, 0};
    m_->ops[id].outputs.push_back(local);
    return {out, local};
  }

  // A vocabulary-parallel loss gathers every device's figures of the split group: the
  // log-sum-exp of each token and the mean target logit, (tokens + 1) floats a device
  // (Module::vocabFigures); listed so the plan shows every byte moved.
  void recordVocabLoss(int opId) {
    const ir::Op& op = m_->ops[opId];
    int targets = op.inputs[1];
    int opStage = op.stage;
    int64_t bytes = micro() ? bytesWith(targets, micro() / stage(opStage).copies()) : -1;
    if (bytes > 0)
      bytes = bounded(checkedMul(bytes / ir::dtypeBytes(m_->tensors[targets].type.dtype) + 1,
                                 4 * stage(opStage).splitWidth));
    m_->bridges.push_back(
        ir::Bridge{opId, "all-gather (vocab-parallel loss)", opStage, opStage, bytes});
  }

  // Whether tensor t depends on a parameter (only then does a gradient flow back into it).
  bool learned(int t) {
    auto hit = learned_.find(t);
    if (hit != learned_.end()) return hit->second;
    int producer = m_->tensors[t].producer;
    bool yes = false;
    if (producer >= 0 && !ir::isIntegral(m_->tensors[t].type.dtype)) {
      const ir::Op& op = m_->ops[producer];
      yes = !op.params.empty();
      for (size_t k = 0; !yes && k < op.inputs.size(); ++k)
        yes = learned(op.inputs[k]);
    }
    return learned_[t] = yes;
  }

  ir::Module* m_ = nullptr;
  std::map<int, bool> learned_;
  std::map<std::tuple<int, int, int, int>, int> cache_;
  std::map<int, int> rename_;
};

} // namespace

std::unique_ptr<Pass> createBridgeInsertionPass() {
  return std::make_unique<BridgeInsertion>();
}

} // namespace epl::passes
