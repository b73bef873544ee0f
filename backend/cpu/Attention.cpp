// Attention kernels (not yet written).
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

namespace epl::backend::cpu {
void attention(const KernelCall&) {
  EPL_ASSERT(false, "attention: not implemented yet");
}
} // namespace epl::backend::cpu
