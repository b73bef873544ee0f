// The CUDA device: cudaMalloc'd memory, a compute stream and a communication stream with
// events between them, copies queued on a stream, and a dispatch of each kernel call to
// its family (Kernels.h). Calls only queue work; synchronize() waits for it and reports a
// failed kernel.
#include "backend/cuda/CudaDevice.h"
#include "backend/HalfStaging.h"
#include "backend/cuda/Cublas.h"
#include "backend/cuda/Kernels.h"

#include <algorithm>
#include <fmt/format.h>
#include <new>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace epl::backend::cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(
        fmt::format("CUDA error in {}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e)));
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("cuBLAS error in {}: {}", what, cublas().statusString(s)));
}

void checkLaunch(const char* what) {
  check(cudaGetLastError(), what);
}

void* Scratch::get(int64_t bytes) {
  if (bytes <= size_) return p_;
  if (p_) {
    check(cudaStreamSynchronize(stream), "growing kernel scratch memory");
    check(cudaFree(p_), "growing kernel scratch memory");
    p_ = nullptr;
  }
  int64_t grown = std::max<int64_t>(bytes, 2 * size_);
  if (cudaMalloc(&p_, static_cast<size_t>(grown)) != cudaSuccess) {
    (void)cudaGetLastError();
    size_ = 0;
    throw std::bad_alloc();
  }
  size_ = grown;
  return p_;
}

Scratch::~Scratch() {
  if (p_) cudaFree(p_);
}

namespace {

using ir::OpKind;

// The families that have a CUDA kernel; dispatch() and hasKernel() agree on this table.
using Family = void (*)(const KernelCall&, const Ctx&);
Family familyOf(OpKind kind) {
  switch (kind) {
  case OpKind::Linear:
    return linear;
  case OpKind::Embedding:
    return embedding;
  case OpKind::Positions:
    return positions;
  case OpKind::LayerNorm:
    return layerNorm;
  case OpKind::RmsNorm:
    return rmsNorm;
  case OpKind::BatchNorm:
    return batchNorm;
  case OpKind::Attention:
    return attention;
  case OpKind::Mlp:
    return mlp;
  case OpKind::MoeRouter:
  case OpKind::MoeDispatch:
  case OpKind::MoeExperts:
  case OpKind::MoeCombine:
    return moe;
  case OpKind::Conv2d:
    return conv2d;
  case OpKind::Gelu:
    return gelu;
  case OpKind::Relu:
    return relu;
  case OpKind::Silu:
    return silu;
  case OpKind::Tanh:
    return cuda::tanh;
  case OpKind::Sigmoid:
    return sigmoid;
  case OpKind::Softmax:
    return softmax;
  case OpKind::Dropout:
    return dropout;
  case OpKind::MaxPool:
    return maxPool;
  case OpKind::AvgPool:
    return avgPool;
  case OpKind::Add:
    return add;
  case OpKind::Sub:
    return sub;
  case OpKind::Mul:
    return mul;
  case OpKind::Scale:
    return cuda::scale;
  case OpKind::Flatten:
  case OpKind::Reshape:
    return reshape;
  case OpKind::Transpose:
    return transpose;
  case OpKind::Mean:
    return mean;
  case OpKind::Select:
  case OpKind::Narrow:
    return keepRun;
  case OpKind::CrossEntropy:
    return crossEntropy;
  case OpKind::Mse:
    return mse;
  default: // `next`, communication and bookkeeping ops run in the interpreter
    return nullptr;
  }
}

// policy `matmul`: exact fp32 (no tensor cores), or tensor cores with TF32 operands. (cuBLAS
// has CUBLAS_COMPUTE_32F_FAST_16BF too, but on an H200 with cuBLAS 13.1 it gave the same
// kernels and bits as TF32 for every product of GPT-2: not offered until it differs.)
cublasComputeType_t computeType(ir::Matmul m) {
  return m == ir::Matmul::Tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC;
}

std::string versionText(int v) { // CUDA's 1000 * major + 10 * minor
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

class CudaDevice final : public Device {
public:
  CudaDevice(int ordinal, ir::Matmul matmul) : ordinal_(ordinal) {
    const CublasApi& blasApi = cublas(); // first: nothing to release if it is missing
    check(cudaSetDevice(ordinal_), "selecting the GPU");
    for (cudaStream_t& s : streams_)
      check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating a stream");
    check(blasApi.create(&blas_), "creating the cuBLAS handle");
    check(blasApi.setStream(blas_, streams_[0]), "binding cuBLAS to the compute stream");
    check(blasApi.setMathMode(blas_, CUBLAS_PEDANTIC_MATH), "setting cuBLAS to fp32 math");
    scratch_.stream = streams_[0];
    staging_.stream = streams_[0];
    ctx_ = Ctx{streams_[0], blas_, computeType(matmul), &scratch_};

    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, ordinal_), "reading the GPU's properties");
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    int blas = 0;
    blasApi.getVersion(blas_, &blas);
    name_ = fmt::format("cuda:{} ({}, {:.0f} GiB; driver {}, runtime {}, cuBLAS {}.{}.{}{})",
                        ordinal_, prop.name, static_cast<double>(prop.totalGlobalMem) / (1u << 30),
                        versionText(driver), versionText(runtime), blas / 10000, (blas / 100) % 100,
                        blas % 100, matmul == ir::Matmul::Tf32 ? "; tf32 matrix products" : "");
  }

  ~CudaDevice() override {
    cudaDeviceSynchronize();
    for (cudaEvent_t e : events_)
      cudaEventDestroy(e);
    if (blas_) cublas().destroy(blas_);
    for (cudaStream_t s : streams_)
      cudaStreamDestroy(s);
  }

  std::string name() const override { return name_; }
  int64_t attentionTilesUpTo() const override { return flashAttentionWidest(); }
  bool hostAddressable() const override { return false; }

  void* allocate(int64_t bytes) override {
    void* p = nullptr;
    size_t rounded = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + 255) / 256 * 256;
    cudaError_t e = cudaMalloc(&p, rounded);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw std::bad_alloc(); // the GPU's limit: the caller reports the plan against it
    }
    check(e, "allocating device memory");
    sizes_[p] = static_cast<int64_t>(rounded);
    held_ += static_cast<int64_t>(rounded);
    peakHeld_ = std::max(peakHeld_, held_);
    return p;
  }
  // Neither release throws (Device.h): after a kernel's fault every CUDA call returns
  // that error again, and they run in destructors while it unwinds.
  void release(void* p) override {
    if (!p) return;
    if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    held_ -= it->second;
    sizes_.erase(it);
  }
  // Page-locked, so that copies to and from it are queued like the rest (from pageable
  // memory CUDA may first wait for the stream); pageable where the driver refuses to lock
  // more, which is slower but still right.
  void* allocateHost(int64_t bytes) override {
    void* p = nullptr;
    if (cudaMallocHost(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1))) == cudaSuccess) {
      pinned_.insert(p);
      return p;
    }
    (void)cudaGetLastError();
    return Device::allocateHost(bytes);
  }
  void releaseHost(void* p) override {
    if (pinned_.erase(p) == 0) return Device::releaseHost(p);
    if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
  }
  // The direction from the addresses (unified addressing), so host memory on both sides
  // works too: the host-staged communicator copies host buffers the same way.
  void copyToDevice(void* dst, const void* src, int64_t bytes, StreamId s) override {
    copy(dst, src, bytes, cudaMemcpyDefault, s);
  }
  void copyToHost(void* dst, const void* src, int64_t bytes, StreamId s) override {
    copy(dst, src, bytes, cudaMemcpyDefault, s);
  }
  void copyOnDevice(void* dst, const void* src, int64_t bytes, StreamId s) override {
    copy(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  }
  void copyRows(void* dst, int64_t dstPitch, const void* src, int64_t srcPitch, int64_t rowBytes,
                int64_t rows, StreamId s) override {
    if (rowBytes <= 0 || rows <= 0) return;
    check(cudaMemcpy2DAsync(dst, static_cast<size_t>(dstPitch), src, static_cast<size_t>(srcPitch),
                            static_cast<size_t>(rowBytes), static_cast<size_t>(rows),
                            cudaMemcpyDeviceToDevice, stream(s)),
          "a copy of rows");
  }
  void fillZero(void* dst, int64_t bytes, StreamId s) override {
    if (bytes > 0)
      check(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), stream(s)), "fillZero");
  }

  void launch(const KernelCall& call, StreamId s) override {
    Family f = familyOf(call.kind);
    if (!f)
      throw std::runtime_error(
          fmt::format("op `{}` has no CUDA kernel", ir::opInfo(call.kind).name));
    expectArity(call);
    if (needsStaging(call)) return launchStaged(call, ctxFor(s), staging_, f);
    f(call, ctxFor(s));
  }
  void optimizerStep(const OptimizerCall& call, StreamId s) override {
    cuda::optimizerStep(call, ctxFor(s));
  }
  void sumSquares(const TensorView& x, float* result, bool accumulate, StreamId s) override {
    cuda::sumSquares(ctxFor(s), x, result, accumulate);
  }
  void scale(const TensorView& x, float factor, StreamId s) override {
    scaleInPlace(ctxFor(s), x, factor);
  }

  EventId record(StreamId s) override {
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an event");
    check(cudaEventRecord(e, stream(s)), "recording an event");
    events_.push_back(e);
    return static_cast<EventId>(events_.size() - 1);
  }
  void* streamHandle(StreamId s) const override { return stream(s); }
  void wait(StreamId s, EventId e) override {
    check(cudaStreamWaitEvent(stream(s), events_.at(static_cast<size_t>(e)), 0),
          "waiting on an event");
  }
  // The buffers' peak, and each kind of scratch at its own: kernel scratch and amp's
  // staging only grow; the stream-ordered pool (the communicators' scratch) reports its
  // high-water mark. An upper bound where those peaks fell at different times. cuBLAS's own
  // workspace is not counted.
  std::optional<int64_t> peakBytes() const override {
    int64_t pool = 0;
    cudaMemPool_t p = nullptr;
    uint64_t high = 0; // the attribute is a 64-bit unsigned count
    if (cudaDeviceGetDefaultMemPool(&p, ordinal_) == cudaSuccess &&
        cudaMemPoolGetAttribute(p, cudaMemPoolAttrUsedMemHigh, &high) == cudaSuccess)
      pool = static_cast<int64_t>(high);
    (void)cudaGetLastError(); // a device without pools has none to count
    return peakHeld_ + scratch_.size() + staging_.size() + pool;
  }

  void synchronize() override {
    for (cudaStream_t s : streams_)
      check(cudaStreamSynchronize(s), "a kernel or copy on the GPU");
    // Events are one-shot between synchronisations: recycle them.
    for (cudaEvent_t e : events_)
      cudaEventDestroy(e);
    events_.clear();
  }

private:
  static constexpr int kStreams = 2; // 0: compute, 1: communication

  cudaStream_t stream(StreamId s) const {
    if (s < 0 || s >= kStreams) throw std::runtime_error(fmt::format("no stream {}", s));
    return streams_[s];
  }
  const Ctx& ctxFor(StreamId s) {
    if (s != 0) throw std::runtime_error("kernels run on the compute stream (0)");
    return ctx_;
  }
  void copy(void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind, StreamId s) {
    if (bytes <= 0 || dst == src) return;
    check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, stream(s)), "a copy");
  }

  int ordinal_;
  std::string name_;
  cudaStream_t streams_[kStreams] = {};
  cublasHandle_t blas_ = nullptr;
  Scratch scratch_;
  Scratch staging_; // amp's f32 copies for calls without a planned workspace
  Ctx ctx_;
  std::vector<cudaEvent_t> events_;
  std::unordered_map<void*, int64_t> sizes_; // allocate()'s buffers and their rounded sizes
  std::unordered_set<void*> pinned_;         // allocateHost()'s page-locked buffers
  int64_t held_ = 0, peakHeld_ = 0;
};

} // namespace

int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError(); // no driver or no GPU: not an error here
    return 0;
  }
  return n;
}

std::unique_ptr<Device> makeCudaDevice(int ordinal, ir::Matmul matmul) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    throw DeviceUnavailable(
        e == cudaSuccess
            ? std::string("--device cuda: this machine has no GPU; use --device cpu")
            : fmt::format("--device cuda: no GPU can be used here: {} (no NVIDIA driver, or "
                          "one older than this build's CUDA {}); use --device cpu",
                          cudaGetErrorString(e), versionText(CUDART_VERSION)));
  }
  return std::make_unique<CudaDevice>(ordinal % n, matmul);
}

bool hasKernel(ir::OpKind kind) {
  return familyOf(kind) != nullptr;
}

} // namespace epl::backend::cuda
