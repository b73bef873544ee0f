// Which device a run uses (`--device auto|cpu|cuda`, docs/gpu.md). `auto` is the GPU where
// this build has CUDA, the machine a GPU and the GPU path runs the whole plan, else the CPU
// (with a note when a GPU is there); `cuda` is the GPU, or an error saying why it cannot
// run the plan.
#pragma once
#include "backend/Device.h"
#include "ir/Module.h"
#include "support/Diagnostics.h"

#include <memory>
#include <string>

namespace epl::interp {

struct DeviceRequest {
  std::string name = "auto"; // auto, cpu or cuda
  int localRank = 0;         // this rank among those on its machine: its GPU
  int threads = 0;           // CPU threads (0: every core)
};

// The device for this rank, or nullptr after an error in `diags` (a GPU asked for that is
// not there, or cannot run this plan). `note` gets a line for the user, or stays empty.
std::unique_ptr<backend::Device> openDevice(const ir::Module& m, const DeviceRequest& request,
                                            std::string* note, Diagnostics& diags);

// This process's rank among the ranks on its machine (0 outside an MPI job).
int localRank();

} // namespace epl::interp
