// amp's staging, the same on every device (HalfStaging.h).
#include "backend/HalfStaging.h"
#include "backend/KernelArgs.h"

namespace epl::backend {

bool needsStaging(const KernelCall& c) {
  if (ir::halfAsStored(c.kind)) return false; // its kernels convert as they go
  if (c.castParams != ir::DType::F32 && c.paramCount > 0) return true;
  for (const auto* views : {&c.in, &c.out})
    for (const TensorView& v : *views)
      if (v.data && ir::isHalf(v.dtype)) return true;
  return false;
}

uint64_t productInputs(const KernelCall& c) {
  return ir::productInputs(c.kind, attrsOf(c), c.backward);
}

uint64_t widenedInputs(const KernelCall& c, uint64_t direct) {
  return direct != 0 ? ir::widenedInputs(c.kind, c.backward, c.in.size()) : 0;
}

uint64_t directInputs(const KernelCall& c) {
  ir::DType t = c.castParams;
  uint64_t mask = productInputs(c);
  if (mask == 0 || !ir::isHalf(t)) return 0;
  for (size_t i = 0; i < c.in.size(); ++i)
    if ((mask >> i & 1) && c.in[i].data && c.in[i].dtype != t && !castsInput(c, i)) return 0;
  return mask;
}

int64_t stagingFloats(const KernelCall& c) {
  uint64_t direct = directInputs(c);
  int64_t total = 0;
  for (size_t i = 0; i < c.in.size(); ++i) {
    const TensorView& v = c.in[i];
    if (!v.data || !(ir::isHalf(v.dtype) || castsInput(c, i))) continue;
    bool asIs = direct >> i & 1;
    if (asIs && ir::isHalf(v.dtype)) continue;
    total += stagingPadded(asIs ? (v.numel() + 1) / 2 : v.numel());
  }
  for (size_t i = 0; i < c.out.size(); ++i)
    if (c.out[i].data && ir::isHalf(c.out[i].dtype) && !writesHalfOutput(c, i))
      total += stagingPadded(c.out[i].numel());
  return total;
}

} // namespace epl::backend
