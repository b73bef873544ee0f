// Mlp kernels (not yet written).
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

namespace epl::backend::cpu {
void mlp(const KernelCall&) {
  EPL_ASSERT(false, "mlp: not implemented yet");
}
} // namespace epl::backend::cpu
