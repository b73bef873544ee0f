// A rank's instruction stream for one training step and for evaluation, and the memory
// plan that places every activation in one arena (DESIGN.md §2: "the plan is data").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace epl::ir {

enum class InstrKind {
  ZeroGrads,   // clear every parameter gradient before the first micro-batch
  Load,        // read micro-batch `micro` into the model inputs (and `next` targets)
  SeedGrad,    // d loss / d loss = 1 / (micro_batches x data-parallel ranks): the step's
               // loss is the mean over the global batch
  Run,         // run op `op` (forward, backward, grad-norm or optimizer)
  ReduceStart, // start summing gradient bucket `bucket` over the data-parallel ranks
  ReduceWait,  // wait until that sum has arrived
};

struct Instr {
  InstrKind kind = InstrKind::Run;
  int op = -1;
  int micro = 0;
  int bucket = -1; // ReduceStart, ReduceWait: index into Module::buckets
};

struct Program {
  int rank = 0;
  std::vector<Instr> step; // one optimizer step, every micro-batch in order
  std::vector<Instr> eval; // one forward pass without dropout, for a batch of B samples
  // The memory plan. offset[t] is tensor t's byte offset in the rank's activation arena,
  // -1 for tensors not in it (parameter gradients have buffers of their own).
  std::vector<int64_t> offset;
  int64_t arenaBytes = 0;     // the arena: the peak of live activations and gradients
  int64_t paramBytes = 0;     // parameters
  int64_t gradBytes = 0;      // parameter gradients
  int64_t optimizerBytes = 0; // optimizer states
  int64_t peakBytes() const { return arenaBytes + paramBytes + gradBytes + optimizerBytes; }
};

} // namespace epl::ir
