// amp: which tensors are stored in half precision (Module::stored). Kernels compute in
// f32; what amp changes is the bytes a rank keeps and moves, and the rounding of what it
// keeps (docs/architecture.md, "Mixed precision").
//
//   1. Every forward op's output is stored in the half type when it is a float, except a
//      loss's (the loss stays f32), the model's result (a loss made of losses, `a + b` or
//      `ce * 0.5`, stays f32 too: the trainer reads it as one) and a communication op's
//      that moves values (a send, a gather, a slice), which keeps its input's type.
//   2. The large tensors a forward saves for its backward follow (attention's qkv and
//      context, the mlp's and the experts' hidden activations); the small statistics stay
//      f32 (norms' mean and reciprocal deviation, attention's and the loss's log-sum-exp).
//   3. A gradient is stored as the tensor it is the gradient of: an activation's in half,
//      the loss seed and every parameter's in f32 (the gradients the optimizer reads).
//   4. Model inputs, integer tensors and the moe statistics keep their own types.
//   5. In split regions, partial sums stay f32 and are rounded once summed, as one device
//      rounds the whole sum: the inputs of all-reduces and reduce-scatters, and the
//      tensors whose gradients are partial (an identity's output, a sequence-parallel
//      gather's). The experts' all-to-all moves f32 rows. Gathers and slices move half
//      values; the executor runs these collectives (and a vocabulary-parallel loss) on
//      f32 copies of half tensors.
//   6. The bridges' bytes (pipelines' transfers) follow their tensors.
// The weights stay f32 (the only copy: no half copy lives between steps); the kernels of
// the matrix-multiplying layers round them to the half type where they read them
// (KernelCall::castParams).
#include "passes/Passes.h"

namespace epl::passes {

namespace {

class Amp : public Pass {
public:
  const char* name() const override { return "amp"; }

  bool run(ir::Module& m, PassContext&) override {
    m.stored.clear();
    if (!m.ampApplies() || m.lossGrad < 0) return false;
    ir::DType half = m.ampDtype();
    m.stored.resize(m.tensors.size());
    for (size_t t = 0; t < m.tensors.size(); ++t)
      m.stored[t] = m.tensors[t].type.dtype;
    std::vector<bool> keep = keptF32(m);
    auto store = [&](int t, ir::DType d) {
      if (t >= 0 && !ir::isIntegral(m.tensors[t].type.dtype) && !keep[t]) m.stored[t] = d;
    };
    for (const ir::Op& op : m.ops) {
      if (op.phase == ir::Phase::Forward) {
        if (op.kind == ir::OpKind::CrossEntropy || op.kind == ir::OpKind::Mse) continue;
        // A collective that moves values keeps their type; a sum is rounded once made.
        bool moves = ir::opInfo(op.kind).split == ir::SplitRule::Communication &&
                     op.kind != ir::OpKind::AllReduce && op.kind != ir::OpKind::ReduceScatter;
        store(op.outputs[0], moves ? m.storedDtype(op.inputs.at(0)) : half);
        // The saved tensors after the outputs: those as large as an activation.
        const ir::OpInfo& info = ir::opInfo(op.kind);
        for (int k = 0; k < info.activationSaved; ++k)
          store(op.outputs.at(static_cast<size_t>(info.outputs + k)), half);
      } else if (op.phase == ir::Phase::Backward) {
        // Outputs: the gradient of each tensor input, then of each parameter (f32).
        const ir::Op& fwd = m.ops[op.forward];
        for (size_t k = 0; k < fwd.inputs.size() && k < op.outputs.size(); ++k)
          store(op.outputs[k], m.storedDtype(fwd.inputs[k]));
      }
    }
    // What the bridges move follows (pipelines' transfers of half activations).
    for (ir::Bridge& b : m.bridges) {
      if (b.op < 0 || b.bytes <= 0) continue;
      int t = m.ops[b.op].outputs.at(0);
      b.bytes =
          b.bytes / ir::dtypeBytes(m.tensors[t].type.dtype) * ir::dtypeBytes(m.storedDtype(t));
    }
    return true;
  }

private:
  // The model's result (step 1), the partial sums of split regions, and the experts'
  // exchanged rows (step 5).
  static std::vector<bool> keptF32(const ir::Module& m) {
    std::vector<bool> keep(m.tensors.size(), false);
    for (int t : m.outputs)
      if (t >= 0) keep[t] = true;
    for (const ir::Op& op : m.ops) {
      if (op.phase != ir::Phase::Forward) continue;
      switch (op.kind) {
      case ir::OpKind::AllReduce:
      case ir::OpKind::ReduceScatter:
        keep[op.inputs.at(0)] = true;
        break;
      case ir::OpKind::Identity:
        keep[op.outputs.at(0)] = true;
        break;
      case ir::OpKind::AllGather:
        if (ir::reduceScattersBackward(op)) keep[op.outputs.at(0)] = true;
        break;
      case ir::OpKind::AllToAll:
        keep[op.inputs.at(0)] = keep[op.outputs.at(0)] = true;
        break;
      default:
        break;
      }
    }
    return keep;
  }
};

} // namespace

std::unique_ptr<Pass> createAmpPass() {
  return std::make_unique<Amp>();
}

} // namespace epl::passes
