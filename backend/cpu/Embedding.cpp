// Embedding kernels (not yet written).
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

namespace epl::backend::cpu {
void embedding(const KernelCall&) {
  EPL_ASSERT(false, "embedding: not implemented yet");
}
void positions(const KernelCall&) {
  EPL_ASSERT(false, "positions: not implemented yet");
}
} // namespace epl::backend::cpu
