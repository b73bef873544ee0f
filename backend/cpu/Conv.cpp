// Conv kernels (not yet written).
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

namespace epl::backend::cpu {
void conv2d(const KernelCall&) {
  EPL_ASSERT(false, "conv2d: not implemented yet");
}
} // namespace epl::backend::cpu
