// Which device a run uses (DeviceChoice.h).
#include "interp/DeviceChoice.h"

#include <cstdlib>
#include <fmt/format.h>

namespace epl::interp {

namespace {

// The first op of the plan the CUDA device has no kernel for, or nullptr.
const ir::Op* opWithoutCudaKernel(const ir::Module& m) {
  for (const ir::Op& op : m.ops) {
    if (op.phase == ir::Phase::Optimizer) continue;
    if (op.kind == ir::OpKind::Next) continue; // the interpreter computes it
    // The executor's transfers (between stages, and a split region's collectives).
    if (ir::opInfo(op.kind).split == ir::SplitRule::Communication) continue;
    if (!backend::deviceSupports("cuda", op.kind)) return &op;
  }
  return nullptr;
}

// Why the CUDA device cannot run this plan, or "" when it can.
std::string cudaRefusal(const ir::Module& m, const ir::Op** op) {
  // Several ranks on GPUs run data parallelism (NCCL), pipelines, split regions and states
  // offloaded to disk (docs/gpu.md): nothing refuses them.
  *op = opWithoutCudaKernel(m);
  if (*op) return fmt::format("`{}` has no CUDA kernel yet", ir::opInfo((*op)->kind).name);
  return "";
}

} // namespace

int localRank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

std::unique_ptr<backend::Device> openDevice(const ir::Module& m, const DeviceRequest& r,
                                            std::string* note, Diagnostics& diags) {
  backend::DeviceOptions options;
  options.threads = r.threads;
  options.ordinal = r.localRank;
  options.matmul = m.policy.matmul;
  std::string name = r.name;
  const ir::Op* op = nullptr;
  if (name == "auto") {
    // The GPU when this build has the CUDA device, the machine a GPU, and the CUDA kernels
    // run the whole plan; else the CPU, saying why where a GPU is here (docs/gpu.md).
    name = "cpu";
    if (backend::cudaAvailable()) {
      std::string why = cudaRefusal(m, &op);
      if (why.empty())
        name = "cuda";
      else
        *note = fmt::format("note: a GPU is here, but {}: running on the CPU", why);
    }
  } else if (name == "cuda") {
    std::string why = cudaRefusal(m, &op);
    if (!why.empty()) {
      diags.error(op ? op->loc : m.loc, fmt::format("--device cuda: {}", why))
          .help("run it with --device cpu");
      return nullptr;
    }
  }
  try {
    return backend::makeDevice(name, options);
  } catch (const backend::DeviceUnavailable& e) {
    diags.error(SourceLoc{}, e.what());
    return nullptr;
  }
}

} // namespace epl::interp
