// Norms kernels (not yet written).
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

namespace epl::backend::cpu {
void layerNorm(const KernelCall&) {
  EPL_ASSERT(false, "layerNorm: not implemented yet");
}
void rmsNorm(const KernelCall&) {
  EPL_ASSERT(false, "rmsNorm: not implemented yet");
}
} // namespace epl::backend::cpu
