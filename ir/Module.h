// The IR: a module of ops over tensors and parameters, grouped into parallel scopes, plus
// the plan the passes attach to it (mesh, layouts, per-rank figures). It knows no backend.
#pragma once
#include "ir/CommStreams.h"
#include "ir/Config.h"
#include "ir/Ops.h"
#include "ir/Program.h"
#include "ir/Types.h"
#include "support/SourceManager.h"

#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace epl::ir {

// Where an op runs in the training step: the model's forward ops, the backward ops
// autodiff adds, and the optimizer ops after them. A Recompute op runs forward op
// `forward` again in the backward, just before the backward ops that read what it makes
// (passes/Recompute.cpp): its outputs stand for that op's in their inputs.
enum class Phase { Forward, Backward, Optimizer, Recompute };
// Whether ops of this phase run in a micro-batch's backward pass (the backward ops and the
// recomputations before them).
inline bool inBackwardPass(Phase p) {
  return p == Phase::Backward || p == Phase::Recompute;
}
// Whether an op of this phase computes as a forward op (its kernel's forward call).
inline bool computesForward(Phase p) {
  return p == Phase::Forward || p == Phase::Recompute;
}

// The tensor-parallel form of an op inside a split region (passes/SplitLayout.cpp): a
// linear or conv2d cut by output columns (`column`) or input rows (`row`), attention by
// heads, the mlp by its hidden width, moe by experts, an embedding or cross-entropy by
// vocabulary; None outside split regions and for ops that follow their inputs' layouts.
enum class SplitForm { None, Column, Row, Heads, Hidden, Experts, Vocab };
// The form's word in plans and hovers ("column", …; "" for None).
const char* splitFormName(SplitForm f);

// How a tensor is spread over the devices of its stage group (G devices, split width w,
// c = G / w copies of the split region):
//   DataParallel  each of the G devices holds 1/G of the micro-batch;
//   Replicated    each device holds its copy's 1/c of the batch, whole along other dims;
//   Sharded       like Replicated, but dim `dim` is cut in w pieces;
//   Partial       like Replicated, but each device holds a partial sum.
enum class LayoutKind { DataParallel, Replicated, Sharded, Partial };
struct Layout {
  LayoutKind kind = LayoutKind::DataParallel;
  int dim = -1;
  bool operator==(const Layout& o) const { return kind == o.kind && dim == o.dim; }
  bool operator!=(const Layout& o) const { return !(*this == o); }
  std::string str() const;
};

struct Tensor {
  std::string name;
  TensorType type;
  int producer = -1; // op id; -1 for model inputs
  Layout layout;
};

struct Param {
  std::string name; // hierarchical: transformer_block.0/attention.qkv_weight
  TensorType type;  // always concrete
  int op = -1;
  int shardDim = -1; // dim cut over the split width, -1 when every device holds it whole
  // The cut dim is blocks side by side, of these relative sizes, each cut alike:
  // attention's qkv weight [D + 2 KV E, M] is q, k and v ({H, KV, KV}), and a device holds
  // its heads' rows of each. Empty: one block.
  std::vector<int64_t> shardBlocks = {};
  // A whole parameter of a split region whose op reads a tensor cut along another dim (a
  // norm over a slice of the sequence): each device's gradient is a partial sum, added up
  // over the whole stage group like the parameters outside split regions.
  bool sumOverSplit = false;
  int grad = -1;                       // its gradient tensor, once autodiff ran
  ParamInit init = ParamInit::Uniform; // from its op's ParamSpec
  int64_t fanIn = 1;
  double initStd = 1; // Normal's standard deviation (embedding's `std`)
  // A weight tied across pipeline stages (linear's `tie`; stage-partition): the other
  // stages whose ops read it. Each holds a copy, initialised alike; the copies' gradients
  // are summed over the ranks of every such stage (a `tied` GradBucket), and each stage's
  // optimizer updates its copy alike, as Megatron-LM does for the embedding and the head.
  std::vector<int> copies = {};
  bool trainable = true; // false: its op's state (ParamSpec::trainable), no optimizer step
};

enum class ScopeKind { Model, Stage, Split };
struct Scope {
  ScopeKind kind = ScopeKind::Model;
  int parent = -1;
  int width = 0; // replicate(n) / split(n); 0 when left out or `auto`
  bool isAuto = false;
  bool isSplitStage = false; // a top-level split(n) block: the whole stage is tensor-parallel
  SourceLoc loc;
};

struct Op {
  OpKind kind = OpKind::Add;
  std::string name;
  std::vector<int> inputs, outputs, params;
  Attrs attrs;
  int scope = 0;
  int stage = -1;
  Phase phase = Phase::Forward;
  SourceLoc loc;  // where the op is written (maybe inside a def in another file)
  SourceLoc site; // the statement in the model body it came from, for plans and errors
  // Set by split-layout: the tensor-parallel form (None when the op is not split) and the
  // layout each input must have.
  SplitForm splitForm = SplitForm::None;
  std::vector<Layout> inputLayouts;
  // Backward ops (autodiff): the forward op they differentiate, and for each output
  // whether it adds into a gradient an earlier backward op already wrote. Their inputs
  // and outputs follow backend::KernelCall's order; -1 marks a tensor not needed.
  int forward = -1;
  std::vector<bool> accumulate;
};

// An all-gather of a sequence slice entering split ops that cut their output (sequence
// parallelism): they leave each device a partial gradient of the gathered tensor, which
// its backward reduce-scatters (an ordinary all-gather's backward keeps a slice).
bool reduceScattersBackward(const Op& op);

// What a split region's transfer op (forward, or a backward `op` of forward `fwd`) does to
// its tensor on a device of the split group: reduce-scatters partial sums, all-reduces
// them, all-gathers the pieces, keeps this device's piece, or passes the values on.
enum class TransferForm { Scatter, Reduce, Gather, Slice, Pass };
TransferForm transferForm(const Op& op, const Op& fwd);
// The dim a split region's transfer op cuts its tensor along: its `dim` attribute (`batch`
// is dim 0, `dim k` dim k).
int transferDim(const Op& op);

// One pipeline stage of a model replica and the devices it owns.
struct StagePlan {
  int scope = -1;
  int group = 1;      // devices in the stage group (G)
  int splitWidth = 1; // widest split region in the stage (w)
  int copies() const { return group / splitWidth; }
  int firstLocalRank = 0; // offset of the group inside one replica
  bool pinned = false;    // replicate(n) fixed the group size
  bool allSplit = false;  // every op is in a split region: the stage runs on its copies
  SourceLoc loc;
  // Filled by param-accounting.
  int64_t paramCount = 0, paramBytes = 0;
  int64_t rankParamCount = 0, rankParamBytes = 0; // held by each device of the group (f32)
  // Model states on each device under the policy's amp, optimizer, ZeRO and offload.
  int64_t stateParamBytes = 0, stateGradBytes = 0, stateOptimizerBytes = 0;
  int64_t offloadedBytes = 0; // moved off the device by `offload`
  int64_t modelStateBytes() const { return stateParamBytes + stateGradBytes + stateOptimizerBytes; }
};

struct Mesh {
  int np = 1;
  int dataParallel = 1;   // outer data-parallel width (model replicas)
  int replicaSize = 1;    // devices one replica needs
  int64_t microBatch = 0; // samples per micro-batch per replica; 0 when unknown
  std::vector<StagePlan> stages;
  // Interleaved schedules: stage blocks per pipeline rank (policy `chunks`). Block k runs
  // on the devices of block k mod depth(), as its model chunk k / depth(); 1 otherwise.
  int chunks = 1;
  // The pipeline's ranks along one replica's path: stage blocks / chunks.
  int depth() const { return static_cast<int>(stages.size()) / chunks; }
  // One stage without split regions: every rank runs the whole model on its share of the
  // batch, and only gradients travel. The runtime runs these plans (and -np 1).
  bool pureDataParallel() const { return stages.size() == 1 && stages[0].splitWidth == 1; }
  // What keeps the runtime from running this plan's pipeline (several stages), in words
  // ("model chunks of split widths 2 (stage 0) and 1 (stage 2) on the same devices"), or
  // empty when it runs: stages of any group sizes (mesh-assignment has checked that each
  // divides the micro-batch), with split regions (one width for the model chunks on the
  // same devices), and any number of data-parallel copies.
  std::string pipelineRefusal() const;
  // Fills a rank program's batch fields (localBatch, wholeBatch, the loader's readers)
  // from its stage, data ranks and split width.
  void placeBatch(Program& p) const;
  // Global rank of (replica, stage, local index).
  int rank(int replica, int stage, int local) const {
    return replica * replicaSize + stages[stage].firstLocalRank + local;
  }
  // A stage's ranks in every replica, by (replica, local index): the group that sums its
  // gradients, each a data-parallel rank of the stage. Its size is dataParallel x group.
  std::vector<int> stageRanks(int stage) const;
  // Every rank of one replica, in rank order: the group the gradient norm is summed over.
  std::vector<int> replicaRanks(int replica) const;
};

// Where the compiler inserted communication, for the plan and later the runtime.
struct Bridge {
  int op = -1;      // the inserted communication op
  std::string what; // human summary: "all-gather batch", "send/recv"
  int fromStage = -1, toStage = -1;
  int64_t bytes = -1; // per micro-batch moved into each receiving device; -1 unknown
};

// A bucket of the data-parallel gradient reduction (passes/DataParallel.cpp): the
// gradients of parameters [firstParam, endParam), which sit side by side in memory, summed
// over the ranks in one collective once backward op `readyOp` ran in the step's last
// micro-batch.
struct GradBucket {
  int firstParam = 0, endParam = 0;
  int64_t bytes = 0; // f32 gradient bytes (Module::wireBytes: what travels)
  int readyOp = -1;
  int stage = 0; // a pipeline's stage whose ranks hold these gradients (and reduce them)
  int ranks = 0; // how many ranks sum them
  // Gradients of parameters inside split regions: summed over the ranks that hold the same
  // pieces (the same split rank in every copy), not over every rank of the stage.
  bool pieces = false;
  // One weight tied across stages (Param::copies): summed over the ranks of every stage
  // holding a copy (Module::tiedRanks), once the backward is done. Each of those stages has
  // such a bucket of it, and the two are one collective.
  bool tied = false;
};

// A number of the main script that sets the layout: the integer literal that a top-level
// block's `repeat` count or a `split` width is, or that the `let` it names is bound to.
// The layout search (docs/cluster.md) tries other values in its place
// (frontend::FrontendOptions::literalValues) and edits the winner's into the script.
struct LayoutKnob {
  // Stages: a top-level block's `repeat`; SplitWidth: a `split` width; Layers: the count
  // of a `repeat(k) f(x)` (a literal or an expression on one line, `loc` and `length` its
  // whole text) written directly in a top-level block that is not repeated, so
  // the search may move layers of f between neighbouring stages (the model stays the same
  // where such repeats follow each other in op order: ops [firstOp, endOp) each); Groups:
  // a top-level `replicate(n)`'s n, where every stage is such a block, so the search may
  // move devices between stages (one replica's devices kept).
  enum class Kind { Stages, SplitWidth, Layers, Groups };
  Kind kind = Kind::Stages;
  std::string let; // the `let` bound to it, or "" for a literal written in the block
  SourceLoc loc;   // the literal; `split(auto)`'s auto; a bare `split`'s keyword
  uint32_t length = 1;
  int64_t value = 0; // 0: the planner's choice (`split(auto)`, `split`)
  bool bare = false; // a `split` with no width: a width is written after the keyword
  // Layers: the repeated def, its top-level block (a scope id), the ops it made, and its
  // chain: the knobs whose layers move between their stages together (their sum kept).
  // Groups: chain 0 for every stage's width once each stage has one.
  std::string def;
  int block = -1;
  size_t firstOp = 0, endOp = 0;
  int chain = -1;
};

struct Module {
  std::string modelName;
  std::string batchSymbol; // the first dim of the model inputs
  std::vector<Tensor> tensors;
  std::vector<Param> params;
  std::vector<Op> ops; // in program order
  std::vector<Scope> scopes{Scope{}};
  std::vector<int> inputs;
  std::vector<int> outputs;
  SourceLoc loc;
  std::vector<LayoutKnob> layoutKnobs;
  Policy policy;
  TrainConfig train;
  std::map<std::string, int64_t> bindings; // symbol values once the mesh is known
  Mesh mesh;
  bool planned = false; // mesh assigned
  std::vector<Bridge> bridges;
  // Training (autodiff onwards): the seed gradient of the loss, the global gradient norm
  // when clipping, and each rank's instruction stream.
  int lossGrad = -1;
  int gradNorm = -1;
  // Data parallelism: -np for a purely data-parallel plan, the data-parallel width of a
  // pipeline's copies (each stage's ranks: Program::dataRanks, GradBucket::ranks), 1 for
  // neither; and the buckets.
  int reduceRanks = 1;
  std::vector<GradBucket> buckets;
  // `recompute = auto` (passes/Recompute.cpp): what it chose, for the plan.
  struct AutoRecompute {
    bool ran = false;
    int blocks = 0, chosen = 0;            // the model body's def calls, and those recomputed
    int64_t budget = 0;                    // `device_memory`; 0 when not set
    int64_t peakWithout = 0, peakWith = 0; // the largest rank's memory plan
    std::vector<std::string> names;        // the chosen blocks (`transformer_block.3`)
  };
  AutoRecompute autoRecompute;
  std::vector<Program> programs;
  // A plan for costing only (PlanOptions::costOnly): `programs` holds one program per
  // pipeline stage, replica 0's first device of the stage's group, each standing for every
  // rank of its stage in every replica (they run the same ops on as many samples). Such a
  // plan is predicted (ir/Predict.h), never run or printed rank by rank.
  bool costOnly = false;
  // A cost-only plan that stopped at a program that does not fit its devices
  // (PlanOptions::overMemory): `programs` ends with it, the later stages not planned, so the
  // largest rank's memory is at least what they say.
  bool stoppedOver = false;
  // Whether the devices the plan is for use the host's memory (the CPU device), as
  // PlanOptions::deviceMemoryIsHost says: `offload_to = cpu` moves the optimizer states off
  // the device only where they do not.
  bool deviceMemoryIsHost = true;
  // The ranks `p` stands for: 1, or its stage's ranks in every replica in a cost-only plan.
  int ranksLike(const Program& p) const;

  // amp (ampApplies, passes/Amp.cpp): the element type each tensor is stored in, by tensor
  // id: bf16 or fp16 for activations and their gradients, the tensor's own type for the
  // rest (model inputs, the loss, parameter gradients, norms' statistics). Empty, or
  // shorter than `tensors`: the tensor's own type. Kernels compute in f32 either way.
  std::vector<DType> stored;
  DType storedDtype(int t) const {
    return static_cast<size_t>(t) < stored.size() ? stored[t] : tensors[t].type.dtype;
  }
  // Whether the runtime applies `amp` (with a `train` block): activations stored in half
  // precision, the weights of the matrix-multiplying layers rounded to it where they are
  // read.
  bool ampApplies() const;
  // The half type of `amp` (bf16 or fp16), F32 without amp.
  DType ampDtype() const {
    return policy.amp == Amp::Bf16   ? DType::BF16
           : policy.amp == Amp::Fp16 ? DType::F16
                                     : DType::F32;
  }
  // Whether the runtime scales the loss (amp = fp16 where amp applies).
  bool scalesLoss() const { return policy.amp == Amp::Fp16 && ampApplies(); }

  int addTensor(std::string name, TensorType type, int producer);
  // Bytes of tensor t under the bindings, in its stored type; nullopt while a dim is unbound.
  std::optional<int64_t> bytesOf(int t) const;
  // The layout -> local-shape arithmetic: the symbol values on a rank (the batch symbol is
  // the rank's share of a micro-batch), and what tensor t and transfer `in` hold there.
  std::map<std::string, int64_t> bindingsOn(const Program& p) const;
  // Tensor t's shape on p's rank: a tensor inside a split region (not data-parallel) holds
  // its copy's micro-batch, and a sharded one 1 / splitWidth of its cut dim. Parameter q's
  // shape there: cut along its shardDim.
  std::vector<int64_t> localShape(const Program& p, int t) const;
  std::vector<int64_t> localParamShape(const Program& p, int q) const;
  // The bytes of the arena a run of op `op` on p's rank takes for its kernel's temporaries
  // (KernelCall::workspace), 0 for none: the fused mlp's activation (and in its backward
  // the activation's gradient), attention's backward dctx and dqkv, conv2d's im2col
  // columns and output rows of a group of images (convGroup; its backward's columns
  // twice, or the buffers of the CPU's oneDNN convolution where they are more:
  // convDirectPlan), moe_experts' gelu of an expert's block of rows (in its backward also
  // dL/dh; a block of every row at most), under amp a block of the rows of linear's half output
  // (halfOutputRows). The CPU kernels' layout, floats side by side in that order. A split
  // region's transfer: the pieces it cuts or joins (transferScratchBytes).
  int64_t workspaceBytes(const Program& p, int op) const;
  // A conv2d's shapes on p's rank (op `op`, or the forward of backward op `op`): x [b, c, h,
  // w], w [co, c, k, k], an output plane of ho x wo; nullopt for another op.
  struct ConvShape {
    int64_t b, c, h, w, co, k, ho, wo;
    int64_t plane() const { return ho * wo; }
    int64_t ckk() const { return c * k * k; }
  };
  std::optional<ConvShape> convShape(const Program& p, int op) const;
  // Forward op `op` is a cross-entropy over a vocabulary split on program p's ranks
  // (Executor::vocabCrossEntropy).
  bool vocabLoss(const Program& p, const Op& op) const {
    return p.splitWidth > 1 && op.kind == OpKind::CrossEntropy && op.splitForm == SplitForm::Vocab;
  }
  // The floats of such a loss that each rank of the split group gathers from every other:
  // the log-sum-exp of each of its rows, and its mean target logit.
  int64_t vocabFigures(const Program& p, const Op& op) const;
  int64_t transferScratchBytes(const Program& p, const Op& o, const Op& fwd) const;
  // The matrix-product FLOPs (ir::opFlops) of p's step on its rank, from its local sizes:
  // its forward runs, the recomputations before their backward, and its backward runs (a
  // split backward's input and parameter parts half each).
  struct StepFlops {
    double forward = 0, recompute = 0, backward = 0;
    double total() const { return forward + recompute + backward; }
  };
  StepFlops stepFlops(const Program& p) const;
  // The matrix products (and their FLOPs) of one run of forward op `op` on p's rank (its
  // local sizes), a micro-batch: its forward's, or its backward's.
  std::vector<Product> runProducts(const Program& p, int op, bool backward) const;
  // The products one run of backward op `op` makes on p's rank: each forward product's two
  // (the gradient of its left operand, then of its right one), less the first product's
  // left-operand gradient where the op's input needs no gradient (the kernels skip it: a
  // first layer that reads the data computes its weight gradient alone).
  std::vector<Product> backwardProducts(const Program& p, int op) const;
  Flops runFlops(const Program& p, int op) const;
  // What the trace and the predicted ops call a Run instruction: "fwd NAME", "recompute
  // NAME", "optimizer NAME", or "bwd NAME" (of its forward op; "bwd-inputs", "bwd-params"
  // for a split backward's parts).
  std::string runName(const Instr& in) const;
  // The program of the first rank of a stage, or nullptr (a plan without programs).
  const Program* firstProgramOf(int stage) const;
  // The model's matrix-product FLOPs of one sample's forward (whole sizes, no split or
  // recomputation: the model FLOPs of MFU); 0 while the batch is symbolic.
  double forwardFlopsPerSample() const;
  // Tokens a sample holds for token data (`tokens(…)`, `text(…)`): its window; else 0.
  int64_t tokensPerSample() const;
  // amp: the bytes of the f32 copies a run of op `op` on p's rank makes of its
  // half-precision tensors and of the weights it rounds (backend/HalfStaging.h's layout:
  // each copy padded to 16 floats); 0 without amp, and for the ops whose kernels read and
  // write half precision as stored (OpInfo::halfAsStored). None of the output of a forward
  // that writes it a block of rows at a time (OpInfo::halfOutputByRows), nor of the inputs
  // that only feed products where every such input is of the half type (ir::productInputs:
  // both devices multiply it as stored; its weights rounded into half a copy's room).
  int64_t ampStagingBytes(const Program& p, int op) const;
  // The inputs of op o's kernel call in order (ir::callArity's layout, which
  // Executor::bindCall binds): a tensor, a parameter, or (tensor -1) a tensor the call
  // passes without data, with the shape of tensor `shapeOf` (a backward's unread input or
  // output).
  struct CallInput {
    int tensor = -1, param = -1, shapeOf = -1;
  };
  std::vector<CallInput> callInputs(const Op& o) const;
  // The bytes of those copies a device writes when its products read the half type as it
  // is (`direct`, backend/HalfStaging.h): linear's, mlp's and attention's tensor inputs then
  // reach the kernel as stored (an estimate: their saved tensors are still copied), and
  // their weights are rounded into half the room.
  int64_t ampStagedBytes(const Program& p, int op, bool direct) const;
  int64_t bytesOn(const Program& p, int t) const;
  // What a Run of communication op `op` moves on p's rank over its split group, following
  // each op's transpose in the backward: all-reduce <-> identity, all-gather <-> slice.
  // nullopt when it moves nothing (a forward slice or identity, a backward all-reduce or
  // all-gather).
  struct SplitCollective {
    CollectiveKind kind = CollectiveKind::AllReduce; // or AllGather, ReduceScatter, AllToAll
    // The Comm call's bytes: the buffer reduced (all-reduce; reduce-scatter: the whole
    // partial tensor), or each rank's piece (all-gather).
    int64_t bytes = 0;
  };
  std::optional<SplitCollective> splitCollective(const Program& p, int op) const;
  // The split regions' communication of one micro-batch of p's step: the collectives of
  // the forward and of the backward, their bytes (an all-reduce's buffer, an all-gather's
  // whole result, a reduce-scatter's whole input), and what a ring sends from each rank:
  // 2 (w - 1) / w of an all-reduce, (w - 1) / w of an all-gather or a reduce-scatter.
  struct SplitTraffic {
    int allReduces[2] = {0, 0}, allGathers[2] = {0, 0}; // [forward, backward]
    int reduceScatters[2] = {0, 0};
    int allToAlls[2] = {0, 0}; // split experts: their rows' bytes, (w - 1) / w of them sent
    int64_t allToAllBytes[2] = {0, 0};
    int64_t allReduceBytes[2] = {0, 0}, allGatherBytes[2] = {0, 0};
    int64_t reduceScatterBytes[2] = {0, 0};
    int64_t ringSendBytes = 0;
  };
  SplitTraffic splitTraffic(const Program& p) const;
  int64_t transferBytes(const Program& p, const Instr& in) const;
  // Where the receives of `list` (p's step or evaluation) land and when they are posted.
  // With a ring of n buffers, receive k (in program order) uses buffer k % n and is posted
  // when the program starts if k < n, else right after receive k - n was waited for and
  // read; a buffer is as large as the largest receive it takes. With n = 0 every receive
  // has a buffer of its own, all posted when the program starts.
  struct ReceivePlan {
    std::vector<int64_t> offset;  // by instruction: its buffer's offset; -1 for the others
    std::vector<int> postedAfter; // by instruction: -1 at the start, else that receive's index
    int64_t bytes = 0;            // all the buffers, each 64-byte aligned
  };
  ReceivePlan receivePlan(const Program& p, const std::vector<Instr>& list, int ring) const;
  // What keeps the runtime from running this plan, in words ("4 pipeline stages and model
  // chunks of split widths 2 (stage 0) and 1 (stage 2) on the same devices"), or empty
  // when it runs. Split regions run in any stage, in
  // any number of copies: linear (column, row), mlp (hidden), attention (heads), conv2d
  // (channels), vocabulary-parallel embedding and cross_entropy, moe (experts), and the
  // ops that follow layouts.
  std::string runRefusal() const;
  // How many ranks compute the loss (each program whose lossRank is its own rank).
  int lossRanks() const;
  // Where integer tensor t comes from in the data: model input `input` (an index into
  // `inputs`), or with `next` that input's next tokens, through ops that only move its
  // elements (reshape, flatten, transpose, the compiler's bridges). input < 0: t is
  // computed, or picked out of the data.
  struct DataSource {
    int input = -1;
    bool next = false;
  };
  DataSource dataSource(int t) const;
  // Whether the runtime applies ZeRO stage 1: each program's optimizer states partitioned
  // over the ranks that sum their gradients (zeroSlices: every rank of a purely
  // data-parallel plan, a pipeline stage's ranks in every copy; for a split region's
  // pieces, the ranks holding the same pieces). It applies to every program or none: with
  // `zero` of 1 or more, an optimizer with states, each program updating parameters that
  // several ranks share (its model chunks' side by side in its layout), and every split
  // group's pieces held by several copies of it (splitPiecesShared).
  bool zeroApplies() const;
  // Every split stage runs in several copies, so that its pieces are summed over several
  // ranks (true without split stages).
  bool splitPiecesShared() const;
  // Parameter q's gradients are summed over the ranks holding the same split pieces (its
  // op is inside a split region of a split stage, and its gradient is not partial), not
  // over every rank of its stage (GradBucket::pieces).
  bool reducedOverPieces(int q) const;
  // Whether the runtime applies ZeRO stage 2 as well: each rank keeps the gradients of its
  // slice alone, every micro-batch's buckets are reduce-scattered into them, and a bucket's
  // gradients live in the arena from their first write to their reduction's end. With
  // `zero` of 2 or more, where stage 1 applies: a purely data-parallel plan, one stage
  // with split regions, or a pipeline (interleaved chunks too) whose every stage has
  // several ranks. Decided from the plan before the schedule, so that the schedule can
  // place the reductions.
  bool zeroShardsGradients() const;
  // Whether the runtime applies ZeRO stage 3 as well: each rank keeps its slice of the
  // parameters alone, and every micro-batch gathers each gradient bucket's parameters whole
  // into the arena before its forward ops and again before its backward ops (Program::
  // gatherOffset), freed after the last op that reads them. With `zero = 3` wherever
  // stage 2 applies and every parameter has a gradient (so every one is in a bucket).
  bool zeroShardsParams() const;
  // The state layout of p's rank (docs/architecture.md, "State layout"): where each
  // parameter it holds sits in its parameter memory, its gradients' and each optimizer
  // state's alike. A rank holds the parameters of its stages' ops (every one without a
  // pipeline), each its own piece (localParamShape), 64-byte aligned, in parameter order:
  // first those summed over the stage's ranks, then those summed over the ranks holding
  // the same split pieces (reducedOverPieces), so that each ZeRO domain is one block. The
  // ranks that share parameters (a data-parallel group) lay them out alike.
  struct ParamLayout {
    std::vector<int64_t> offset, bytes; // by parameter; offset -1: not held on this rank
    int64_t total = 0;
    bool holds(int q) const { return offset[q] >= 0; }
    int64_t end(int q) const { return offset[q] + (bytes[q] + 63) / 64 * 64; }
    // Parameters [first, end), all held: where the first starts and the last ends.
    int64_t spanBegin(int first) const { return offset[first]; }
    int64_t spanEnd(int endParam) const { return end(endParam - 1); }
  };
  ParamLayout paramLayout(const Program& p) const;
  // Whether p's rank holds parameter q (one of its stages' ops reads it).
  bool holdsParam(const Program& p, int q) const;
  // The stages holding parameter q: its maker's, then a tied weight's copies'.
  std::vector<int> stagesHolding(int q) const;
  // Whether parameter q is a tied weight's copy on p's rank (held there, made in another
  // stage): the gradient norm counts it at its maker.
  bool holdsCopy(const Program& p, int q) const;
  // The ranks of every stage holding tied weight q (its maker's and its copies'), sorted:
  // of a weight cut in split regions (the same dim and width in each stage), those holding
  // the pieces of split rank `splitRank`.
  std::vector<int> tiedRanks(int q, int splitRank = 0) const;
  // ZeRO's domains on p's rank, in layout order: the block of the parameters it updates
  // that are summed over its stage's ranks (p.dataRanks; rank p.dataRank among them), and
  // the block of those summed over the ranks holding its split pieces (`pieces`; their
  // ranks in rank order), each cut into one slice a rank.
  struct ZeroSlice {
    int64_t base = 0, bytes = 0; // slice k is [base + k bytes, base + (k + 1) bytes)
    int ranks = 1, rank = 0;
    bool pieces = false;
    int64_t begin() const { return base + rank * bytes; } // this rank's slice
    int64_t end() const { return begin() + bytes; }
  };
  std::vector<ZeroSlice> zeroSlices(const Program& p) const;
  // ZeRO: by bucket, the pieces of its parameter bytes [begin, end) of the layout that
  // each rank k of its domain (zeroSlices) holds in its slice (those with some): where
  // stage 2 reduce-scatters a bucket and from where stage 3 gathers it.
  struct SlicePiece {
    int rank = 0;
    int64_t begin = 0, end = 0;
  };
  std::vector<std::vector<SlicePiece>> bucketPieces(const Program& p) const;
  // The ranks a reduction of bucket b on p's rank runs over: b.ranks, but for a tied
  // weight's bucket under ZeRO stage 2 in a micro-batch (not its stages' sum, `tie`), its
  // ZeRO domain's.
  int reductionRanks(const Program& p, const GradBucket& b, bool tie) const;
  // ZeRO stage 2: the bytes of the tied weights' buckets p's rank holds, each whole, side
  // by side after its gradient slice: where their slices are summed over the stages
  // holding them (Instr::tie). 0 without ZeRO stage 2.
  int64_t tieBytes(const Program& p) const;
  // Whether bucket b's gradients are p's rank's: it holds their parameters and, of a weight
  // tied across stages, b is the bucket of p's stage's copy: each stage holding the weight
  // has a bucket of it, and a rank fills and reduces its own stage's alone.
  bool holdsBucket(const Program& p, const GradBucket& b) const {
    return holdsParam(p, b.firstParam) && (!b.tied || b.stage % mesh.depth() == p.stage);
  }
  // Whether Run `in` writes output k of its op: a split backward's B part writes the input
  // gradients, its W part the parameter gradients (ir::writesOutput); any other run, all.
  bool runWrites(const Instr& in, size_t k) const {
    const Op& op = ops[in.op];
    return op.phase != Phase::Backward || writesOutput(in.part, k, ops[op.forward].inputs.size());
  }
  // By parameter, the gradient bucket p's rank puts its gradient in (and, under ZeRO stage
  // 3, gathers it with); -1: none on that rank.
  std::vector<int> paramBuckets(const Program& p) const;
  // The bytes bucket b's reduction sends from each rank: its gradients in `comm_dtype`.
  int64_t wireBytes(const GradBucket& b) const {
    return b.bytes / 4 * dtypeBytes(policy.commDtype);
  }
  // The optimizer states each parameter has (adam/adamw 2, sgd with momentum 1, else 0).
  int optimizerStates() const;
  // Whether the runtime keeps the optimizer states off the device (`offload = optimizer`,
  // an optimizer with states): in a file (`offload_to = disk`), or in host memory
  // (`offload_to = cpu`) on devices with memory of their own (!deviceMemoryIsHost; the CPU
  // device's memory is the host's already). Either way streamed through staging buffers.
  bool offloadApplies() const;
  bool offloadsToHostMemory() const {
    return offloadApplies() && policy.offloadTo == OffloadTarget::Cpu;
  }
  // Where offloaded states are, for the reports: "on disk" or "in host memory".
  const char* offloadPlace() const { return offloadsToHostMemory() ? "in host memory" : "on disk"; }
  // Whether the parameters' slices go with them (`offload = params`, where ZeRO stage 3
  // applies: each rank's slice is then all it holds of them).
  // Each gather reads the rank's part of a bucket from the file, and the optimizer ops
  // stream the slice with the states.
  bool offloadsParams() const;
  // Where each micro-batch uses its slot of p's arena in p.step: the index of its first
  // and last instruction that reads or writes the arena (a load, a forward or backward op,
  // a transfer, the loss seed), -1 for a micro-batch the program does not run. The
  // executor holds the slot between them; a send is waited for before the slot's next
  // micro-batch starts, or at the step's end.
  struct SlotUse {
    std::vector<int> first, last;
  };
  SlotUse slotUse(const Program& p) const;
  int addScope(Scope s);
  // The stage scope enclosing a scope, or -1 for the model root.
  int stageScopeOf(int scope) const;
  // The split scope enclosing a scope (a split block, or a split stage), or -1.
  int splitScopeOf(int scope) const;
};

} // namespace epl::ir
