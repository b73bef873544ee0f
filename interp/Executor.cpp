// The instruction loop of one rank: buffers, kernel calls bound once, and each
// instruction's device work. Subtle orderings are noted where they happen.
#include "interp/Executor.h"

#include "backend/HalfStaging.h"
#include "backend/comm/Wire.h"
#include "interp/MemoryFit.h"

#include "support/Assert.h"
#include "support/Random.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <functional>
#include <list>
#include <malloc.h>
#include <new>
#include <set>

namespace epl::interp {

namespace {

constexpr int64_t kAlign = 64;

// The machine's monotonic clock: the same on every rank of one machine.
double monotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Where dim `dim` of a tensor of `shape` is cut in `pieces`: the rows before it, the
// piece's elements after it, per row (whole = pieces x piece).
struct Cut {
  int64_t rows = 1, piece = 1;
};
Cut cutOf(const std::vector<int64_t>& shape, int dim, int pieces) {
  Cut c;
  for (int d = 0; d < dim; ++d)
    c.rows *= shape[d];
  for (size_t d = dim; d < shape.size(); ++d)
    c.piece *= shape[d];
  c.piece /= pieces;
  return c;
}

// Piece `k` of `pieces` along a cut (Cut) between a whole tensor and its piece, either way.
void copyPiece(float* whole, float* piece, Cut c, int pieces, int k, bool toPiece) {
  for (int64_t r = 0; r < c.rows; ++r) {
    float* w = whole + (r * pieces + k) * c.piece;
    float* p = piece + r * c.piece;
    if (toPiece)
      std::memcpy(p, w, 4 * c.piece);
    else
      std::memcpy(w, p, 4 * c.piece);
  }
}

// The whole tensor from `pieces` pieces laid one after another (an all-gather's result).
void joinPieces(const float* gathered, float* whole, Cut c, int pieces) {
  for (int k = 0; k < pieces; ++k)
    copyPiece(whole, const_cast<float*>(gathered) + k * c.rows * c.piece, c, pieces, k, false);
}

// Piece `k` of `pieces` of a parameter of `shape` cut along `dim`, between the whole
// parameter and the piece, either way. The dim is `blocks` side by side (Param::shardBlocks:
// relative sizes; one block when empty), and the piece holds its share of each, in order.
void copyParamPiece(float* whole, float* piece, const std::vector<int64_t>& shape, int dim,
                    const std::vector<int64_t>& blocks, int pieces, int k, bool toPiece) {
  int64_t rows = 1, inner = 1, n = shape[dim], total = 0;
  for (int d = 0; d < dim; ++d)
    rows *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d)
    inner *= shape[d];
  std::vector<int64_t> sizes = blocks.empty() ? std::vector<int64_t>{1} : blocks;
  for (int64_t b : sizes)
    total += b;
  int64_t unit = n / total; // split-layout checked that the width divides every block
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = 0; // the block's first index along dim
    for (int64_t b : sizes) {
      int64_t part = b * unit / pieces;
      float* w = whole + (r * n + at + k * part) * inner;
      float* p = piece + (r * (n / pieces) + at / pieces) * inner;
      if (toPiece)
        std::memcpy(p, w, 4 * part * inner);
      else
        std::memcpy(w, p, 4 * part * inner);
      at += b * unit;
    }
  }
}

using ir::isHalf;

// The 16-bit wire format of a half type: its decode (scale 1) is the conversion.
backend::WireType wireOf(ir::DType t) {
  return t == ir::DType::BF16 ? backend::WireType::BF16 : backend::WireType::F16;
}

// amp: what the executor reads on the host (the evaluation's logits) it reads in f32. A half
// view's values widened into `buf` (when `values`: else only sized, for a result), as an f32
// view; an f32 view as it is.
backend::TensorView widened(const backend::TensorView& v, std::vector<float>& buf, bool values) {
  if (!isHalf(v.dtype) || !v.data) return v;
  buf.resize(static_cast<size_t>(v.numel()));
  if (values) backend::wire::decode(wireOf(v.dtype), v.data, buf.data(), v.numel(), 1.f);
  backend::TensorView f = v;
  f.data = buf.data();
  f.dtype = ir::DType::F32;
  return f;
}

// The device's views an op the executor runs on the host reads and writes (the experts'
// counts, the vocabulary-parallel loss's per-row figures, the evaluation's logits), in
// host memory: the views themselves where the device's memory is the host's; else host
// copies, those it reads filled by the device's copies, those it writes copied back by
// finish().
class HostSide {
public:
  explicit HostSide(backend::Device& dev) : dev_(dev), mirror_(!dev.hostAddressable()) {}
  // v with its values, to read.
  backend::TensorView in(const backend::TensorView& v) { return mirrored(v, true, false); }
  // v to write (with its values first when `values`: a result added into).
  backend::TensorView out(const backend::TensorView& v, bool values) {
    return mirrored(v, values, true);
  }
  // The written views to the device.
  void finish() {
    for (const Back& b : back_)
      dev_.copyToDevice(b.device, b.host, b.bytes);
    back_.clear();
  }

private:
  backend::TensorView mirrored(const backend::TensorView& v, bool values, bool written) {
    if (!mirror_ || !v.data) return v;
    int64_t bytes = v.bytes();
    buffers_.emplace_back(static_cast<size_t>(bytes));
    backend::TensorView h = v;
    h.data = buffers_.back().data();
    if (values) {
      dev_.copyToHost(h.data, v.data, bytes);
      dev_.synchronize();
    }
    if (written) back_.push_back({v.data, h.data, bytes});
    return h;
  }
  struct Back {
    void* device;
    const void* host;
    int64_t bytes;
  };
  backend::Device& dev_;
  bool mirror_;
  std::list<std::vector<unsigned char>> buffers_; // stable addresses
  std::vector<Back> back_;
};

} // namespace

// How long the destructor waits for each transfer an error left behind.
constexpr double kDrainSeconds = 0.1;

Executor::Executor(const ir::Module& m, backend::Device& device, backend::Comm& comm,
                   OptimizerSettings optimizer)
    : m_(m), program_(m.programs.at(comm.rank())), dev_(device), comm_(comm), opt_(optimizer),
      bindings_(m.bindingsOn(program_)) {
  EPL_ASSERT(comm_.size() == static_cast<int>(m.programs.size()),
             "one instruction stream per rank of the communicator");
  // First, before anything a rank may fail on alone: the split is collective.
  splitCommunicators();
  states_ = opt_.kind == backend::OptimizerKind::Sgd ? (opt_.momentum > 0 ? 1 : 0) : 2;
  if (m_.scalesLoss()) lossScale_ = m_.policy.lossScale;
  // The state layout: this rank's parameters alone, each its own piece; the ranks that share
  // them lay them out alike (Module::paramLayout).
  ir::Module::ParamLayout layout = m_.paramLayout(program_);
  paramOffset_ = layout.offset;
  int64_t total = layout.total;
  for (size_t p = 0; p < m_.params.size(); ++p) {
    paramShape_.push_back(m_.localParamShape(program_, static_cast<int>(p)));
    int64_t n = 1;
    for (int64_t d : paramShape_.back())
      n *= d;
    paramElems_.push_back(n);
    wholeElems_.push_back(*ir::numElements(m_.params[p].type.shape, {}));
  }
  gradBytes_ = std::max<int64_t>(total, kAlign);
  // ZeRO stage 1 over the ranks that sum this rank's gradients: in each domain, its slice
  // of the memory of the parameters it updates (one block), whose optimizer states it
  // alone holds and updates.
  if (m_.zeroApplies()) {
    for (const ir::Module::ZeroSlice& slice : m_.zeroSlices(program_)) {
      backend::Comm* comm = slice.pieces ? pieces_.get() : &reduceComm();
      EPL_ASSERT(comm && slice.ranks == comm->size() && slice.rank == comm->rank(),
                 "ZeRO partitions over the ranks that sum gradients");
      zero_.push_back({slice, comm, sliceBytes_});
      sliceBytes_ += slice.bytes;
    }
    shardGrads_ = m_.zeroShardsGradients();
    shardParams_ = m_.zeroShardsParams();
    paramsOnDisk_ = m_.offloadsParams();
  }
  EPL_ASSERT(m_.zeroApplies() || !m_.zeroShardsGradients(), "ZeRO stage 2 comes with stage 1");
  allocateBuffers();
  if (disk_) planOffloadChunks();
  gradParam_.assign(m_.tensors.size(), -1);
  for (size_t p = 0; p < m_.params.size(); ++p)
    if (m_.params[p].grad >= 0) gradParam_[m_.params[p].grad] = static_cast<int>(p);
  planFusedUpdates();
  for (size_t i = 0; i < m_.ops.size(); ++i) {
    if (m_.ops[i].phase != ir::Phase::Forward) continue;
    if (m_.ops[i].kind == ir::OpKind::Next) nextOps_.push_back(static_cast<int>(i));
    hasMoe_ = hasMoe_ || m_.ops[i].kind == ir::OpKind::MoeDispatch;
  }
  // This rank's share of each micro-batch: in a pipeline, a stage group's share (the
  // module's batch symbol counts the replica's micro-batch there).
  staging_.resize(program_.microBatches);
  for (HostBatch& b : staging_) {
    for (int t : m_.inputs)
      b.inputs.emplace_back(dev_, m_.bytesOn(program_, t));
    if (!nextOps_.empty())
      b.next = backend::HostBuffer(dev_, m_.bytesOn(program_, m_.ops[nextOps_[0]].outputs[0]));
  }
  int64_t staged = staging_.front().next.bytes();
  for (const backend::HostBuffer& input : staging_.front().inputs)
    staged += input.bytes();
  EPL_ASSERT(staged * program_.microBatches == program_.inputBytes,
             "the host's input copies differ from the memory plan's");
  lossHost_ = backend::HostBuffer(dev_, 4 * program_.microBatches);
  normHost_ = backend::HostBuffer(dev_, 4);
  int dispatches = 0; // the step's runs of a moe_dispatch forward (recomputations included)
  for (const ir::Instr& in : program_.step)
    dispatches += in.kind == ir::InstrKind::Run && m_.ops[in.op].kind == ir::OpKind::MoeDispatch &&
                  m_.ops[in.op].phase == ir::Phase::Forward;
  moeStatsHost_ = backend::HostBuffer(dev_, 4 * kMoeStats * dispatches);
  seeds_ = backend::HostBuffer(dev_, 4 * program_.microBatches);
  lossWeight_.assign(program_.microBatches, 1.0);
  if (const ir::Op& loss = m_.ops[lossOp()]; loss.kind == ir::OpKind::CrossEntropy)
    ignored_ = std::max<int64_t>(ir::ignoredClass(&loss.attrs), -1);
  localBatch_ = bindings_.at(m_.batchSymbol);
  lossRanks_ = m_.lossRanks();
  for (const ir::GradBucket& b : m_.buckets) { // another stage's bucket: empty here
    bool mine = m_.holdsBucket(program_, b);
    bucketBegin_.push_back(mine ? layout.spanBegin(b.firstParam) : 0);
    bucketEnd_.push_back(mine ? layout.spanEnd(b.endParam) : 0);
  }
  pending_.resize(m_.buckets.size());
  pendingOn_.assign(m_.buckets.size(), nullptr);
  if (shardGrads_) planShardedBuckets();
  if (paramsOnDisk_) planGatherReads();
  if (shardParams_) gathering_.resize(2 * m_.buckets.size());
  for (const ir::Instr& in : program_.step)
    if (in.kind == ir::InstrKind::ReduceStart) {
      firstStarted_ = in.bucket;
      break;
    }
  int64_t recvOffset = 0;
  placeReceives(program_.step, program_.recvRing, stepRecv_, recvOffset);
  placeReceives(program_.eval, 0, evalRecv_, recvOffset);
  EPL_ASSERT(recvOffset == program_.recvBytes, "the receive buffers differ from the plan's");
  wire_ = program_.commDtype == ir::DType::BF16  ? backend::WireType::BF16
          : program_.commDtype == ir::DType::F16 ? backend::WireType::F16
                                                 : backend::WireType::F32;
  bindCalls();
  planSlotUse();
}

// Which instructions of the step begin and end each micro-batch's use of its slot
// (Module::slotUse).
void Executor::planSlotUse() {
  ir::Module::SlotUse use = m_.slotUse(program_);
  takesSlot_.assign(program_.step.size(), -1);
  freesSlot_.assign(program_.step.size(), -1);
  for (int micro = 0; micro < program_.microBatches; ++micro) {
    if (use.first[micro] < 0) continue;
    takesSlot_[use.first[micro]] = micro;
    freesSlot_[use.last[micro]] = micro;
  }
  slotHolder_.assign(program_.slots, -1);
  sending_.assign(program_.slots, {});
}

void Executor::occupySlot(size_t index) {
  int micro = takesSlot_[index];
  if (micro < 0) return;
  // The slot's previous micro-batch may still be sending.
  if (tracing_ && !sending_[slotOf(micro)].empty()) {
    double began = trace_->nowUs();
    finishSends(slotOf(micro));
    trace_->add({fmt::format("send-wait slot {}", slotOf(micro)), tracingStep_, micro,
                 Track::Communication, began, trace_->nowUs()});
  }
  finishSends(slotOf(micro));
  int& holder = slotHolder_[slotOf(micro)];
  if (holder >= 0) {
    std::string why = fmt::format("micro-batch {} needs slot {}, which micro-batch {} still "
                                  "holds: the plan has too few slots for the schedule",
                                  micro, slotOf(micro), holder);
    EPL_ASSERT(holder < 0, why.c_str());
  }
  holder = micro;
  peakInFlight_ = std::max(peakInFlight_, ++inFlight_);
}

void Executor::vacateSlot(size_t index) {
  int micro = freesSlot_[index];
  if (micro < 0) return;
  slotHolder_[slotOf(micro)] = -1;
  --inFlight_;
}

// A reduction, receive or send still in flight (an error left runStep) may be reading or
// writing the rank's buffers: it is waited for before they are freed. After a collective
// timed out the communicator has failed every outstanding operation already, so these
// waits return at once; after a transfer timed out the peer may be gone, so each wait
// gives up after kDrainSeconds (then the communicator halts and finishes the rest), and
// the job ends within about the timeout that ended it, not one more per transfer.
Executor::~Executor() {
  // Every transfer that may still be in flight, with the communicator it runs on.
  auto inFlight = [&](const std::function<void(backend::Request&, backend::Comm&)>& f) {
    for (size_t b = 0; b < pending_.size(); ++b)
      if (pendingOn_[b]) f(pending_[b], *pendingOn_[b]);
    for (auto* list : {&stepRecv_, &evalRecv_})
      for (Receive& r : *list)
        f(r.request, comm_);
    for (auto& slot : sending_)
      for (Sending& x : slot)
        f(x.request, comm_);
    for (size_t k = 0; k < gathering_.size(); ++k) // by 2 bucket + use
      for (backend::Request& r : gathering_[k])
        f(r, *bucketDomain(static_cast<int>(k / 2)).comm);
  };
  bool leftBehind = false;
  inFlight([&](backend::Request& r, backend::Comm& comm) {
    try {
      leftBehind = leftBehind || (!r.empty() && !comm.test(r));
    } catch (const backend::CommError&) {
      // Failed already: its wait returns at once.
    }
  });
  if (leftBehind) {
    comm_.setTimeout(kDrainSeconds);
    reduceComm().setTimeout(kDrainSeconds);
  }
  inFlight([&](backend::Request& r, backend::Comm& comm) {
    try {
      comm.wait(r, "a transfer left behind by an error");
    } catch (const backend::CommError&) {
      // The error that ended the step is the one reported.
    }
  });
  try {
    dev_.synchronize();
  } catch (const std::exception&) {
    // A device that failed in the step fails here again (a GPU's errors stick): the error
    // that ended the step is the one reported, and throwing here would end the process.
  }
  releaseBuffers();
}

// The plan's buffers. A failed allocation releases the others and becomes OutOfMemory,
// which the driver reports as the plan's memory against the machine's.
void Executor::allocateBuffers() {
  auto allocate = [&](int64_t bytes) { return static_cast<unsigned char*>(dev_.allocate(bytes)); };
  try {
    arena_ = allocate(std::max<int64_t>(program_.activationBytes(), kAlign));
    if (program_.recvBytes > 0) recvMem_ = allocate(program_.recvBytes);
    if (m_.gradNorm >= 0) normPieces_ = reinterpret_cast<float*>(allocate(4));
    // With ZeRO the slices of every rank, side by side, may reach past the parameters;
    // with stage 3 the rank holds its own slice alone.
    // (none, with the slice in the offloaded states' file).
    if (!paramsOnDisk_) params_ = allocate(shardParams_ ? sliceBytes_ : zeroStatesBytes());
    grads_ = allocate(shardGrads_ ? sliceBytes_ + m_.tieBytes(program_) : gradBytes_);
    if (program_.offloadedBytes > 0)
      stagingMem_ = allocate(program_.stagingBytes);
    else
      for (int k = 0; k < states_; ++k) {
        stateMem_[k] = allocate(stateBytes());
        dev_.fillZero(stateMem_[k], stateBytes());
      }
  } catch (const std::bad_alloc&) {
    releaseBuffers();
    throw OutOfMemory(program_.peakBytes());
  }
  if (program_.offloadedBytes == 0) return;
  // Offloaded to disk: the staging buffers, each a chunk of every state, as the plan sized
  // them; the file's worker thread reads and writes them from the host. On a device whose
  // memory is not the host's, the worker's are host memory of the same layout, and each
  // chunk is copied to the device's buffers for its update and back (optimizerStep).
  int64_t buffer =
      (program_.stagingBytes - program_.partStagingBytes) / ir::Program::kStagingBuffers;
  try {
    int blocks = states_ + (paramsOnDisk_ ? 1 : 0); // the parameters' slice last
    EPL_ASSERT(states_ > 0 && buffer % (4 * blocks) == 0,
               "a staging buffer holds a whole chunk of every state");
    if (!dev_.hostAddressable()) hostStaging_ = backend::HostBuffer(dev_, program_.stagingBytes);
    std::vector<unsigned char*> staging;
    for (int b = 0; b < ir::Program::kStagingBuffers; ++b)
      staging.push_back(workerStaging() + b * buffer);
    if (m_.offloadsToHostMemory()) {
      // `offload_to = cpu`: the states (and the parameters' slice) in page-locked host
      // memory, streamed as a file's would be.
      hostStates_ = backend::HostBuffer(dev_, blocks * stateBytes());
      disk_ = std::make_unique<OffloadedStates>(hostStates_.data(), blocks, stateBytes(),
                                                std::move(staging), buffer / blocks);
    } else {
      std::string dir = opt_.offloadDir.empty() ? std::filesystem::temp_directory_path().string()
                                                : opt_.offloadDir;
      disk_ = std::make_unique<OffloadedStates>(dir, blocks, stateBytes(), std::move(staging),
                                                buffer / blocks);
    }
  } catch (...) {
    releaseBuffers();
    throw;
  }
}

void Executor::releaseBuffers() {
  disk_.reset(); // its worker thread uses the staging buffers
  for (unsigned char** b :
       {&arena_, &params_, &grads_, &stateMem_[0], &stateMem_[1], &recvMem_, &stagingMem_}) {
    if (*b) dev_.release(*b);
    *b = nullptr;
  }
  if (zeroBias_) dev_.release(zeroBias_);
  zeroBias_ = nullptr;
  if (normPieces_) dev_.release(normPieces_);
  normPieces_ = nullptr;
}

// One forward kernel of no attributes on the device: `in` to `out`.
void Executor::launchPlain(ir::OpKind kind, std::vector<backend::TensorView> in,
                           const backend::TensorView& out) {
  static const ir::Attrs none;
  backend::KernelCall c;
  c.kind = kind;
  c.attrs = &none;
  c.in = std::move(in);
  c.out = {out};
  dev_.launch(c);
}

// `to` = `from`, converted to its dtype on the device: a reshape's copy, whose kernel widens
// and rounds half views as any kernel does (HalfStaging.h).
void Executor::castInto(const backend::TensorView& from, const backend::TensorView& to) {
  if (from.data != to.data) launchPlain(ir::OpKind::Reshape, {from}, to);
}

// dst += the f32 values of dst's shape at `values`, on the device (its add kernel).
void Executor::addInto(const backend::TensorView& dst, void* values) {
  backend::TensorView v = dst;
  v.data = values;
  launchPlain(ir::OpKind::Add, {dst, v}, dst);
}

backend::TensorView Executor::shapeOnly(int t) const {
  backend::TensorView v;
  v.dtype = m_.storedDtype(t);
  v.shape = m_.localShape(program_, t);
  return v;
}

backend::TensorView Executor::view(int t, int slot) const {
  backend::TensorView v = shapeOnly(t);
  if (gradParam_[t] >= 0 && shardGrads_) {
    int q = gradParam_[t], b = bucketOfParam_[q];
    v.data = bucketMem(b, slot) + (paramOffset_[q] - bucketBegin_[b]);
  } else if (gradParam_[t] >= 0) {
    v.data = grads_ + paramOffset_[gradParam_[t]];
  } else {
    EPL_ASSERT(program_.offset[t] >= 0, "tensor has no place in the memory plan");
    // A shared tensor sits in the region after the slots, the same for every micro-batch.
    int64_t base = program_.isShared(t) ? program_.slots * program_.slotStride()
                                        : slot * program_.slotStride();
    v.data = arena_ + base + program_.offset[t];
  }
  return v;
}

backend::TensorView Executor::paramView(int p, int use, int slot) const {
  backend::TensorView v;
  v.shape = paramShape_[p];
  if (!shardParams_) {
    v.data = params_ + paramOffset_[p];
  } else if (use >= 0) {
    int b = bucketOfParam_[p];
    v.data = gatherMem(b, use, slot) + (paramOffset_[p] - bucketBegin_[b]);
  }
  return v;
}

backend::TensorView Executor::stateView(int p, int k) const {
  backend::TensorView v = paramView(p);
  v.data = k < states_ && zero_.empty() && !disk_ ? stateMem_[k] + paramOffset_[p] : nullptr;
  return v;
}

// Kernel calls in backend::KernelCall's order, bound to this rank's buffers once per slot.
// Only the ops this rank runs are bound: a pipeline stage has no place for the others.
void Executor::bindCalls() {
  perSample_.assign(m_.ops.size(), 0);
  // A dropout's mask is keyed by its op's place among the model's own forward ops: the
  // communication a plan inserts between them does not change it, so the masks are the
  // same at any -np, pipelines included.
  seedKey_.assign(m_.ops.size(), 0);
  uint64_t key = 0;
  for (size_t i = 0; i < m_.ops.size(); ++i)
    if (m_.ops[i].phase == ir::Phase::Forward &&
        ir::opInfo(m_.ops[i].kind).split != ir::SplitRule::Communication)
      seedKey_[i] = key++;
  for (size_t i = 0; i < m_.ops.size(); ++i)
    if (m_.ops[i].kind == ir::OpKind::Dropout && m_.ops[i].phase == ir::Phase::Forward) {
      int t = m_.ops[i].outputs[0];
      const ir::Layout& l = m_.tensors[t].layout;
      bool whole = l.kind != ir::LayoutKind::DataParallel;
      int64_t rows = whole ? program_.wholeBatch : localBatch_;
      // A cut tensor's mask is the whole tensor's: its elements per sample count whole.
      bool cut = l.kind == ir::LayoutKind::Sharded && program_.splitWidth > 1;
      perSample_[i] =
          shapeOnly(t).numel() * (cut ? program_.splitWidth : 1) / std::max<int64_t>(rows, 1);
    }
  // A recomputation draws what the op it repeats drew (a dropout's mask).
  for (size_t i = 0; i < m_.ops.size(); ++i)
    if (m_.ops[i].phase == ir::Phase::Recompute) {
      seedKey_[i] = seedKey_[m_.ops[i].forward];
      perSample_[i] = perSample_[m_.ops[i].forward];
    }
  // A split op's attributes on this rank: the heads, hidden width, output width … it cuts
  // are its share.
  localAttrs_.resize(m_.ops.size());
  for (size_t i = 0; i < m_.ops.size(); ++i) {
    const ir::Op& op = m_.ops[i];
    localAttrs_[i] = op.attrs;
    const ir::Op& fwd = op.phase == ir::Phase::Backward ? m_.ops[op.forward] : op;
    bool cuts = fwd.splitForm == ir::SplitForm::Heads || fwd.splitForm == ir::SplitForm::Hidden ||
                fwd.splitForm == ir::SplitForm::Column;
    for (const std::string& cut : {ir::cutAttr(fwd.kind), ir::opInfo(fwd.kind).cutAlso}) {
      auto it = localAttrs_[i].find(cut);
      if (cuts && program_.splitWidth > 1 && it != localAttrs_[i].end())
        it->second = std::get<int64_t>(it->second) / program_.splitWidth;
    }
  }
  // The zero bias of split ranks past the first (bindCall): sized once, as calls keep
  // pointers into it.
  int64_t widest = 0;
  for (size_t q = 0; q < paramShape_.size(); ++q)
    if (paramShape_[q].size() == 1) widest = std::max(widest, paramElems_[q]);
  if (program_.splitWidth > 1 && widest > 0) {
    zeroBias_ = static_cast<float*>(dev_.allocate(4 * widest));
    zeroBiasFloats_ = widest;
    dev_.fillZero(zeroBias_, 4 * widest);
  }
  std::vector<bool> runs(m_.ops.size(), false);
  for (const ir::Instr& in : program_.step)
    if (in.kind == ir::InstrKind::Run) runs[in.op] = true;
  calls_.assign(program_.slots, std::vector<Bound>(m_.ops.size()));
  for (int slot = 0; slot < program_.slots; ++slot)
    for (size_t i = 0; i < m_.ops.size(); ++i)
      if (runs[i]) bindCall(static_cast<int>(i), slot);
  bindParts();
  bindWorkspaces();
}

// Each kernel's workspace where the memory plan put it: in the slot the call is bound for,
// or in the region the micro-batches share.
void Executor::bindWorkspaces() {
  for (const ir::Program::Workspace& w : program_.workspaces) {
    EPL_ASSERT(w.offset >= 0, "a kernel's workspace has no place in the memory plan");
    auto& calls = w.part == ir::BackwardPart::Whole    ? calls_
                  : w.part == ir::BackwardPart::Inputs ? inputCalls_
                                                       : paramCalls_;
    for (int slot = 0; slot < program_.slots && !calls.empty(); ++slot) {
      backend::KernelCall& c = calls[slot][w.op].call;
      int64_t base =
          w.shared ? program_.slots * program_.slotStride() : slot * program_.slotStride();
      c.workspace = reinterpret_cast<float*>(arena_ + base + w.offset);
      c.workspaceFloats = w.bytes / 4;
      c.stagingFloats = w.stagingBytes / 4;
    }
  }
}

// A split backward's parts are the whole call with the outputs the part does not write left
// null; each kept output keeps its accumulate flag. No new kernel: every backward kernel
// computes only the gradients whose outputs have data.
void Executor::bindParts() {
  for (const ir::Instr& in : program_.step) {
    if (in.kind != ir::InstrKind::Run || in.part == ir::BackwardPart::Whole) continue;
    auto& calls = in.part == ir::BackwardPart::Inputs ? inputCalls_ : paramCalls_;
    if (calls.empty()) calls.assign(program_.slots, std::vector<Bound>(m_.ops.size()));
    size_t n = m_.ops[m_.ops[in.op].forward].inputs.size();
    for (int slot = 0; slot < program_.slots; ++slot) {
      backend::KernelCall& c = calls[slot][in.op].call;
      if (!c.out.empty()) continue; // bound for an earlier micro-batch
      c = calls_[slot][in.op].call;
      for (size_t k = 0; k < c.out.size(); ++k)
        if (!ir::writesOutput(in.part, k, n)) c.out[k].data = nullptr;
    }
  }
}

backend::KernelCall& Executor::callOf(const ir::Instr& in) {
  int slot = slotOf(in.micro);
  switch (in.part) {
  case ir::BackwardPart::Whole:
    break;
  case ir::BackwardPart::Inputs:
    return inputCalls_[slot][in.op].call;
  case ir::BackwardPart::Params:
    return paramCalls_[slot][in.op].call;
  }
  return calls_[slot][in.op].call;
}

void Executor::bindCall(int i, int slot) {
  auto view = [&](int t) { return this->view(t, slot); };
  const ir::Op& op = m_.ops[i];
  backend::KernelCall& c = calls_[slot][i].call;
  c.kind = op.kind;
  c.attrs = &localAttrs_[i];
  const ir::Op& fwdOp = op.phase == ir::Phase::Backward ? m_.ops[op.forward] : op;
  // The statistics of the whole micro-batch, which the stage's ranks share; inside a split
  // region each rank of a split group holds its copy's samples whole (batch_norm is
  // replicated there), and the ranks of the same split rank in every copy share them.
  // A rank that shares none (a pipeline of one rank a stage, whose reduceComm() is every
  // rank) sums nothing.
  bool inRegion = m_.splitScopeOf(fwdOp.scope) >= 0 && program_.splitWidth > 1;
  backend::Comm* readers =
      inRegion ? pieces_.get() : (program_.dataRanks > 1 ? &reduceComm() : nullptr);
  if (fwdOp.kind == ir::OpKind::BatchNorm && readers && readers->size() > 1) {
    EPL_ASSERT(inRegion || readers->size() == program_.dataRanks,
               "batch_norm's ranks share a micro-batch");
    std::string what = fmt::format("the batch statistics of {}", fwdOp.name);
    c.sumOverReaders = [readers, what](double* values, int64_t n) {
      backend::Comm& comm = *readers;
      std::vector<double> all(static_cast<size_t>(n * comm.size()));
      comm.allGather(values, all.data(), 8 * n, what);
      for (int64_t k = 0; k < n; ++k) {
        double s = 0; // in rank order: every rank the same sums
        for (int r = 0; r < comm.size(); ++r)
          s += all[static_cast<size_t>(r * n + k)];
        values[k] = s;
      }
    };
  }
  if (fwdOp.kind == ir::OpKind::Embedding && fwdOp.splitForm == ir::SplitForm::Vocab &&
      program_.splitWidth > 1) {
    c.vocabSlice = true;
    c.vocabFirst = program_.splitRank * paramShape_[fwdOp.params[0]][0];
  }
  if (ir::castsWeights(fwdOp.kind) && !op.params.empty()) {
    c.castParams = m_.stored.empty() ? ir::DType::F32 : m_.ampDtype();
    c.firstParam = (op.phase == ir::Phase::Backward ? 1 : 0) + fwdOp.inputs.size();
    c.paramCount = op.params.size();
  }
  bool forward = ir::computesForward(op.phase);
  if ((forward && op.kind == ir::OpKind::Next) || (!forward && op.phase != ir::Phase::Backward))
    return;
  // The inputs in the call's layout, which the memory plan's amp staging reads too.
  for (const ir::Module::CallInput& in : m_.callInputs(op))
    c.in.push_back(in.param >= 0    ? paramView(in.param, gatherUse(in.param, op.phase), slot)
                   : in.tensor >= 0 ? view(in.tensor)
                                    : shapeOnly(in.shapeOf));
  if (forward) {
    for (int t : op.outputs)
      c.out.push_back(view(t));
    // A row-parallel linear, split mlp or split attention leaves partial sums, which the
    // all-reduce after it adds up: the output bias is added by the split group's first rank
    // alone.
    bool partial = op.splitForm == ir::SplitForm::Row || op.splitForm == ir::SplitForm::Hidden ||
                   op.splitForm == ir::SplitForm::Heads;
    int bias = partial ? ir::outputBiasIndex(op.kind, op.attrs) : -1;
    if (bias >= 0 && program_.splitRank != 0) {
      backend::TensorView& b = c.in[op.inputs.size() + static_cast<size_t>(bias)];
      EPL_ASSERT(zeroBiasFloats_ >= b.numel(),
                 "the zero bias is sized for every bias before the calls are bound");
      b.data = zeroBias_;
    }
  } else {
    const ir::Op& fwd = m_.ops[op.forward];
    c.backward = true;
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      int t = op.outputs[k];
      c.out.push_back(t >= 0 ? view(t) : shapeOnly(fwd.inputs[k]));
    }
    c.accumulate = op.accumulate;
    // moe's load-balancing loss: each sample's share of the step's loss.
    if (fwd.kind == ir::OpKind::MoeDispatch)
      c.sampleWeight = 1.f / static_cast<float>(m_.train.batch);
  }
}

int64_t Executor::firstSample(int micro, int t) const {
  bool whole = program_.splitWidth > 1 && t >= 0 &&
               m_.tensors[t].layout.kind != ir::LayoutKind::DataParallel;
  if (!whole) return firstSample(micro);
  // The copy's micro-batch: its split group is one reader of whole micro-batches.
  int copies = program_.dataRanks / program_.splitWidth;
  return (static_cast<int64_t>(micro) * copies + program_.dataRank / program_.splitWidth) *
         program_.wholeBatch;
}

void Executor::toPiece(int q, const float* whole, float* piece) const {
  const std::vector<int64_t>& shape = paramShape_[q];
  int w = program_.splitWidth, dim = m_.params[q].shardDim;
  std::vector<int64_t> wholeShape = shape;
  wholeShape[dim] *= w;
  copyParamPiece(const_cast<float*>(whole), piece, wholeShape, dim, m_.params[q].shardBlocks, w,
                 program_.splitRank, true);
}

void Executor::fromPieces(int q, const float* pieces, float* whole) const {
  const std::vector<int64_t>& shape = paramShape_[q];
  int w = program_.splitWidth, dim = m_.params[q].shardDim;
  std::vector<int64_t> wholeShape = shape;
  wholeShape[dim] *= w;
  int64_t elems = paramElems_[q];
  for (int k = 0; k < w; ++k)
    copyParamPiece(whole, const_cast<float*>(pieces) + k * elems, wholeShape, dim,
                   m_.params[q].shardBlocks, w, k, false);
}

// Parameters and states come and go whole: one cut over the split group, or held by other
// ranks alone, is kept whole on the host until broadcastState hands every rank its share;
// with ZeRO, the rank's piece of it in the host copy of the memory its slices cut.
void Executor::writeParam(int p, const float* host) {
  if (!holds(p) || sharded(p)) wholeParam_[p].assign(host, host + wholeElems_[p]);
  if (!holds(p)) return;
  if (shardParams_) keepWhole(p, kParams, host);
  placeWhole(p, kParams, host);
}
void Executor::keepWhole(int p, int k, const float* host) {
  std::vector<float>& whole = zeroWhole(k);
  whole.resize(static_cast<size_t>(zeroStatesBytes() / 4));
  float* at = whole.data() + paramOffset_[p] / 4;
  if (sharded(p))
    toPiece(p, host, at);
  else
    std::copy(host, host + paramElems_[p], at);
}
void Executor::readParam(int p, float* host) const {
  if (!holds(p) || sharded(p)) {
    EPL_ASSERT(wholeParam_.count(p), "gatherShards() and gatherStages() run before a parameter "
                                     "cut or held elsewhere is read");
    const std::vector<float>& v = wholeParam_.at(p);
    std::copy(v.begin(), v.end(), host);
    return;
  }
  if (shardParams_) {
    EPL_ASSERT(!zeroParams_.empty(),
               "gatherShards() runs before ZeRO-partitioned parameters are read");
    auto first = zeroParams_.begin() + paramOffset_[p] / 4;
    std::copy(first, first + paramElems_[p], host);
    return;
  }
  dev_.copyToHost(host, params_ + paramOffset_[p], 4 * paramElems_[p]);
  dev_.synchronize();
}
void Executor::writeState(int p, int k, const float* host) {
  EPL_ASSERT(k < states_, "no such optimizer state");
  statesWritten_ = true;
  if (!holds(p) || sharded(p)) wholeState_[{p, k}].assign(host, host + wholeElems_[p]);
  if (!holds(p)) return;
  if (!zero_.empty()) keepWhole(p, k, host);
  placeWhole(p, k, host);
}
void Executor::readState(int p, int k, float* host) const {
  EPL_ASSERT(k < states_, "no such optimizer state");
  if (!holds(p) || sharded(p)) {
    EPL_ASSERT(wholeState_.count({p, k}), "gatherShards() and gatherStages() run before a state "
                                          "cut or held elsewhere is read");
    const std::vector<float>& v = wholeState_.at({p, k});
    std::copy(v.begin(), v.end(), host);
    return;
  }
  if (!zero_.empty()) {
    const std::vector<float>& whole = zeroStates_[k];
    EPL_ASSERT(!whole.empty(), "gatherShards() runs before a ZeRO-partitioned state is read");
    auto first = whole.begin() + paramOffset_[p] / 4;
    std::copy(first, first + paramElems_[p], host);
    return;
  }
  readModel(k, paramOffset_[p], 4 * paramElems_[p], host);
}

void Executor::readModel(int k, int64_t offset, int64_t bytes, void* host) const {
  if (disk_ && (k != kParams || paramsOnDisk_))
    return disk_->read(k == kParams ? states_ : k, offset, bytes, host);
  dev_.copyToHost(host, (k == kParams ? params_ : stateMem_[k]) + offset, bytes);
  dev_.synchronize();
}

void Executor::writeModel(int k, int64_t offset, int64_t bytes, const void* host) {
  if (disk_ && (k != kParams || paramsOnDisk_))
    return disk_->write(k == kParams ? states_ : k, offset, bytes, host);
  dev_.copyToDevice((k == kParams ? params_ : stateMem_[k]) + offset, host, bytes);
  dev_.synchronize();
}

void Executor::placeWhole(int q, int k, const float* whole) {
  const float* mine = whole;
  std::vector<float> piece;
  if (sharded(q)) {
    piece.resize(static_cast<size_t>(paramElems_[q]));
    toPiece(q, whole, piece.data());
    mine = piece.data();
  }
  int64_t begin = paramOffset_[q], end = begin + 4 * paramElems_[q];
  if (!(k == kParams ? shardParams_ : !zero_.empty()))
    return writeModel(k, begin, end - begin, mine);
  const ZeroDomain* d = findDomain(begin); // none: a parameter without a gradient
  if (!d) return;
  int64_t from = std::max(begin, d->slice.begin()), to = std::min(end, d->slice.end());
  if (from < to) writeModel(k, stateOffset(from), to - from, mine + (from - begin) / 4);
}

// Parameter by parameter, whole from the root (its host copy or its memory: readParam), to
// every rank; each keeps its share of those it holds. The optimizer states go alike where
// the root wrote them (a checkpoint's), else they stay at zero everywhere.
void Executor::broadcastState(int root) {
  // The communicator reads device memory from the host side (the CPU device's memory is
  // host memory; a GPU device pairs with a communicator that reads its own).
  dev_.synchronize();
  if (m_.scalesLoss()) { // a resumed run's loss scale
    double scale[2] = {lossScale_, static_cast<double>(goodSteps_)};
    comm_.broadcast(scale, sizeof scale, root, "broadcasting the loss scale");
    lossScale_ = scale[0];
    goodSteps_ = static_cast<int>(scale[1]);
  }
  int read = comm_.rank() == root && statesWritten_;
  comm_.broadcast(&read, sizeof read, root, "whether optimizer states were read");
  std::vector<float> whole;
  for (size_t p = 0; p < m_.params.size(); ++p) {
    int q = static_cast<int>(p);
    whole.resize(static_cast<size_t>(wholeElems_[q]));
    for (int k = kParams; k < (read ? states_ : 0); ++k) {
      // A checkpoint holds no optimizer states of a parameter no optimizer updates
      // (batch_norm's running statistics, a layer no loss reads): zeros, as a start's.
      bool none = k != kParams && (!holds(q) || sharded(q)) && !wholeState_.count({q, k});
      if (comm_.rank() == root && none) std::fill(whole.begin(), whole.end(), 0.f);
      if (comm_.rank() == root && !none)
        k == kParams ? readParam(q, whole.data()) : readState(q, k, whole.data());
      comm_.broadcast(whole.data(), 4 * wholeElems_[q], root,
                      fmt::format("broadcasting @{}{}", m_.params[q].name,
                                  k == kParams ? "" : " (optimizer state)"));
      if (holds(q)) placeWhole(q, k, whole.data());
    }
  }
  statesWritten_ = false;
  dropGathered();
}

void Executor::dropGathered() {
  for (std::vector<float>& s : zeroStates_)
    std::vector<float>().swap(s);
  std::vector<float>().swap(zeroParams_);
  wholeParam_.clear();
  wholeState_.clear();
  // The whole arrays were host memory the memory plan does not count: once freed, the
  // allocator would keep blocks of their size resident for later requests (glibc raises its
  // mmap threshold to the largest block freed). Hand them back.
  malloc_trim(0);
}

void Executor::gatherShards() {
  wholeParam_.clear();
  wholeState_.clear();
  // ZeRO: in each domain, the slices of the optimizer states (with stage 3, of the
  // parameters too), side by side, on the first of the ranks that share them (rank 0, a
  // pipeline stage's first, or a split rank's first copy; a split group's pieces are
  // joined below, and gatherStages takes them on to rank 0), one owner's broadcast at a time.
  for (int k = shardParams_ ? kParams : 0; k < states_ && !zero_.empty(); ++k) {
    dev_.synchronize();
    for (const ZeroDomain& d : zero_) {
      backend::Comm& group = *d.comm;
      bool reader = group.rank() == 0;
      std::vector<float> slice(static_cast<size_t>(d.slice.bytes / 4));
      std::vector<float>& whole = zeroWhole(k);
      if (reader) whole.resize(static_cast<size_t>(zeroStatesBytes() / 4));
      for (int r = 0; r < group.size(); ++r) {
        float* data = reader ? whole.data() + (d.slice.base + r * d.slice.bytes) / 4 : slice.data();
        if (r == group.rank()) readModel(k, d.at, d.slice.bytes, data);
        group.broadcast(data, d.slice.bytes, r,
                        fmt::format("gathering rank {}'s {}", r,
                                    k == kParams ? "parameters" : "optimizer states"));
      }
    }
  }
  if (program_.splitWidth == 1) return;
  dev_.synchronize();
  for (size_t p = 0; p < m_.params.size(); ++p) {
    int q = static_cast<int>(p);
    if (!sharded(q)) continue;
    auto gather = [&](int k, std::vector<float>& whole) {
      std::vector<float> mine(static_cast<size_t>(paramElems_[q]));
      if (!(k == kParams ? shardParams_ : !zero_.empty())) {
        readModel(k, paramOffset_[q], 4 * paramElems_[q], mine.data());
      } else if (!zeroWhole(k).empty()) { // joined above on the split rank's first copy
        auto first = zeroWhole(k).begin() + paramOffset_[q] / 4;
        std::copy(first, first + paramElems_[q], mine.begin());
      }
      std::vector<float> pieces(static_cast<size_t>(paramElems_[q] * program_.splitWidth));
      splitComm().allGather(mine.data(), pieces.data(), 4 * paramElems_[q],
                            fmt::format("gathering @{}", m_.params[q].name));
      whole.resize(static_cast<size_t>(wholeElems_[q]));
      fromPieces(q, pieces.data(), whole.data());
    };
    gather(kParams, wholeParam_[q]);
    for (int k = 0; k < states_; ++k)
      gather(k, wholeState_[{q, k}]);
  }
}

// A pipeline: each parameter rank 0 does not hold goes whole from the first rank of its stage
// (readParam: gatherShards joined its pieces and ZeRO slices there), with its optimizer
// states, and rank 0 keeps them aside.
void Executor::gatherStages() {
  if (program_.stages == 1) return;
  std::vector<int> owner(m_.params.size(), -1);
  for (const ir::Program& p : m_.programs)
    for (size_t q = 0; q < m_.params.size(); ++q)
      if (p.dataRank == 0 && owner[q] < 0 && m_.holdsParam(p, static_cast<int>(q)))
        owner[q] = p.rank;
  dev_.synchronize();
  std::vector<float> whole;
  for (size_t p = 0; p < m_.params.size(); ++p) {
    int q = static_cast<int>(p);
    if (owner[q] < 0 || m_.holdsParam(m_.programs[0], q)) continue;
    whole.resize(static_cast<size_t>(wholeElems_[q]));
    for (int k = kParams; k < states_; ++k) {
      if (comm_.rank() == owner[q])
        k == kParams ? readParam(q, whole.data()) : readState(q, k, whole.data());
      comm_.broadcast(whole.data(), 4 * wholeElems_[q], owner[q],
                      fmt::format("gathering @{} from rank {}", m_.params[q].name, owner[q]));
      if (comm_.rank() == 0) (k == kParams ? wholeParam_[q] : wholeState_[{q, k}]) = whole;
    }
  }
}

// Copies a micro-batch's inputs into its slot: the ones this rank's ops read.
void Executor::load(int micro) {
  const HostBatch& b = staging_[micro];
  int slot = slotOf(micro);
  for (size_t i = 0; i < m_.inputs.size(); ++i)
    if (program_.offset[m_.inputs[i]] >= 0)
      dev_.copyToDevice(view(m_.inputs[i], slot).data, b.inputs[i].data(), b.inputs[i].bytes());
  for (int op : nextOps_)
    if (program_.offset[m_.ops[op].outputs[0]] >= 0)
      dev_.copyToDevice(view(m_.ops[op].outputs[0], slot).data, b.next.data(), b.next.bytes());
}

// The Recvs of a program get buffers outside the arena (ir::Module::receivePlan): a step's
// share a ring of them, the first receives posted when the step starts and each later one
// once its buffer's previous receive was read; an evaluation's have one each, all posted
// at its start. Either way a receive is posted before its Send must finish (the
// communication check makes sure), so a sender never stalls on its receiver.
void Executor::placeReceives(const std::vector<ir::Instr>& list, int ring,
                             std::vector<Receive>& out, int64_t& offset) {
  ir::Module::ReceivePlan plan = m_.receivePlan(program_, list, ring);
  out.assign(list.size(), Receive{});
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].kind != ir::InstrKind::Recv) continue;
    out[i].offset = offset + plan.offset[i];
    out[i].atStart = plan.postedAfter[i] < 0;
    if (!out[i].atStart) out[static_cast<size_t>(plan.postedAfter[i])].posts.push_back(i);
  }
  offset += plan.bytes;
}

void Executor::postReceives(const std::vector<ir::Instr>& list, std::vector<Receive>& receives) {
  receiving_ = &receives;
  receivingList_ = &list;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == ir::InstrKind::Recv && receives[i].atStart) postReceive(i);
}

void Executor::postReceive(size_t index) {
  const ir::Instr& in = (*receivingList_)[index];
  Receive& r = (*receiving_)[index];
  r.request = comm_.irecv(recvMem_ + r.offset, m_.transferBytes(program_, in), in.peer, in.tag);
}

// Where a transfer's samples start in its tensor: the tensor's, or its row `firstRow`.
unsigned char* Executor::transferData(const ir::Instr& in) const {
  backend::TensorView v = view(in.tensor, slotOf(in.micro));
  return static_cast<unsigned char*>(v.data) + v.bytes() / v.shape.at(0) * in.firstRow;
}

// The receiver posts its receive ahead (placeReceives: at its step's start, or once the
// receive before it in its buffer was read). In a training step the transfer
// goes on while the rank computes: it is waited for before the next micro-batch takes its
// slot (occupySlot), or at the step's end, and the memory plan keeps the tensor to the end
// of its micro-batch (ir::sendWaitPositions). In evaluation it is waited for at once.
void Executor::send(const ir::Instr& in, size_t index, int64_t step, bool training) {
  // The transfer reads the tensor from the host side: it must be written.
  dev_.synchronize();
  backend::Request r =
      comm_.isend(transferData(in), m_.transferBytes(program_, in), in.peer, in.tag);
  std::string what = fmt::format("instruction {} of step {}: send %{} of micro-batch {} to rank {}",
                                 index, step + 1, m_.tensors[in.tensor].name, in.micro, in.peer);
  if (!training) return comm_.wait(r, what);
  sending_[slotOf(in.micro)].push_back({std::move(r), std::move(what)});
}

// Waits for the sends still reading slot `slot` (all slots: -1).
void Executor::finishSends(int slot) {
  for (int s = 0; s < static_cast<int>(sending_.size()); ++s) {
    if (slot >= 0 && s != slot) continue;
    for (Sending& x : sending_[s])
      comm_.wait(x.request, x.what);
    sending_[s].clear();
  }
}

// Waits for the posted receive, then writes it into the tensor, or adds it (a gradient
// that other ops of this stage add into too) through the reshape backward's write-or-add.
void Executor::receive(const ir::Instr& in, size_t index, int64_t step, Receive& r) {
  comm_.wait(r.request,
             fmt::format("instruction {} of step {}: recv %{} of micro-batch {} from rank {}",
                         index, step + 1, m_.tensors[in.tensor].name, in.micro, in.peer));
  // The rows it carries: the whole tensor, or a re-cut micro-batch's share.
  backend::TensorView dst = shapeOnly(in.tensor);
  if (in.rows >= 0) dst.shape[0] = in.rows;
  dst.data = transferData(in);
  unsigned char* src = recvMem_ + r.offset;
  if (!in.accumulate) {
    dev_.copyOnDevice(dst.data, src, dst.bytes());
  } else {
    backend::KernelCall c;
    c.kind = ir::OpKind::Reshape;
    c.backward = true;
    c.attrs = &noAttrs_;
    backend::TensorView dy = dst;
    dy.data = src;
    backend::TensorView shape = dst;
    shape.data = nullptr;
    c.in = {dy, shape, shape};
    c.out = {dst};
    c.accumulate = {true};
    dev_.launch(c);
  }
  // Then the receives that take this buffer next, once the device has read it.
  if (r.posts.empty()) return;
  dev_.synchronize();
  for (size_t next : r.posts)
    postReceive(next);
}

// A pipeline of more ranks than stages (stage groups, data-parallel copies): the ranks of
// this rank's stage in every replica (ordered by data rank) sum its gradient buckets; the
// ranks of its replica (by rank) sum the squared gradient norm. Every rank splits, in the
// same order. A stage with split regions in several copies: the ranks of this rank's split
// group run the regions' collectives and sum the squared gradient norm; the ranks with its
// split rank in every copy sum the gradients of the pieces it holds.
void Executor::splitCommunicators() {
  // A weight tied across stages: the ranks of the stages holding it (of a matrix cut in
  // split regions, those holding one piece) sum its gradients. Every rank splits once per
  // such weight, in parameter order.
  for (size_t q = 0; q < m_.params.size(); ++q) {
    int k = static_cast<int>(q);
    if (m_.params[q].copies.empty() || program_.stages == 1) continue;
    bool mine = m_.holdsParam(program_, k);
    int piece = m_.reducedOverPieces(k) ? program_.splitRank : 0;
    auto sub = comm_.split(mine ? piece : 1 << 20, program_.rank);
    if (mine) tied_[k] = std::move(sub);
  }
  int widest = 1;
  for (const ir::StagePlan& st : m_.mesh.stages)
    widest = std::max(widest, st.splitWidth);
  if (widest > 1 && comm_.size() > 1) {
    split_ = comm_.split(program_.rank - program_.splitRank, program_.splitRank);
    pieces_ = comm_.split(program_.stage * widest + program_.splitRank, program_.rank);
    EPL_ASSERT(split_->size() == program_.splitWidth,
               "the sub-communicators are the split groups and their copies");
  }
  if (program_.stages == 1 || comm_.size() == program_.stages) return;
  stageReplicas_ = comm_.split(program_.stage, program_.dataRank);
  pipeline_ = comm_.split(program_.replica, program_.rank);
  EPL_ASSERT(stageReplicas_->size() == program_.dataRanks &&
                 pipeline_->size() == m_.mesh.replicaSize,
             "the sub-communicators are the mesh's groups");
}

// Sums bucket b's gradients over the data-parallel ranks, in the background. Gradients sit
// in parameter order, so a bucket is one block; the padding between parameters is zero.
void Executor::startReduce(int b, int micro) {
  // The collective reads the gradients as the device's queued work leaves them (Comm.h):
  // no synchronisation here, so the host goes on queueing the backward.
  // fp16 carries each rank's share times the rank count, so small gradients stay normal.
  // (Every rank of a collective scales alike: a tied weight's, by the ranks summing it.)
  int ranks = m_.buckets[b].tied && !shardGrads_ ? m_.buckets[b].ranks : program_.dataRanks;
  float scale = wire_ == backend::WireType::F16 ? static_cast<float>(ranks) : 1.f;
  if (b == firstStarted_) reduceBegan_ = monotonicSeconds();
  if (!shardGrads_) {
    float* data = reinterpret_cast<float*>(grads_ + bucketBegin_[b]);
    pendingOn_[b] = &bucketComm(b);
    pending_[b] =
        bucketComm(b).iallReduce(data, (bucketEnd_[b] - bucketBegin_[b]) / 4, wire_, scale);
    return;
  }
  // ZeRO stage 2: rank k gets the sum of the bucket's bytes in its slice, in place.
  float* data = reinterpret_cast<float*>(bucketMem(b, slotOf(micro)));
  const ZeroDomain& d = bucketDomain(b);
  int64_t mine = std::clamp(d.slice.begin(), bucketBegin_[b], bucketEnd_[b]) - bucketBegin_[b];
  pendingOn_[b] = d.comm;
  pending_[b] =
      d.comm->ireduceScatterBlocks(data, data + mine / 4, scatterCounts_[b], wire_, scale);
}

std::pair<int64_t, int64_t> Executor::slicePart(int b) const {
  const ZeroDomain& d = bucketDomain(b);
  return {std::max(d.slice.begin(), bucketBegin_[b]), std::min(d.slice.end(), bucketEnd_[b])};
}

// Each stage's slices cover the tied weight once, so the sum over every stage's ranks of
// the blocks (each rank's part placed, the rest zero) is the weight's summed gradient; each
// rank then keeps its part. In f32: one sum a step, of sums already.
void Executor::startTieSum(int b) {
  unsigned char* whole = grads_ + tieAt_[b];
  int64_t bytes = bucketEnd_[b] - bucketBegin_[b];
  auto [begin, end] = slicePart(b);
  dev_.fillZero(whole, bytes);
  if (begin < end) dev_.copyOnDevice(whole + (begin - bucketBegin_[b]), gradAt(begin), end - begin);
  pendingOn_[b] = &bucketComm(b);
  pending_[b] = bucketComm(b).iallReduce(reinterpret_cast<float*>(whole), bytes / 4);
}

void Executor::endTieSum(int b) {
  auto [begin, end] = slicePart(b);
  if (begin < end)
    dev_.copyOnDevice(gradAt(begin), grads_ + tieAt_[b] + (begin - bucketBegin_[b]), end - begin);
}

// ZeRO stage 2, once: each parameter's bucket; where each bucket is cut between the ranks'
// slices (rank k's floats of it); and which buckets each step instruction writes first in
// its micro-batch (their gradients add, so the bucket's place in the arena is cleared
// before: the memory plan's first touch).
void Executor::planShardedBuckets() {
  bucketOfParam_ = m_.paramBuckets(program_);
  gatherPieces_ = m_.bucketPieces(program_);
  scatterCounts_.assign(m_.buckets.size(), {});
  for (size_t b = 0; b < m_.buckets.size(); ++b) {
    EPL_ASSERT(bucketEnd_[b] - bucketBegin_[b] == program_.bucketBytes[b],
               "a gradient bucket's bytes differ from the memory plan's");
    scatterCounts_[b].assign(bucketDomain(static_cast<int>(b)).comm->size(), 0);
    for (const ir::Module::SlicePiece& piece : gatherPieces_[b])
      scatterCounts_[b][piece.rank] = (piece.end - piece.begin) / 4;
  }
  // The runs of the slice memory the gradient norm sums: all of it, but for a whole
  // parameter inside a split region, which every rank of its split group holds alike
  // (the first counts it), and a tied weight's copy (its maker's stage counts it).
  std::vector<std::pair<int64_t, int64_t>> skipped;
  for (int q : program_.params) {
    bool twice = m_.holdsCopy(program_, q) ||
                 (program_.splitRank != 0 && m_.reducedOverPieces(q) && !sharded(q));
    auto [begin, end] = updatedBytes(q);
    if (twice && begin < end)
      skipped.push_back({stateOffset(begin), stateOffset(begin) + end - begin});
  }
  std::sort(skipped.begin(), skipped.end());
  int64_t from = 0;
  for (auto [begin, end] : skipped) {
    if (from < begin) normRuns_.push_back({from, begin});
    from = end;
  }
  if (from < sliceBytes_) normRuns_.push_back({from, sliceBytes_});
  // A tied weight's whole bucket for its sum over the stages, after the slice.
  tieAt_.assign(m_.buckets.size(), -1);
  int64_t tie = sliceBytes_;
  for (size_t b = 0; b < m_.buckets.size(); ++b)
    if (m_.buckets[b].tied && m_.buckets[b].stage % m_.mesh.depth() == program_.stage) {
      tieAt_[b] = tie;
      tie += bucketEnd_[b] - bucketBegin_[b];
    }
  EPL_ASSERT(tie - sliceBytes_ == m_.tieBytes(program_),
             "the tied weights' blocks differ from the memory plan's");
  clearBuckets_.assign(program_.step.size(), {});
  std::set<std::pair<int, int>> written; // (micro-batch, bucket)
  for (size_t i = 0; i < program_.step.size(); ++i) {
    const ir::Instr& in = program_.step[i];
    if (in.kind != ir::InstrKind::Run || m_.ops[in.op].phase == ir::Phase::Optimizer) continue;
    const ir::Op& op = m_.ops[in.op];
    // zb's B part leaves the parameter gradients to W (the memory plan's rule too).
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      int t = op.outputs[k];
      if (t < 0 || gradParam_[t] < 0 || !m_.runWrites(in, k)) continue;
      if (written.insert({in.micro, bucketOfParam_[gradParam_[t]]}).second)
        clearBuckets_[i].push_back(bucketOfParam_[gradParam_[t]]);
    }
  }
  EPL_ASSERT(std::all_of(program_.params.begin(), program_.params.end(),
                         [&](int q) { return bucketOfParam_[q] >= 0; }),
             "every parameter a rank updates is in a gradient bucket");
}

// ZeRO stage 3: the bucket's bytes [begin, end) of the flat parameter memory, whole in its
// block: each rank whose slice holds some of them copies its part there and broadcasts it
// to the others, in the background. With the slice on disk, a step's gather `part` (its
// index among the step's reads, planGatherReads) was read ahead; evaluation reads now.
void Executor::startGather(const ir::Instr& in, int part) {
  unsigned char* block = gatherMem(in.bucket, in.use, slotOf(in.micro));
  int64_t first = bucketBegin_[in.bucket];
  std::vector<backend::Request>& started = gathering_[2 * in.bucket + in.use];
  EPL_ASSERT(started.empty(), "a bucket's gather is waited for before it starts again");
  backend::Comm& comm = *bucketDomain(in.bucket).comm;
  for (const ir::Module::SlicePiece& piece : gatherPieces_[in.bucket]) {
    if (piece.rank != comm.rank()) continue;
    if (paramsOnDisk_ && part >= 0) { // read ahead into host memory
      dev_.copyToDevice(block + (piece.begin - first),
                        disk_->acquirePart(static_cast<size_t>(part)), piece.end - piece.begin);
      dev_.synchronize(); // done with the read-ahead buffer before it takes the next part
      disk_->releasePart(static_cast<size_t>(part));
    } else if (paramsOnDisk_) {
      std::vector<unsigned char> read(static_cast<size_t>(piece.end - piece.begin));
      disk_->read(states_, stateOffset(piece.begin), piece.end - piece.begin, read.data());
      dev_.copyToDevice(block + (piece.begin - first), read.data(), piece.end - piece.begin);
      dev_.synchronize();
    } else {
      dev_.copyOnDevice(block + (piece.begin - first), paramAt(piece.begin),
                        piece.end - piece.begin);
    }
  }
  // The broadcasts read the block after the copies queued into it (Comm.h).
  for (const ir::Module::SlicePiece& piece : gatherPieces_[in.bucket])
    started.push_back(
        comm.ibroadcast(block + (piece.begin - first), piece.end - piece.begin, piece.rank));
}

void Executor::waitGather(const ir::Instr& in, size_t index, int64_t step) {
  const ir::GradBucket& b = m_.buckets[in.bucket];
  std::vector<backend::Request>& started = gathering_[2 * in.bucket + in.use];
  for (backend::Request& r : started)
    bucketDomain(in.bucket).comm->wait(
        r,
        fmt::format("instruction {} of step {}: gather-wait bucket {} ({} "
                    "parameters from {}, for the {} of micro-batch {})",
                    index, step + 1, in.bucket, b.endParam - b.firstParam,
                    m_.params[b.firstParam].name, in.use == 0 ? "forward" : "backward", in.micro));
  started.clear();
}

// ZeRO stage 2: this rank's sum of bucket b, reduced in the slot `slot`, added into its
// gradient slice (zero-grads cleared it, so the first micro-batch's lands as it is).
void Executor::foldSlice(int b, int slot) {
  auto [begin, end] = slicePart(b);
  if (begin >= end) return;
  unsigned char* sum = bucketMem(b, slot) + (begin - bucketBegin_[b]);
  backend::KernelCall add;
  add.kind = ir::OpKind::Add;
  add.attrs = &noAttrs_;
  add.in = {backend::TensorView{gradAt(begin), ir::DType::F32, {(end - begin) / 4}},
            backend::TensorView{sum, ir::DType::F32, {(end - begin) / 4}}};
  add.out = {add.in[0]};
  dev_.launch(add);
}

void Executor::run(const ir::Instr& in, size_t index, int64_t step, uint64_t seed, bool training) {
  switch (in.kind) {
  case ir::InstrKind::ZeroGrads:
    dev_.fillZero(grads_, shardGrads_ ? sliceBytes_ : gradBytes_);
    return;
  case ir::InstrKind::Load:
    load(in.micro);
    return;
  case ir::InstrKind::Send:
    send(in, index, step, training);
    return;
  case ir::InstrKind::Recv:
    receive(in, index, step, (*receiving_)[index]);
    return;
  case ir::InstrKind::SeedGrad: {
    // The loss of this micro-batch is final once its forward ran: queue its copy to the
    // host now (read after the step's synchronize), then seed d loss = 1 / (micro_batches x
    // data-parallel ranks): the ranks' summed gradients are the global batch's mean.
    int slot = slotOf(in.micro);
    dev_.copyToHost(lossHost_.data<float>() + in.micro, view(m_.outputs[0], slot).data, 4);
    // Inside a split region a split group computes one loss over its copy's samples.
    int shares = program_.dataRanks;
    if (m_.tensors[m_.outputs[0]].layout.kind != ir::LayoutKind::DataParallel)
      shares /= program_.splitWidth;
    // amp = fp16: times the loss scale, so that small gradients stay above half's range.
    // With an ignored class, the loss is the mean over the kept targets of the global
    // batch: each micro-batch's mean weighs by its share of them.
    if (ignored_ >= 0) lossWeight_[in.micro] = keptWeight(slot, in.micro);
    // Each micro-batch's seed has its own place: the copy may still be queued when the
    // next one's is written (the step's synchronize frees them all).
    float* seed = seeds_.data<float>() + in.micro;
    *seed =
        static_cast<float>(lossScale_ * lossWeight_[in.micro] / (program_.microBatches * shares));
    dev_.copyToDevice(view(m_.lossGrad, slot).data, seed, 4);
    return;
  }
  case ir::InstrKind::ReduceStart:
    if (in.tie) return startTieSum(in.bucket);
    startReduce(in.bucket, in.micro);
    return;
  case ir::InstrKind::ReduceWait: {
    const ir::GradBucket& b = m_.buckets[in.bucket];
    auto began = std::chrono::steady_clock::now();
    pendingOn_[in.bucket]->wait(
        pending_[in.bucket],
        fmt::format("instruction {} of step {}: reduce-wait bucket {} ({} gradients "
                    "from {}, {} bytes)",
                    index, step + 1, in.bucket, b.endParam - b.firstParam,
                    m_.params[b.firstParam].name, b.bytes));
    reduceWaitSeconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    reduceEnded_ = monotonicSeconds();
    if (in.tie)
      endTieSum(in.bucket);
    else if (shardGrads_)
      foldSlice(in.bucket, slotOf(in.micro));
    return;
  }
  case ir::InstrKind::GatherStart:
    startGather(in, paramsOnDisk_ && training ? gatherPart_[index] : -1);
    return;
  case ir::InstrKind::GatherWait:
    waitGather(in, index, step);
    return;
  case ir::InstrKind::Run:
    break;
  }
  const ir::Op& op = m_.ops[in.op];
  if (op.phase == ir::Phase::Optimizer) {
    EPL_ASSERT(training && index < joinedElems_.size(), "optimizer ops run in the step");
    return optimizerStep(in.op, step, joinedElems_[index]);
  }
  if (op.kind == ir::OpKind::Next) return; // the load wrote its targets
  int fwd = op.phase == ir::Phase::Backward ? op.forward : in.op;
  if (m_.ops[fwd].kind == ir::OpKind::AllToAll) return moeExchange(in, index, step);
  if (ir::opInfo(m_.ops[fwd].kind).split == ir::SplitRule::Communication)
    return splitTransfer(in, index, step);
  if (vocabLoss(fwd)) return vocabCrossEntropy(in, index, step);
  backend::KernelCall& c = callOf(in);
  c.training = training;
  c.seed = mixSeeds({seed, static_cast<uint64_t>(step), seedKey_[fwd]});
  int out = m_.ops[fwd].outputs[0];
  c.elementOffset = perSample_[fwd] * firstSample(in.micro, out);
  const ir::Layout& l = m_.tensors[out].layout;
  if (m_.ops[fwd].kind == ir::OpKind::Dropout && l.kind == ir::LayoutKind::Sharded &&
      program_.splitWidth > 1) {
    std::vector<int64_t> local = shapeOnly(out).shape;
    c.cutPiece = cutOf(local, l.dim, 1).piece;
    c.cutPieces = program_.splitWidth;
    c.cutIndex = program_.splitRank;
  }
  dev_.launch(c);
  if (training && shardParams_ && op.kind == ir::OpKind::BatchNorm &&
      op.phase == ir::Phase::Forward)
    keepRunningStats(op, slotOf(in.micro));
  if (training && op.kind == ir::OpKind::MoeDispatch && op.phase == ir::Phase::Forward) {
    // Queued behind the kernel: the step adds them up once the device is done (runStep).
    EPL_ASSERT(kMoeStats * (moeDispatched_ + 1) * 4 <= moeStatsHost_.bytes(),
               "a slot for each moe_dispatch run of the step");
    dev_.copyToHost(moeStatsHost_.data<float>() + kMoeStats * moeDispatched_++, c.out[2].data,
                    4 * kMoeStats);
  }
}

// ZeRO stage 3: a training batch_norm updated its running statistics in the gathered copy
// of their bucket, which is dropped after its last reader. Every rank of the stage computed
// the same update (from the whole micro-batch's statistics), so each copies its slice's
// part of them back, before any later gather reads the slices.
void Executor::keepRunningStats(const ir::Op& op, int slot) {
  EPL_ASSERT(!paramsOnDisk_, "batch_norm's running statistics are kept in memory");
  for (int q : op.params) {
    if (m_.params[q].trainable) continue;
    auto [from, to] = updatedBytes(q); // in its bucket, as every parameter under ZeRO stage 3
    const auto* gathered =
        static_cast<const unsigned char*>(paramView(q, gatherUse(q, op.phase), slot).data);
    if (from < to) dev_.copyOnDevice(paramAt(from), gathered + (from - paramOffset_[q]), to - from);
  }
}

// A vocabulary-parallel cross-entropy: each rank holds a slice of the logits' columns, and
// the kernel runs on it (KernelCall::vocabSlice). Forward: each rank's per-row log-sum-exp
// of its slice and its mean target logit (of the rows whose target it holds) are
// all-gathered in the op's planned workspace (Module::workspaceBytes), and every rank's
// device combines them into the row's log-sum-exp (saved for the backward) and the mean
// loss (KernelCall::vocabSlices): a float a row each way, and no wait for the device.
// Backward: softmax minus one-hot on its own columns, with the saved log-sum-exp; no
// communication. The logits are never gathered.
void Executor::vocabCrossEntropy(const ir::Instr& in, size_t index, int64_t step) {
  const ir::Op& op = m_.ops[in.op];
  bool backward = op.phase == ir::Phase::Backward;
  if (backward && op.outputs[0] < 0) return;
  int w = program_.splitWidth, slot = slotOf(in.micro);
  backend::KernelCall c = callOf(in);
  c.vocabSlice = true;
  c.vocabFirst =
      program_.splitRank * shapeOnly(backward ? op.inputs[1] : op.inputs[0]).shape.back();
  dev_.launch(c);
  if (backward) return;
  backend::TensorView targets = view(op.inputs[1], slot);
  backend::TensorView loss = view(op.outputs[0], slot), lse = view(op.outputs[1], slot);
  int64_t rows = targets.numel(), figures = m_.vocabFigures(program_, op);
  EPL_ASSERT(loss.dtype == ir::DType::F32 && lse.dtype == ir::DType::F32,
             "cross_entropy's loss and log-sum-exps are f32");
  EPL_ASSERT(figures == rows + 1,
             "the plan's figures are each row's lse and the mean target logit");
  // This rank's [lse of each row, mean target logit], then every slice's side by side.
  float* mine = c.workspace ? c.workspace + c.stagingFloats : nullptr;
  EPL_ASSERT(mine && c.workspaceFloats - c.stagingFloats >= figures * (w + 1),
             "the memory plan holds the vocabulary slices' figures");
  float* all = mine + figures;
  dev_.copyOnDevice(mine, lse.data, 4 * rows);
  dev_.copyOnDevice(mine + rows, loss.data, 4);
  splitComm().allGather(mine, all, 4 * figures,
                        fmt::format("instruction {} of step {}: {}", index, step + 1, op.name));
  backend::KernelCall combine;
  combine.kind = ir::OpKind::CrossEntropy;
  combine.attrs = c.attrs;
  combine.vocabSlices = w;
  combine.in = {backend::TensorView{all, ir::DType::F32, {w, figures}}, targets};
  combine.out = {loss, lse};
  dev_.launch(combine);
}

// A split region's communication op, forward or backward (its transpose): all-reduce
// <-> identity, all-gather <-> slice, reduce-scatter <-> all-gather (sequence
// parallelism). On the device's memory: its copies, kernels and the split group's
// communicator (NCCL on GPUs).
void Executor::splitTransfer(const ir::Instr& in, size_t index, int64_t step) {
  const ir::Op& op = m_.ops[in.op];
  bool backward = op.phase == ir::Phase::Backward;
  const ir::Op& fwd = backward ? m_.ops[op.forward] : op;
  int slot = slotOf(in.micro);
  // Forward: input -> output. Backward: the output's gradient -> the input's.
  int from = op.inputs[0], to = op.outputs[0];
  if (to < 0) return; // no gradient flows back through it
  bool add = backward && op.accumulate[0];
  // Its workspace in the arena (Module::workspaceBytes): with amp, f32 copies of its half
  // tensors first (Module::ampStagingBytes), on which the collective runs, its result
  // rounded back; then the pieces it cuts or joins.
  const backend::KernelCall& call = callOf(in);
  float* at = call.workspace;
  auto asF32 = [&](const backend::TensorView& v, bool values) {
    if (!isHalf(v.dtype) || !v.data) return v;
    EPL_ASSERT(at && at + backend::stagingPadded(v.numel()) <= call.workspace + call.stagingFloats,
               "the memory plan holds a transfer's f32 copies");
    backend::TensorView f = v;
    f.dtype = ir::DType::F32;
    f.data = at;
    at += backend::stagingPadded(v.numel());
    if (values) castInto(v, f);
    return f;
  };
  backend::TensorView stored = view(to, slot);
  backend::TensorView src = asF32(view(from, slot), true);
  backend::TensorView dst = asF32(stored, add);
  float* scratch = call.workspace ? call.workspace + call.stagingFloats : nullptr;
  EPL_ASSERT(4 * (call.workspaceFloats - call.stagingFloats) >=
                 m_.transferScratchBytes(program_, op, fwd),
             "the memory plan holds a transfer's pieces");
  transfer(op, fwd, src, dst, add, scratch, [&] {
    return fmt::format("instruction {} of step {}: {} {}", index, step + 1,
                       backward ? "backward of" : "", op.name);
  });
  castInto(dst, stored);
}

// splitTransfer's collective on f32 views in device memory: src to dst (added into it with
// `add`), with `scratch` as Module::transferScratchBytes lays it out. The pieces are cut
// and joined by the device's copies of rows; a collective first waits for what the device
// queued before it, and what the device queues after it runs once it finished (the
// communicator's wait).
void Executor::transfer(const ir::Op& op, const ir::Op& fwd, const backend::TensorView& src,
                        const backend::TensorView& dst, bool add, float* scratch,
                        const std::function<std::string()>& what) {
  auto put = [&](float* values) { // dst = values, or += with `add`
    if (!add) {
      if (values != dst.data) dev_.copyOnDevice(dst.data, values, dst.bytes());
      return;
    }
    addInto(dst, values);
  };
  // Piece k of each of a cut's rows, between a whole tensor and its piece (rows side by
  // side), either way.
  auto piece = [&](float* whole, float* part, Cut c, int k, bool toPiece) {
    int64_t row = 4 * c.piece, pitch = row * program_.splitWidth;
    if (toPiece)
      dev_.copyRows(part, row, whole + k * c.piece, pitch, row, c.rows);
    else
      dev_.copyRows(whole + k * c.piece, pitch, part, row, row, c.rows);
  };
  int w = program_.splitWidth, k = program_.splitRank;
  int dim = ir::transferDim(fwd);
  switch (ir::transferForm(op, fwd)) {
  case ir::TransferForm::Scatter: {
    // The whole partial tensor laid out as w pieces one after another, then each rank
    // receives the sum of its piece.
    Cut c = cutOf(src.shape, dim, w);
    float* send = scratch;
    float* sum = send + src.numel();
    for (int j = 0; j < w; ++j)
      piece(src.f32(), send + j * c.rows * c.piece, c, j, true);
    splitComm().reduceScatter(send, sum, dst.numel(), what());
    return put(sum);
  }
  case ir::TransferForm::Reduce: {
    // Sums in place in the source when the result is added: the source (a partial sum, or
    // the identity's gradient) has no other reader.
    float* buf = add ? src.f32() : dst.f32();
    if (!add) dev_.copyOnDevice(buf, src.data, src.bytes());
    splitComm().allReduce(buf, src.numel(), what());
    if (add) put(buf);
    return;
  }
  case ir::TransferForm::Gather: {
    // The pieces, then joined into the result, or beside it to be added. A cut of dim 0
    // lays the pieces one after another: they land joined.
    Cut c = cutOf(dst.shape, dim, w);
    EPL_ASSERT(src.numel() * w == dst.numel(), "an all-gather's result holds its pieces");
    float* pieces = c.rows == 1 && !add ? dst.f32() : scratch;
    float* whole = c.rows == 1 ? pieces : add ? scratch + dst.numel() : dst.f32();
    splitComm().allGather(src.data, pieces, src.bytes(), what());
    if (c.rows > 1)
      for (int j = 0; j < w; ++j)
        piece(whole, pieces + j * c.rows * c.piece, c, j, false);
    if (add) put(whole);
    return;
  }
  case ir::TransferForm::Slice: {
    Cut c = cutOf(src.shape, dim, w);
    float* mine = add ? scratch : dst.f32();
    piece(src.f32(), mine, c, k, true);
    if (add) put(mine);
    return;
  }
  case ir::TransferForm::Pass: // the values as they are
    return put(src.f32());
  }
}

// Split experts' all-to-all (bridge-insertion): the dispatch brings each rank the rows of
// its experts from every rank of its split group, the combine takes the experts' outputs
// back, and each one's backward moves the gradients the other way. A rank's dispatched
// rows are grouped by expert, so the rows of one rank's experts are one block: each rank
// sends each peer one block and gets one from each. The counts travel first (the
// dispatch's forward) and are kept for the combine and the backward of the micro-batch.
// A rank holds what it got by expert, then sending rank: the order one device running
// every expert would hold them in. Rows past the ones in use are zero.
void Executor::moeExchange(const ir::Instr& in, size_t index, int64_t step) {
  const ir::Op& op = m_.ops[in.op];
  bool backward = op.phase == ir::Phase::Backward;
  const ir::Op& fwd = backward ? m_.ops[op.forward] : op;
  bool dispatch = std::get<std::string>(fwd.attrs.at("phase")) == "dispatch";
  int slot = slotOf(in.micro);
  int to = op.outputs[0];
  if (to < 0) return; // no gradient flows back through it
  int w = program_.splitWidth;
  int countsT = fwd.inputs[1];
  backend::Comm& comm = splitComm();
  auto what = [&] {
    return fmt::format("instruction {} of step {}: {}{}", index, step + 1,
                       backward ? "backward of " : "", op.name);
  };
  dev_.synchronize();
  HostSide host(dev_);
  MoeTraffic& tr = moeTraffic_[{countsT, slot}];
  if (dispatch && !backward) { // the counts: of each rank's experts, and of this rank's
    backend::TensorView counts = host.in(view(countsT, slot));
    const int32_t* c = static_cast<const int32_t*>(counts.data);
    int64_t experts = counts.numel(), el = experts / w;
    std::vector<int32_t> got(static_cast<size_t>(experts));
    backend::Request r = comm.iallToAll(c, got.data(), 4 * el);
    comm.wait(r, what());
    tr.sent.assign(w, 0);
    for (int64_t e = 0; e < experts; ++e)
      tr.sent[e / el] += c[e];
    tr.got.assign(got.begin(), got.end());
    int32_t* mine = static_cast<int32_t*>(host.out(view(op.outputs[1], slot), false).data);
    for (int64_t x = 0; x < el; ++x) {
      int64_t n = 0;
      for (int i = 0; i < w; ++i)
        n += got[i * el + x];
      mine[x] = static_cast<int32_t>(n);
    }
  }
  host.finish();
  EPL_ASSERT(static_cast<int>(tr.sent.size()) == w, "a moe exchange before its dispatch");
  bool add = backward && op.accumulate[0];
  backend::TensorView src = view(op.inputs[0], slot), dst = view(to, slot);
  int64_t d = src.shape.back(), el = static_cast<int64_t>(tr.got.size()) / w;
  // Where each rank's block starts in the local layout, and each (expert, rank) run in the
  // experts' layout.
  std::vector<int64_t> localAt(w + 1, 0), expertAt(el * w + 1, 0);
  for (int j = 0; j < w; ++j)
    localAt[j + 1] = localAt[j] + tr.sent[j];
  for (int64_t x = 0; x < el; ++x)
    for (int i = 0; i < w; ++i)
      expertAt[x * w + i + 1] = expertAt[x * w + i] + tr.got[i * el + x];
  bool toExperts = dispatch != backward;
  // On the device, in the op's planned workspace (Module::transferScratchBytes): the blocks
  // to send that are not one run of the source, the blocks received that are not one run
  // of the result, and the result to add. Toward the experts a peer's block is one run of
  // the local layout and lands as one run of each expert; back, the other way.
  const backend::KernelCall& call = callOf(in);
  float* sendBuf = call.workspace + call.stagingFloats;
  float* recvBuf = sendBuf + src.numel();
  float* into = add ? recvBuf + dst.numel() : dst.f32();
  EPL_ASSERT(call.workspace && 4 * (call.workspaceFloats - call.stagingFloats) >=
                                   m_.transferScratchBytes(program_, op, fwd),
             "the memory plan holds an exchange's blocks");
  const float* s = src.f32();
  auto rows = [&](float* to, const float* from, int64_t n) {
    dev_.copyOnDevice(to, from, 4 * n * d);
  };
  // Per peer: where its block to send and its block received lie.
  std::vector<const float*> out(w);
  std::vector<float*> back(w);
  std::vector<int64_t> outRows(w), backRows(w);
  float* packed = sendBuf;
  float* received = recvBuf;
  int me = program_.splitRank;
  for (int i = 0; i < w; ++i) {
    int64_t toExpertsRows = 0;
    for (int64_t x = 0; x < el; ++x)
      toExpertsRows += tr.got[i * el + x];
    if (toExperts) {
      out[i] = s + localAt[i] * d;
      outRows[i] = tr.sent[i];
      backRows[i] = toExpertsRows;
      // This rank's own block is read where it lies; a peer's lands in the buffer.
      back[i] = i == me ? const_cast<float*>(out[i]) : received;
      if (i != me) received += toExpertsRows * d;
    } else {
      outRows[i] = toExpertsRows;
      backRows[i] = tr.sent[i];
      back[i] = into + localAt[i] * d;
      // This rank's own runs go straight into place; a peer's are packed to send.
      float* at = i == me ? back[i] : packed;
      out[i] = at;
      for (int64_t x = 0; x < el; ++x) {
        int64_t n = expertAt[x * w + i + 1] - expertAt[x * w + i];
        rows(at, s + expertAt[x * w + i] * d, n);
        at += n * d;
      }
      if (i != me) packed = at;
    }
  }
  // The sends read the sources and packed blocks as the device's copies leave them (Comm.h).
  std::vector<backend::Request> requests;
  constexpr int kTag = 0x4d4f; // the split communicator carries nothing else point to point
  for (int i = 0; i < w; ++i) {
    if (i == me) continue;
    if (backRows[i] > 0) requests.push_back(comm.irecv(back[i], 4 * backRows[i] * d, i, kTag));
    if (outRows[i] > 0) requests.push_back(comm.isend(out[i], 4 * outRows[i] * d, i, kTag));
  }
  for (backend::Request& r : requests)
    comm.wait(r, what());
  int64_t used = toExperts ? expertAt[el * w] : localAt[w];
  if (toExperts) // each peer's block, run by run, into its experts' places
    for (int i = 0; i < w; ++i) {
      const float* from = back[i];
      for (int64_t x = 0; x < el; ++x) {
        int64_t n = tr.got[i * el + x];
        rows(into + expertAt[x * w + i] * d, from, n);
        from += n * d;
      }
    }
  if (used * d < dst.numel()) dev_.fillZero(into + used * d, 4 * (dst.numel() - used * d));
  if (add) addInto(dst, into);
}

// Each pipeline stage sums the squares of its own gradients; the ranks' sums add up to the
// global norm. It stays on the device, where the updates read their clip factor, and under
// a loss scale its inverse and whether the gradients overflowed, which skips them
// (OptimizerCall::squaredNorm): the host never waits for it within the step.
void Executor::gradNorm(const ir::Op& op) {
  float* acc = static_cast<float*>(view(m_.gradNorm).data);
  normOnDevice_ = true;
  if (shardGrads_) { // ZeRO stage 2: each rank's slices (zero between parameters)
    bool first = true;
    for (auto [begin, end] : normRuns_) {
      dev_.sumSquares(backend::TensorView{grads_ + begin, ir::DType::F32, {(end - begin) / 4}}, acc,
                      !first);
      first = false;
    }
    if (first) dev_.fillZero(acc, 4);
    // Every gradient is in one rank's slice: in a pipeline, of its stage's ranks.
    return sumNormOnDevice(acc, &comm_);
  }
  // The squares of this rank's gradients: whole ones, and its pieces of sharded ones.
  std::vector<bool> mine(m_.tensors.size(), false);
  for (int p : program_.params) // a tied weight's copy counts at its maker's stage
    mine[m_.params[p].grad] = !m_.holdsCopy(program_, p);
  // The sum of squares of the whole gradients or of the pieces into `into`: 0 where none.
  auto sumSquares = [&](bool pieces, float* into) {
    bool first = true;
    for (int g : op.inputs)
      if (mine[g] && sharded(gradParam_[g]) == pieces) {
        dev_.sumSquares(view(g), into, !first);
        first = false;
      }
    if (first) dev_.fillZero(into, 4);
  };
  // Each gradient is counted once: the ranks of a stage group hold the same summed
  // gradients (its first rank counts the whole ones, its first split group the pieces),
  // and a pipeline's stages add theirs up. A stage of split regions alone: every copy of
  // the split group sums its own, the whole ones from its first rank.
  bool whole = program_.stages > 1 || program_.splitWidth == 1 ? program_.local == 0
                                                               : program_.splitRank == 0;
  bool cut = program_.stages > 1 ? program_.local < program_.splitWidth : program_.splitWidth > 1;
  backend::Comm* across = program_.stages > 1       ? &normComm()
                          : program_.splitWidth > 1 ? &splitComm()
                                                    : nullptr;
  // acc = (the whole ones' sum or 0) + (the pieces' sum or 0).
  if (whole)
    sumSquares(false, acc);
  else
    dev_.fillZero(acc, 4);
  if (cut) {
    sumSquares(true, normPieces_);
    addInto(backend::TensorView{acc, ir::DType::F32, {1}}, normPieces_);
  }
  sumNormOnDevice(acc, across);
}

// The squared norm at acc (device memory), summed over `across` where the ranks hold parts
// of it, stays there for the updates; its copy for the step's figures comes to the host
// behind it and is read after the step (runStep).
void Executor::sumNormOnDevice(float* acc, backend::Comm* across) {
  if (across) across->allReduce(acc, 1, "the squared gradient norm");
  dev_.copyToHost(normHost_.data<float>(), acc, 4);
}

// The bytes of parameter p's memory this rank updates: all of them, or those in its ZeRO
// slice (the update is elementwise).
std::pair<int64_t, int64_t> Executor::updatedBytes(int p) const {
  return updatedBytes(paramOffset_[p], paramOffset_[p] + 4 * paramElems_[p]);
}

std::pair<int64_t, int64_t> Executor::updatedBytes(int64_t begin, int64_t end) const {
  if (zero_.empty()) return {begin, end};
  const ZeroDomain& d = domainOf(begin);
  return {std::max(begin, d.slice.begin()), std::min(end, d.slice.end())};
}

// `offload = params`: the step's gathers read this rank's part of each bucket from the
// file, in the order they start, ahead of them (Program::partStagingBytes).
void Executor::planGatherReads() {
  std::vector<OffloadedStates::Part> parts;
  gatherPart_.assign(program_.step.size(), -1);
  for (size_t i = 0; i < program_.step.size(); ++i) {
    const ir::Instr& in = program_.step[i];
    if (in.kind != ir::InstrKind::GatherStart) continue;
    int me = bucketDomain(in.bucket).comm->rank();
    for (const ir::Module::SlicePiece& piece : gatherPieces_[in.bucket])
      if (piece.rank == me) {
        EPL_ASSERT(gatherPart_[i] < 0, "a rank's slice holds one piece of a bucket");
        gatherPart_[i] = static_cast<int>(parts.size());
        parts.push_back({stateOffset(piece.begin), piece.end - piece.begin});
      }
  }
  for (const OffloadedStates::Part& part : parts)
    EPL_ASSERT(part.bytes <= program_.partStagingBytes,
               "a gather's part fits the memory plan's read-ahead buffer");
  disk_->setParts(states_, std::move(parts),
                  workerStaging() + (program_.stagingBytes - program_.partStagingBytes));
}

// Offloaded states: the chunks of the step's optimizer ops, in the order the step runs
// them, each at most a staging buffer's chunk.
void Executor::planOffloadChunks() {
  std::vector<OffloadedStates::Chunk> chunks;
  opChunks_.assign(m_.ops.size(), {0, 0});
  for (const ir::Instr& in : program_.step) {
    if (in.kind != ir::InstrKind::Run) continue;
    const ir::Op& op = m_.ops[in.op];
    if (op.phase != ir::Phase::Optimizer || op.kind == ir::OpKind::GradNorm) continue;
    EPL_ASSERT(opChunks_[in.op].second == 0, "an optimizer op runs once a step");
    auto [begin, end] = updatedBytes(op.params.at(0));
    opChunks_[in.op].first = chunks.size();
    for (int64_t at = begin; at < end; at += disk_->chunkBytes()) {
      chunks.push_back({stateOffset(at), std::min(disk_->chunkBytes(), end - at)});
      chunkParamAt_.push_back(at);
    }
    opChunks_[in.op].second = chunks.size() - opChunks_[in.op].first;
  }
  disk_->setChunks(std::move(chunks));
}

// Consecutive optimizer ops of the step whose parameters lie end to end run as one update
// (docs/architecture.md, "One update for adjacent parameters"): one device call over their
// joined bytes, which on a GPU is one launch instead of one a parameter. The parameters,
// their gradients and their states share the layout (Module::paramLayout), so parameters
// end to end in one memory are in all. The update is elementwise with the same settings
// for every parameter, so each element gets the same arithmetic either way. Under ZeRO the
// parameters of a run lie in one domain, whose slice on this rank cuts one range of the run.
// Not with offloaded states, whose updates take chunks of their own.
void Executor::planFusedUpdates() {
  joinedElems_.assign(program_.step.size(), -1);
  if (disk_) return;
  auto sameDomain = [&](int q, int first) {
    if (zero_.empty()) return true;
    const ZeroDomain* d = findDomain(paramOffset_[q]);
    return d && d == findDomain(paramOffset_[first]);
  };
  auto updated = [&](size_t i) { // the parameter instruction i updates, or -1
    const ir::Instr& in = program_.step[i];
    if (in.kind != ir::InstrKind::Run) return -1;
    const ir::Op& op = m_.ops[in.op];
    if (op.phase != ir::Phase::Optimizer || op.kind == ir::OpKind::GradNorm) return -1;
    EPL_ASSERT(gradParam_[op.inputs[0]] == op.params.at(0),
               "an optimizer op reads its parameter's gradient");
    return op.params.at(0);
  };
  for (size_t i = 0; i < program_.step.size();) {
    size_t end = i + 1;
    int first = updated(i), last = first;
    if (first >= 0)
      for (int q;
           end < program_.step.size() && (q = updated(end)) >= 0 &&
           paramOffset_[q] == paramOffset_[last] + 4 * paramElems_[last] && sameDomain(q, first);
           ++end)
        last = q;
    if (end - i > 1) {
      joinedElems_[i] = (paramOffset_[last] - paramOffset_[first]) / 4 + paramElems_[last];
      for (size_t k = i + 1; k < end; ++k)
        joinedElems_[k] = 0;
    }
    i = end;
  }
}

void Executor::optimizerStep(int id, int64_t step, int64_t joined) {
  const ir::Op& op = m_.ops[id];
  if (op.kind == ir::OpKind::GradNorm) return gradNorm(op);
  if (joined == 0) return; // an earlier op of the step updated it with its own
  int p = op.params.at(0);
  backend::OptimizerCall c;
  c.kind = opt_.kind;
  c.lr = lr_;
  c.beta1 = opt_.beta1;
  c.beta2 = opt_.beta2;
  c.eps = opt_.eps;
  c.weightDecay = opt_.weightDecay;
  c.momentum = opt_.momentum;
  c.step = step + 1;
  if (normOnDevice_) { // the grad-norm op ran: for clipping, or under a loss scale
    c.squaredNorm = static_cast<const float*>(view(m_.gradNorm).data);
    c.maxNorm = opt_.clipGradNorm;
    c.lossScale = m_.scalesLoss() ? lossScale_ : 0;
  }
  c.param = paramView(p);
  c.grad = view(op.inputs[0]);
  c.state1 = stateView(p, 0);
  c.state2 = stateView(p, 1);
  if (zero_.empty() && !disk_) {
    if (joined > 0) // this op's parameter and the next ones', end to end
      for (backend::TensorView* v : {&c.param, &c.grad, &c.state1, &c.state2})
        v->shape = {joined};
    return dev_.optimizerStep(c);
  }
  // A run of the parameter's bytes [from, to), with its states at s1 and s2.
  EPL_ASSERT(gradParam_[op.inputs[0]] == p, "an optimizer op reads its parameter's gradient");
  auto update = [&](int64_t from, int64_t to, unsigned char* param, unsigned char* s1,
                    unsigned char* s2) {
    for (backend::TensorView* v : {&c.param, &c.grad, &c.state1, &c.state2})
      v->shape = {(to - from) / 4};
    c.param.data = param;
    c.grad.data = gradAt(from);
    c.state1.data = states_ > 0 ? s1 : nullptr;
    c.state2.data = states_ > 1 ? s2 : nullptr;
    dev_.optimizerStep(c);
  };
  if (!disk_) {
    auto [begin, end] =
        joined > 0 ? updatedBytes(paramOffset_[p], paramOffset_[p] + 4 * joined) : updatedBytes(p);
    if (begin >= end) return;
    int64_t at = stateOffset(begin);
    return update(begin, end, paramAt(begin), stateMem_[0] + at,
                  states_ > 1 ? stateMem_[1] + at : nullptr);
  }
  // On disk: chunk by chunk, as the file's worker reads them in. Where the worker's buffers
  // are host memory apart from the device's, each chunk's blocks go to the device's
  // buffer of the same place for the update and come back.
  auto [first, count] = opChunks_[id];
  int blocks = states_ + (paramsOnDisk_ ? 1 : 0);
  for (size_t i = first; i < first + count; ++i) {
    disk_->acquire(i);
    int64_t at = chunkParamAt_[i], bytes = disk_->chunk(i).bytes;
    auto onDevice = [&](int k) { return stagingMem_ + (disk_->stateOf(i, k) - workerStaging()); };
    bool mirror = workerStaging() != stagingMem_;
    if (mirror)
      for (int k = 0; k < blocks; ++k)
        dev_.copyToDevice(onDevice(k), disk_->stateOf(i, k), bytes);
    update(at, at + bytes, paramsOnDisk_ ? onDevice(states_) : paramAt(at), onDevice(0),
           states_ > 1 ? onDevice(1) : nullptr);
    if (mirror)
      for (int k = 0; k < blocks; ++k)
        dev_.copyToHost(disk_->stateOf(i, k), onDevice(k), bytes);
    dev_.synchronize(); // the update is done with the buffer before it is written back
    disk_->release(i);
  }
}

const Executor::ZeroDomain* Executor::findDomain(int64_t b) const {
  for (const ZeroDomain& d : zero_)
    if (b >= d.slice.base && b < d.slice.base + d.slice.ranks * d.slice.bytes) return &d;
  return nullptr;
}

const Executor::ZeroDomain& Executor::domainOf(int64_t b) const {
  const ZeroDomain* d = findDomain(b);
  EPL_ASSERT(d != nullptr, "a parameter byte ZeRO partitions lies in one of its domains");
  return *d;
}

// ZeRO: every rank's updated slice of the parameters, to every rank, in place (the slices
// lie side by side in the parameter memory).
void Executor::gatherParams(int64_t step) {
  dev_.synchronize();
  for (const ZeroDomain& d : zero_)
    d.comm->allGather(params_ + d.slice.begin(), params_ + d.slice.base, d.slice.bytes,
                      fmt::format("gathering the parameters updated in step {}", step + 1));
}

// What the trace calls an instruction.
std::string Executor::traceName(const ir::Instr& in) const {
  auto tensor = [&] { return m_.tensors[in.tensor].name; };
  switch (in.kind) {
  case ir::InstrKind::ZeroGrads:
    return "zero-grads";
  case ir::InstrKind::Load:
    return "load";
  case ir::InstrKind::SeedGrad:
    return "seed-grad";
  case ir::InstrKind::ReduceStart:
    return fmt::format("reduce-start bucket {}{}", in.bucket, in.tie ? " tied" : "");
  case ir::InstrKind::ReduceWait:
    return fmt::format("reduce-wait bucket {}{}", in.bucket, in.tie ? " tied" : "");
  case ir::InstrKind::GatherStart:
    return fmt::format("gather-start bucket {} {}", in.bucket, in.use == 0 ? "fwd" : "bwd");
  case ir::InstrKind::GatherWait:
    return fmt::format("gather-wait bucket {} {}", in.bucket, in.use == 0 ? "fwd" : "bwd");
  case ir::InstrKind::Send:
    return fmt::format("send %{} mb {} -> rank {}", tensor(), in.micro, in.peer);
  case ir::InstrKind::Recv:
    return fmt::format("recv %{} mb {} <- rank {}", tensor(), in.micro, in.peer);
  case ir::InstrKind::Run:
    break;
  }
  return m_.runName(in);
}

// An instruction of a traced step. The device is synchronized after it, so a queued
// device's work is counted in the instruction that queued it.
void Executor::runTraced(const ir::Instr& in, size_t index, int64_t step, uint64_t seed) {
  if (joinedElems_[index] == 0) return; // an earlier update's, traced there
  double began = trace_->nowUs();
  run(in, index, step, seed, true);
  dev_.synchronize();
  bool comm = in.kind == ir::InstrKind::Send || in.kind == ir::InstrKind::Recv ||
              in.kind == ir::InstrKind::ReduceStart || in.kind == ir::InstrKind::ReduceWait ||
              in.kind == ir::InstrKind::GatherStart || in.kind == ir::InstrKind::GatherWait ||
              (in.kind == ir::InstrKind::Run && m_.splitCollective(program_, in.op));
  trace_->add({traceName(in), step, in.micro, comm ? Track::Communication : Track::Compute, began,
               trace_->nowUs()});
}

StepResult Executor::runStep(int64_t step, float lr, uint64_t seed) {
  lr_ = lr;
  std::fill(std::begin(moeStats_), std::end(moeStats_), 0.0);
  moeDispatched_ = 0;
  gradNorm_ = -1; // measured by the grad-norm op: when clipping, or scaling the loss
  normOnDevice_ = false;
  overflow_ = false;
  reduceWaitSeconds_ = 0;
  postReceives(program_.step, stepRecv_);
  if (disk_) disk_->beginStep(); // its first chunks are read while the step computes
  bool traced = trace_ && trace_->wants();
  if (traced) trace_->beginStep(step);
  tracing_ = traced;
  tracingStep_ = step;
  for (size_t i = 0; i < program_.step.size(); ++i) {
    occupySlot(i);
    for (size_t k = 0; shardGrads_ && k < clearBuckets_[i].size(); ++k) {
      int b = clearBuckets_[i][k];
      dev_.fillZero(bucketMem(b, slotOf(program_.step[i].micro)), bucketEnd_[b] - bucketBegin_[b]);
    }
    if (traced)
      runTraced(program_.step[i], i, step, seed);
    else
      run(program_.step[i], i, step, seed, true);
    vacateSlot(i);
  }
  tracing_ = false;
  finishSends(-1);
  if (disk_) disk_->endStep();
  if (!zero_.empty() && !shardParams_) gatherParams(step);
  dev_.synchronize();
  if (traced) trace_->endStep();
  if (normOnDevice_) {
    // Under a loss scale, the norm of the scaled gradients: infinite or NaN where they
    // overflowed, which skipped the updates (backend::overflowed) on every rank alike.
    float sq = *normHost_.data<float>();
    overflow_ = m_.scalesLoss() && backend::overflowed(sq, lossScale_);
    gradNorm_ = std::sqrt(static_cast<double>(sq)) / lossScale_;
  }
  const float* stats = moeStatsHost_.data<float>();
  for (int d = 0; d < moeDispatched_; ++d) // in the order they ran
    for (int k = 0; k < kMoeStats; ++k)
      moeStats_[k] += stats[kMoeStats * d + k];
  StepResult r;
  const float* losses = lossHost_.data<float>();
  for (int k = 0; k < program_.microBatches; ++k)
    r.loss += ignored_ >= 0 ? losses[k] * lossWeight_[static_cast<size_t>(k)] : losses[k];
  r.loss /= program_.microBatches;
  // A pipeline's last stage alone has the loss: from its one rank, or gathered below.
  if (program_.stages > 1 && lossRanks_ == 1)
    comm_.broadcast(&r.loss, sizeof r.loss, program_.lossRank,
                    fmt::format("the loss of step {}", step + 1));
  r.reduceWaitSeconds = reduceWaitSeconds_;
  if (lossRanks_ > 1) {
    // Each loss rank's mean loss over its samples (they hold equal shares of the batch),
    // gathered so that every rank adds them in rank order, with when each rank's
    // reductions began and ended.
    double mine[3] = {r.loss, reduceBegan_, reduceEnded_};
    std::vector<double> all(3 * static_cast<size_t>(comm_.size()));
    comm_.allGather(mine, all.data(), sizeof mine, fmt::format("the loss of step {}", step + 1));
    r.loss = 0;
    double began = 0, ended = 0;
    int losses = 0;
    for (int k = 0; k < comm_.size(); ++k) {
      if (m_.programs[k].lossRank == k) {
        r.loss += all[3 * k];
        ++losses;
      }
      began = std::max(began, all[3 * k + 1]);
      ended = std::max(ended, all[3 * k + 2]);
    }
    r.loss /= losses;
    r.reduceSpanSeconds = ended - began;
  }
  if (hasMoe_) {
    // Every rank's moe statistics, added up in rank order (each rank routed its own
    // tokens; a rank without moe layers adds zeros).
    std::vector<double> all(4 * static_cast<size_t>(comm_.size()));
    comm_.allGather(moeStats_, all.data(), sizeof moeStats_,
                    fmt::format("the moe statistics of step {}", step + 1));
    double sum[4] = {0, 0, 0, 0};
    for (int k = 0; k < comm_.size(); ++k)
      for (int j = 0; j < 4; ++j)
        sum[j] += all[4 * k + j];
    r.moeAux = sum[3] > 0 ? sum[0] / sum[3] : 0;
    r.moeDropped = sum[2] > 0 ? sum[1] / sum[2] : 0;
  }
  r.gradNorm = gradNorm_;
  // amp = fp16: the scale this step used; an overflow halves it for the next, and
  // kLossScaleWindow steps without one double it (PyTorch's GradScaler's rule).
  if (m_.scalesLoss()) {
    r.lossScale = lossScale_;
    r.skipped = overflow_;
    if (overflow_) {
      lossScale_ /= 2;
      goodSteps_ = 0;
    } else if (++goodSteps_ == ir::Policy::kLossScaleWindow) {
      lossScale_ *= 2;
      goodSteps_ = 0;
    }
  }
  // ZeRO stage 2 reduces every micro-batch's gradients.
  for (size_t b = 0; b < bucketBegin_.size(); ++b)
    r.reduceBytes += (shardGrads_ ? program_.microBatches : 1) * (bucketEnd_[b] - bucketBegin_[b]) /
                     4 * (wire_ == backend::WireType::F32 ? 4 : 2);
  return r;
}

// A micro-batch's weight under an ignored class (lossWeight_): its kept share of the loss's
// targets on this rank, over the global batch's kept share. 0 when the step keeps none.
double Executor::keptWeight(int slot, int micro) {
  const ir::Op& op = m_.ops[lossOp()];
  backend::TensorView t = view(op.inputs[1], slot);
  EPL_ASSERT(targets_ > 0, "the step's count of kept targets was set");
  if (kept_ == 0) return 0;
  // The host's count where the loss holds the micro-batch's whole targets (its samples'
  // share of the global batch's); else (a loss over a piece of them) the device's.
  int64_t mine = 0, perSample = targets_ / m_.train.batch;
  if (!keptMine_.empty() && t.numel() == localBatch_ * perSample) {
    mine = keptMine_.at(static_cast<size_t>(micro));
  } else {
    std::vector<int32_t> targets(static_cast<size_t>(t.numel()));
    dev_.copyToHost(targets.data(), t.data, t.bytes());
    dev_.synchronize();
    mine = ir::keptTargets(targets.data(), t.numel(), ignored_);
  }
  return static_cast<double>(mine) * static_cast<double>(targets_) /
         (static_cast<double>(t.numel()) * static_cast<double>(kept_));
}

int Executor::lossOp() const {
  return m_.tensors[m_.outputs[0]].producer;
}

int64_t Executor::classes() const {
  const ir::Op& op = m_.ops[lossOp()];
  if (op.kind != ir::OpKind::CrossEntropy) return 0;
  return shapeOnly(op.inputs[0]).shape.back() * (vocabLoss(lossOp()) ? program_.splitWidth : 1);
}

double Executor::runEval(std::vector<float>* logits, std::vector<int32_t>* targets) {
  postReceives(program_.eval, evalRecv_);
  for (size_t i = 0; i < program_.eval.size(); ++i)
    run(program_.eval[i], i, 0, 0, false);
  float loss = 0;
  if (!holdsLoss()) {
    if (logits) logits->clear();
    if (targets) targets->clear();
    dev_.synchronize();
    return 0;
  }
  dev_.copyToHost(&loss, view(m_.outputs[0]).data, 4);
  const ir::Op& op = m_.ops[lossOp()];
  if (vocabLoss(lossOp())) {
    gatherVocabLogits(op, logits, targets);
    return loss;
  }
  if (op.kind == ir::OpKind::CrossEntropy && logits && targets) {
    backend::TensorView l = view(op.inputs[0]), t = view(op.inputs[1]);
    logits->resize(l.numel());
    targets->resize(t.numel());
    dev_.copyToHost(targets->data(), t.data, t.bytes());
    if (l.dtype == ir::DType::F32) {
      dev_.copyToHost(logits->data(), l.data, l.bytes());
    } else { // amp: logits stored in half precision
      std::vector<uint16_t> half(static_cast<size_t>(l.numel()));
      dev_.copyToHost(half.data(), l.data, l.bytes());
      dev_.synchronize();
      backend::wire::decode(wireOf(l.dtype), half.data(), logits->data(), l.numel(), 1.f);
    }
  }
  dev_.synchronize();
  return loss;
}

// A vocabulary-parallel loss's evaluation: the split group gathers the logits' columns
// (every time: the ranks must agree), and each rank keeps the rows of its own samples, as
// a rank outside split regions has them (all of them where it reads the whole micro-batch).
void Executor::gatherVocabLogits(const ir::Op& op, std::vector<float>* logits,
                                 std::vector<int32_t>* targets) {
  int w = program_.splitWidth;
  dev_.synchronize();
  HostSide host(dev_);
  backend::TensorView l = widened(host.in(view(op.inputs[0])), ampIn_, true),
                      t = host.in(view(op.inputs[1]));
  std::vector<float> pieces(static_cast<size_t>(l.numel() * w));
  splitComm().allGather(l.data, pieces.data(), l.bytes(), "gathering the evaluation's logits");
  if (!logits || !targets) return;
  std::vector<int64_t> whole = l.shape;
  whole.back() *= w;
  std::vector<float> all(static_cast<size_t>(l.numel() * w));
  joinPieces(pieces.data(), all.data(), cutOf(whole, static_cast<int>(whole.size()) - 1, w), w);
  int64_t rows = t.numel(), mine = program_.readsWhole ? rows : rows / w;
  int64_t first = program_.readsWhole ? 0 : program_.splitRank * mine;
  int64_t v = whole.back();
  logits->assign(all.begin() + first * v, all.begin() + (first + mine) * v);
  const int32_t* tp = static_cast<const int32_t*>(t.data);
  targets->assign(tp + first, tp + first + mine);
}

std::vector<float> Executor::forwardLogits() {
  std::vector<float> logits;
  std::vector<int32_t> targets;
  runEval(&logits, &targets);
  return logits;
}

} // namespace epl::interp
