// The CUDA device (DESIGN: docs/architecture.md, "backend/"): one GPU, its memory, streams
// and events, and a kernel for each builtin op (Kernels.h). Nothing here needs a GPU to
// link: without one, gpuCount() is 0 and makeCudaDevice throws DeviceUnavailable.
#pragma once
#include "backend/Device.h"

#include <memory>

namespace epl::backend::cuda {

// GPUs this process can use; 0 when there is none or the driver is missing.
int gpuCount();
// The device on GPU `ordinal % gpuCount()`, its fp32 matrix products in `matmul`'s
// precision. Throws DeviceUnavailable without a GPU.
std::unique_ptr<Device> makeCudaDevice(int ordinal, ir::Matmul matmul);
// Whether the CUDA device has a kernel for this op kind.
bool hasKernel(ir::OpKind kind);

} // namespace epl::backend::cuda
