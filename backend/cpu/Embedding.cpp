// embedding (a learned lookup table) and positions (a learned [seq, dim] table, added to
// the input by a broadcasting add). The embedding gradient scatters rows into the table;
// columns are split among threads so each row is added in token order on any thread count.
//
// Shape legend: N tokens, V vocab, D width, T positions.
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

#include <algorithm>

namespace epl::backend::cpu {

namespace {

int32_t checkedToken(const int32_t* tok, int64_t n, int64_t v) {
  int32_t t = tok[n];
  EPL_ASSERT(t >= 0 && t < v, "embedding token id out of range of the vocabulary");
  return t;
}

// A token's row in this call's table (KernelCall::vocabSlice), or -1 where another device
// holds it.
int64_t rowOf(const KernelCall& c, const int32_t* tok, int64_t n, int64_t v) {
  if (!c.vocabSlice) return checkedToken(tok, n, v);
  int64_t r = tok[n] - c.vocabFirst;
  return r >= 0 && r < v ? r : -1;
}

// in = [tokens i32 [N], W [V, D]], out = [y [N, D]].
void embeddingForward(const KernelCall& c) {
  const int32_t* tok = c.in[0].i32();
  const float* w = c.in[1].f32();
  int64_t n = c.in[0].numel(), v = c.in[1].shape[0], d = c.in[1].shape[1];
  float* y = c.out[0].f32();
  parallelFor(n, rowGrain(d), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      int64_t r = rowOf(c, tok, i, v);
      if (r >= 0)
        std::memcpy(y + i * d, w + r * d, sizeof(float) * d);
      else
        std::memset(y + i * d, 0, sizeof(float) * d);
    }
  });
}

// in = [dy [N, D], tokens, W, y], out = [dtokens (never), dW [V, D]].
void embeddingBackward(const KernelCall& c) {
  GradOut dw = gradOut(c, 1);
  if (!dw) return;
  const float* dy = c.in[0].f32();
  const int32_t* tok = c.in[1].i32();
  int64_t n = c.in[1].numel(), v = c.in[2].shape[0], d = c.in[2].shape[1];
  zeroUnlessAcc(dw, v * d);
  constexpr int64_t kCols = 32;
  int64_t chunks = (d + kCols - 1) / kCols;
  parallelFor(chunks, n * d > kParallelMin ? 1 : chunks, [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      int64_t c0 = ch * kCols, w = std::min(kCols, d - c0);
      for (int64_t i = 0; i < n; ++i) {
        int64_t r = rowOf(c, tok, i, v);
        if (r < 0) continue;
        float* dst = dw.p + r * d + c0;
        const float* src = dy + i * d + c0;
        for (int64_t j = 0; j < w; ++j)
          dst[j] += src[j];
      }
    }
  });
}

} // namespace

void embedding(const KernelCall& c) {
  if (!c.backward) return embeddingForward(c);
  embeddingBackward(c);
}

// Forward: in = [W [T, D]], out = [y [T, D]] = W. Backward: in = [dy, W, y], out = [dW].
void positions(const KernelCall& c) {
  if (!c.backward) {
    std::memcpy(c.out[0].data, c.in[0].data, static_cast<size_t>(c.in[0].bytes()));
    return;
  }
  if (GradOut dw = gradOut(c, 0)) writeOrAdd(dw, c.in[0].f32(), c.in[0].numel());
}

} // namespace epl::backend::cpu
