// The guarded CPU device (Device.h, makeGuardedCpuDevice): the CPU device's kernels on
// memory the host may touch only inside the device's own calls, as a GPU's. Its buffers are
// mapped with no access and opened for the length of each call (a kernel, a copy, an
// optimizer step); a read or write of them from anywhere else is a segmentation fault, and
// the handler below says what it most likely was, and where. And every address a kernel or a
// copy within the device takes must lie in one of its buffers: host memory handed to one
// (which a GPU's could not read) stops the process, naming the call. With it the
// executor's GPU paths (copies instead of host pointers, communicators staged through host
// memory) run and are checked on a machine without a GPU.
#include "backend/Device.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <execinfo.h>
#include <map>
#include <new>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace epl::backend {

namespace {

// A fault on the guarded memory: a line for the test's log, then the default action (the
// core dump and the exit status of a segmentation fault). On a stack of its own: the fault
// may come from a thread whose stack pointer oneDNN's kernels moved (KernelUtil.cpp).
void onFault(int sig) {
  static const char message[] =
      "\nEPL_GUARD_DEVICE: a segmentation fault, most likely the host reading or writing the "
      "guarded device's memory outside the device's calls (a GPU's memory would not be "
      "there)\n";
  ssize_t ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
  (void)ignored;
  void* frames[48]; // where: the faulting code's callers
  backtrace_symbols_fd(frames, backtrace(frames, 48), STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// The handler is set again by each guarded device: something else may have replaced it since
// an earlier one (a test harness restores its own after each test).
void installFaultMessage() {
  static bool ready = false;
  if (!ready) {
    ready = true;
    void* frame = nullptr;
    backtrace(&frame, 1); // loads what backtrace needs now, not inside the handler
    static char stack[64 * 1024];
    stack_t ss{};
    ss.ss_sp = stack;
    ss.ss_size = sizeof stack;
    sigaltstack(&ss, nullptr);
  }
  struct sigaction sa {};
  sa.sa_handler = onFault;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, nullptr);
}

class GuardedDevice final : public Device {
public:
  explicit GuardedDevice(int threads) : inner_(makeCpuDevice(threads)) { installFaultMessage(); }
  ~GuardedDevice() override {
    for (const auto& [p, bytes] : regions_)
      munmap(p, bytes);
  }

  std::string name() const override {
    return inner_->name() + " (guarded: its memory is the host's only inside its calls)";
  }
  bool hostAddressable() const override { return false; }

  void* allocate(int64_t bytes) override {
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + page - 1) / page * page;
    void* p = mmap(nullptr, size, open_ > 0 ? PROT_READ | PROT_WRITE : PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    regions_[p] = size;
    return p;
  }
  void release(void* p) override {
    auto it = regions_.find(p);
    if (it == regions_.end()) return;
    munmap(it->first, it->second);
    regions_.erase(it);
  }
  // Host <-> device copies take any address, as the CUDA device's (cudaMemcpyDefault): the
  // communicators stage host and device buffers alike through them.
  void copyToDevice(void* dst, const void* src, int64_t bytes, StreamId s) override {
    Open o(*this);
    inner_->copyToDevice(dst, src, bytes, s);
  }
  void copyToHost(void* dst, const void* src, int64_t bytes, StreamId s) override {
    Open o(*this);
    inner_->copyToHost(dst, src, bytes, s);
  }
  void copyOnDevice(void* dst, const void* src, int64_t bytes, StreamId s) override {
    mine(dst, bytes, "copyOnDevice's destination");
    mine(src, bytes, "copyOnDevice's source");
    Open o(*this);
    inner_->copyOnDevice(dst, src, bytes, s);
  }
  void fillZero(void* dst, int64_t bytes, StreamId s) override {
    mine(dst, bytes, "fillZero's destination");
    Open o(*this);
    inner_->fillZero(dst, bytes, s);
  }
  void copyRows(void* dst, int64_t dstPitch, const void* src, int64_t srcPitch, int64_t rowBytes,
                int64_t rows, StreamId s) override {
    if (rows > 0) {
      mine(dst, (rows - 1) * dstPitch + rowBytes, "copyRows's destination");
      mine(src, (rows - 1) * srcPitch + rowBytes, "copyRows's source");
    }
    Open o(*this);
    inner_->copyRows(dst, dstPitch, src, srcPitch, rowBytes, rows, s);
  }
  void launch(const KernelCall& call, StreamId s) override {
    auto what = [&](const std::string& part) {
      return std::string(ir::opInfo(call.kind).name) + (call.backward ? "'s backward " : " ") +
             part;
    };
    for (const auto* views : {&call.in, &call.out})
      for (size_t i = 0; i < views->size(); ++i) {
        const TensorView& v = (*views)[i];
        if (!inside(v.data, v.bytes()))
          refuse(what((views == &call.in ? "input " : "output ") + std::to_string(i)), v.data,
                 v.bytes());
      }
    if (!inside(call.workspace, 4 * call.workspaceFloats))
      refuse(what("workspace"), call.workspace, 4 * call.workspaceFloats);
    Open o(*this);
    inner_->launch(call, s);
  }
  void optimizerStep(const OptimizerCall& call, StreamId s) override {
    for (const TensorView* v : {&call.param, &call.grad, &call.state1, &call.state2})
      mine(v->data, v->bytes(), "an optimizer step's tensor");
    if (call.squaredNorm) mine(call.squaredNorm, 4, "an optimizer step's squared norm");
    Open o(*this);
    inner_->optimizerStep(call, s);
  }
  void sumSquares(const TensorView& x, float* result, bool accumulate, StreamId s) override {
    mine(x.data, x.bytes(), "sumSquares's input");
    mine(result, 4, "sumSquares's result");
    Open o(*this);
    inner_->sumSquares(x, result, accumulate, s);
  }
  void scale(const TensorView& x, float factor, StreamId s) override {
    mine(x.data, x.bytes(), "scale's tensor");
    Open o(*this);
    inner_->scale(x, factor, s);
  }
  EventId record(StreamId s) override { return inner_->record(s); }
  void wait(StreamId s, EventId e) override { inner_->wait(s, e); }
  void synchronize() override { inner_->synchronize(); }

private:
  // Every buffer readable and writable for the length of one call (calls do not nest, but
  // a count keeps that safe).
  struct Open {
    explicit Open(GuardedDevice& d) : d(d) {
      if (d.open_++ == 0) d.protect(PROT_READ | PROT_WRITE);
    }
    ~Open() {
      if (--d.open_ == 0) d.protect(PROT_NONE);
    }
    GuardedDevice& d;
  };
  void protect(int access) {
    for (const auto& [p, bytes] : regions_)
      if (mprotect(p, bytes, access) != 0) {
        static const char message[] = "EPL_GUARD_DEVICE: mprotect failed\n";
        ssize_t ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
        (void)ignored;
        std::abort();
      }
  }

  // `bytes` at p (null: a view the call does not touch) inside one of the device's buffers,
  // else the process stops: a GPU's kernel or copy could not reach host memory.
  void mine(const void* p, int64_t bytes, const char* what) const {
    if (!inside(p, bytes)) refuse(what, p, bytes);
  }
  bool inside(const void* p, int64_t bytes) const {
    if (!p || bytes <= 0) return true;
    auto it = regions_.upper_bound(const_cast<void*>(p));
    if (it == regions_.begin()) return false;
    --it;
    auto at = static_cast<const char*>(p), first = static_cast<const char*>(it->first);
    return at >= first && at + bytes <= first + it->second;
  }
  [[noreturn]] static void refuse(const std::string& what, const void* p, int64_t bytes) {
    std::fprintf(stderr,
                 "\nEPL_GUARD_DEVICE: %s (%lld bytes at %p) is not in the device's memory: a "
                 "GPU could not reach it\n",
                 what.c_str(), static_cast<long long>(bytes), p);
    void* frames[48];
    backtrace_symbols_fd(frames, backtrace(frames, 48), STDERR_FILENO);
    std::abort();
  }

  std::unique_ptr<Device> inner_;
  std::map<void*, size_t> regions_; // mapped buffers, their sizes in whole pages
  int open_ = 0;
};

} // namespace

std::unique_ptr<Device> makeGuardedCpuDevice(int threads) {
  return std::make_unique<GuardedDevice>(threads);
}

} // namespace epl::backend
