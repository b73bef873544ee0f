// amp's staging, the same on every device (HalfStaging.h).
#include "backend/HalfStaging.h"

namespace epl::backend {

bool needsStaging(const KernelCall& c) {
  if (c.castParams != ir::DType::F32 && c.paramCount > 0) return true;
  for (const auto* views : {&c.in, &c.out})
    for (const TensorView& v : *views)
      if (v.data && ir::isHalf(v.dtype)) return true;
  return false;
}

int64_t stagingFloats(const KernelCall& c) {
  int64_t total = 0;
  for (size_t i = 0; i < c.in.size(); ++i)
    if (c.in[i].data && (ir::isHalf(c.in[i].dtype) || castsInput(c, i)))
      total += stagingPadded(c.in[i].numel());
  for (const TensorView& v : c.out)
    if (v.data && ir::isHalf(v.dtype)) total += stagingPadded(v.numel());
  return total;
}

} // namespace epl::backend
