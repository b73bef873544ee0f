// linear: y = x W^T + b, and its backward, as three cuBLAS GEMMs and a column sum (the CUDA
// twin of backend/cpu/Linear.cpp). Under amp x, W and dy may come in the half type, which
// the products read as it is (HalfStaging.h, directInputs). A half y is written a block of
// rows at a time (ir::halfOutputRows): each block in f32 in scratch, then rounded.
//
// Shape legend: N rows (every dim of x but the last), D input width, O output width.
#include "backend/cuda/Common.cuh"

namespace epl::backend::cuda {

namespace {

// in = [x [N, D], W [O, D], b [O]?], out = [y [N, O]].
void linearForward(const KernelCall& c, const Ctx& ctx, bool hasBias) {
  const TensorView &x = c.in[0], &w = c.in[1];
  int64_t d = lastDim(x), n = rowsOf(x), o = w.shape[0];
  const TensorView& out = c.out[0];
  bool half = out.dtype != ir::DType::F32;
  int64_t rows = half ? ir::halfOutputRows(n, o) : n;
  // f32: one block, y itself. Half: the stream orders each block's products after the
  // previous block's rounding.
  float* y = half ? static_cast<float*>(ctx.scratch->get(4 * rows * o)) : out.f32();
  for (int64_t r0 = 0; r0 < n; r0 += rows) {
    int64_t cnt = std::min(rows, n - r0);
    if (hasBias) broadcastRows(ctx, y, c.in[2].f32(), cnt, o);
    gemm(ctx, false, true, cnt, o, d, 1.f, operandOf(x).at(r0 * d), d, operandOf(w), d,
         hasBias ? 1.f : 0.f, y, o);
    if (half) narrowTo(ctx, out.dtype, y, static_cast<uint16_t*>(out.data) + r0 * o, cnt * o);
  }
}

// in = [dy [N, O], x, W, b?, y], out = [dx [N, D], dW [O, D], db [O]?].
void linearBackward(const KernelCall& c, const Ctx& ctx, bool hasBias) {
  const TensorView &dy = c.in[0], &x = c.in[1], &w = c.in[2];
  int64_t d = lastDim(x), n = rowsOf(x), o = w.shape[0];
  if (GradOut dx = gradOut(c, 0))
    gemm(ctx, false, false, n, d, o, 1.f, operandOf(dy), o, operandOf(w), d, dx.beta(), dx.p, d);
  if (GradOut dw = gradOut(c, 1))
    gemm(ctx, true, false, o, d, n, 1.f, operandOf(dy), o, operandOf(x), d, dw.beta(), dw.p, d);
  if (hasBias)
    if (GradOut db = gradOut(c, 2)) columnSum(ctx, operandOf(dy), n, o, db);
}

} // namespace

void linear(const KernelCall& c, const Ctx& ctx) {
  bool hasBias = attrBool(c, "bias");
  if (!c.backward) {
    linearForward(c, ctx, hasBias);
  } else {
    linearBackward(c, ctx, hasBias);
  }
}

} // namespace epl::backend::cuda
