// mlp: y = act(x W1^T + b1) W2^T + b2 (the CUDA twin of backend/cpu/Mlp.cpp); the forward
// saves the pre-activation h and the backward recomputes act(h) from it. GEMMs through
// cuBLAS, act(h) and its gradient in scratch memory. Under amp (the call casts its weights
// to a half type) the hidden act(h) and its gradient dL/dh are rounded to that type before
// the products that read them, as on the CPU: in place, or into half arrays where the
// products read the type as it is (x, W1, W2 and dy then come in it too).
//
// Shape legend: N rows (every dim of x but the last), D width, F hidden width.
#include "backend/cuda/Common.cuh"

namespace epl::backend::cuda {

namespace {

// Floats rounded up to a multiple of 256 bytes, to carve one scratch buffer into pieces.
int64_t padded(int64_t floats) {
  return (floats + 63) / 64 * 64;
}

// in = [x [N, D], W1 [F, D], b1 [F], W2 [D, F], b2 [D]], out = [y [N, D], h [N, F]].
void mlpForward(const KernelCall& c, const Ctx& ctx) {
  const TensorView& x = c.in[0];
  int64_t d = lastDim(x), n = rowsOf(x), f = c.in[1].shape[0];
  Act act = parseAct(attrWord(c, "act"));
  float *y = c.out[0].f32(), *h = c.out[1].f32();
  // act(h), then (amp, products reading the half type as it is) its half values.
  float* a = static_cast<float*>(ctx.scratch->get(4 * 2 * padded(n * f)));
  broadcastRows(ctx, h, c.in[2].f32(), n, f);
  gemm(ctx, false, true, n, f, d, 1.f, operandOf(x), d, operandOf(c.in[1]), d, 1.f, h, f);
  actForward(ctx, act, h, a, n * f);
  Operand hidden = a;
  if (ir::isHalf(c.castParams))
    hidden =
        roundedOperand(ctx, c.castParams, x.dtype != ir::DType::F32, a, n * f, a + padded(n * f));
  broadcastRows(ctx, y, c.in[4].f32(), n, d);
  gemm(ctx, false, true, n, d, f, 1.f, hidden, f, operandOf(c.in[3]), f, 1.f, y, d);
}

// in = [dy, x, W1, b1, W2, b2, y, h], out = [dx, dW1, db1, dW2, db2].
void mlpBackward(const KernelCall& c, const Ctx& ctx) {
  const TensorView& x = c.in[1];
  int64_t d = lastDim(x), n = rowsOf(x), f = c.in[2].shape[0];
  Act act = parseAct(attrWord(c, "act"));
  Operand dy = operandOf(c.in[0]), w1 = operandOf(c.in[2]), w2 = operandOf(c.in[4]);
  const float* h = c.in[7].f32();
  float* a = static_cast<float*>(ctx.scratch->get(4 * 3 * padded(n * f)));
  float* da = a + padded(n * f);
  void* half = da + padded(n * f); // the rounded act(h), then dL/dh (stream-ordered reuse)
  bool amp = ir::isHalf(c.castParams), asIs = dy.type != ir::DType::F32;
  if (GradOut dw2 = gradOut(c, 3)) {
    actForward(ctx, act, h, a, n * f);
    Operand hidden = amp ? roundedOperand(ctx, c.castParams, asIs, a, n * f, half) : Operand(a);
    gemm(ctx, true, false, d, f, n, 1.f, dy, d, hidden, f, dw2.beta(), dw2.p, f);
  }
  if (GradOut db2 = gradOut(c, 4)) columnSum(ctx, dy, n, d, db2);
  gemm(ctx, false, false, n, f, d, 1.f, dy, d, w2, f, 0.f, da, f);
  actBackwardInPlace(ctx, act, h, da, n * f); // da is now dL/dh
  if (GradOut db1 = gradOut(c, 2)) columnSum(ctx, da, n, f, db1);
  Operand dh = amp ? roundedOperand(ctx, c.castParams, asIs, da, n * f, half) : Operand(da);
  if (GradOut dw1 = gradOut(c, 1))
    gemm(ctx, true, false, f, d, n, 1.f, dh, f, operandOf(x), d, dw1.beta(), dw1.p, d);
  if (GradOut dx = gradOut(c, 0))
    gemm(ctx, false, false, n, d, f, 1.f, dh, f, w1, d, dx.beta(), dx.p, d);
}

} // namespace

void mlp(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) return mlpForward(c, ctx);
  mlpBackward(c, ctx);
}

} // namespace epl::backend::cuda
