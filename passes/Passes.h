// Factories for every pass, in pipeline order (passes/Pipeline.cpp runs them).
#pragma once
#include "passes/Pass.h"

namespace epl::passes {

// Recomputes every tensor's type from its producer and the op table, so any module (from
// the front end or a later pass) is checked against one set of shape rules.
std::unique_ptr<Pass> createShapeInferencePass();
// Gives every op a pipeline stage: the top-level `replicate`/`split` block around it, or
// for ops outside all blocks, the next stage (the last one after the final block).
std::unique_ptr<Pass> createStagePartitionPass();
// Sizes the device mesh: split widths (resolving `auto`), stage groups, the outer
// data-parallel width from -np, and the micro-batch size the batch symbol binds to.
std::unique_ptr<Pass> createMeshAssignmentPass();
// Inside `split` regions, picks each op's tensor-parallel form (column/row linear, heads,
// hidden, vocab, experts, channels), the layouts it needs and makes, and its parameter
// shards; checks that the split width divides what it cuts.
std::unique_ptr<Pass> createSplitLayoutPass();
// Inserts the communication the layouts imply: all-gather/all-reduce/slice where a
// `replicate` region meets a `split` one, all-to-all around experts, send/recv between
// stages. Records each as a Bridge with its bytes.
std::unique_ptr<Pass> createBridgeInsertionPass();
// Counts parameters and bytes per stage and per device.
std::unique_ptr<Pass> createParamAccountingPass();
// The backward graph as IR (one backward op per forward op on the path to the loss, with
// the tensors it reads saved by the forward), then a grad-norm op when clipping and one
// optimizer op per parameter. Nothing without a `train` block.
std::unique_ptr<Pass> createAutodiffPass();
// Mixed precision (`amp`): the tensors stored in bf16 or fp16 (Module::stored).
std::unique_ptr<Pass> createAmpPass();
// Recomputation (`recompute`, and sequence parallelism's all-gathers): forward ops run
// again just before the backward ops that read what they make, so what they made need not
// live through the forward.
std::unique_ptr<Pass> createRecomputePass();
// Data parallelism: which ranks average gradients, and the buckets they do it in.
std::unique_ptr<Pass> createDataParallelPass();
// Each rank's instruction stream for a training step and for evaluation.
std::unique_ptr<Pass> createSchedulePass();
// Liveness and buffer reuse: every activation's offset in its rank's arena, and the
// rank's peak bytes.
std::unique_ptr<Pass> createMemoryPlanPass();
// The memory plan of one program, the pass's work for it; `previous` (or null), the program
// before it, whose plan it shares where the two run the same stream.
void planMemory(const ir::Module& m, ir::Program& p, const ir::Program* previous);

} // namespace epl::passes
