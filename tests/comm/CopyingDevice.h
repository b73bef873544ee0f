// A device whose memory is the host's and whose copies are counted: what the host-staged
// communicator (backend/comm/StagedComm.h) needs of a device, for its tests without a GPU.
#pragma once
#include "backend/Device.h"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

namespace epl::commtest {

// Memory the host can read, as a device's would be after its copies; only copies and
// synchronisation are used by a communicator, so kernels are refused.
class CopyingDevice final : public backend::Device {
public:
  std::string name() const override { return "copying"; }
  bool hostAddressable() const override { return false; }
  void* allocate(int64_t bytes) override { return ::operator new(static_cast<size_t>(bytes)); }
  void release(void* p) override { ::operator delete(p); }
  void copyToDevice(void* dst, const void* src, int64_t bytes, backend::StreamId) override {
    toDevice += bytes;
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void copyToHost(void* dst, const void* src, int64_t bytes, backend::StreamId) override {
    toHost += bytes;
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void copyOnDevice(void*, const void*, int64_t, backend::StreamId) override { refuse(); }
  void fillZero(void*, int64_t, backend::StreamId) override { refuse(); }
  void launch(const backend::KernelCall&, backend::StreamId) override { refuse(); }
  void optimizerStep(const backend::OptimizerCall&, backend::StreamId) override { refuse(); }
  void sumSquares(const backend::TensorView&, float*, bool, backend::StreamId) override {
    refuse();
  }
  void scale(const backend::TensorView&, float, backend::StreamId) override { refuse(); }
  backend::EventId record(backend::StreamId) override { return 0; }
  void wait(backend::StreamId, backend::EventId) override {}
  void synchronize() override { ++synchronized; }

  std::atomic<int64_t> toDevice{0}, toHost{0}, synchronized{0};

private:
  [[noreturn]] static void refuse() { throw std::logic_error("a communicator ran a kernel"); }
};

} // namespace epl::commtest
