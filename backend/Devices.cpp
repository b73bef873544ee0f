// The device registry: a device by name, for the trainer, the sampler and the tools.
#include "backend/Device.h"

#if EPL_HAVE_CUDA
#include "backend/cuda/CudaDevice.h"
#include "backend/cuda/Nccl.h"
#endif
#include "backend/comm/StagedComm.h"
#include "backend/cpu/Parallel.h"

#include <cstdlib>
#include <fmt/format.h>
#include <string>

namespace epl::backend {

namespace {

bool guarded() {
  const char* guard = std::getenv("EPL_GUARD_DEVICE");
  return guard && *guard && std::string(guard) != "0";
}

} // namespace

std::unique_ptr<Device> makeDevice(const std::string& name, const DeviceOptions& options) {
  if (name == "cpu") {
    if (guarded()) return makeGuardedCpuDevice(options.threads);
    return makeCpuDevice(options.threads);
  }
  if (name == "cuda") {
#if EPL_HAVE_CUDA
    auto device = cuda::makeCudaDevice(options.ordinal, options.matmul);
    // The host's work beside the GPU's (reading the training data: synthetic batches on
    // the CPU pool's threads) takes the rank's share of the cores, as a CPU run's kernels do.
    cpu::setThreads(options.threads);
    return device;
#else
    throw DeviceUnavailable("this epl was built without CUDA (no nvcc was found when it was "
                            "configured); use --device cpu, or rebuild where CUDA is installed");
#endif
  }
  throw DeviceUnavailable("unknown device `" + name + "`; expected cpu or cuda");
}

bool deviceMemoryIsHost(const std::string& request) {
  if (request == "cuda" || (request == "auto" && cudaAvailable())) return false;
  return !guarded();
}

bool cudaAvailable() {
#if EPL_HAVE_CUDA
  return cuda::gpuCount() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Comm> makeDeviceComm(Comm& world, Device& device, std::string* note) {
  if (world.size() == 1) return nullptr;
  auto staged = [&](const char* why) {
    *note = fmt::format("note: {}: the ranks' collectives go through {}, staged through host "
                        "memory",
                        why, world.name());
    return makeStagedComm(world, device);
  };
  // The path of ranks that share a GPU, on any device: for tests on machines without one.
  const char* force = std::getenv("EPL_STAGED_COMM");
  if (force && *force && std::string(force) != "0") return staged("EPL_STAGED_COMM is set");
  if (device.hostAddressable()) return nullptr;
#if EPL_HAVE_CUDA
  if (device.name().rfind("cuda", 0) == 0) return cuda::makeGpuComm(world, device, note);
#endif
  return staged("this device's memory is not the host's");
}

bool deviceSupports(const std::string& name, ir::OpKind kind) {
#if EPL_HAVE_CUDA
  if (name == "cuda") return cuda::hasKernel(kind);
#endif
  (void)kind;
  return name == "cpu";
}

} // namespace epl::backend
