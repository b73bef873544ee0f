// amp's staging, the same on every device (HalfStaging.h).
#include "backend/HalfStaging.h"
#include "backend/KernelShapes.h"

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
  switch (c.kind) {
  case ir::OpKind::Linear: // [x, W, b?] / [dy, x, W, b?, y]
    return c.backward ? 0b111 : 0b11;
  case ir::OpKind::Mlp: // [x, W1, b1, W2, b2] / [dy, x, W1, b1, W2, b2, y, h]
    return c.backward ? 0b10111 : 0b1011;
  case ir::OpKind::Attention: { // KernelShapes.h: the projections' operands, the saved context
    AttentionSlots a = attentionSlots(c);
    uint64_t mask = uint64_t{1} | uint64_t{1} << a.wqkv | uint64_t{1} << a.wp;
    return c.backward ? mask | uint64_t{1} << 1 | uint64_t{1} << a.ctx : mask;
  }
  default:
    return 0;
  }
}

uint64_t widenedInputs(const KernelCall& c, uint64_t direct) {
  bool h = c.kind == ir::OpKind::Mlp && c.backward && direct != 0 && c.in.size() > 7;
  return h ? uint64_t{1} << 7 : 0;
}

int64_t stagingFloats(const KernelCall& c) {
  int64_t total = 0;
  for (size_t i = 0; i < c.in.size(); ++i)
    if (c.in[i].data && (ir::isHalf(c.in[i].dtype) || castsInput(c, i)))
      total += stagingPadded(c.in[i].numel());
  for (size_t i = 0; i < c.out.size(); ++i)
    if (c.out[i].data && ir::isHalf(c.out[i].dtype) && !writesHalfOutput(c, i))
      total += stagingPadded(c.out[i].numel());
  return total;
}

} // namespace epl::backend
