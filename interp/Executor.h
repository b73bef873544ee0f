// Runs one rank's instruction stream (ir::Program) on a backend::Device: owns the rank's
// activation arena, parameters, gradients and optimizer states in device memory, and turns
// each instruction into device calls. The training loop around it is in Trainer.cpp.
#pragma once
#include "backend/Device.h"
#include "backend/comm/Comm.h"
#include "interp/OffloadedStates.h"
#include "interp/Trace.h"
#include "ir/Module.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace epl::interp {

// One micro-batch on the host, in the model's input order.
struct HostBatch {
  std::vector<backend::HostBuffer> inputs; // one per model input, as the device stores it
  backend::HostBuffer next; // `next(tokens)` targets (int32), when the model reads them
  int32_t* nextTargets() const { return next.data<int32_t>(); }
  int64_t nextCount() const { return next.bytes() / 4; }
};

// Optimizer hyper-parameters of the run, with the current learning rate.
struct OptimizerSettings {
  backend::OptimizerKind kind = backend::OptimizerKind::AdamW;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weightDecay = 0.f, momentum = 0.f;
  double clipGradNorm = 0; // 0: off
  // Where the optimizer states' file goes when the plan keeps them on disk
  // (Program::offloadedBytes); empty: the system's temporary directory.
  std::string offloadDir;
};

struct StepResult {
  double loss = 0; // mean over the step's micro-batches and data-parallel ranks
  // The global L2 norm before clipping, measured when clipping or under amp = fp16; -1
  // otherwise (not measured).
  double gradNorm = -1;
  // Data parallelism: seconds this rank was blocked in reduce-wait; seconds from the last
  // rank's first reduce-start to the last rank's last reduce-wait (the reductions' own
  // time once every rank has joined; by the monotonic clock, so meaningful when the ranks
  // share one machine); and the bytes its reductions sent (in the wire type, `comm_dtype`).
  double reduceWaitSeconds = 0, reduceSpanSeconds = 0;
  int64_t reduceBytes = 0;
  // A model with `moe`: the mean over its moe layers and the step's samples of the
  // load-balancing loss (1 when the experts share the tokens evenly), and the share of
  // token copies the capacity dropped; -1 without moe.
  double moeAux = -1, moeDropped = -1;
  // amp = fp16: the loss scale of this step (0 without one), and whether its gradients
  // overflowed, so that it updated nothing.
  double lossScale = 0;
  bool skipped = false;
};

class Executor {
public:
  // Runs the stream of `comm.rank()`.
  Executor(const ir::Module& m, backend::Device& device, backend::Comm& comm,
           OptimizerSettings optimizer);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  const ir::Module& module() const { return m_; }
  backend::Comm& comm() const { return comm_; }
  // Samples this rank reads for one micro-batch.
  int64_t localBatch() const { return localBatch_; }
  // Where micro-batch `micro` of this rank starts in the step's global batch: micro-batch
  // j of the step is the same samples at any -np, cut into one slice per reader.
  int64_t firstSample(int micro) const {
    return (static_cast<int64_t>(micro) * program_.readers + program_.reader) * localBatch_;
  }
  // Where this rank's evaluation slices start: its index among the ranks that read
  // different samples of each micro-batch, and their number.
  int reader() const { return program_.reader; }
  int readers() const { return program_.readers; }
  // Whether this rank computes the loss (a pipeline's other stages do not).
  bool holdsLoss() const { return program_.lossRank == comm_.rank(); }
  // Buffers Load copies from: one per micro-batch, sized for the rank's micro-batch.
  HostBatch& staging(int micro) { return staging_[micro]; }
  bool readsNextTokens() const { return !nextOps_.empty(); }
  int microBatches() const { return program_.microBatches; }
  // The ranks ZeRO partitions the optimizer states over (0: every rank holds them all): of
  // the parameters summed over the stage's ranks, or (`pieces`) of a split region's pieces.
  int zeroRanks(bool pieces = false) const {
    for (const ZeroDomain& d : zero_)
      if (d.slice.pieces == pieces) return d.slice.ranks;
    return 0;
  }
  bool zeroApplied() const { return !zero_.empty(); }
  // The directory of the file holding the optimizer states, when they are offloaded to disk
  // (else empty).
  std::string offloadDir() const { return disk_ ? disk_->dir() : std::string(); }

  // Parameters and optimizer states (k = 0, 1) by param index, as f32 host arrays.
  void writeParam(int p, const float* host);
  void readParam(int p, float* host) const;
  int statesPerParam() const { return states_; }
  void writeState(int p, int k, const float* host);
  void readState(int p, int k, float* host) const;
  int64_t paramElements(int p) const { return wholeElems_[p]; } // whole, as read and written
  // Copies `root`'s parameters and optimizer states (those it read or wrote: every one,
  // whichever ranks hold them) to the ranks that hold them, each keeping its share.
  // Collective.
  void broadcastState(int root);
  // A stage with split regions: every rank gathers the sharded parameters and optimizer
  // states whole, so that rank 0 can read them (checkpoints); with ZeRO, the first rank of
  // each domain's group gathers its ranks' slices of the optimizer states (and with stage
  // 3 of the parameters). Collective.
  void gatherShards();
  // Frees what gatherShards and gatherStages gathered for rank 0's reads.
  void dropGathered();
  // A pipeline: the first rank of each stage sends its parameters and optimizer states
  // whole (after gatherShards), and rank 0 keeps those of the other stages aside for
  // readParam and readState (checkpoints). Collective.
  void gatherStages();

  // Records the instructions of the next steps into `trace` (until it is full); null: off.
  // While recording, each instruction synchronizes the device, so its time is its own.
  void setTrace(TraceRecorder* trace) { trace_ = trace; }
  // One optimizer step over every micro-batch's staging buffers. `step` is 0-based.
  StepResult runStep(int64_t step, float lr, uint64_t seed);
  // A forward pass without dropout over staging(0). Returns the loss; when the loss is a
  // cross-entropy, `logits` and `targets` get its inputs (rows x classes, rows).
  double runEval(std::vector<float>* logits, std::vector<int32_t>* targets);
  // Forward only, for sampling: the logits that feed the loss (all rows).
  std::vector<float> forwardLogits();
  int64_t classes() const;
  // A cross-entropy loss's `ignore_index` when it names a class that can occur (>= 0),
  // else -1: its mean is over the targets kept, so the step's weights need the global
  // batch's count of them (setKeptTargets) before the step runs.
  int64_t ignoredClass() const { return ignored_; }
  // Of the step's global batch, how many loss targets there are and how many are kept; and
  // of each of this rank's micro-batches (firstSample, localBatch), how many are kept
  // (`mine`, one a micro-batch, or empty): read from the data on the host, so the seed of
  // each micro-batch's loss needs no copy of its targets from the device.
  void setKeptTargets(int64_t kept, int64_t total, std::vector<int64_t> mine = {}) {
    kept_ = kept;
    targets_ = total;
    keptMine_ = std::move(mine);
  }
  int64_t arenaBytes() const { return program_.arenaBytes; }
  // The runtime's account of activations: the most micro-batches whose slot of the arena
  // was held at once over the steps run so far (a micro-batch holds slot m % slots from its
  // forward's first instruction to its backward's last); each holds Program::slotStride().
  int peakInFlight() const { return peakInFlight_; }
  // amp = fp16: the loss scale the next step uses (1 without one), and the steps since it
  // last changed; a checkpoint keeps both.
  double lossScale() const { return lossScale_; }
  int lossScaleSteps() const { return goodSteps_; }
  void setLossScale(double scale, int steps) {
    lossScale_ = scale;
    goodSteps_ = steps;
  }

private:
  struct Bound {
    backend::KernelCall call; // views bound to this rank's buffers
  };
  // A pipeline's receive: where its buffer sits in recvMem_, the transfer in flight, whether
  // it is posted when the program starts, and the receives (by instruction) posted once it
  // is read: those that take its buffer next (ir::Module::receivePlan).
  struct Receive {
    int64_t offset = -1;
    backend::Request request;
    bool atStart = true;
    std::vector<size_t> posts;
  };
  void allocateBuffers();
  void releaseBuffers();
  int slotOf(int micro) const { return micro % program_.slots; }
  backend::TensorView view(int tensor, int slot = 0) const;
  backend::TensorView shapeOnly(int tensor) const;
  // Parameter p's shape, and where it is: its place in the parameter memory, or with ZeRO
  // stage 3 (whose memory is the rank's slice alone) where the op that reads it finds it:
  // its bucket's gathered block for `use` (0 forward, 1 backward) in `slot`; without a use,
  // nowhere (the optimizer's updates address the slice, paramAt).
  backend::TensorView paramView(int p, int use = -1, int slot = 0) const;
  backend::TensorView stateView(int p, int k) const;
  void bindCalls();
  void planSlotUse();
  void occupySlot(size_t index);
  void vacateSlot(size_t index);
  void bindCall(int op, int slot);
  void bindParts();
  void bindWorkspaces();
  backend::KernelCall& callOf(const ir::Instr& in);
  void load(int micro);
  void run(const ir::Instr& in, size_t index, int64_t step, uint64_t seed, bool training);
  void runTraced(const ir::Instr& in, size_t index, int64_t step, uint64_t seed);
  std::string traceName(const ir::Instr& in) const;
  void placeReceives(const std::vector<ir::Instr>& list, int ring, std::vector<Receive>& out,
                     int64_t& offset);
  void postReceives(const std::vector<ir::Instr>& list, std::vector<Receive>& receives);
  void postReceive(size_t index);
  unsigned char* transferData(const ir::Instr& in) const;
  void send(const ir::Instr& in, size_t index, int64_t step, bool training);
  void finishSends(int slot);
  void receive(const ir::Instr& in, size_t index, int64_t step, Receive& r);
  void gradNorm(const ir::Op& op);
  void sumNormOnDevice(float* acc, backend::Comm* across);
  void splitTransfer(const ir::Instr& in, size_t index, int64_t step);
  void transfer(const ir::Op& op, const ir::Op& fwd, const backend::TensorView& src,
                const backend::TensorView& dst, bool add, float* scratch,
                const std::function<std::string()>& what);
  void moeExchange(const ir::Instr& in, size_t index, int64_t step);
  void vocabCrossEntropy(const ir::Instr& in, size_t index, int64_t step);
  void keepRunningStats(const ir::Op& op, int slot);
  void gatherVocabLogits(const ir::Op& op, std::vector<float>* logits,
                         std::vector<int32_t>* targets);
  // Forward op `op` is a cross-entropy over a vocabulary split on this rank.
  bool vocabLoss(int op) const { return m_.vocabLoss(program_, m_.ops[op]); }
  // Where micro-batch `micro`'s piece of tensor t starts in the step's global batch: the
  // rank's slice (data-parallel), or its copy's inside a split region.
  int64_t firstSample(int micro, int t) const;
  // This rank holds parameter q (Module::paramLayout), and holds a piece of it cut over the
  // split group.
  bool holds(int q) const { return paramOffset_[q] >= 0; }
  bool sharded(int q) const { return holds(q) && paramElems_[q] != wholeElems_[q]; }
  // A whole parameter (or optimizer state) <-> this rank's piece of it.
  void toPiece(int q, const float* whole, float* piece) const;
  void fromPieces(int q, const float* pieces, float* whole) const;
  void startReduce(int bucket, int micro);
  void splitCommunicators();
  // Where gradient buckets are summed (a stage's ranks in every replica, or every rank),
  // and the squared gradient norm (the ranks of this rank's replica, or every rank).
  backend::Comm& reduceComm() const { return stageReplicas_ ? *stageReplicas_ : comm_; }
  backend::Comm& normComm() const { return pipeline_ ? *pipeline_ : comm_; }
  // The ranks of this rank's split group (a stage with split regions), in split-rank order.
  backend::Comm& splitComm() const { return split_ ? *split_ : comm_; }
  // Where bucket b's gradients are summed.
  backend::Comm& bucketComm(int b) const {
    if (m_.buckets[b].tied) return *tied_.at(m_.buckets[b].firstParam);
    return m_.buckets[b].pieces && pieces_ ? *pieces_ : reduceComm();
  }
  // joined: the elements of the update (joinedElems_), -1 its own parameter's.
  void optimizerStep(int op, int64_t step, int64_t joined);
  void planFusedUpdates();
  std::pair<int64_t, int64_t> updatedBytes(int p) const;
  // The same for parameter bytes [begin, end) of one ZeRO domain (or none).
  std::pair<int64_t, int64_t> updatedBytes(int64_t begin, int64_t end) const;
  // Where parameter byte b's optimizer states are in each state's memory (or file): with
  // ZeRO, in the rank's slices side by side (b in one of them).
  int64_t stateOffset(int64_t b) const {
    if (zero_.empty()) return b;
    const ZeroDomain& d = domainOf(b);
    return d.at + b - d.slice.begin();
  }
  void planOffloadChunks();
  void planGatherReads();
  // Bytes [offset, offset + bytes) of the parameters' memory (k = kParams) or of optimizer
  // state k's (in memory or on disk), to or from host memory. Blocking.
  static constexpr int kParams = -1;
  void readModel(int k, int64_t offset, int64_t bytes, void* host) const;
  void writeModel(int k, int64_t offset, int64_t bytes, const void* host);
  // This rank's share of whole parameter q (k = kParams) or of its optimizer state k, from
  // `whole` into its memory: its piece of a cut one, and of that the part in its ZeRO slice.
  void placeWhole(int q, int k, const float* whole);
  // ZeRO: the rank's piece of whole parameter q (k = kParams) or of its optimizer state k,
  // into the host copy of the memory its domains' slices cut (zeroWhole).
  void keepWhole(int q, int k, const float* whole);
  void gatherParams(int64_t step);
  // ZeRO stage 3: start gathering bucket b whole into its block for `use` in the slot of
  // micro-batch `micro`; wait until it has arrived.
  void startGather(const ir::Instr& in, int part);
  void waitGather(const ir::Instr& in, size_t index, int64_t step);
  // Bytes of each optimizer state this rank holds: its ZeRO slices, or every parameter.
  int64_t stateBytes() const { return zero_.empty() ? gradBytes_ : sliceBytes_; }
  // ZeRO: the bytes of a whole optimizer state on the host: every parameter's place, and
  // the slices' padding past the last.
  int64_t zeroStatesBytes() const {
    int64_t n = gradBytes_;
    for (const ZeroDomain& d : zero_)
      n = std::max(n, d.slice.base + d.slice.ranks * d.slice.bytes);
    return n;
  }
  int lossOp() const;
  double keptWeight(int slot, int micro);

  const ir::Module& m_;
  const ir::Program& program_;
  backend::Device& dev_;
  backend::Comm& comm_;
  // A pipeline of more ranks than stages: sub-communicators of comm_ (null otherwise).
  std::unique_ptr<backend::Comm> stageReplicas_, pipeline_, split_, pieces_;
  // By weight tied across stages that this rank holds: the ranks of every stage holding it.
  std::map<int, std::unique_ptr<backend::Comm>> tied_;
  OptimizerSettings opt_;
  int states_ = 0;
  unsigned char* arena_ = nullptr;
  unsigned char* params_ = nullptr;
  unsigned char* grads_ = nullptr;
  unsigned char* stateMem_[2] = {nullptr, nullptr};
  int64_t gradBytes_ = 0;
  std::vector<int64_t> paramOffset_, paramElems_, wholeElems_;
  // By instruction of the step, an optimizer op's update (planFusedUpdates): -1 its own
  // parameter, n elements of its parameter and the next ones' end to end, 0 updated by an
  // earlier instruction's.
  std::vector<int64_t> joinedElems_;
  std::vector<std::vector<int64_t>> paramShape_; // this rank's piece of each parameter
  // Parameters cut over the split group, and those this rank does not hold, with their
  // optimizer states, as whole host arrays: between rank 0's writes and broadcastState, or
  // gatherShards (gatherStages) and rank 0's reads; whether rank 0 wrote states (a
  // checkpoint's; they start at zero otherwise).
  std::map<int, std::vector<float>> wholeParam_;
  std::map<std::pair<int, int>, std::vector<float>> wholeState_;
  bool statesWritten_ = false;
  // In device memory: a zero bias for the split ranks that must not add one to their
  // partial sums (bindCall).
  float* zeroBias_ = nullptr;
  int64_t zeroBiasFloats_ = 0;
  void launchPlain(ir::OpKind kind, std::vector<backend::TensorView> in,
                   const backend::TensorView& out);
  void castInto(const backend::TensorView& from, const backend::TensorView& to);
  void addInto(const backend::TensorView& dst, void* values);
  std::vector<float> ampIn_; // amp: the f32 copy of the evaluation's gathered logits
  // ZeRO stage 1 (Module::zeroApplies) over the ranks that share this rank's parameters,
  // in each domain (Module::zeroSlices: those summed over the stage's ranks, and a split
  // region's pieces, summed over the ranks holding the same ones) with the communicator of
  // its ranks: the rank holds the optimizer states of its slice of each, side by side
  // (`at`: where the domain's slice starts there; sliceBytes_ in all), updates the
  // parameters there alone, and the slices are all-gathered after the optimizer ops
  // (zero_ empty: off). Whole states sit on the host (zeroStates_, laid out like the
  // parameters) between gatherShards and rank 0's reads (then dropGathered), or rank 0's
  // writes and broadcastState.
  struct ZeroDomain {
    ir::Module::ZeroSlice slice;
    backend::Comm* comm = nullptr;
    int64_t at = 0;
  };
  std::vector<ZeroDomain> zero_;
  int64_t sliceBytes_ = 0;
  // The domain whose slices hold parameter byte b, and bucket b's.
  const ZeroDomain& domainOf(int64_t b) const;
  const ZeroDomain* findDomain(int64_t b) const; // null: in none
  const ZeroDomain& bucketDomain(int b) const {
    return zero_.at(m_.buckets[b].pieces && zero_.back().slice.pieces ? zero_.size() - 1 : 0);
  }
  std::vector<float> zeroStates_[2];
  // ZeRO stage 3 (Module::zeroShardsParams): params_ holds the parameters of the slice
  // alone (byte b of the flat memory at paramAt(b)); each bucket is gathered whole into
  // the arena (Program::gatherOffset) by one broadcast from each rank whose slice holds
  // part of it (gatherPieces_, which stage 2's reduce-scatters cut by too), in flight in
  // gathering_ (by 2 b + use). Whole parameters
  // sit on the host (zeroParams_, flat) as the states do in zeroStates_.
  bool shardParams_ = false;
  // `offload = params` (Module::offloadsParams): the slice is the offloaded file's block
  // states_ instead (params_ is null); gathers read the rank's part from it.
  bool paramsOnDisk_ = false;
  std::vector<std::vector<ir::Module::SlicePiece>> gatherPieces_;
  std::vector<std::vector<backend::Request>> gathering_;
  std::vector<float> zeroParams_;
  unsigned char* paramAt(int64_t b) const { return params_ + (shardParams_ ? stateOffset(b) : b); }
  // The gathered block (use) an op of `phase` reads parameter q from: the forward's, or the
  // backward's where it does not keep the forward's (Program::keepsGather).
  int gatherUse(int q, ir::Phase phase) const {
    if (!shardParams_) return 0;
    return phase == ir::Phase::Forward || program_.keepsForwardGather(bucketOfParam_[q]) ? 0 : 1;
  }
  unsigned char* gatherMem(int b, int use, int slot) const {
    int id = static_cast<int>(m_.tensors.size() + m_.buckets.size()) + 2 * b + use;
    int64_t base = program_.isShared(id) ? program_.slots * program_.slotStride()
                                         : slot * program_.slotStride();
    return arena_ + base + program_.gatherOffset[2 * b + use];
  }
  // The host copy of what readModel/writeModel call k (kParams: the parameters).
  std::vector<float>& zeroWhole(int k) { return k == kParams ? zeroParams_ : zeroStates_[k]; }
  // ZeRO stage 2 (Module::zeroShardsGradients): grads_ holds the gradients of the rank's ZeRO
  // slices alone (laid out as the optimizer states are); bucket b's gradients sit in the arena
  // at Program::bucketOffset[b] (of the micro-batch's slot, or of the shared region),
  // cleared before the step instruction that first writes them in each micro-batch
  // (clearBuckets_, by instruction), and each reduction is reduce-scattered in place there,
  // then added into grads_.
  bool shardGrads_ = false;
  std::vector<int> bucketOfParam_;
  std::vector<std::vector<int64_t>> scatterCounts_;   // by bucket: floats of it in each slice
  std::vector<std::pair<int64_t, int64_t>> normRuns_; // slice bytes the gradient norm sums
  std::vector<std::vector<int>> clearBuckets_;
  unsigned char* bucketMem(int b, int slot) const {
    int id = static_cast<int>(m_.tensors.size()) + b;
    int64_t base = program_.isShared(id) ? program_.slots * program_.slotStride()
                                         : slot * program_.slotStride();
    return arena_ + base + program_.bucketOffset[b];
  }
  // Where the gradient of parameter byte b is in grads_ (its slice, with ZeRO stage 2).
  unsigned char* gradAt(int64_t b) const { return grads_ + (shardGrads_ ? stateOffset(b) : b); }
  void planShardedBuckets();
  void foldSlice(int bucket, int slot);
  // ZeRO stage 2: bucket b's bytes in this rank's gradient slice, [first, second).
  std::pair<int64_t, int64_t> slicePart(int b) const;
  // A tied weight's bucket (Instr::tie): its slices summed over every stage holding it, in
  // its whole block after the gradient slice (tieAt_, by bucket; Module::tieBytes).
  void startTieSum(int b);
  void endTieSum(int b);
  std::vector<int64_t> tieAt_;
  // Optimizer states offloaded to disk (Program::offloadedBytes > 0; stateMem_ is then
  // null): the file, the staging buffers' memory, and the step's chunks: by optimizer op id
  // its first chunk and their number; by chunk, where it starts in the parameter memory.
  std::unique_ptr<OffloadedStates> disk_;
  unsigned char* stagingMem_ = nullptr;
  // Offloaded to disk on a device whose memory is not the host's: the file worker's
  // staging buffers, host memory laid out as stagingMem_ (else empty: it uses stagingMem_).
  backend::HostBuffer hostStaging_;
  backend::HostBuffer hostStates_; // `offload_to = cpu`: what the file would hold
  unsigned char* workerStaging() {
    return hostStaging_.empty() ? stagingMem_ : hostStaging_.data();
  }
  std::vector<std::pair<size_t, size_t>> opChunks_;
  std::vector<int64_t> chunkParamAt_;
  // With `offload = params`, by step instruction: the read of the file its gather takes
  // (OffloadedStates::setParts), -1 for none.
  std::vector<int> gatherPart_;
  // Split experts: what each moe's dispatch exchanged for the micro-batch in each slot, by
  // (its counts tensor, slot): the rows this rank sent to each rank of its split group,
  // and the rows of each of its experts it got from each (rank-major), for the combine and
  // the backward.
  struct MoeTraffic {
    std::vector<int64_t> sent, got;
  };
  std::map<std::pair<int, int>, MoeTraffic> moeTraffic_;
  // The step's moe statistics (moe_dispatch's stats summed), and whether the model has moe
  // layers (every rank then gathers them, a pipeline's other stages too). Each dispatch's
  // stats come to the host behind its kernel, in a slot of their own, and are added up
  // after the step: on a GPU no dispatch waits for the device.
  static constexpr int kMoeStats = 4;
  double moeStats_[kMoeStats] = {0, 0, 0, 0};
  backend::HostBuffer moeStatsHost_;
  int moeDispatched_ = 0; // the step's dispatches so far
  bool hasMoe_ = false;
  std::vector<ir::Attrs> localAttrs_; // by op id: its attributes on this rank
  std::vector<int> gradParam_;        // tensor id -> param index for parameter gradients, else -1
  std::vector<std::vector<Bound>> calls_; // by slot, then op id
  // A split backward (zb): the calls of its B (input gradients only) and W (parameter
  // gradients only), by slot, then op id; bound for the ops this rank runs in that part.
  std::vector<std::vector<Bound>> inputCalls_, paramCalls_;
  std::vector<HostBatch> staging_;
  std::vector<int> nextOps_;
  std::map<std::string, int64_t> bindings_; // symbol values on this rank
  // Each micro-batch's loss, copied from the device as its forward ends, and the seed of
  // its backward (d loss / d loss), copied to it: host buffers the copies leave queued,
  // read (the losses) after the step's synchronize.
  backend::HostBuffer lossHost_, seeds_;
  // The gradients' squared norm (gradNorm, when clipping or under a loss scale) stays on
  // the device for the updates: whether this step's grad-norm op ran, the pieces' sum beside
  // the whole ones' in the grad-norm tensor, and the norm's copy for the step's figures.
  bool normOnDevice_ = false;
  float* normPieces_ = nullptr;
  backend::HostBuffer normHost_;
  // A loss with an ignored class: each micro-batch's weight among the step's, the
  // micro-batch's kept targets over its targets times the global batch's targets over its
  // kept ones (1 when nothing is ignored).
  std::vector<double> lossWeight_;
  int64_t ignored_ = -1, kept_ = 0, targets_ = 0;
  std::vector<int64_t> keptMine_; // setKeptTargets: by micro-batch, or empty
  int64_t localBatch_ = 0;
  int lossRanks_ = 0;              // ranks that compute the loss
  std::vector<int64_t> perSample_; // by op id: elements of a dropout's tensor per sample
  std::vector<uint64_t> seedKey_;  // by forward op id: what its dropout seed mixes in
  // Gradient buckets: each one block of grads_ (empty for another stage's), and its
  // reduction while in flight.
  std::vector<int64_t> bucketBegin_, bucketEnd_;
  std::vector<backend::Request> pending_;
  std::vector<backend::Comm*> pendingOn_; // the communicator each ran on
  unsigned char* recvMem_ = nullptr;
  std::vector<Receive> stepRecv_, evalRecv_;              // by instruction index
  std::vector<Receive>* receiving_ = nullptr;             // the list runStep or runEval posted
  const std::vector<ir::Instr>* receivingList_ = nullptr; // and their instructions
  ir::Attrs noAttrs_;
  backend::WireType wire_ = backend::WireType::F32;
  float lr_ = 0;
  // amp = fp16 (Module::scalesLoss): the loss scale, the steps since it last changed, and
  // whether this step's gradients overflowed. 1 and never otherwise.
  double lossScale_ = 1;
  int goodSteps_ = 0;
  bool overflow_ = false;
  double gradNorm_ = 0;
  double reduceWaitSeconds_ = 0;
  int firstStarted_ = -1;                    // the bucket of the step's first reduce-start
  double reduceBegan_ = 0, reduceEnded_ = 0; // monotonic clock
  TraceRecorder* trace_ = nullptr;
  bool tracing_ = false; // this step is traced
  int64_t tracingStep_ = 0;
  // Slot accounting over the step program: the micro-batch whose slot instruction i takes
  // (its first) or gives back (its last), -1 for none; who holds each slot now.
  std::vector<int> takesSlot_, freesSlot_, slotHolder_;
  // A step's sends in flight, by the slot they read from.
  struct Sending {
    backend::Request request;
    std::string what;
  };
  std::vector<std::vector<Sending>> sending_;
  int inFlight_ = 0, peakInFlight_ = 0;
};

} // namespace epl::interp
