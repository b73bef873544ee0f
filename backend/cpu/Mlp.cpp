// mlp: y = act(x W1^T + b1) W2^T + b2, fused into one kernel; the forward saves the
// pre-activation h and the backward recomputes act(h) from it. GEMMs through sgemm.
//
// Shape legend: N rows (every dim of x but the last), D width, F hidden width.
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

namespace epl::backend::cpu {

namespace {

// in = [x [N, D], W1 [F, D], b1 [F], W2 [D, F], b2 [D]], out = [y [N, D], h [N, F]].
void mlpForward(const KernelCall& c) {
  const TensorView& x = c.in[0];
  int64_t d = lastDim(x), n = rowsOf(x), f = c.in[1].shape[0];
  Act act = parseAct(attrWord(c, "act"));
  float *y = c.out[0].f32(), *h = c.out[1].f32(), *a = workspace(c, 0, 0, n * f);
  const float *b1 = c.in[2].f32(), *b2 = c.in[4].f32();
  // Each slice of rows takes its bias and activation while the product has it in cache.
  gemmThen(false, true, n, f, d, 1.f, x.f32(), d, c.in[1].f32(), d, 0.f, h, f,
           [&](int64_t r0, int64_t r1) {
             addRows(h, b1, r0, r1, f);
             actForward(act, h + r0 * f, a + r0 * f, (r1 - r0) * f);
           });
  gemmThen(false, true, n, d, f, 1.f, a, f, c.in[3].f32(), f, 0.f, y, d,
           [&](int64_t r0, int64_t r1) { addRows(y, b2, r0, r1, d); });
}

// in = [dy, x, W1, b1, W2, b2, y, h], out = [dx, dW1, db1, dW2, db2].
void mlpBackward(const KernelCall& c) {
  const TensorView& x = c.in[1];
  int64_t d = lastDim(x), n = rowsOf(x), f = c.in[2].shape[0];
  Act act = parseAct(attrWord(c, "act"));
  const float *dy = c.in[0].f32(), *w1 = c.in[2].f32(), *w2 = c.in[4].f32(), *h = c.in[7].f32();
  float *a = workspace(c, 0, 0, n * f), *da = workspace(c, 1, n * f, n * f);
  if (GradOut dw2 = gradOut(c, 3)) {
    // act(h) for dW2 and act'(h) in da from one pass over h; then dL/da in a (free once
    // dW2 has it), times act'(h).
    actForwardAndGrad(act, h, a, da, n * f);
    gemm(true, false, d, f, n, 1.f, dy, d, a, f, dw2.beta(), dw2.p, f);
    gemm(false, false, n, f, d, 1.f, dy, d, w2, f, 0.f, a, f);
    multiplyInto(da, a, n * f); // da is now dL/dh
  } else {
    gemm(false, false, n, f, d, 1.f, dy, d, w2, f, 0.f, da, f);
    actBackwardInPlace(act, h, da, n * f); // da is now dL/dh
  }
  if (GradOut db2 = gradOut(c, 4)) columnSum(dy, n, d, db2);
  if (GradOut dw1 = gradOut(c, 1))
    gemm(true, false, f, d, n, 1.f, da, f, x.f32(), d, dw1.beta(), dw1.p, d);
  if (GradOut db1 = gradOut(c, 2)) columnSum(da, n, f, db1);
  if (GradOut dx = gradOut(c, 0))
    gemm(false, false, n, d, f, 1.f, da, f, w1, d, dx.beta(), dx.p, d);
}

} // namespace

void mlp(const KernelCall& c) {
  if (!c.backward) return mlpForward(c);
  mlpBackward(c);
}

} // namespace epl::backend::cpu
