// linear: y = x W^T + b (linearRows), and its backward, as two products and a column sum.
// Under amp the products may read x, W and dy in bf16 as they are (HalfStaging.h,
// directInputs); operandOf takes each view as it comes.
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
  linearRows(operandOf(x), operandOf(w), hasBias ? c.in[2].f32() : nullptr, n, o, d,
             c.out[0].f32());
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
