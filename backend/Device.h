// The device interface the interpreter runs on: device memory, explicit host <-> device
// copies, ordered streams with events, and kernels. The CPU device finishes each call
// before it returns; a CUDA device only queues it on a stream. So the interpreter never
// reads device memory from the host without `copyToHost` followed by `synchronize` (or
// waiting on an event), and the same interpreter drives both.
#pragma once
#include "backend/HostDevice.h"
#include "ir/Config.h"
#include "ir/Ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace epl::backend {

class Comm;

// A tensor in device memory with a concrete shape. `data` is null for a tensor a kernel
// does not read or write (its shape is still set, e.g. for broadcasting in backward).
struct TensorView {
  void* data = nullptr;
  ir::DType dtype = ir::DType::F32;
  std::vector<int64_t> shape;

  int64_t numel() const;
  int64_t bytes() const;
  float* f32() const { return static_cast<float*>(data); }
  int32_t* i32() const { return static_cast<int32_t*>(data); }
};

// Where a call's elements lie in a tensor cut over a split group (KernelCall::cutPiece):
// piece `index` of `pieces` of every row of `piece` elements; piece 0: the whole tensor.
// Read on the host and in the GPU's kernels alike.
struct CutPiece {
  int64_t piece = 0;
  int pieces = 1, index = 0;
  // The whole tensor's index of element i.
  EPL_HOST_DEVICE int64_t whole(int64_t i) const {
    return piece == 0 ? i : (i / piece * pieces + index) * piece + i % piece;
  }
};

// One kernel launch for a builtin op.
//
// Forward:  in  = the op's tensor inputs, then its params (in ir::paramSpecs order);
//           out = the op's output, then the saved tensors of ir::gradInfo.
// Backward: in  = [grad of the output, each tensor input, each param, the output, each
//                  saved tensor]; inputs and output have null data unless ir::gradInfo
//                  says the backward reads them;
//           out = [grad of each tensor input, grad of each param]; null data where no
//                  gradient is wanted (integer inputs, model inputs).
//           accumulate[i]: add into out[i] instead of overwriting it.
struct KernelCall {
  ir::OpKind kind = ir::OpKind::Add;
  bool backward = false;
  bool training = true; // dropout is the identity when false
  const ir::Attrs* attrs = nullptr;
  std::vector<TensorView> in, out;
  std::vector<bool> accumulate;
  uint64_t seed = 0; // dropout: the same seed in the forward and its backward
  // dropout: the index of this call's first element among the step's whole batch (every
  // micro-batch of every rank), so a mask depends on the sample, not on how -np and
  // micro_batches cut the batch.
  int64_t elementOffset = 0;
  // dropout on a tensor cut over a split group: the call holds piece `cutIndex` of
  // `cutPieces` of every row of cutPiece elements (a row: the dims before the cut one), so
  // its element i is element (i / cutPiece) cutPieces cutPiece + cutIndex cutPiece +
  // i % cutPiece of the whole tensor. cutPiece 0: the call holds the whole tensor.
  int64_t cutPiece = 0;
  int cutPieces = 1, cutIndex = 0;
  // embedding over a vocabulary split: the call holds rows [vocabFirst, vocabFirst + V) of
  // the table; other tokens give zero rows (another device adds theirs) and no gradient.
  // cross_entropy over one: the call holds those columns of the logits; its forward gives
  // the slice's log-sum-exp and mean target logit, and its backward the one-hot where the
  // slice holds the target (backend/cpu/Losses.cpp).
  int64_t vocabFirst = 0;
  bool vocabSlice = false;
  // cross_entropy's forward combining the w = vocabSlices slices' (Executor::
  // vocabCrossEntropy): in = [each slice's lse of every row and mean target logit, side by
  // side: f32 [w, N + 1], targets i32 [N]], out = [loss f32[], lse [N]]: the rows' whole
  // log-sum-exp, and the mean over the kept rows of it less the target's logit. 0: no such.
  int vocabSlices = 0;
  // Memory for the kernel's temporaries, from the rank's arena (Module::workspaceBytes
  // says how much each op takes; the memory plan places it): floats, or null for a call
  // of no plan (tests), whose kernel takes its own scratch instead.
  float* workspace = nullptr;
  int64_t workspaceFloats = 0;
  // amp: the first stagingFloats of the workspace are for the f32 copies of the call's
  // half-precision operands (both devices widen them; Module::ampStagingBytes), the
  // kernel's own workspace after them.
  int64_t stagingFloats = 0;
  // amp: views of dtype bf16 or f16 hold tensors stored in half precision; kernels compute
  // in f32 and round what they store. A matrix-multiplying layer reads its parameters
  // (in[firstParam, firstParam + paramCount), f32 masters) rounded to castParams, as a
  // half-precision GEMM reads its cast weights; F32: as they are.
  ir::DType castParams = ir::DType::F32;
  size_t firstParam = 0, paramCount = 0;
  // The weight of one sample in the step's loss (1 / the global batch), for a loss an op
  // adds on its own: moe_dispatch's backward adds aux_weight x this x d(aux)/d(gates) per
  // sample (its load-balancing loss).
  float sampleWeight = 0.f;
  // batch_norm under data parallelism: sums values[0, n) (this rank's per-channel sums) in
  // place over the ranks that share the micro-batch, so the statistics are the whole
  // micro-batch's, as on one device. Called on the launching thread; empty: one rank.
  std::function<void(double* values, int64_t n)> sumOverReaders;
  // The whole tensor's index of the call's element i.
  int64_t wholeIndex(int64_t i) const { return cutOf().whole(i); }
  CutPiece cutOf() const { return {cutPiece, cutPieces, cutIndex}; }
};

enum class OptimizerKind { Sgd, Adam, AdamW };

// The factor clip_grad_norm scales the gradients by, from their global squared norm:
// maxNorm / (norm + 1e-6) where that is below 1, else 1 (torch.nn.utils.clip_grad_norm_), in
// double. The same bits on the host and in a CUDA kernel (IEEE square root and division).
EPL_HOST_DEVICE inline float clipFactor(float squaredNorm, double maxNorm) {
  double coef = maxNorm / (::sqrt(static_cast<double>(squaredNorm)) + 1e-6);
  return coef < 1 ? static_cast<float>(coef) : 1.f;
}

// Under a loss scale (amp = fp16; lossScale > 0) the squared norm is the scaled gradients':
// whether they overflowed (an infinite or NaN sum, alike on every rank: the step is skipped),
// and what they are multiplied by: the clip factor of their unscaled norm
// (sqrt(squaredNorm) / lossScale) where maxNorm > 0, over the scale. Without one, the clip
// factor. The host's arithmetic, in double, as on a GPU.
EPL_HOST_DEVICE inline bool overflowed(float squaredNorm, double lossScale) {
  return lossScale > 0 && !(squaredNorm <= 3.40282347e+38f); // NaN or infinite
}
EPL_HOST_DEVICE inline float updateFactor(float squaredNorm, double maxNorm, double lossScale) {
  if (lossScale <= 0) return clipFactor(squaredNorm, maxNorm);
  double coef = maxNorm / (::sqrt(static_cast<double>(squaredNorm)) / lossScale + 1e-6);
  float clip = maxNorm > 0 && coef < 1 ? static_cast<float>(coef) : 1.f;
  return static_cast<float>(clip / lossScale);
}

// One optimizer update of one parameter, PyTorch's formulas (torch.optim.SGD / Adam /
// AdamW). The gradient is first multiplied by gradScale and, where squaredNorm is set, by
// updateFactor(*squaredNorm, maxNorm, lossScale): clipping and a loss scale's inverse read on
// the device, the squared norm (device memory) final in the order of the device's work, so
// the host need not wait for it; where overflowed(*squaredNorm, lossScale) the call leaves
// everything as it was (a skipped step). Sgd uses state1 as the momentum buffer (null data
// without momentum); Adam and AdamW use state1 = exp_avg, state2 = exp_avg_sq.
struct OptimizerCall {
  OptimizerKind kind = OptimizerKind::AdamW;
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weightDecay = 0.f, momentum = 0.f;
  int64_t step = 1; // 1-based, for bias correction and the first momentum step
  float gradScale = 1.f;
  const float* squaredNorm = nullptr;
  double maxNorm = 0;   // clip_grad_norm's, 0 for none
  double lossScale = 0; // amp = fp16's scale of the gradients, 0 for none
  TensorView param, grad, state1, state2;
};

using StreamId = int; // 0 is the compute stream
using EventId = int;

class Device {
public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  // The widest attention head whose T x T scores this device's kernel keeps in tiles, never
  // in memory (the cost model's ir::ClusterDevice::tilesUpTo, for a run's comparison with
  // its prediction); 0: none, kEveryWidth: all, as the CPU's kernel.
  static constexpr int64_t kEveryWidth = std::numeric_limits<int64_t>::max();
  virtual int64_t attentionTilesUpTo() const { return kEveryWidth; }
  // Whether the host reads and writes device memory directly (the CPU device's memory is
  // the host's).
  virtual bool hostAddressable() const = 0;

  // Device memory, 64-byte aligned; throws std::bad_alloc when there is not enough.
  // release(nullptr) does nothing. release and releaseHost never throw: they run in
  // destructors, also while an error from the device unwinds.
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* p) = 0;
  // Host memory the device copies from and to without the host waiting: page-locked on a
  // GPU, where a copy from or to pageable memory may wait for the work queued before it.
  // The executor's buffers that cross every step (the batch, each micro-batch's loss and
  // its seed) and the offloaded states' host buffers. 64-byte aligned; throws
  // std::bad_alloc. By default ordinary host memory.
  virtual void* allocateHost(int64_t bytes) {
    size_t rounded = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    return p;
  }
  virtual void releaseHost(void* p) { std::free(p); }
  virtual void copyToDevice(void* dst, const void* src, int64_t bytes, StreamId s = 0) = 0;
  virtual void copyToHost(void* dst, const void* src, int64_t bytes, StreamId s = 0) = 0;
  virtual void copyOnDevice(void* dst, const void* src, int64_t bytes, StreamId s = 0) = 0;
  virtual void fillZero(void* dst, int64_t bytes, StreamId s = 0) = 0;
  // `rows` runs of rowBytes, from every srcPitch bytes of src to every dstPitch bytes of dst
  // (both device memory): a piece of each row of a tensor cut along a dim, or the pieces
  // joined back. By default one copyOnDevice a row.
  virtual void copyRows(void* dst, int64_t dstPitch, const void* src, int64_t srcPitch,
                        int64_t rowBytes, int64_t rows, StreamId s = 0) {
    for (int64_t r = 0; r < rows; ++r)
      copyOnDevice(static_cast<char*>(dst) + r * dstPitch,
                   static_cast<const char*>(src) + r * srcPitch, rowBytes, s);
  }

  // Kernels.
  virtual void launch(const KernelCall& call, StreamId s = 0) = 0;
  virtual void optimizerStep(const OptimizerCall& call, StreamId s = 0) = 0;
  // *result (one f32 in device memory) = sum of x^2, or += when accumulate.
  virtual void sumSquares(const TensorView& x, float* result, bool accumulate, StreamId s = 0) = 0;
  virtual void scale(const TensorView& x, float factor, StreamId s = 0) = 0;

  // Ordering between streams, and with the host.
  virtual EventId record(StreamId s) = 0;
  virtual void wait(StreamId s, EventId e) = 0;
  virtual void synchronize() = 0;
  // The native handle of stream s (a cudaStream_t), for a communicator on this device to
  // order its work after the stream's (Comm.h); null for a device that runs each call to
  // its end before returning.
  virtual void* streamHandle(StreamId) const { return nullptr; }

  // The most device memory the run's buffers held at once since the device was made: what
  // allocate() handed out at its peak, plus what the device's kernels and communicators
  // took for scratch at theirs. Nothing for a device whose memory is the host's: the
  // process's resident set measures that.
  virtual std::optional<int64_t> peakBytes() const { return std::nullopt; }
};

// Bytes of Device::allocateHost, zeroed, released with the buffer (the device must outlive
// it).
class HostBuffer {
public:
  HostBuffer() = default;
  HostBuffer(Device& dev, int64_t bytes)
      : dev_(&dev), p_(bytes > 0 ? dev.allocateHost(bytes) : nullptr),
        bytes_(std::max<int64_t>(bytes, 0)) {
    if (p_) std::memset(p_, 0, static_cast<size_t>(bytes_));
  }
  ~HostBuffer() {
    if (p_) dev_->releaseHost(p_);
  }
  HostBuffer(HostBuffer&& other) noexcept { swap(other); }
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    HostBuffer gone(std::move(*this));
    swap(other);
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  template <class T = unsigned char> T* data() const { return static_cast<T*>(p_); }
  int64_t bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }

private:
  void swap(HostBuffer& other) noexcept {
    std::swap(dev_, other.dev_);
    std::swap(p_, other.p_);
    std::swap(bytes_, other.bytes_);
  }
  Device* dev_ = nullptr;
  void* p_ = nullptr;
  int64_t bytes_ = 0;
};

// The CPU device: OpenBLAS for GEMMs, `threads` worker threads for the rest (0: all cores).
std::unique_ptr<Device> makeCpuDevice(int threads = 0);
// The CPU device on memory the host may touch only inside the device's calls, as a GPU's
// (hostAddressable() is false; any other access is a segmentation fault): the GPU paths of
// the executor and the communicators, checked without a GPU. `--device cpu` opens it when
// the environment sets EPL_GUARD_DEVICE (a testing hook, as EPL_STAGED_COMM).
std::unique_ptr<Device> makeGuardedCpuDevice(int threads = 0);

// A device that cannot be made here: a build without CUDA, no GPU, a GPU the runtime
// refuses. The message is for the user and says what to do instead.
class DeviceUnavailable : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct DeviceOptions {
  int threads = 0; // cpu: worker threads (0: all cores)
  int ordinal = 0; // cuda: which GPU of this machine (the rank's local rank)
  // cuda: fp32 matrix products exact, or on tensor cores in tf32 (policy `matmul`);
  // the CPU multiplies in fp32 whatever it says.
  ir::Matmul matmul = ir::Matmul::Fp32;
};

// The registry (Devices.cpp): "cpu" or "cuda". Throws DeviceUnavailable.
std::unique_ptr<Device> makeDevice(const std::string& name, const DeviceOptions& options);
// Whether this build has the CUDA device and this machine a GPU it can use.
bool cudaAvailable();
// Whether the device `--device request` (auto, cpu or cuda) takes uses the host's memory:
// the CPU device's does; a GPU's, and the guarded CPU device's (EPL_GUARD_DEVICE), do not.
// `auto` is taken for the GPU wherever there is one.
bool deviceMemoryIsHost(const std::string& request);
// The communicator for collectives on `device`'s memory between the ranks of `world`
// (every rank calls it, with its device made): null where `world` serves (the host
// addresses the device's memory, or one rank); on GPUs, NCCL, else `world` staged through
// host memory. `note` says which. It must be destroyed before `world` and `device`.
std::unique_ptr<Comm> makeDeviceComm(Comm& world, Device& device, std::string* note);
// Whether the named device has a kernel for `kind` (every device has every kernel of the
// CPU device once the GPU path is complete; until then the driver picks the CPU for a plan
// the GPU cannot run).
bool deviceSupports(const std::string& name, ir::OpKind kind);

} // namespace epl::backend
