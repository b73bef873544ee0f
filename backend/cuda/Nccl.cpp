// The NCCL communicator (Nccl.h).
#include "backend/cuda/Nccl.h"

#include "backend/Device.h"
#include "backend/comm/Pending.h"
#include "backend/comm/StagedComm.h"
#include "backend/cuda/Kernels.h"
#include "backend/cuda/Library.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <thread>
#include <vector>

namespace epl::backend::cuda {

std::string openNccl(const std::string& library, NcclApi& api) {
  std::string error;
  void* lib = openLibrary(library, error);
  if (!lib) return error;
  resolve(lib, "ncclGetVersion", api.getVersion, error);
  resolve(lib, "ncclGetUniqueId", api.getUniqueId, error);
  resolve(lib, "ncclCommInitRank", api.commInitRank, error);
  resolve(lib, "ncclCommDestroy", api.commDestroy, error);
  resolve(lib, "ncclCommAbort", api.commAbort, error);
  resolve(lib, "ncclCommGetAsyncError", api.commGetAsyncError, error);
  resolve(lib, "ncclGetErrorString", api.errorString, error);
  resolve(lib, "ncclAllReduce", api.allReduce, error);
  resolve(lib, "ncclReduceScatter", api.reduceScatter, error);
  resolve(lib, "ncclReduce", api.reduce, error);
  resolve(lib, "ncclAllGather", api.allGather, error);
  resolve(lib, "ncclBroadcast", api.broadcast, error);
  resolve(lib, "ncclSend", api.send, error);
  resolve(lib, "ncclRecv", api.recv, error);
  resolve(lib, "ncclGroupStart", api.groupStart, error);
  resolve(lib, "ncclGroupEnd", api.groupEnd, error);
  return error.empty() ? error : fmt::format("{}: {}", library, error);
}

const NcclApi* nccl(std::string* why) {
  struct Loaded {
    NcclApi api;
    std::string error;
  };
  static const Loaded loaded = [] {
    Loaded l;
    l.error = openNccl("libnccl.so.2", l.api);
    // The directory this build found NCCL in, for a machine whose library path lacks it.
    if (!l.error.empty() && openNccl(EPL_NCCL_DIR "/libnccl.so.2", l.api).empty()) l.error.clear();
    return l;
  }();
  if (loaded.error.empty()) return &loaded.api;
  if (why) *why = loaded.error;
  return nullptr;
}

std::string ncclVersionText(const NcclApi& api) {
  int v = 0;
  api.getVersion(&v); // 10000 major + 100 minor + patch since 2.9
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

namespace {

// One started collective: the event recorded after it (and its conversions) on the
// communicator's stream, the device memory it took, and the host buffers it writes back.
struct NcclPending final : detail::Pending {
  NcclPending(const Comm* owner, std::string description)
      : Pending(owner, std::move(description)) {}
  cudaEvent_t done = nullptr;
  std::vector<void*> scratch; // cudaMallocAsync'd on the stream; freed after the wait
  struct Back {
    void* host;
    const void* device;
    int64_t bytes;
  };
  std::vector<Back> back; // device to host once done
};

bool onDevice(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError(); // an address CUDA does not know: host memory
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

ncclDataType_t ncclType(WireType w) {
  switch (w) {
  case WireType::F32:
    return ncclFloat32;
  case WireType::BF16:
    return ncclBfloat16;
  case WireType::F16:
    return ncclFloat16;
  }
  return ncclFloat32;
}

class NcclComm final : public Comm {
public:
  NcclComm(const NcclApi& api, Comm& bootstrap, Device& device, std::unique_ptr<Comm> owned)
      : api_(api), bootstrap_(bootstrap), device_(device), owned_(std::move(owned)),
        staged_(makeStagedComm(bootstrap, device)) {
    setTimeout(bootstrap.timeout());
    cudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream");
    // The collectives' scratch (host buffers' device copies, half-precision wires) comes from
    // the device's stream-ordered pool; kept there once freed rather than handed back to the
    // driver at every synchronisation, so a step's buckets do not map memory anew.
    int ordinal = 0;
    cudaMemPool_t pool = nullptr;
    uint64_t keep = UINT64_MAX;
    if (cudaGetDevice(&ordinal) == cudaSuccess &&
        cudaDeviceGetDefaultMemPool(&pool, ordinal) == cudaSuccess)
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    (void)cudaGetLastError(); // a device without pools keeps the default
    // Rank 0's id, or its failure to make one: every rank learns which.
    struct {
      ncclUniqueId id;
      ncclResult_t made;
    } root{};
    if (bootstrap.rank() == 0) root.made = api_.getUniqueId(&root.id);
    bootstrap.broadcast(&root, sizeof root, 0, "NCCL's unique id");
    ncclCheck(root.made, "making NCCL's unique id on rank 0");
    ncclCheck(api_.commInitRank(&comm_, bootstrap.size(), root.id, bootstrap.rank()),
              "starting NCCL");
  }

  ~NcclComm() override {
    if (comm_) {
      if (broken_) {
        api_.commAbort(comm_);
      } else {
        cudaStreamSynchronize(stream_);
        api_.commDestroy(comm_);
      }
    }
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  std::string name() const override { return "nccl " + ncclVersionText(api_); }

  Request iallReduce(float* data, int64_t count, WireType wire, float scale) override {
    detail::checkSize(*this, count, "count");
    detail::checkScale(*this, wire, scale);
    auto p = start(detail::describeReduction("all-reduce", count, wire));
    auto* d = static_cast<float*>(mapped(*p, data, 4 * count, true, true));
    if (size() > 1 && count > 0) {
      if (wire == WireType::F32) {
        ncclCheck(api_.allReduce(d, d, count, ncclFloat32, ncclSum, comm_, stream_), "all-reduce");
      } else {
        auto* h = static_cast<uint16_t*>(scratch(*p, 2 * count));
        wireEncode(stream_, wire == WireType::BF16, d, h, count, scale);
        ncclCheck(api_.allReduce(h, h, count, ncclType(wire), ncclSum, comm_, stream_),
                  "all-reduce");
        wireDecode(stream_, wire == WireType::BF16, h, d, count, scale);
      }
    }
    return finish(std::move(p));
  }

  Request ireduceScatterBlocks(const float* send, float* recv, const std::vector<int64_t>& counts,
                               WireType wire, float scale) override {
    int64_t total = detail::checkBlocks(*this, counts);
    detail::checkScale(*this, wire, scale);
    const int n = size(), me = rank();
    std::vector<int64_t> starts(counts.size(), 0);
    for (size_t q = 1; q < counts.size(); ++q)
      starts[q] = starts[q - 1] + counts[q - 1];
    const int64_t mine = counts[static_cast<size_t>(me)];
    auto p = start(detail::describeReduction("reduce-scatter", total, wire));
    auto [s, r] = mappedTwo(*p, send, 4 * total, recv, 4 * mine);
    const float* in = static_cast<const float*>(s);
    float* out = static_cast<float*>(r);
    if (n == 1) {
      copy(out, in, 4 * mine);
      return finish(std::move(p));
    }
    bool half = wire != WireType::F32, bf16 = wire == WireType::BF16;
    const void* from = in;
    void* to = out;
    int width = half ? 2 : 4;
    if (half) { // the whole send rounded, this rank's block summed in the wire type
      auto* h = static_cast<uint16_t*>(scratch(*p, 2 * total));
      wireEncode(stream_, bf16, in, h, total, scale);
      from = h;
      to = h + starts[static_cast<size_t>(me)];
    }
    auto at = [&](int64_t floats) { return static_cast<const char*>(from) + width * floats; };
    bool even =
        std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
    if (even && mine > 0) {
      ncclCheck(api_.reduceScatter(from, to, mine, ncclType(wire), ncclSum, comm_, stream_),
                "reduce-scatter");
    } else if (!even) { // blocks of their own sizes: one reduce to each block's rank
      ncclCheck(api_.groupStart(), "reduce-scatter");
      for (int q = 0; q < n; ++q) {
        int64_t c = counts[static_cast<size_t>(q)];
        if (c == 0) continue;
        void* dst = q == me ? to : const_cast<char*>(at(starts[static_cast<size_t>(q)]));
        ncclCheck(api_.reduce(at(starts[static_cast<size_t>(q)]), dst, c, ncclType(wire), ncclSum,
                              q, comm_, stream_),
                  "reduce-scatter");
      }
      ncclCheck(api_.groupEnd(), "reduce-scatter");
    }
    if (half) wireDecode(stream_, bf16, static_cast<const uint16_t*>(to), out, mine, scale);
    return finish(std::move(p));
  }

  Request iallGather(const void* send, void* recv, int64_t bytes) override {
    detail::checkSize(*this, bytes, "byte count");
    auto p = start(detail::describeBytes("all-gather", bytes));
    auto [r, s] = mappedTwoReversed(*p, recv, bytes * size(), send, bytes);
    if (size() == 1)
      copy(r, s, bytes);
    else if (bytes > 0)
      ncclCheck(api_.allGather(s, r, bytes, ncclUint8, comm_, stream_), "all-gather");
    return finish(std::move(p));
  }

  Request ibroadcast(void* data, int64_t bytes, int root) override {
    detail::checkSize(*this, bytes, "byte count");
    detail::checkPeer(*this, root, "broadcast from");
    auto p = start(detail::describeBytes("broadcast", bytes) + fmt::format(" from rank {}", root));
    void* d = mapped(*p, data, bytes, rank() == root, true);
    if (size() > 1 && bytes > 0)
      ncclCheck(api_.broadcast(d, d, bytes, ncclUint8, root, comm_, stream_), "broadcast");
    return finish(std::move(p));
  }

  Request iallToAll(const void* send, void* recv, int64_t bytes) override {
    detail::checkSize(*this, bytes, "byte count");
    const int n = size();
    auto a = reinterpret_cast<uintptr_t>(send), b = reinterpret_cast<uintptr_t>(recv);
    uintptr_t span = static_cast<uintptr_t>(bytes * n);
    if (n > 1 && bytes > 0 && a < b + span && b < a + span)
      detail::misuse(*this, "all-to-all needs separate send and recv buffers");
    auto p = start(detail::describeBytes("all-to-all", bytes * n));
    const void* s = mapped(*p, send, bytes * n, true, false);
    void* r = mapped(*p, recv, bytes * n, false, true);
    if (n == 1) {
      copy(r, s, bytes);
    } else if (bytes > 0) {
      ncclCheck(api_.groupStart(), "all-to-all");
      for (int q = 0; q < n; ++q) {
        ncclCheck(
            api_.send(static_cast<const char*>(s) + q * bytes, bytes, ncclUint8, q, comm_, stream_),
            "all-to-all");
        ncclCheck(api_.recv(static_cast<char*>(r) + q * bytes, bytes, ncclUint8, q, comm_, stream_),
                  "all-to-all");
      }
      ncclCheck(api_.groupEnd(), "all-to-all");
    }
    return finish(std::move(p));
  }

  Request isend(const void* data, int64_t bytes, int peer, int tag) override {
    staged_->setTimeout(timeout());
    return staged_->isend(data, bytes, peer, tag);
  }
  Request irecv(void* data, int64_t bytes, int peer, int tag) override {
    staged_->setTimeout(timeout());
    return staged_->irecv(data, bytes, peer, tag);
  }

  Request ibarrier() override {
    auto p = start("barrier");
    if (size() > 1) {
      auto* one = static_cast<float*>(scratch(*p, 4));
      cudaCheck(cudaMemsetAsync(one, 0, 4, stream_), "a barrier");
      ncclCheck(api_.allReduce(one, one, 1, ncclFloat32, ncclSum, comm_, stream_), "barrier");
    }
    return finish(std::move(p));
  }

  std::unique_ptr<Comm> split(int color, int key) override {
    bootstrap_.setTimeout(timeout());
    auto sub = bootstrap_.split(color, key);
    Comm& ref = *sub;
    auto c = std::make_unique<NcclComm>(api_, ref, device_, std::move(sub));
    c->setTimeout(timeout());
    return c;
  }

  void wait(Request& r, const std::string& what) override {
    if (r.empty()) return;
    if (r.get()->owner == staged_.get()) {
      staged_->setTimeout(timeout());
      return staged_->wait(r, what);
    }
    auto* p = dynamic_cast<NcclPending*>(r.get());
    if (!p || p->owner != this) {
      std::string description = r.get()->description;
      r.reset();
      detail::misuse(*this, fmt::format("`{}` waits on a {} started by another communicator", what,
                                        description));
    }
    if (broken_) { // an earlier wait timed out and aborted NCCL: this one cannot finish
      std::string description = p->description;
      r.reset();
      detail::misuse(*this, fmt::format("`{}` waits on a {} that the abort after an earlier "
                                        "timeout cancelled",
                                        what, description));
    }
    auto [timedOut, error] = poll(*p);
    if (timedOut) {
      // NCCL cannot withdraw a collective: the communicator is aborted, and stays unusable.
      broken_ = true;
      api_.commAbort(comm_);
      comm_ = nullptr;
      std::string message = fmt::format("rank {}: `{}` did not finish within {:g} s ({})", rank(),
                                        what, timeout(), p->description);
      r.reset();
      throw CommError(message);
    }
    if (error.empty())
      for (const NcclPending::Back& b : p->back)
        if (cudaMemcpy(b.host, b.device, static_cast<size_t>(b.bytes), cudaMemcpyDefault) !=
            cudaSuccess)
          error = cudaGetErrorString(cudaGetLastError());
    release(*p);
    std::string description = p->description;
    r.reset();
    if (!error.empty())
      throw CommError(
          fmt::format("rank {}: `{}` failed: {} ({})", rank(), what, error, description));
  }

  bool test(Request& r) override {
    if (r.empty()) return true;
    if (r.get()->owner == staged_.get()) return staged_->test(r);
    auto* p = dynamic_cast<NcclPending*>(r.get());
    return p && cudaEventQuery(p->done) != cudaErrorNotReady;
  }

  [[noreturn]] void abort(int code) override {
    if (comm_) api_.commAbort(comm_); // kernels waiting for other ranks stop
    comm_ = nullptr;
    bootstrap_.abort(code);
    std::abort(); // not reached: the bootstrap's abort ends the process
  }

private:
  std::shared_ptr<NcclPending> start(std::string description) {
    if (broken_)
      detail::misuse(*this, "the NCCL communicator was aborted after a timeout and cannot be used");
    // The device's buffers as its compute stream leaves them (Comm.h): the communicator's
    // stream waits for what was queued there so far, and the host does not.
    if (auto* compute = static_cast<cudaStream_t>(device_.streamHandle(0))) {
      if (!ready_)
        cudaCheck(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "creating an event");
      cudaCheck(cudaEventRecord(ready_, compute), "recording an event");
      cudaCheck(cudaStreamWaitEvent(stream_, ready_, 0), "waiting on the compute stream");
    }
    return std::make_shared<NcclPending>(this, std::move(description));
  }

  Request finish(std::shared_ptr<NcclPending> p) {
    cudaCheck(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming), "creating an event");
    cudaCheck(cudaEventRecord(p->done, stream_), "recording an event");
    return Request(std::move(p));
  }

  void* scratch(NcclPending& p, int64_t bytes) {
    void* d = nullptr;
    cudaCheck(cudaMallocAsync(&d, static_cast<size_t>(std::max<int64_t>(bytes, 1)), stream_),
              "allocating a collective's device memory");
    p.scratch.push_back(d);
    return d;
  }

  // `data` where NCCL can use it: itself on the device, else a device copy (filled from it
  // when `read`, written back to it by the wait when `write`).
  void* mapped(NcclPending& p, const void* data, int64_t bytes, bool read, bool write) {
    if (bytes <= 0 || !data || onDevice(data)) return const_cast<void*>(data);
    void* d = scratch(p, bytes);
    if (read)
      cudaCheck(cudaMemcpyAsync(d, data, static_cast<size_t>(bytes), cudaMemcpyDefault, stream_),
                "copying a host buffer to the device");
    if (write) p.back.push_back({const_cast<void*>(data), d, bytes});
    return d;
  }

  // An input and an output that may lie inside it (in place): one device copy where they do.
  std::pair<void*, void*> mappedTwo(NcclPending& p, const void* in, int64_t inBytes, void* out,
                                    int64_t outBytes) {
    if (!detail::liesWithin(out, outBytes, in, inBytes) || onDevice(in))
      return {mapped(p, in, inBytes, true, false), mapped(p, out, outBytes, false, true)};
    char* d = static_cast<char*>(mapped(p, in, inBytes, true, false));
    char* o = d + (static_cast<const char*>(out) - static_cast<const char*>(in));
    if (outBytes > 0) p.back.push_back({out, o, outBytes});
    return {d, o};
  }

  // An output and an input that may lie inside it (an all-gather in place).
  std::pair<void*, const void*> mappedTwoReversed(NcclPending& p, void* out, int64_t outBytes,
                                                  const void* in, int64_t inBytes) {
    if (!detail::liesWithin(in, inBytes, out, outBytes) || onDevice(out))
      return {mapped(p, out, outBytes, false, true), mapped(p, in, inBytes, true, false)};
    char* d = static_cast<char*>(mapped(p, out, outBytes, true, true));
    return {d, d + (static_cast<const char*>(in) - static_cast<const char*>(out))};
  }

  void copy(void* dst, const void* src, int64_t bytes) {
    if (bytes > 0 && dst != src)
      cudaCheck(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, stream_),
                "a copy");
  }

  // How a wait on an event ended: finished (no error), failed (the error of CUDA or NCCL),
  // or out of time.
  struct Polled {
    bool timedOut = false;
    std::string error;
  };

  // Waits for p's event, at most timeout() seconds. Sleeps between polls, longer as the wait
  // goes on, so a waiting rank leaves the CPU to others.
  Polled poll(NcclPending& p) {
    using Clock = std::chrono::steady_clock;
    auto began = Clock::now();
    auto nap = std::chrono::microseconds(5);
    for (;;) {
      cudaError_t e = cudaEventQuery(p.done);
      if (e == cudaSuccess) return {};
      if (e != cudaErrorNotReady) return {false, cudaGetErrorString(e)};
      ncclResult_t async = ncclSuccess;
      api_.commGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        return {false, fmt::format("NCCL: {}", api_.errorString(async))};
      double waited = std::chrono::duration<double>(Clock::now() - began).count();
      if (timeout() > 0 && waited > timeout()) return {true, ""};
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }

  void release(NcclPending& p) {
    for (void* d : p.scratch)
      cudaFreeAsync(d, stream_);
    p.scratch.clear();
    if (p.done) cudaEventDestroy(p.done);
    p.done = nullptr;
  }

  void cudaCheck(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw CommError(fmt::format("rank {}: {}: {}", rank(), what, cudaGetErrorString(e)));
  }
  void ncclCheck(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress)
      throw CommError(fmt::format("rank {}: {}: NCCL: {}", rank(), what, api_.errorString(r)));
  }

  const NcclApi& api_;
  Comm& bootstrap_;
  Device& device_;
  std::unique_ptr<Comm> owned_;  // a sub-communicator's bootstrap
  std::unique_ptr<Comm> staged_; // point to point
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr; // recorded on the compute stream as an operation starts
  ncclComm_t comm_ = nullptr;
  bool broken_ = false;
};

} // namespace

std::unique_ptr<Comm> makeNcclComm(const NcclApi& api, Comm& bootstrap, Device& device) {
  return std::make_unique<NcclComm>(api, bootstrap, device, nullptr);
}

std::unique_ptr<Comm> makeGpuComm(Comm& world, Device& device, std::string* note) {
  // What each rank brings: its GPU's UUID, and whether NCCL loaded.
  struct Mine {
    char uuid[16];
    char loaded;
  } mine{};
  int ordinal = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&ordinal) == cudaSuccess &&
      cudaGetDeviceProperties(&prop, ordinal) == cudaSuccess)
    std::copy(prop.uuid.bytes, prop.uuid.bytes + 16, mine.uuid);
  std::string why;
  const NcclApi* api = nccl(&why);
  mine.loaded = api != nullptr;
  std::vector<Mine> all(static_cast<size_t>(world.size()));
  world.allGather(&mine, all.data(), sizeof mine, "which GPU each rank runs on");
  auto staged = [&](std::string reason) {
    *note = fmt::format("note: {}: the ranks' collectives go through {}, staged through host "
                        "memory",
                        reason, world.name());
    return makeStagedComm(world, device);
  };
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = 0; b < a; ++b)
      if (std::equal(all[a].uuid, all[a].uuid + 16, all[b].uuid))
        return staged(fmt::format("ranks {} and {} share a GPU, which NCCL does not allow", b, a));
  for (size_t a = 0; a < all.size(); ++a)
    if (!all[a].loaded)
      return staged(fmt::format("rank {} could not load NCCL{}", a,
                                static_cast<int>(a) == world.rank() ? " (" + why + ")" : ""));
  note->clear(); // the run's header names the communicator
  return makeNcclComm(*api, world, device);
}

} // namespace epl::backend::cuda
