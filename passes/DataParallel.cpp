// data-parallel: the gradient reduction of a plan whose ranks each run the whole model on
// their share of the batch (Mesh::pureDataParallel, -np > 1), of a pipeline whose stages
// have several ranks (stage groups, data-parallel copies of the pipeline), and of the
// parameters outside the split regions of a stage that has some.
//
//   1. Every rank's gradients are summed over the ranks that hold the same parameters: all
//      np ranks, or a pipeline stage's ranks in every replica (the loss seed already
//      divides by their number, Program::dataRanks, so the sum is the mean over the global
//      batch). A stage of one rank in all has nothing to sum.
//   2. Parameters are grouped into buckets of about `bucket_mb`, from the last parameter
//      back: backward produces the last layers' gradients first. A bucket is a run of
//      consecutive parameters of one stage, so its gradients are one block of memory and one
//      collective. `bucket_mb = 0` makes one bucket of everything (of each stage).
//   3. A bucket is ready after the last backward op that writes one of its gradients; the
//      schedule starts its reduction there in the step's last micro-batch (earlier
//      micro-batches only accumulate), so communication overlaps the rest of the
//      backward. `overlap_comm = false` starts every bucket after the whole backward (of
//      its stage). Either way not before the last instruction that writes one of its
//      gradients: under zb an op's parameter gradients (its W part) may run after a later
//      op's input gradients (passes/PipelinePrograms.cpp, reductionStarts).
//   4. ZeRO stage 2 (Module::zeroShardsGradients) holds about two buckets of gradients at a
//      time besides each rank's slice: with `zero` >= 2, and without
//      `bucket_mb` in the script, buckets are of kZeroBucketBytes rather than 25 MB.
//   5. A weight tied across pipeline stages (Param::copies) is a bucket of its own in each
//      stage holding it, summed over the ranks of all of them (Module::tiedRanks) after
//      each one's backward: the embedding's gradient from the first stage and the head's
//      from the last, as Megatron-LM sums them. Also in a pipeline of one rank a stage.
#include "passes/Passes.h"

#include <algorithm>

namespace epl::passes {

namespace {

constexpr int64_t kZeroBucketBytes = 2'000'000;

class DataParallel : public Pass {
public:
  const char* name() const override { return "data-parallel"; }

  bool run(ir::Module& m, PassContext&) override {
    m.buckets.clear();
    m.reduceRanks = 1;
    if (!m.train.present || m.lossGrad < 0 || !m.planned) return false;
    const ir::Mesh& mesh = m.mesh;
    bool copies =
        mesh.stages.size() > 1 && mesh.np > mesh.depth() && mesh.pipelineRefusal().empty();
    // A stage with split regions: its ranks share each micro-batch outside the regions, so
    // the parameters there sum their gradients over all of them; inside, each rank computed
    // its piece (or the whole, alike in its split group) from its copy's micro-batch, summed
    // over the ranks of its split rank in every copy and replica.
    bool split = mesh.stages.size() == 1 && mesh.stages[0].splitWidth > 1 && m.runRefusal().empty();
    bool reduces = copies || split || (mesh.pureDataParallel() && mesh.np > 1);
    bool tied = mesh.stages.size() > 1 && mesh.pipelineRefusal().empty() &&
                std::any_of(m.params.begin(), m.params.end(),
                            [](const ir::Param& p) { return !p.copies.empty(); });
    if (!reduces && !tied) return false;
    if (reduces) m.reduceRanks = copies ? mesh.dataParallel : mesh.np;
    auto widthOf = [&](int p) { return mesh.stages[m.ops[m.params[p].op].stage].splitWidth; };
    // A whole parameter whose op reads a cut tensor (sumOverSplit) has partial gradients
    // in its split group: summed over the whole stage, like those outside the regions.
    auto inRegion = [&](int p) { return m.reducedOverPieces(p); };
    auto localBytes = [&](int p) {
      int64_t n = 4 * ir::numElements(m.params[p].type.shape, {}).value_or(0);
      return inRegion(p) && m.params[p].shardDim >= 0 ? n / widthOf(p) : n;
    };
    auto ranksOf = [&](int stage) {
      return copies ? mesh.dataParallel * mesh.stages[stage].group : mesh.np;
    };
    auto stageOf = [&](const ir::Op& op) { return copies ? op.stage : 0; };
    std::vector<int> gradOf(m.tensors.size(), -1), lastWriter(m.params.size(), -1);
    for (size_t p = 0; p < m.params.size(); ++p)
      if (m.params[p].grad >= 0) gradOf[m.params[p].grad] = static_cast<int>(p);
    std::vector<int> lastBackward(mesh.stages.size(), -1); // by stage
    std::vector<int> lastOfStage(mesh.stages.size(), -1);  // by stage, in a pipeline too
    std::vector<int> lastForward(mesh.stages.size(), -1);  // by stage, in a pipeline too
    for (size_t i = 0; i < m.ops.size(); ++i) {
      const ir::Op& op = m.ops[i];
      if (op.phase == ir::Phase::Forward) lastForward[op.stage] = static_cast<int>(i);
      if (op.phase != ir::Phase::Backward) continue;
      lastBackward[stageOf(op)] = static_cast<int>(i);
      lastOfStage[op.stage] = static_cast<int>(i);
      for (int t : op.outputs)
        if (t >= 0 && gradOf[t] >= 0) lastWriter[gradOf[t]] = static_cast<int>(i);
    }
    auto paramStage = [&](int p) { return copies ? m.ops[m.params[p].op].stage : 0; };
    int64_t bucketBytes = m.policy.bucketBytes;
    if (m.policy.zero >= ir::ZeroStage::Gradients && !m.policy.keyLocs.count("bucket_mb") &&
        bucketBytes > 0)
      bucketBytes = std::min(bucketBytes, kZeroBucketBytes);
    auto tiedAt = [&](int p) { return tied && !m.params[p].copies.empty(); };
    int end = reduces ? static_cast<int>(m.params.size()) : 0;
    ir::GradBucket b{end, end, 0, -1, end > 0 ? paramStage(end - 1) : 0, 0};
    for (int p = end - 1; p >= 0; --p) {
      if (tiedAt(p)) { // its own buckets, below; the run before it was closed
        b = ir::GradBucket{p, p, 0, -1, p > 0 ? paramStage(p - 1) : 0, 0};
        continue;
      }
      b.firstParam = p;
      b.bytes += localBytes(p);
      b.readyOp = std::max(b.readyOp, lastWriter[p]);
      bool full = bucketBytes > 0 && b.bytes >= bucketBytes;
      if (full || p == 0 || paramStage(p - 1) != b.stage || inRegion(p - 1) != inRegion(p) ||
          tiedAt(p - 1)) {
        if (!m.policy.overlapComm || b.readyOp < 0) b.readyOp = lastBackward[b.stage];
        b.pieces = inRegion(p);
        b.ranks = b.pieces ? ranksOf(b.stage) / widthOf(p) : ranksOf(b.stage);
        // A stage without a backward op (no layer of it reaches the loss: Autodiff warns)
        // has no gradient to sum.
        if (b.ranks > 1 && b.readyOp >= 0) m.buckets.push_back(b);
        b = ir::GradBucket{p, p, 0, -1, p > 0 ? paramStage(p - 1) : 0, 0};
      }
    }
    for (int q = static_cast<int>(m.params.size()) - 1; q >= 0; --q) {
      if (!tiedAt(q)) continue;
      int ranks = static_cast<int>(m.tiedRanks(q).size());
      for (int s : m.stagesHolding(q)) {
        // A stage whose copy of the weight reaches no loss (Autodiff warns) runs no backward
        // op: its gradient (zeros) is final after its forward, and it still joins the sum.
        int ready = lastOfStage[s] >= 0 ? lastOfStage[s] : lastForward[s];
        ir::GradBucket t{q, q + 1, localBytes(q), ready, s, ranks};
        t.pieces = inRegion(q);
        t.tied = true;
        m.buckets.push_back(t);
      }
    }
    return true;
  }
};

} // namespace

std::unique_ptr<Pass> createDataParallelPass() {
  return std::make_unique<DataParallel>();
}

} // namespace epl::passes
