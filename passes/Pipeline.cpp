// The pass pipeline. Order matters where noted.
#include "passes/Pipeline.h"

#include "passes/Passes.h"

namespace epl::passes {

void buildPipeline(PassManager& pm) {
  pm.add(createShapeInferencePass());
  // Stages come before the mesh: group sizes are per stage.
  pm.add(createStagePartitionPass());
  // The mesh fixes split widths and the micro-batch, which the split rules and the byte
  // counts of bridges need.
  pm.add(createMeshAssignmentPass());
  pm.add(createSplitLayoutPass());
  // Bridges follow layouts: a conversion is inserted only where a consumer's layout
  // differs from its producer's.
  pm.add(createBridgeInsertionPass());
  pm.add(createParamAccountingPass());
  // Training. Autodiff follows the planning passes because they annotate forward ops
  // only; the split and pipeline rewrites of backward ops come with multi-rank streams.
  pm.add(createAutodiffPass());
  // amp reads the gradients autodiff made; recomputed copies are stored as the tensors
  // they repeat.
  pm.add(createAmpPass());
  // Recompute ops go before the backward ops that read them, and are scheduled with them.
  pm.add(createRecomputePass());
  // Buckets need the backward ops; the schedule places their reductions.
  pm.add(createDataParallelPass());
  pm.add(createSchedulePass());
  // The memory plan reads the streams: liveness is over instructions.
  pm.add(createMemoryPlanPass());
}

} // namespace epl::passes
