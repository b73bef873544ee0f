// A communicator over device memory that the communicator under it cannot address: every
// buffer passes through host memory, copied with the device's own copies. For ranks on GPUs
// that cannot talk to each other directly: several ranks sharing one GPU (NCCL refuses
// them), or a build or machine without NCCL. The collectives are the inner communicator's
// (MPI), on the host copies; a wait copies what the operation wrote back to the device.
//
// Starting an operation copies its inputs to the host and waits for the device, so the
// caller must have finished writing them (the executor synchronises before every
// collective anyway). Buffers may be device or host memory: the device's copies take
// either (docs/architecture.md, "The CUDA backend").
#pragma once
#include "backend/comm/Comm.h"

#include <memory>

namespace epl::backend {

class Device;

// `inner` must outlive the result; `device` too.
std::unique_ptr<Comm> makeStagedComm(Comm& inner, Device& device);

} // namespace epl::backend
