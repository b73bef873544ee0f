// The communicator between ranks on GPUs (docs/gpu.md, "Several GPUs"): NCCL for the
// collectives, on a stream of its own, bootstrapped over the job's MPI communicator (rank 0's
// unique id broadcast). NCCL is opened when the communicator is made, not linked, as cuBLAS
// is (Cublas.h), so a binary starts where it is missing.
//
// Buffers may be device or host memory: host buffers are copied to the device and back.
// Point-to-point transfers go over the MPI communicator, staged through host memory
// (StagedComm.h): MPI's semantics (tags, sends and recvs started in any order) without the
// ordering NCCL's point to point needs.
#pragma once
#include "backend/comm/Comm.h"

#include <memory>
#include <nccl.h>
#include <string>

namespace epl::backend {
class Device;
}

namespace epl::backend::cuda {

// The NCCL entry points the communicator calls, resolved from the loaded library.
struct NcclApi {
  decltype(&::ncclGetVersion) getVersion = nullptr;
  decltype(&::ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&::ncclCommInitRank) commInitRank = nullptr;
  decltype(&::ncclCommDestroy) commDestroy = nullptr;
  decltype(&::ncclCommAbort) commAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) commGetAsyncError = nullptr;
  decltype(&::ncclGetErrorString) errorString = nullptr;
  decltype(&::ncclAllReduce) allReduce = nullptr;
  decltype(&::ncclReduceScatter) reduceScatter = nullptr;
  decltype(&::ncclReduce) reduce = nullptr;
  decltype(&::ncclAllGather) allGather = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclSend) send = nullptr;
  decltype(&::ncclRecv) recv = nullptr;
  decltype(&::ncclGroupStart) groupStart = nullptr;
  decltype(&::ncclGroupEnd) groupEnd = nullptr;
};

// Opens `library` (a name the loader searches for, or a path) and resolves every entry
// point into `api`. Returns "", or why not: the loader's message, or the first symbol
// missing.
std::string openNccl(const std::string& library, NcclApi& api);

// The process's NCCL (libnccl.so.2 from the library path, else from the directory this
// build found it in), or null with `why` saying what failed. Opened once.
const NcclApi* nccl(std::string* why);

// "2.28.9": the loaded library's version.
std::string ncclVersionText(const NcclApi& api);

// An NCCL communicator over the ranks of `bootstrap` (every one of them calls this at
// once), each on the GPU `device` runs on. Point to point goes over `bootstrap`, staged by
// `device`. Both must outlive the result. Throws CommError when NCCL fails to start.
std::unique_ptr<Comm> makeNcclComm(const NcclApi& api, Comm& bootstrap, Device& device);

// The communicator for collectives on GPU memory between the ranks of `world` (all call
// it at once, each with its device made): NCCL when each rank has a GPU of its own and
// every rank loaded NCCL; else `world` staged through host memory. `note` says which, and
// why not NCCL.
std::unique_ptr<Comm> makeGpuComm(Comm& world, Device& device, std::string* note);

} // namespace epl::backend::cuda
