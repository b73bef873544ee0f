// Moe kernels (not yet written).
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

namespace epl::backend::cpu {
void moe(const KernelCall&) {
  EPL_ASSERT(false, "moe: not implemented yet");
}
} // namespace epl::backend::cpu
