// Pooling kernels (not yet written).
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

namespace epl::backend::cpu {
void maxPool(const KernelCall&) {
  EPL_ASSERT(false, "maxPool: not implemented yet");
}
void avgPool(const KernelCall&) {
  EPL_ASSERT(false, "avgPool: not implemented yet");
}
} // namespace epl::backend::cpu
