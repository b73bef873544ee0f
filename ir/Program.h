// A rank's instruction stream for one training step and for evaluation, and the memory
// plan that places every activation in one arena (DESIGN.md §2: "the plan is data").
#pragma once
#include "ir/Types.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace epl::ir {

enum class InstrKind : uint8_t {
  ZeroGrads,   // clear every parameter gradient before the first micro-batch
  Load,        // read micro-batch `micro` into the model inputs (and `next` targets)
  SeedGrad,    // d loss / d loss = 1 / (micro_batches x data-parallel ranks): the step's
               // loss is the mean over the global batch
  Run,         // run op `op` (forward, backward, grad-norm or optimizer)
  ReduceStart, // start summing gradient bucket `bucket` over the data-parallel ranks
  ReduceWait,  // wait until that sum has arrived
  // Pipelines: a tensor of micro-batch `micro` between two stages' ranks. A Send starts
  // the transfer from the tensor; a step's is waited for before the next micro-batch takes
  // the slot, or at the step's end (an evaluation's at once); every Recv of a step is posted
  // at the step's start into a buffer of its own, and the Recv instruction waits for it and
  // writes (or, with `accumulate`, adds) it into the tensor.
  Send,
  Recv,
  // ZeRO stage 3 (Module::zeroShardsParams): start gathering parameter bucket `bucket`
  // whole into its block of the arena for the forward (`use` 0) or the backward and
  // recomputation (`use` 1) of micro-batch `micro` (each rank holding a slice of it
  // broadcasts that part), and wait until it has arrived. The start comes one block ahead
  // of the wait, so a gather overlaps the previous block's compute.
  GatherStart,
  GatherWait,
};

// Which gradients a Run of a backward op writes. Zero-bubble schedules run a backward op
// twice per micro-batch: first its input gradients (sent upstream at once), later its
// parameter gradients; the kernel call leaves the other outputs null.
enum class BackwardPart : uint8_t { Whole, Inputs, Params };

// Whether `part` writes output `k` of a backward op whose forward has `tensorInputs` inputs
// (its outputs: the gradient of each tensor input, then of each parameter).
inline bool writesOutput(BackwardPart part, size_t k, size_t tensorInputs) {
  return part == BackwardPart::Whole || (part == BackwardPart::Inputs) == (k < tensorInputs);
}

// 40 bytes: a pipeline's rank runs about a hundred thousand of them a step, and a search
// plans each stage's of hundreds of plans (docs/cluster.md), so every pass that walks them
// reads fewer cache lines.
struct Instr {
  Instr(InstrKind kind = InstrKind::Run, int op = -1, int micro = 0, int bucket = -1)
      : op(op), micro(micro), bucket(bucket), kind(kind) {}
  int op = -1;
  int micro = 0;
  int bucket = -1; // ReduceStart, ReduceWait: index into Module::buckets
  // Send, Recv: the tensor, the other rank, a tag unique per (micro-batch, direction,
  // stage boundary), and whether the received values add into the tensor.
  int tensor = -1;
  int peer = -1;
  int tag = -1;
  // Between stage groups of different sizes a micro-batch is re-cut: the transfer carries
  // `rows` samples of the tensor from sample `firstRow` of this rank's share (rows < 0: the
  // whole tensor).
  int firstRow = 0, rows = -1;
  InstrKind kind = InstrKind::Run;
  BackwardPart part = BackwardPart::Whole; // Run of a backward op: the gradients it writes
  uint8_t use = 0; // GatherStart, GatherWait: 0 the forward's copy of the bucket, 1 the backward's
  bool accumulate = false;
  // ReduceStart, ReduceWait of a tied weight's bucket under ZeRO stage 2: not a micro-batch's
  // reduce-scatter but the step's one sum of the slices over every stage holding the weight
  // (each rank's part of it placed in the whole bucket, the rest zero, then summed).
  bool tie = false;
};

struct Program {
  int rank = 0;
  // Pipelines: this rank's stage among `stages` (1: every rank runs the whole model), the
  // rank whose stage computes the loss, and the parameters this rank updates (their
  // gradients are its share of the global gradient norm). Without a pipeline: stage 0,
  // lossRank = rank, every parameter.
  int stage = 0;
  int stages = 1;
  int lossRank = 0;
  std::vector<int> params;
  // The ranks that hold this rank's parameters and share each micro-batch between them
  // (every rank of a purely data-parallel plan; a pipeline stage's ranks in every replica),
  // this rank's index among them, and the samples of one micro-batch it runs: the batch
  // symbol's value on this rank.
  int dataRanks = 1;
  int dataRank = 0;
  int64_t localBatch = 0;
  // The data loader: the ranks that read different samples of each micro-batch and this
  // rank's index among them (where its slice starts). They are the data ranks, except in
  // a stage of split regions whose micro-batch does not divide over its devices: there
  // every rank reads its copy's whole micro-batch (readsWhole; localBatch = wholeBatch),
  // and the ranks of a split group read the same samples.
  int readers = 1;
  int reader = 0;
  bool readsWhole = false;
  // Samples of a whole tensor inside split regions: the copy's micro-batch.
  int64_t wholeBatch = 0;
  // What the executor takes from the policy: micro-batches per step, and the element
  // type of gradient reductions on the wire.
  int microBatches = 1;
  DType commDtype = DType::F32;
  // A pipeline: this rank's replica, and its index among its stage group's devices.
  int replica = 0;
  int local = 0;
  // A stage with `split` regions: their width, and this rank's index in its split group
  // (local = copy x splitWidth + splitRank). Inside a region a rank holds its copy's whole
  // micro-batch (wholeBatch samples) and 1 / splitWidth of every cut dim.
  int splitWidth = 1;
  int splitRank = 0;
  std::vector<Instr> step; // one optimizer step, every micro-batch in order
  std::vector<Instr> eval; // one forward pass without dropout, for a batch of B samples
  // The memory plan. offset[t] is tensor t's byte offset in the rank's activation arena,
  // -1 for tensors not in it (parameter gradients have buffers of their own).
  // A pipeline stage keeps several micro-batches in flight: the arena is the plan of one
  // micro-batch (a slot), repeated `slots` times, and micro-batch m uses slot m % slots.
  // With several slots, the tensors whose whole life lies inside one run of their micro-
  // batch's instructions (no other micro-batch's in between: a forward's or a backward's
  // temporaries, most of a recomputed block) need no slot of their own: they sit in one
  // region after the slots that every micro-batch uses in turn (shared[t], sharedBytes),
  // their offsets relative to it. Empty shared: none.
  std::vector<int64_t> offset;
  int64_t arenaBytes = 0; // one slot: the peak of one micro-batch's live activations and gradients
  int slots = 1;
  std::vector<char> shared;
  int64_t sharedBytes = 0;
  int64_t slotStride() const { return (arenaBytes + 63) / 64 * 64; }
  int64_t activationBytes() const { return slots * slotStride() + sharedBytes; }
  bool isShared(int t) const { return !shared.empty() && shared[t]; }
  // ZeRO stage 2 (Module::zeroShardsGradients): gradient bucket b's gradients, laid out as
  // the parameters are (each 64-byte aligned), sit in the arena at bucketOffset[b] from
  // their first write in a micro-batch to the end of their reduction; gradBytes is the
  // rank's slice of the gradients, which the reductions add into; shared[tensors + b] says
  // whether bucket b is in the shared region. Offset -1: another stage's bucket. Empty
  // otherwise.
  std::vector<int64_t> bucketOffset, bucketBytes;
  // ZeRO stage 3 (Module::zeroShardsParams): where bucket b's gathered parameters sit in
  // the arena, laid out as in the flat parameter memory, for the forward (gatherOffset[2 b])
  // and for the backward (2 b + 1); shared[tensors + buckets + 2 b + use] says whether the
  // block is in the shared region. paramBytes is then the rank's slice alone. Empty
  // otherwise.
  std::vector<int64_t> gatherOffset;
  // By bucket: whether the backward reads bucket b's forward block instead of gathering it
  // again (its last forward reader and first backward one run back to back in every
  // micro-batch: the head of a data-parallel step, a last pipeline stage's). Then the
  // backward's block is unused. Empty: none.
  std::vector<char> keepsGather;
  bool keepsForwardGather(int b) const { return !keepsGather.empty() && keepsGather[b]; }
  // Kernel workspaces in the arena (Module::workspaceBytes): for each op and part of a
  // backward the rank runs that takes one, where it is (in the micro-batch's slot, or in
  // the shared region), live for that one instruction. With amp on the CPU device, the
  // first stagingBytes of it hold the call's f32 copies of its half-precision operands
  // (Module::ampStagingBytes), the kernel's own workspace after them.
  struct Workspace {
    int op = -1;
    BackwardPart part = BackwardPart::Whole;
    int64_t offset = 0, bytes = 0;
    bool shared = false;
    int64_t stagingBytes = 0;
  };
  std::vector<Workspace> workspaces;
  // The kernel scratch of the ledger: the largest workspace, inside the activations' arena
  // for one instruction at a time (0: none).
  int64_t largestWorkspace() const {
    int64_t most = 0;
    for (const Workspace& w : workspaces)
      most = std::max(most, w.bytes);
    return most;
  }
  // The buffers the step's and the evaluation's receives are posted into
  // (Module::receivePlan). A step's receives share `recvRing` buffers in turn (0: one
  // each, all posted when the step starts).
  int64_t recvBytes = 0;
  int recvRing = 0;
  int64_t paramBytes = 0;     // parameters
  int64_t gradBytes = 0;      // parameter gradients
  int64_t optimizerBytes = 0; // optimizer states in memory
  // `offload = optimizer` to disk (Module::offloadApplies): the optimizer states live in a
  // file (offloadedBytes of it), and the optimizer ops stream them through stagingBytes of
  // memory, kStagingBuffers buffers of one chunk of every state: one read ahead, one being
  // updated, one being written back.
  static constexpr int kStagingBuffers = 3;
  int64_t offloadedBytes = 0;
  int64_t stagingBytes = 0;
  // Of stagingBytes, with `offload = params` (Module::offloadsParams): the buffer, the
  // largest part of a bucket a rank's slice holds, that the ZeRO-3 gathers' reads of the
  // file land in, each ahead of its gather (the step between two gathers hides it).
  int64_t partStagingBytes = 0;
  // The communicators' scratch: what the ring reductions in flight at once take
  // (support/RingScratch.h), the gradient buckets' and the split regions' collectives.
  // Each communicator keeps it for its next reductions.
  int64_t commBytes = 0;
  // The host's copies of the step's micro-batches that loads read from (Executor::staging):
  // the model inputs and the `next` targets of each micro-batch, at this rank's size.
  int64_t inputBytes = 0;
  int64_t peakBytes() const {
    return (slots == 1 ? arenaBytes : activationBytes()) + recvBytes + paramBytes + gradBytes +
           optimizerBytes + stagingBytes + commBytes + inputBytes;
  }
};

} // namespace epl::ir
