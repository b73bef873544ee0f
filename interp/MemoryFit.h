// Whether a plan's memory fits the machine that runs it, checked before anything is
// allocated: a failed allocation, or the kernel's out-of-memory killer, would say far less.
#pragma once
#include "ir/Module.h"
#include "support/Diagnostics.h"

#include <cstdint>
#include <new>
#include <optional>
#include <string>

namespace epl::interp {

// Bytes the machine can still give this process: MemAvailable from /proc/meminfo, less
// where a cgroup limits the process; nullopt when the system says neither.
std::optional<int64_t> availableMemory();

// Whether `ranks` ranks of the plan, each holding its program's activations, parameters,
// gradients and optimizer states, fit in `available` bytes; when not, reports the error
// at the train block's `batch`.
bool checkMemoryFits(const ir::Module& m, int ranks, int64_t available, Diagnostics& diags);

// Thrown by the Executor when allocating the plan's buffers fails (another process took
// the memory after the check, or the system would not say how much there was). A
// std::bad_alloc, so one handler serves it and any other allocation that fails.
class OutOfMemory : public std::bad_alloc {
public:
  explicit OutOfMemory(int64_t planned);
  const char* what() const noexcept override { return message_.c_str(); }

private:
  std::string message_;
};

// The same error as checkMemoryFits for a rank whose allocation failed.
void reportOutOfMemory(const ir::Module& m, int ranks, Diagnostics& diags);

} // namespace epl::interp
