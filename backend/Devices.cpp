// The device registry: a device by name, for the trainer, the sampler and the tools.
#include "backend/Device.h"

#if EPL_HAVE_CUDA
#include "backend/cuda/CudaDevice.h"
#endif

namespace epl::backend {

std::unique_ptr<Device> makeDevice(const std::string& name, const DeviceOptions& options) {
  if (name == "cpu") return makeCpuDevice(options.threads);
  if (name == "cuda") {
#if EPL_HAVE_CUDA
    return cuda::makeCudaDevice(options.ordinal, options.matmul);
#else
    throw DeviceUnavailable("this epl was built without CUDA (no nvcc was found when it was "
                            "configured); use --device cpu, or rebuild where CUDA is installed");
#endif
  }
  throw DeviceUnavailable("unknown device `" + name + "`; expected cpu or cuda");
}

bool cudaAvailable() {
#if EPL_HAVE_CUDA
  return cuda::gpuCount() > 0;
#else
  return false;
#endif
}

bool deviceSupports(const std::string& name, ir::OpKind kind) {
#if EPL_HAVE_CUDA
  if (name == "cuda") return cuda::hasKernel(kind);
#endif
  (void)kind;
  return name == "cpu";
}

} // namespace epl::backend
