// split-layout: choose each op's tensor-parallel form inside `split` regions.
//
// Layouts follow the data, as in Megatron-LM: a linear on a whole input is column-parallel
// and leaves its output cut along the last dim; a linear on such a cut input is
// row-parallel and leaves partial sums. attention splits heads, mlp its hidden width,
// embedding and cross_entropy the vocabulary, moe its experts, conv2d its output channels.
// Elementwise ops keep a layout their inputs share; everything else wants whole tensors.
// Outside split regions every tensor is data-parallel (the batch spread over the group).
//
// With `sequence_parallel = true` (Korthikanti et al., 2022), partial sums that feed
// row-wise or elementwise ops are reduce-scattered along the sequence (dim 1) instead of
// all-reduced, and those ops work on the slice: the residual stream, its norms and dropout
// hold 1 / w of the sequence, and ops that want it whole all-gather it again.
#include "passes/Passes.h"

#include <fmt/format.h>
#include <map>

namespace epl::passes {

namespace {

using ir::Layout;
using ir::LayoutKind;

const Layout kData{LayoutKind::DataParallel, -1};
const Layout kWhole{LayoutKind::Replicated, -1};
Layout cutAlong(int dim) {
  return Layout{LayoutKind::Sharded, dim};
}
const Layout kPartial{LayoutKind::Partial, -1};

class SplitLayout : public Pass {
public:
  const char* name() const override { return "split-layout"; }

  bool run(ir::Module& m, PassContext& ctx) override {
    readers_.clear();
    for (size_t i = 0; i < m.ops.size(); ++i)
      for (int t : m.ops[i].inputs)
        readers_[t].push_back(static_cast<int>(i));
    for (ir::Param& prm : m.params)
      prm.sumOverSplit = false;
    cutBy_.clear();
    for (size_t i = 0; i < m.ops.size(); ++i) {
      ir::Op& op = m.ops[i];
      int region = m.splitScopeOf(op.scope);
      int width = region >= 0 ? m.scopes[region].width : 1;
      op.inputLayouts.assign(op.inputs.size(), kData);
      op.splitForm = ir::SplitForm::None;
      Layout out = kData;
      if (width > 1 && !assign(m, op, width, region, out, ctx)) return true;
      if (!tiedCutsAgree(m, op, ctx)) return true;
      for (int t : op.outputs)
        m.tensors[t].layout = out;
    }
    return true;
  }

private:
  // Whether every op reading `tensor` is a moe's (experts want tokens spread, not gathered).
  bool onlyExpertsRead(const ir::Module& m, int tensor) const {
    auto it = readers_.find(tensor);
    if (it == readers_.end()) return false;
    for (int op : it->second) {
      ir::SplitRule r = ir::opInfo(m.ops[op].kind).split;
      if (r != ir::SplitRule::Experts && r != ir::SplitRule::Tokens) return false;
    }
    return true;
  }

  std::map<int, std::vector<int>> readers_; // tensor -> ops that read it

  // Sequence parallelism: whether `op` cuts the sequence of its tensors (dim 1) where they
  // arrive partial or already cut there. False when the policy is off or a tensor has no
  // sequence (fewer than 3 dims, or unknown length); an error when the length does not
  // divide by the width.
  bool sequenceCut(const ir::Module& m, const ir::Op& op, int w, int region, bool& failed,
                   PassContext& ctx) const {
    failed = false;
    if (!m.policy.sequenceParallel) return false;
    const ir::Shape& first = m.tensors[op.inputs[0]].type.shape;
    bool wants = false;
    for (int t : op.inputs) {
      const ir::Shape& s = m.tensors[t].type.shape;
      if (s.size() < 3 || s.size() != first.size() || !s[1].isConstant()) return false;
      Layout l = current(m, t);
      if (l.kind == LayoutKind::Sharded && l.dim != 1) return false;
      wants = wants || l.kind == LayoutKind::Partial || l == cutAlong(1);
    }
    if (!wants) return false;
    if (divides(op, m, region, first[1].coef, w, "sequence length", ctx,
                " with `sequence_parallel = true`"))
      return true;
    failed = true;
    return false;
  }

  // The op's input is cut along a dim its parameters do not have (a slice of the sequence,
  // the channels, or spread tokens): each device's gradient of its whole parameters is a
  // partial sum, added up over the split group as well (data-parallel pass).
  static void partialParamGrads(ir::Module& m, const ir::Op& op) {
    for (int p : op.params)
      if (m.params[p].shardDim < 0) m.params[p].sumOverSplit = true;
  }

  // Layout a tensor has where `op` reads it (a producer outside the region gives data-parallel).
  Layout current(const ir::Module& m, int tensor) const { return m.tensors[tensor].layout; }

  static bool divides(const ir::Op& op, const ir::Module& m, int region, int64_t size, int width,
                      const char* what, PassContext& ctx, const char* why = "") {
    if (size % width == 0) return true;
    auto d = ctx.diags.error(op.site, fmt::format("{} ({}) must be divisible by split width ({}){}",
                                                  what, size, width, why));
    if (op.site.line == op.loc.line && op.site.file == op.loc.file)
      d.length(static_cast<uint32_t>(ir::opInfo(op.kind).name.size()));
    else
      d.noteAt(op.loc, fmt::format("the op it cuts: `{}`", op.name));
    d.noteAt(m.scopes[region].loc, fmt::format("split width {} set here", width));
    return false;
  }

  // The size split divides for `op` (its heads, hidden width, experts, …).
  static int64_t cut(const ir::Op& op) { return ir::intAttr(op.attrs, ir::cutAttr(op.kind)); }

  void shard(ir::Module& m, const ir::Op& op, size_t param, int dim) {
    m.params[op.params[param]].shardDim = dim;
  }

  // A weight two layers share (linear's `tie`) is cut one way: the later layer's form must
  // cut it along the dim the earlier one did (a column-parallel head and a vocab-parallel
  // embedding both cut the vocabulary, dim 0) over the same width (an op outside every
  // block joins the region of a top-level `split` stage). In two stages, each holds a copy
  // cut alike (Param::copies).
  bool tiedCutsAgree(const ir::Module& m, const ir::Op& op, PassContext& ctx) {
    int region = m.splitScopeOf(op.scope);
    int width = region >= 0 ? m.scopes[region].width : 1;
    for (int q : op.params) {
      int dim = width > 1 ? m.params[q].shardDim : -1;
      auto [it, fresh] = cutBy_.try_emplace(q, TiedCut{dim, width, op.name});
      if (fresh || (it->second.dim == dim && it->second.width == width)) continue;
      auto along = [](int d, int w) {
        return d < 0 ? std::string("whole") : fmt::format("cut along dim {} {} ways", d, w);
      };
      auto d = ctx.diags.error(
          op.site, fmt::format("`{}` would hold its tied weight `{}` {}, but `{}` holds it {}: a "
                               "tied weight is cut one way",
                               op.name, m.params[q].name, along(dim, width), it->second.op,
                               along(it->second.dim, it->second.width)));
      if (op.site.line == op.loc.line && op.site.file == op.loc.file)
        d.length(static_cast<uint32_t>(ir::opInfo(op.kind).name.size()));
      else
        d.noteAt(op.loc, fmt::format("the op: `{}`", op.name));
      d.help("a `linear` head cuts its weight's rows (the vocabulary, as `embedding` does) "
             "when it reads a whole input, as after a `layer_norm`");
      return false;
    }
    return true;
  }
  struct TiedCut {
    int dim, width; // the dim cut (-1: whole) and the split width
    std::string op; // the first op reading it
  };
  std::map<int, TiedCut> cutBy_; // by parameter: how its first reader holds it

  bool assign(ir::Module& m, ir::Op& op, int w, int region, Layout& out, PassContext& ctx) {
    auto rank = [&](int t) { return static_cast<int>(m.tensors[t].type.shape.size()); };
    int x = op.inputs.empty() ? -1 : op.inputs[0];
    std::fill(op.inputLayouts.begin(), op.inputLayouts.end(), kWhole);
    if (op.kind == ir::OpKind::Next) {
      // Targets of each sample: the loader writes them with the tokens' layout (a split op
      // that wants them whole gets them gathered).
      op.inputLayouts[0] = out = current(m, x);
      return true;
    }
    switch (ir::opInfo(op.kind).split) {
    case ir::SplitRule::Linear: {
      int d = rank(x) - 1;
      int64_t in = m.tensors[x].type.shape[d].coef, n = cut(op);
      return columnOrRow(m, op, w, region, d, in, n, "`linear` input width",
                         "`linear` output width", out, ctx);
    }
    case ir::SplitRule::Heads:
      return assignHeads(m, op, w, region, out, ctx);
    case ir::SplitRule::Hidden:
      if (!divides(op, m, region, cut(op), w, "mlp hidden width", ctx)) return false;
      op.splitForm = ir::SplitForm::Hidden;
      shard(m, op, 0, 0), shard(m, op, 1, 0), shard(m, op, 2, 1);
      out = kPartial;
      return true;
    case ir::SplitRule::Experts:
      if (!divides(op, m, region, cut(op), w, "experts", ctx)) return false;
      op.splitForm = ir::SplitForm::Experts;
      // Each device's dispatched rows and counts, as the dispatch left them: the
      // all-to-all before the experts brings each device its experts' rows from the whole
      // group (whole: the copy's tokens) and their counts (cut), the one after takes the
      // outputs back (bridge-insertion).
      std::fill(op.inputLayouts.begin(), op.inputLayouts.end(), kData);
      for (size_t p = 0; p < op.params.size(); ++p)
        shard(m, op, p, 0);
      out = kWhole;
      return true;
    case ir::SplitRule::Tokens:
      // The router, the dispatch and the combine: each device its own tokens (nothing cut).
      std::fill(op.inputLayouts.begin(), op.inputLayouts.end(), kData);
      partialParamGrads(m, op);
      out = kData;
      return true;
    case ir::SplitRule::Channels: {
      int64_t in = m.tensors[x].type.shape[1].coef, n = cut(op);
      return columnOrRow(m, op, w, region, 1, in, n, "`conv2d` input channels", "`conv2d` channels",
                         out, ctx);
    }
    case ir::SplitRule::Vocab:
      return assignVocab(m, op, w, region, out, ctx);
    case ir::SplitRule::Elementwise: {
      bool failed = false;
      if (sequenceCut(m, op, w, region, failed, ctx)) {
        std::fill(op.inputLayouts.begin(), op.inputLayouts.end(), cutAlong(1));
        out = cutAlong(1);
        return true;
      }
      if (failed) return false;
      // Keep a layout all inputs share (not partial sums, which must be reduced first).
      Layout l = current(m, op.inputs[0]);
      bool same = l.kind != LayoutKind::Partial;
      // A pooling window must not straddle a cut along height or width.
      bool pool = op.kind == ir::OpKind::MaxPool || op.kind == ir::OpKind::AvgPool;
      if (pool && l.kind == LayoutKind::Sharded && l.dim >= 2) same = false;
      for (int t : op.inputs)
        same = same && current(m, t) == l && rank(t) == rank(op.inputs[0]);
      if (same) {
        std::fill(op.inputLayouts.begin(), op.inputLayouts.end(), l);
        out = l;
        return true;
      }
      out = kWhole;
      return true;
    }
    case ir::SplitRule::RowWise: {
      // Rows are independent, so a norm could run data-parallel; that pays only when
      // experts read it (they want tokens spread). Otherwise gather its input once, as
      // Megatron-LM does, so a residual beside it reuses the gathered tensor.
      Layout l = current(m, x);
      bool failed = false;
      if (sequenceCut(m, op, w, region, failed, ctx)) l = cutAlong(1);
      if (failed) return false;
      bool forExperts = l.kind == LayoutKind::DataParallel && onlyExpertsRead(m, op.outputs[0]);
      if (forExperts || (l.kind == LayoutKind::Sharded && l.dim != rank(x) - 1)) {
        op.inputLayouts[0] = l;
        out = l;
        partialParamGrads(m, op);
      } else {
        out = kWhole;
      }
      return true;
    }
    case ir::SplitRule::Replicated:
    case ir::SplitRule::Communication:
      out = kWhole;
      return true;
    }
    return true;
  }

  // Attention: each device its share of the query heads and of the k/v heads they read.
  // Wqkv and bqkv by rows, in three blocks (q, k, v: H, KV and KV heads), Wp by columns;
  // bp whole. Without biases, Wqkv and Wp.
  bool assignHeads(ir::Module& m, ir::Op& op, int w, int region, Layout& out, PassContext& ctx) {
    int64_t kv = op.attrs.count("kv_heads") ? ir::intAttr(op.attrs, "kv_heads") : cut(op);
    if (!divides(op, m, region, cut(op), w, "heads", ctx) ||
        !divides(op, m, region, kv, w, "kv_heads", ctx))
      return false;
    op.splitForm = ir::SplitForm::Heads;
    std::vector<int64_t> blocks{cut(op), kv, kv};
    bool bias = op.params.size() == 4;
    shard(m, op, 0, 0);
    m.params[op.params[0]].shardBlocks = blocks;
    if (bias) {
      shard(m, op, 1, 0);
      m.params[op.params[1]].shardBlocks = blocks;
    }
    shard(m, op, bias ? 2 : 1, 1);
    out = kPartial;
    return true;
  }

  // A weight [out, in, …] applied along dim `d` of the input: column-parallel (cut `out`,
  // output cut along d) on a whole input, row-parallel (cut `in`, partial sums) on an
  // input already cut along d.
  bool columnOrRow(ir::Module& m, ir::Op& op, int w, int region, int d, int64_t in, int64_t outSize,
                   const char* inWhat, const char* outWhat, Layout& out, PassContext& ctx) {
    if (current(m, op.inputs[0]) == cutAlong(d)) {
      if (!divides(op, m, region, in, w, inWhat, ctx)) return false;
      op.splitForm = ir::SplitForm::Row;
      op.inputLayouts[0] = cutAlong(d);
      shard(m, op, 0, 1);
      out = kPartial;
      return true;
    }
    if (!divides(op, m, region, outSize, w, outWhat, ctx)) return false;
    op.splitForm = ir::SplitForm::Column;
    shard(m, op, 0, 0);
    if (op.params.size() > 1) shard(m, op, 1, 0);
    out = cutAlong(d);
    return true;
  }

  bool assignVocab(ir::Module& m, ir::Op& op, int w, int region, Layout& out, PassContext& ctx) {
    if (op.kind == ir::OpKind::Embedding) {
      if (!divides(op, m, region, cut(op), w, "vocab", ctx)) return false;
      op.splitForm = ir::SplitForm::Vocab;
      shard(m, op, 0, 0);
      out = kPartial;
      return true;
    }
    // cross_entropy: vocabulary-parallel when the logits arrive cut along the vocab.
    int logits = op.inputs[0];
    int last = static_cast<int>(m.tensors[logits].type.shape.size()) - 1;
    if (m.tensors[logits].layout == cutAlong(last)) {
      op.splitForm = ir::SplitForm::Vocab;
      op.inputLayouts[0] = cutAlong(last);
    }
    out = kWhole;
    return true;
  }
};

} // namespace

std::unique_ptr<Pass> createSplitLayoutPass() {
  return std::make_unique<SplitLayout>();
}

} // namespace epl::passes
