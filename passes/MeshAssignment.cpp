// mesh-assignment: size the device mesh and the micro-batch.
//
//   1. Each split region gets a width: its own `split(n)`, or for `split`/`split(auto)`
//      the widest explicit width in the model, else the widest of 8, 4, 2 that divides
//      what the region cuts and -np.
//   2. A stage's split width w is its widest region; g is the widest over all stages.
//   3. Each stage group has g devices, or n when `replicate(n)` pins it; it must be a
//      multiple of the stage's w. One replica needs the sum of the groups.
//   4. -np must be a multiple of that sum; the quotient is the outer data-parallel width.
//      With `chunks = v` (interleaved), the stage blocks go round-robin over S / v device
//      groups: block k shares block k mod (S / v)'s devices, and a replica needs the sum of
//      the first S / v groups.
//   5. global batch = micro-batch x micro_batches x data-parallel width, and each stage
//      must divide its micro-batch over its devices. The batch symbol binds to it.
//   With -np 1 every split width is 1: one device runs the whole model.
#include "passes/Passes.h"

#include "ir/PipelineSchedule.h"
#include "support/Checked.h"

#include <climits>
#include <fmt/format.h>

namespace epl::passes {

namespace {

// The sizes a region cuts under split, for choosing an `auto` width.
std::vector<int64_t> cutSizes(const ir::Module& m, int region) {
  std::vector<int64_t> out;
  for (const ir::Op& op : m.ops) {
    if (m.splitScopeOf(op.scope) != region) continue;
    for (const std::string& attr : {ir::cutAttr(op.kind), ir::opInfo(op.kind).cutAlso})
      if (!attr.empty() && op.attrs.count(attr)) out.push_back(ir::intAttr(op.attrs, attr));
  }
  return out;
}

class MeshAssignment : public Pass {
public:
  const char* name() const override { return "mesh-assignment"; }

  bool run(ir::Module& m, PassContext& ctx) override {
    ir::Mesh& mesh = m.mesh;
    int p = static_cast<int>(mesh.stages.size());
    if (ctx.np == 1)
      for (size_t s = 1; s < m.scopes.size(); ++s)
        m.scopes[s] = oneDevice(m.scopes[s]);
    std::vector<int> regionStage = regionsByStage(m);
    resolveWidths(m, ctx, regionStage);
    int g = 1;
    for (auto& st : mesh.stages)
      st.splitWidth = 1;
    for (size_t r = 0; r < regionStage.size(); ++r)
      if (regionStage[r] >= 0) {
        auto& st = mesh.stages[regionStage[r]];
        st.splitWidth = std::max(st.splitWidth, m.scopes[r].width);
        g = std::max(g, st.splitWidth);
      }
    if (!assignChunks(m, ctx)) return true;
    int depth = mesh.depth();
    int64_t offset = 0;
    for (int s = 0; s < p; ++s) {
      ir::StagePlan& st = mesh.stages[s];
      st.group = st.pinned ? m.scopes[st.scope].width : g;
      if (st.group % st.splitWidth != 0) {
        ctx.diags
            .error(st.loc,
                   fmt::format("stage {} has {} devices, which cannot hold a split of width {}", s,
                               st.group, st.splitWidth))
            .length(9)
            .help(fmt::format("make `replicate({})` a multiple of {}", st.group, st.splitWidth));
        return true;
      }
      if (s >= depth) {
        // A later model chunk on the devices of block s mod depth.
        const ir::StagePlan& host = mesh.stages[s % depth];
        if (st.group != host.group) {
          ctx.diags
              .error(st.loc, fmt::format("stage {} shares the devices of stage {} (`chunks = {}`), "
                                         "which has {} device{}, not {}",
                                         s, s % depth, mesh.chunks, host.group,
                                         host.group == 1 ? "" : "s", st.group))
              .length(9)
              .help("give the stage blocks that share devices the same `replicate(n)`");
          return true;
        }
        st.firstLocalRank = host.firstLocalRank;
        continue;
      }
      st.firstLocalRank = static_cast<int>(offset);
      offset += st.group;
      if (offset > INT_MAX) {
        ctx.diags
            .error(m.loc, fmt::format("one replica of `{}` needs more than {} devices", m.modelName,
                                      INT_MAX))
            .length(static_cast<uint32_t>(m.modelName.size()));
        return true;
      }
    }
    mesh.replicaSize = static_cast<int>(offset);
    mesh.np = ctx.np > 0 ? ctx.np : mesh.replicaSize;
    if (mesh.np % mesh.replicaSize != 0) {
      auto d = ctx.diags.error(
          m.loc, fmt::format("-np {} is not a multiple of the {} devices one replica of `{}` needs",
                             mesh.np, mesh.replicaSize, m.modelName));
      d.length(static_cast<uint32_t>(m.modelName.size()));
      for (int s = 0; s < p; ++s)
        d.note(fmt::format("stage {}: {} device{} (split width {})", s, mesh.stages[s].group,
                           mesh.stages[s].group == 1 ? "" : "s", mesh.stages[s].splitWidth));
      d.help(fmt::format("use -np {}, {} or another multiple of {}", mesh.replicaSize,
                         2 * mesh.replicaSize, mesh.replicaSize));
      return true;
    }
    mesh.dataParallel = mesh.np / mesh.replicaSize;
    checkSchedule(m, ctx);
    bindBatch(m, ctx);
    if (!ctx.diags.hasErrors()) checkSizes(m, ctx);
    m.planned = !ctx.diags.hasErrors();
    return true;
  }

private:
  static ir::Scope oneDevice(ir::Scope sc) {
    sc.width = 1;
    sc.isAuto = false;
    return sc;
  }

  // The stage of every split region (indexed by scope id), -1 for other scopes.
  static std::vector<int> regionsByStage(const ir::Module& m) {
    std::vector<int> out(m.scopes.size(), -1);
    for (const ir::Op& op : m.ops) {
      int r = m.splitScopeOf(op.scope);
      if (r >= 0) out[r] = op.stage;
    }
    return out;
  }

  void resolveWidths(ir::Module& m, PassContext& ctx, const std::vector<int>& regionStage) {
    int explicitMax = 0;
    for (size_t r = 0; r < m.scopes.size(); ++r)
      if (regionStage[r] >= 0 && !m.scopes[r].isAuto)
        explicitMax = std::max(explicitMax, m.scopes[r].width);
    int p = static_cast<int>(m.mesh.stages.size());
    for (size_t r = 0; r < m.scopes.size(); ++r) {
      ir::Scope& sc = m.scopes[r];
      if (regionStage[r] < 0 || !sc.isAuto) continue;
      if (explicitMax > 0) {
        sc.width = explicitMax;
        continue;
      }
      sc.width = 1;
      auto sizes = cutSizes(m, static_cast<int>(r));
      for (int w : {8, 4, 2}) {
        bool fits = ctx.np == 0 || ctx.np % (p * w) == 0;
        for (int64_t s : sizes)
          fits = fits && s % w == 0;
        if (fits) {
          sc.width = w;
          break;
        }
      }
    }
  }

  // `chunks = v`: v stage blocks per pipeline rank, for the interleaved schedule; the stage
  // blocks must fill the ranks evenly and leave at least two. One stage (-np 1 collapses
  // the model into one) has nothing to interleave: chunks is 1.
  static bool assignChunks(ir::Module& m, PassContext& ctx) {
    ir::Mesh& mesh = m.mesh;
    const ir::Policy& pol = m.policy;
    int blocks = static_cast<int>(mesh.stages.size());
    mesh.chunks = 1;
    if (pol.chunks == 1 || blocks < 2) return true;
    SourceLoc at = pol.keyLocs.count("chunks") ? pol.keyLocs.at("chunks") : m.loc;
    if (pol.schedule != ir::Schedule::Interleaved) {
      ctx.diags.error(at, fmt::format("`chunks = {}` needs `schedule = interleaved`", pol.chunks))
          .length(6)
          .note("chunks places several stage blocks on each pipeline rank, which only the "
                "interleaved schedule orders")
          .help("set `schedule = interleaved`, or remove `chunks`");
      return false;
    }
    if (blocks % pol.chunks != 0 || blocks / pol.chunks < 2) {
      ctx.diags
          .error(at, fmt::format("`chunks = {}` does not fit {} stage blocks", pol.chunks, blocks))
          .length(6)
          .note("the stage blocks go round-robin over blocks / chunks pipeline ranks, which "
                "must be a whole number of at least 2")
          .help(blocks >= 4 ? fmt::format("use `chunks = {}`", blocks % 2 == 0 ? 2 : 1)
                            : std::string("use `chunks = 1`, or more `replicate { … }` stages"));
      return false;
    }
    mesh.chunks = static_cast<int>(pol.chunks);
    return true;
  }

  // The schedule's own requirements (ir/PipelineSchedule.h), reported at the `schedule` key;
  // the default schedule, 1f1b, orders any pipeline. -np 1 runs every stage on one device,
  // where no schedule applies.
  void checkSchedule(ir::Module& m, PassContext& ctx) {
    const ir::Policy& pol = m.policy;
    if (pol.schedule != ir::Schedule::Interleaved || !pol.keyLocs.count("schedule") || ctx.np == 1)
      return;
    SourceLoc at = pol.keyLocs.at("schedule");
    int p = m.mesh.depth(), mb = static_cast<int>(pol.microBatches);
    if (m.mesh.stages.size() < 2) {
      ctx.diags.error(at, "`schedule = interleaved` needs at least two pipeline stages")
          .length(8)
          .help("use `gpipe` or `1f1b`, or split the model into `replicate { … }` stages");
      return;
    }
    std::string why = ir::scheduleRequirement(pol.schedule, {p, mb, m.mesh.chunks});
    if (!why.empty())
      ctx.diags.error(at, fmt::format("`schedule = interleaved` {}", why))
          .length(8)
          .note("interleaved 1F1B runs the micro-batches in rounds of one per stage")
          .help(fmt::format("use `micro_batches = {}`, or `1f1b` or `zb`", (mb / p + 1) * p));
  }

  void bindBatch(ir::Module& m, PassContext& ctx) {
    if (!m.train.present || m.train.batch <= 0) return;
    ir::Mesh& mesh = m.mesh;
    int64_t mb = m.policy.microBatches, dp = mesh.dataParallel, batch = m.train.batch;
    SourceLoc at = m.train.keyLocs.count("batch") ? m.train.keyLocs.at("batch") : m.loc;
    if (batch % (mb * dp) != 0) {
      ctx.diags
          .error(at, fmt::format("global batch {} is not divisible by micro_batches ({}) x "
                                 "data-parallel width ({}) = {}",
                                 batch, mb, dp, mb * dp))
          .length(5)
          .help(fmt::format("make `batch` a multiple of {}", mb * dp));
      return;
    }
    int64_t micro = batch / (mb * dp);
    for (size_t s = 0; s < mesh.stages.size(); ++s) {
      // Ops outside split regions spread the micro-batch over the whole group; a stage
      // that is all split regions spreads it over its copies.
      const ir::StagePlan& st = mesh.stages[s];
      int64_t devices = st.allSplit ? st.copies() : st.group;
      if (micro % devices != 0) {
        int64_t need = mb * dp * devices;
        ctx.diags
            .error(
                at,
                fmt::format(
                    "a micro-batch of {} samples cannot be divided over the {} devices of stage {}",
                    micro, devices, s))
            .length(5)
            .note(fmt::format("micro-batch = batch {} / (micro_batches {} x data-parallel {})",
                              batch, mb, dp))
            .help(fmt::format("make `batch` a multiple of {}", need));
        return;
      }
    }
    mesh.microBatch = micro;
    m.bindings[m.batchSymbol] = micro;
  }

  // Bytes op `op` holds with the batch bound (a symbol without a binding counts as 1):
  // its outputs and their gradients, what autodiff saves, its parameters with their
  // gradients and two optimizer moments (moe's dispatched rows, top_k copies of its
  // tokens, are an output of moe_dispatch). nullopt past 2^63 - 1.
  static std::optional<int64_t> opBytes(const ir::Module& m, const ir::Op& op) {
    std::optional<int64_t> sum = 0;
    auto add = [&](const ir::TensorType& t, int64_t times) {
      std::optional<int64_t> b = ir::checkedBytes(t, m.bindings);
      if (sum && b) b = checkedMul(*b, times);
      sum = sum && b ? checkedAdd(*sum, *b) : std::nullopt;
    };
    std::vector<ir::TensorType> in;
    for (int t : op.inputs)
      in.push_back(m.tensors[t].type);
    for (int t : op.outputs)
      add(m.tensors[t].type, 2);
    for (const ir::TensorType& t : ir::gradInfo(op.kind, in, op.attrs).saved)
      add(t, 1);
    for (int p : op.params)
      add(m.params[p].type, 4);
    return sum;
  }

  // Sizes grow when the batch binds. Every tensor must still fit, and so must the sum of
  // all of them (below 2^62 bytes, a margin for alignment), so that the passes after
  // this one add up bytes without overflow.
  void checkSizes(const ir::Module& m, PassContext& ctx) {
    constexpr int64_t kLimit = int64_t{1} << 62;
    std::optional<int64_t> total = 0;
    auto add = [&](std::optional<int64_t> b) {
      total = total && b ? checkedAdd(*total, *b) : std::nullopt;
    };
    for (int t : m.inputs)
      add(ir::checkedBytes(m.tensors[t].type, m.bindings));
    for (const ir::Op& op : m.ops) {
      add(opBytes(m, op));
      if (total && *total <= kLimit) continue;
      auto d = ctx.diags.error(
          op.loc, fmt::format("`{}` brings the tensors of `{}` past 2^62 bytes (about 4.6 EB)",
                              ir::opInfo(op.kind).name, m.modelName));
      if (op.site.file != op.loc.file || op.site.line != op.loc.line)
        d.noteAt(op.site, "in the expansion of this call");
      auto b = m.bindings.find(m.batchSymbol);
      if (b != m.bindings.end())
        d.note(
            fmt::format("with `{}` bound to the micro-batch of {} samples", b->first, b->second));
      d.note("counted: activations and their gradients, tensors saved for the backward, and "
             "parameters with their gradients and optimizer states");
      return;
    }
  }
};

} // namespace

std::unique_ptr<Pass> createMeshAssignmentPass() {
  return std::make_unique<MeshAssignment>();
}

} // namespace epl::passes
