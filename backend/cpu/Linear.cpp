// linear: y = x W^T + b (linearRows), and its backward, as two products and a column sum.
// Under amp the products may read x, W and dy in bf16 as they are (HalfStaging.h,
// directInputs); operandOf takes each view as it comes. A half y is written a block of rows
// at a time (ir::halfOutputRows): each block in f32 in the workspace, then rounded.
//
// Shape legend: N rows (every dim of x but the last), D input width, O output width.
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

namespace epl::backend::cpu {

namespace {

// in = [x [N, D], W [O, D], b [O]?], out = [y [N, O]].
void linearForward(const KernelCall& c, bool hasBias) {
  const TensorView &x = c.in[0], &w = c.in[1];
  int64_t d = lastDim(x), n = rowsOf(x), o = w.shape[0];
  const float* b = hasBias ? c.in[2].f32() : nullptr;
  const TensorView& y = c.out[0];
  if (y.dtype == ir::DType::F32) return linearRows(operandOf(x), operandOf(w), b, n, o, d, y.f32());
  int64_t rows = ir::halfOutputRows(n, o);
  float* block = workspace(c, 0, 0, rows * o);
  for (int64_t r0 = 0; r0 < n; r0 += rows) {
    int64_t cnt = std::min(rows, n - r0);
    linearRows(operandOf(x).at(r0 * d), operandOf(w), b, cnt, o, d, block);
    narrowTo(y.dtype, block, static_cast<uint16_t*>(y.data) + r0 * o, cnt * o);
  }
}

// in = [dy [N, O], x, W, b?, y], out = [dx [N, D], dW [O, D], db [O]?].
void linearBackward(const KernelCall& c, bool hasBias) {
  const TensorView &dy = c.in[0], &x = c.in[1], &w = c.in[2];
  int64_t d = lastDim(x), n = rowsOf(x), o = w.shape[0];
  if (GradOut dx = gradOut(c, 0))
    gemm(false, false, n, d, o, 1.f, operandOf(dy), o, operandOf(w), d, dx.beta(), dx.p, d);
  if (GradOut dw = gradOut(c, 1))
    gemm(true, false, o, d, n, 1.f, operandOf(dy), o, operandOf(x), d, dw.beta(), dw.p, d);
  if (hasBias)
    if (GradOut db = gradOut(c, 2)) columnSum(operandOf(dy), n, o, db);
}

} // namespace

void linear(const KernelCall& c) {
  bool hasBias = attrBool(c, "bias");
  if (!c.backward) {
    linearForward(c, hasBias);
  } else {
    linearBackward(c, hasBias);
  }
}

} // namespace epl::backend::cpu
