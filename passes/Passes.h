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

} // namespace epl::passes
