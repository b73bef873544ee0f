// mlp: y = act(x W1^T + b1) W2^T + b2, fused into one kernel; the forward saves the
// pre-activation h and the backward recomputes act(h) from it.
//
// Under amp (the call casts its weights to a half type) every product reads operands of
// that type, as PyTorch's autocast stores them: the hidden act(h) and its gradient dL/dh
// are rounded to it before the products that read them. Where the products read the half
// type as it is (HalfStaging.h, directInputs: on the CPU, always; cpu::gemm multiplies bf16
// natively where oneDNN has kernels for it and widens the rest a piece at a time) the
// rounded values go to half arrays laid over the f32 workspace, which then holds no f32;
// elsewhere they are rounded in place and stay f32. There the backward reads the saved h as
// stored too, widening a piece at a time (HalfStaging.h, widenedInputs).
//
// Shape legend: N rows (every dim of x but the last), D width, F hidden width.
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

namespace epl::backend::cpu {

namespace {

// Elements of the hidden a thread converts at a time, through its own f32 scratch.
constexpr int64_t kChunk = 1 << 14;

// f32 values [at, at + n) of a hidden array, rounded to `half` under amp: in place
// (`asIs` false), or into the half array laid over `dst` (which holds no f32 values then)
// from the f32 values fill(at, n, tmp) writes to a scratch chunk.
template <class Fill>
void roundHidden(ir::DType half, bool asIs, float* dst, int64_t at, int64_t n, Fill&& fill) {
  if (!asIs) {
    fill(at, n, dst + at);
    if (ir::isHalf(half)) roundTo(half, dst + at, n);
    return;
  }
  parallelFor(n, kChunk, [&](int64_t lo, int64_t hi) {
    float* tmp = scratch(2, std::min(kChunk, hi - lo));
    for (int64_t i = lo; i < hi; i += kChunk) {
      int64_t len = std::min(kChunk, hi - i);
      fill(at + i, len, tmp);
      narrowTo(half, tmp, static_cast<uint16_t*>(static_cast<void*>(dst)) + at + i, len);
    }
  });
}

// in = [x [N, D], W1 [F, D], b1 [F], W2 [D, F], b2 [D]], out = [y [N, D], h [N, F]].
void mlpForward(const KernelCall& c) {
  const TensorView& x = c.in[0];
  int64_t d = lastDim(x), n = rowsOf(x), f = c.in[1].shape[0];
  Act act = parseAct(attrWord(c, "act"));
  float *y = c.out[0].f32(), *h = c.out[1].f32(), *a = workspace(c, 0, 0, n * f);
  const float *b1 = c.in[2].f32(), *b2 = c.in[4].f32();
  bool asIs = x.dtype != ir::DType::F32;
  Operand hidden = asIs ? Operand(a, x.dtype) : Operand(a);
  // Each slice of rows takes its bias and activation while the product has it in cache.
  gemmThen(false, true, n, f, d, 1.f, operandOf(x), d, operandOf(c.in[1]), d, 0.f, h, f,
           [&](int64_t r0, int64_t r1) {
             addRows(h, b1, r0, r1, f);
             roundHidden(
                 c.castParams, asIs, a, r0 * f, (r1 - r0) * f,
                 [&](int64_t at, int64_t len, float* to) { actForward(act, h + at, to, len); });
           });
  gemmThen(false, true, n, d, f, 1.f, hidden, f, operandOf(c.in[3]), f, 0.f, y, d,
           [&](int64_t r0, int64_t r1) { addRows(y, b2, r0, r1, d); });
}

// in = [dy, x, W1, b1, W2, b2, y, h], out = [dx, dW1, db1, dW2, db2].
void mlpBackward(const KernelCall& c) {
  const TensorView& x = c.in[1];
  int64_t d = lastDim(x), n = rowsOf(x), f = c.in[2].shape[0];
  Act act = parseAct(attrWord(c, "act"));
  Operand dy = operandOf(c.in[0]), w1 = operandOf(c.in[2]), w2 = operandOf(c.in[4]);
  // h's f32 values [at, at + len): as they are, or (the products reading half precision
  // as stored, widenedInputs) widened into the thread's scratch.
  const TensorView& hv = c.in[7];
  auto h = [&](int64_t at, int64_t len) {
    return hv.dtype == ir::DType::F32 ? hv.f32() + at : f32Run(hv, at, len, scratch(3, len));
  };
  float *a = workspace(c, 0, 0, n * f), *da = workspace(c, 1, n * f, n * f);
  ir::DType half = c.castParams;
  bool asIs = dy.type != ir::DType::F32;
  Operand hidden = asIs ? Operand(a, dy.type) : Operand(a);
  if (GradOut dw2 = gradOut(c, 3)) {
    // act(h) for dW2 and act'(h) in da from one pass over h; then dL/da in a (free once
    // dW2 has it), times act'(h).
    roundHidden(half, asIs, a, 0, n * f, [&](int64_t at, int64_t len, float* to) {
      actForwardAndGrad(act, h(at, len), to, da + at, len);
    });
    gemm(true, false, d, f, n, 1.f, dy, d, hidden, f, dw2.beta(), dw2.p, f);
    gemm(false, false, n, f, d, 1.f, dy, d, w2, f, 0.f, a, f);
    multiplyInto(da, a, n * f); // da is now dL/dh
  } else {
    gemm(false, false, n, f, d, 1.f, dy, d, w2, f, 0.f, da, f);
    parallelFor(n * f, kChunk, [&](int64_t lo, int64_t hi) { // da is now dL/dh
      for (int64_t i = lo; i < hi; i += kChunk) {
        int64_t len = std::min(kChunk, hi - i);
        actBackwardInPlace(act, h(i, len), da + i, len);
      }
    });
  }
  if (GradOut db2 = gradOut(c, 4)) columnSum(dy, n, d, db2);
  if (GradOut db1 = gradOut(c, 2)) columnSum(da, n, f, db1);
  // dL/dh rounded for the two products that read it: into a (free now) where they read
  // the half type as it is, else in place.
  Operand dh = ir::isHalf(half) ? roundedOperand(half, asIs, da, n * f, a) : Operand(da);
  if (GradOut dw1 = gradOut(c, 1))
    gemm(true, false, f, d, n, 1.f, dh, f, operandOf(x), d, dw1.beta(), dw1.p, d);
  if (GradOut dx = gradOut(c, 0))
    gemm(false, false, n, d, f, 1.f, dh, f, w1, d, dx.beta(), dx.p, d);
}

} // namespace

void mlp(const KernelCall& c) {
  if (!c.backward) return mlpForward(c);
  mlpBackward(c);
}

} // namespace epl::backend::cpu
