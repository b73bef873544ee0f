// The CPU device: host memory, synchronous copies, and a dispatch of each kernel call to
// its family (Kernels.h). Every call has finished when it returns, so streams and events
// are trivial.
#include "backend/HalfStaging.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"
#include "support/Assert.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace epl::backend {

namespace {

using ir::OpKind;

void dispatch(const KernelCall& c) {
  using namespace cpu;
  expectArity(c);
  switch (c.kind) {
  case OpKind::Linear:
    return linear(c);
  case OpKind::Embedding:
    return embedding(c);
  case OpKind::Positions:
    return positions(c);
  case OpKind::LayerNorm:
    return layerNorm(c);
  case OpKind::RmsNorm:
    return rmsNorm(c);
  case OpKind::BatchNorm:
    return batchNorm(c);
  case OpKind::Attention:
    return attention(c);
  case OpKind::Mlp:
    return mlp(c);
  case OpKind::MoeRouter:
  case OpKind::MoeDispatch:
  case OpKind::MoeExperts:
  case OpKind::MoeCombine:
    return moe(c);
  case OpKind::Conv2d:
    return conv2d(c);
  case OpKind::Gelu:
    return gelu(c);
  case OpKind::Relu:
    return relu(c);
  case OpKind::Silu:
    return silu(c);
  case OpKind::Tanh:
    return cpu::tanh(c);
  case OpKind::Sigmoid:
    return sigmoid(c);
  case OpKind::Softmax:
    return softmax(c);
  case OpKind::Dropout:
    return dropout(c);
  case OpKind::MaxPool:
    return maxPool(c);
  case OpKind::AvgPool:
    return avgPool(c);
  case OpKind::Add:
    return add(c);
  case OpKind::Sub:
    return sub(c);
  case OpKind::Mul:
    return mul(c);
  case OpKind::Scale:
    return cpu::scale(c);
  case OpKind::Flatten:
  case OpKind::Reshape:
    return reshape(c);
  case OpKind::Transpose:
    return transpose(c);
  case OpKind::Mean:
    return mean(c);
  case OpKind::Select:
  case OpKind::Narrow:
    return keepRun(c);
  case OpKind::CrossEntropy:
    return crossEntropy(c);
  case OpKind::Mse:
    return mse(c);
  case OpKind::Next:
    EPL_ASSERT(false, "`next` is not a kernel: the interpreter computes it");
    return;
  default: // communication and bookkeeping ops run on a Comm or in the interpreter
    EPL_ASSERT(false, "op kind is not a device kernel");
    return;
  }
}

class CpuDevice final : public Device {
public:
  explicit CpuDevice(int threads) {
    cpu::initThreads(threads);
    threads_ = cpu::threadCount();
  }

  std::string name() const override {
    return "cpu (" + std::to_string(threads_) + (threads_ == 1 ? " thread)" : " threads)");
  }
  bool hostAddressable() const override { return true; }

  void* allocate(int64_t bytes) override {
    EPL_ASSERT(bytes >= 0, "negative allocation");
    size_t rounded = (static_cast<size_t>(bytes) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) throw std::bad_alloc(); // the machine's limit, not a bug: the caller reports it
    return p;
  }
  void release(void* p) override { std::free(p); }
  void copyToDevice(void* dst, const void* src, int64_t bytes, StreamId) override {
    copy(dst, src, bytes);
  }
  void copyToHost(void* dst, const void* src, int64_t bytes, StreamId) override {
    copy(dst, src, bytes);
  }
  void copyOnDevice(void* dst, const void* src, int64_t bytes, StreamId) override {
    copy(dst, src, bytes);
  }
  void fillZero(void* dst, int64_t bytes, StreamId) override { cpu::zeroBytes(dst, bytes); }
  void copyRows(void* dst, int64_t dstPitch, const void* src, int64_t srcPitch, int64_t rowBytes,
                int64_t rows, StreamId) override {
    if (rows == 1 || (dstPitch == rowBytes && srcPitch == rowBytes))
      return copy(dst, src, rows * rowBytes);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dstPitch,
                  static_cast<const char*>(src) + r * srcPitch, static_cast<size_t>(rowBytes));
  }

  void launch(const KernelCall& call, StreamId) override {
    if (needsStaging(call)) return cpu::launchStaged(call, dispatch);
    dispatch(call);
  }
  void optimizerStep(const OptimizerCall& call, StreamId) override { cpu::optimizerStep(call); }
  void sumSquares(const TensorView& x, float* result, bool accumulate, StreamId) override {
    cpu::sumSquares(x, result, accumulate);
  }
  void scale(const TensorView& x, float factor, StreamId) override { cpu::scaleInPlace(x, factor); }

  EventId record(StreamId) override { return nextEvent_++; }
  void wait(StreamId, EventId) override {}
  void synchronize() override {}

private:
  static void copy(void* dst, const void* src, int64_t bytes) { cpu::copyBytes(dst, src, bytes); }

  int threads_ = 1;
  EventId nextEvent_ = 0;
};

} // namespace

std::unique_ptr<Device> makeCpuDevice(int threads) {
  return std::make_unique<CpuDevice>(threads);
}

} // namespace epl::backend
