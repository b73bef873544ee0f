// The communicators between ranks on GPUs (backend/cuda/Nccl.h), on one GPU: the
// conformance suite (tests/comm/Conformance.h) through NCCL on one rank, and through MPI's
// stand-in staged by the CUDA device where two ranks share the GPU (two threads here,
// each with its own device, over the in-process communicators), then collectives on device
// memory. Exit 77 without a GPU (CTest's skip); prints each failure and exits 1 on any.
#include "../comm/Conformance.h"
#include "../comm/OnRanks.h"
#include "backend/Device.h"
#include "backend/cuda/Nccl.h"

#include <cstdio>
#include <mutex>

using namespace epl::backend;
using namespace epl::commtest;

namespace {

std::mutex printing;
int failures = 0;

void fail(int rank, const std::string& what) {
  std::lock_guard<std::mutex> lock(printing);
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  ++failures;
}

// Collectives whose buffers are device memory, against the same on host buffers.
void checkDeviceMemory(Comm& c, Device& d) {
  const int n = c.size(), r = c.rank();
  const int64_t count = 70001;
  std::vector<float> host = floats(r, count * n, true), back(count * n);
  auto* grads = static_cast<float*>(d.allocate(4 * count * n));
  d.copyToDevice(grads, host.data(), 4 * count * n);
  d.synchronize();
  c.allReduce(grads, count, "device grads");
  d.copyToHost(back.data(), grads, 4 * count);
  d.synchronize();
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i)
    wrong += back[i] != static_cast<float>(exactSum(n, i, true));
  if (wrong) fail(r, fmt::format("all-reduce on device memory: {} of {} wrong", wrong, count));
  // ZeRO's reduce-scatter in place, then the all-gather of the slices in place.
  d.copyToDevice(grads, host.data(), 4 * count * n);
  d.synchronize();
  Request q = c.ireduceScatter(grads, grads + r * count, count);
  c.wait(q, "device slices");
  q = c.iallGather(grads + r * count, grads, 4 * count);
  c.wait(q, "device gather");
  d.copyToHost(back.data(), grads, 4 * count * n);
  d.synchronize();
  wrong = 0;
  for (int64_t i = 0; i < count * n; ++i)
    wrong += back[i] != static_cast<float>(exactSum(n, i, true));
  if (wrong)
    fail(r, fmt::format("reduce-scatter and all-gather on device memory: {} of {} wrong", wrong,
                        count * n));
  d.release(grads);
}

void runSuite(Comm& c, Device& d) {
  for (const Conformance& check : conformanceSuite()) {
    if (check.minRanks > c.size()) continue;
    Checks results;
    check.run(c, results);
    for (const std::string& f : results.failed)
      fail(c.rank(), fmt::format("{} ({}): {}", check.name, c.name(), f));
  }
  checkDeviceMemory(c, d);
}

std::unique_ptr<Device> gpu() {
  DeviceOptions options;
  return makeDevice("cuda", options);
}

} // namespace

int main() {
  if (!cudaAvailable()) {
    std::puts("skipped: no GPU here");
    return 77;
  }
  // One rank: NCCL.
  {
    auto device = gpu();
    auto self = makeSelfComm();
    self->setTimeout(60);
    std::string note;
    auto comm = cuda::makeGpuComm(*self, *device, &note);
    std::printf("one rank: %s%s\n", comm->name().c_str(),
                note.empty() ? "" : (": " + note).c_str());
    if (comm->name().rfind("nccl ", 0) != 0) fail(0, "one rank on a GPU did not get NCCL");
    runSuite(*comm, *device);
  }
  // Two ranks on the one GPU: NCCL refuses them, so MPI's part is staged through the host.
  {
    auto world = makeLocalComms(2);
    std::vector<std::unique_ptr<Device>> devices(2);
    std::vector<std::unique_ptr<Comm>> comms(2);
    std::vector<std::string> notes(2);
    onRanks(world, [&](Comm& w) {
      w.setTimeout(60);
      devices[w.rank()] = gpu();
      comms[w.rank()] = cuda::makeGpuComm(w, *devices[w.rank()], &notes[w.rank()]);
    });
    std::printf("two ranks on one GPU: %s: %s\n", comms[0]->name().c_str(), notes[0].c_str());
    if (notes[0].find("ranks 0 and 1 share a GPU") == std::string::npos)
      fail(0, "two ranks on one GPU were not told why NCCL was not used");
    onRanks(comms, [&](Comm& c) { runSuite(c, *devices[c.rank()]); });
    comms.clear();
  }
  std::printf("%s\n", failures ? "FAILED" : "all checks passed");
  return failures ? 1 : 0;
}
