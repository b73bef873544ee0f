// shape-inference: recompute each op's output types from its inputs with the op table.
#include "passes/Passes.h"

#include "support/Assert.h"

namespace epl::passes {

namespace {

class ShapeInference : public Pass {
public:
  const char* name() const override { return "shape-inference"; }

  bool run(ir::Module& m, PassContext& ctx) override {
    bool changed = false;
    for (ir::Op& op : m.ops) {
      if (op.phase != ir::Phase::Forward) continue;
      std::vector<ir::TensorType> in, out;
      for (int t : op.inputs)
        in.push_back(m.tensors[t].type);
      std::string err = ir::inferTypes(op.kind, in, op.attrs, out);
      if (!err.empty()) {
        // The front end checks each op as it builds it, so this is a user mistake only
        // for modules built some other way; report it at the op.
        ctx.diags.error(op.loc, err);
        return changed;
      }
      // Outputs past the op table's are the tensors autodiff saves for the backward.
      EPL_ASSERT(out.size() <= op.outputs.size(), "op output count differs from the op table");
      for (size_t k = 0; k < out.size(); ++k) {
        ir::TensorType& t = m.tensors[op.outputs[k]].type;
        if (!(t == out[k])) {
          t = out[k];
          changed = true;
        }
      }
    }
    return changed;
  }
};

} // namespace

std::unique_ptr<Pass> createShapeInferencePass() {
  return std::make_unique<ShapeInference>();
}

} // namespace epl::passes
