// attention: fused qkv projection, scaled dot-product attention per head, output
// projection. The attention itself is flash-attention style: the scores of one head are
// never held as a T x T matrix, only as one Q x K tile per thread.
//
// Forward:
//   0. qkv = x Wqkv^T + bqkv; with `rotary`, each q and k head turned in place (below).
//   Then for each (batch, head, block of Q query rows), in parallel:
//   1. for each block of K keys (up to the diagonal when causal):
//      S = scale * q k^T (sgemm into the tile), masked (causal, and the padding mask's keys);
//      new row max m', rescale the running sum l and the output row by exp(m - m');
//      P = exp(S - m'); l += rowsum(P); out += P v (sgemm).
//   2. out /= l; lse = m + log(l) is saved for the backward. A row whose every key is
//      masked (l = 0) gets out = 0 and lse = -inf, and no gradient.
// Query head i reads k/v head i / G (G = H / KV heads share one: grouped-query attention).
// Backward, for each (batch, k/v head) in parallel (one task owns that head's dk, dv and its
// G query heads' dq, which it visits in order):
//   Dvec = rowsum(dout * out); for each key block j, for each query block i that sees it:
//   P = exp(scale q_i k_j^T - lse_i); dv_j += P^T dout_i; dP = dout_i v_j^T;
//   dS = P (dP - Dvec_i); dq_i += scale dS k_j; dk_j += scale dS^T q_i.
//   With `rotary`, dq and dk then turn back (the rotation's transpose).
// The loops run in a fixed order inside each task, so the result does not depend on
// scheduling. GEMMs, large and per tile, all go through sgemm.
//
// Rotary position embeddings (RoFormer; the "rotate half" form of HF LLaMA): in each head,
// dims i and i + E/2 (i < E/2) of position t turn by the angle t base^(-2i / E):
//   (a, b) -> (a cos - b sin, b cos + a sin).
//
// The padding mask [B, T] (integers: non-zero keeps key t of sample b, 0 masks it) becomes
// one byte a key, read by the forward and the backward alike; a masked key's probability is
// 0, as a score of -inf would make it.
//
// Shape legend: B batch, T time, D width, H heads, E head width (D / H), KV k/v heads, G query
// heads per k/v head, LD = D + 2 KV E a row of qkv, Q query rows and K key rows of a tile.
#include "backend/KernelShapes.h"
#include "backend/comm/Wire.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"
#include "backend/cpu/Lanes.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace epl::backend::cpu {

namespace {

constexpr int64_t kBlockQ = 64, kBlockK = 64;

using Dims = AttentionDims;

// Keys of the block starting at k0 that query row `row` may see: all kn, or up to the diagonal.
inline int64_t visibleKeys(const Dims& s, int64_t row, int64_t k0, int64_t kn) {
  return s.causal ? std::clamp<int64_t>(row - k0 + 1, 0, kn) : kn;
}

// The largest of x[0..n): in 16 lanes, so that it vectorises (the max of floats does not
// depend on the order).
inline float rowMax(const float* x, int64_t n) {
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
#pragma omp simd
    for (int u = 0; u < kLanes; ++u)
      lane[u] = std::max(lane[u], x[j + u]);
  float mx = -std::numeric_limits<float>::infinity();
  for (; j < n; ++j)
    mx = std::max(mx, x[j]);
  for (float v : lane)
    mx = std::max(mx, v);
  return mx;
}

// x[j] = exp(x[j] - shift) for j < n, in a loop that vectorises.
inline void expShifted(float* x, int64_t n, float shift) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j)
    x[j] = expf32(x[j] - shift);
}

// x[j] = 0 where the padding mask drops key j (`kept` null: none dropped). After an exp:
// a dropped key's score may exceed the row's max, and whatever exp made of it goes.
inline void zeroDropped(float* x, const uint8_t* kept, int64_t n) {
  if (!kept) return;
  for (int64_t j = 0; j < n; ++j)
    if (!kept[j]) x[j] = 0.f;
}

// The sum of x[0..n) in a fixed order that vectorises (KernelUtil.h).
inline float laneSum(const float* x, int64_t n) {
  return cpu::laneSum(n, [x](int64_t j) { return x[j]; });
}

// Online-softmax update of one tile row: turns scores into probabilities relative to the new
// running max, and returns the factor that rescales the row's earlier sum and output. `kept`
// (the padding mask of the tile's keys, or null) zeroes the masked keys; while every key the
// row has seen is masked, m stays -inf and l 0.
inline float onlineSoftmaxRow(float* srow, const uint8_t* kept, int64_t valid, int64_t kn, float& m,
                              float& l) {
  float mx = m;
  if (kept) {
    for (int64_t j = 0; j < valid; ++j)
      if (kept[j]) mx = std::max(mx, srow[j]);
    if (mx == -std::numeric_limits<float>::infinity()) {
      std::fill(srow, srow + kn, 0.f);
      return 1.f;
    }
  } else {
    mx = std::max(mx, rowMax(srow, valid));
  }
  float alpha = expf32(m - mx);
  expShifted(srow, valid, mx);
  zeroDropped(srow, kept, valid);
  float sum = laneSum(srow, valid);
  std::fill(srow + valid, srow + kn, 0.f);
  l = l * alpha + sum;
  m = mx;
  return alpha;
}

// The padding mask as one byte a key, [B, T] (1: attend to it), or empty without a mask.
std::vector<uint8_t> keptKeys(const KernelCall& c, int slot) {
  if (slot < 0) return {};
  const TensorView& mask = c.in[slot];
  EPL_ASSERT(mask.dtype == ir::DType::I32 || mask.dtype == ir::DType::I64,
             "attention's mask is i32 or i64");
  std::vector<uint8_t> kept(static_cast<size_t>(mask.numel()));
  for (size_t i = 0; i < kept.size(); ++i)
    kept[i] = mask.dtype == ir::DType::I32 ? mask.i32()[i] != 0
                                           : static_cast<const int64_t*>(mask.data)[i] != 0;
  return kept;
}

// Forward for the query rows [q0, q0 + Q) of head hi in batch bi. Accumulates straight into
// ctx (row stride D); writes lse [B, H, T]. `kept`: the mask's [B, T] bytes, or null.
void forwardBlock(const Dims& s, const float* qkv, const uint8_t* kept, int64_t bi, int64_t hi,
                  int64_t q0, float* ctx, float* lse, float* tile, float* m, float* l) {
  const int64_t ld = s.ld;
  const float* q = qkv + bi * s.t * ld + hi * s.e;
  const float *k = qkv + bi * s.t * ld + s.d + hi / s.group() * s.e, *v = k + s.kvd;
  int64_t rows = std::min(kBlockQ, s.t - q0), kEnd = s.causal ? q0 + rows : s.t;
  float* o = ctx + (bi * s.t + q0) * s.d + hi * s.e;
  for (int64_t i = 0; i < rows; ++i) {
    m[i] = -std::numeric_limits<float>::infinity();
    l[i] = 0.f;
    std::fill(o + i * s.d, o + i * s.d + s.e, 0.f);
  }
  for (int64_t k0 = 0; k0 < kEnd; k0 += kBlockK) {
    int64_t kn = std::min(kBlockK, kEnd - k0);
    gemm(false, true, rows, kn, s.e, s.scale, q + q0 * ld, ld, k + k0 * ld, ld, 0.f, tile, kn);
    for (int64_t i = 0; i < rows; ++i) {
      int64_t valid = visibleKeys(s, q0 + i, k0, kn);
      const uint8_t* keys = kept ? kept + bi * s.t + k0 : nullptr;
      float alpha = onlineSoftmaxRow(tile + i * kn, keys, valid, kn, m[i], l[i]);
      if (alpha != 1.f)
        for (int64_t j = 0; j < s.e; ++j)
          o[i * s.d + j] *= alpha;
    }
    gemm(false, false, rows, s.e, kn, 1.f, tile, kn, v + k0 * ld, ld, 1.f, o, s.d);
  }
  float* lseRow = lse + (bi * s.h + hi) * s.t + q0;
  for (int64_t i = 0; i < rows; ++i) {
    bool none = l[i] == 0.f; // every key masked: out 0, and the backward passes no gradient
    float inv = none ? 0.f : 1.f / l[i];
    for (int64_t j = 0; j < s.e; ++j)
      o[i * s.d + j] *= inv;
    lseRow[i] = none ? -std::numeric_limits<float>::infinity() : m[i] + std::log(l[i]);
  }
}

// The rotary angles' cosines and sines, [T, E/2] each: position t, pair i turns by
// t base^(-2i / E) (in double, then rounded once).
struct RotaryTable {
  std::vector<float> cos, sin;
  explicit RotaryTable(const Dims& s) : cos(s.t * (s.e / 2)), sin(s.t * (s.e / 2)) {
    int64_t half = s.e / 2;
    for (int64_t t = 0; t < s.t; ++t)
      for (int64_t i = 0; i < half; ++i) {
        double angle =
            static_cast<double>(t) *
            std::pow(s.rotaryBase, -2.0 * static_cast<double>(i) / static_cast<double>(s.e));
        cos[t * half + i] = static_cast<float>(std::cos(angle));
        sin[t * half + i] = static_cast<float>(std::sin(angle));
      }
  }
};

// Turns the q and k heads of every row of qkv [B, T, LD] in place: forward by the angles,
// or back (`inverse`, the transpose: how a gradient goes through the rotation).
void rotate(const Dims& s, const RotaryTable& r, float* qkv, bool inverse) {
  int64_t half = s.e / 2, heads = s.h + s.kv; // q's heads, then k's: the first D + KVD columns
  float sign = inverse ? -1.f : 1.f;
  parallelFor(s.b * s.t, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const float *c = r.cos.data() + (row % s.t) * half, *sn = r.sin.data() + (row % s.t) * half;
      for (int64_t h = 0; h < heads; ++h) {
        float* a = qkv + row * s.ld + h * s.e;
        float* b = a + half;
        for (int64_t i = 0; i < half; ++i) {
          float ai = a[i], bi = b[i], si = sign * sn[i];
          a[i] = ai * c[i] - bi * si;
          b[i] = bi * c[i] + ai * si;
        }
      }
    }
  });
}

// in = [x [B, T, M], mask [B, T], Wqkv [LD, M], bqkv [LD], Wp [M, D], bp [M]] (no mask
// without one, no biases with `bias = false`), out = [y [B, T, M], qkv [B, T, LD], ctx
// [B, T, D], lse [B, H, T]] (M = D unless the heads are split).
void attentionForward(const KernelCall& c, const AttentionSlots& a) {
  const TensorView& x = c.in[0];
  Dims s = attentionDims(c, x, c.in[a.wqkv]);
  int64_t n = s.b * s.t;
  float *y = c.out[0].f32(), *qkv = c.out[1].f32(), *ctx = c.out[2].f32(), *lse = c.out[3].f32();
  linearRows(operandOf(x), operandOf(c.in[a.wqkv]), a.bqkv >= 0 ? c.in[a.bqkv].f32() : nullptr, n,
             s.ld, s.m, qkv);
  if (s.rotary) rotate(s, RotaryTable(s), qkv, false);
  // Under amp the score products read q, k and v rounded to the half type, as they are
  // stored: the backward, which reads them so, then differentiates what the forward ran.
  if (ir::isHalf(c.castParams)) roundTo(c.castParams, qkv, n * s.ld);
  std::vector<uint8_t> kept = keptKeys(c, a.mask);
  const uint8_t* keys = kept.empty() ? nullptr : kept.data();
  int64_t qBlocks = (s.t + kBlockQ - 1) / kBlockQ, tasks = s.b * s.h * qBlocks;
  parallelFor(tasks, 1, [&](int64_t lo, int64_t hi) {
    float *tile = scratch(3, kBlockQ * kBlockK), *ml = scratch(4, 2 * kBlockQ);
    for (int64_t task = lo; task < hi; ++task) {
      int64_t qb = task % qBlocks, bh = task / qBlocks;
      forwardBlock(s, qkv, keys, bh / s.h, bh % s.h, qb * kBlockQ, ctx, lse, tile, ml,
                   ml + kBlockQ);
    }
  });
  // Under amp the output projection reads the context rounded to the half type (as it is
  // stored): into the workspace's half array where the product reads the type as it is.
  Operand context = ctx;
  if (ir::isHalf(c.castParams))
    context = roundedOperand(c.castParams, x.dtype != ir::DType::F32, ctx, n * s.d,
                             workspace(c, 0, 0, (n * s.d + 1) / 2));
  linearRows(context, operandOf(c.in[a.wp]), a.bp >= 0 ? c.in[a.bp].f32() : nullptr, n, s.m, s.d,
             y);
}

// Per-thread tiles of the backward, and the mask's bytes (null without one).
struct BackwardTiles {
  float *p, *dp, *dvec;
  const uint8_t* kept;
};

// Backward through the attention of query head hi in batch bi: its dq, and what it adds to
// the dk, dv of its k/v head, go into dqkv (zeroed by the caller). dctx and ctx have row
// stride D.
void backwardHead(const Dims& s, const float* qkv, Operand ctx, const float* dctx, const float* lse,
                  int64_t bi, int64_t hi, float* dqkv, const BackwardTiles& w) {
  const int64_t ld = s.ld, off = bi * s.t * ld + hi * s.e, offO = bi * s.t * s.d + hi * s.e;
  const int64_t offKv = bi * s.t * ld + s.d + hi / s.group() * s.e;
  const float *q = qkv + off, *k = qkv + offKv, *v = k + s.kvd;
  float *dq = dqkv + off, *dk = dqkv + offKv, *dv = dk + s.kvd;
  const float *dO = dctx + offO, *lseRow = lse + (bi * s.h + hi) * s.t;
  // The context as saved: f32, or the half type where the output projection's products
  // read it so.
  auto o = [&](int64_t i) {
    if (ctx.type == ir::DType::F32) return static_cast<const float*>(ctx.p)[offO + i];
    uint16_t h = static_cast<const uint16_t*>(ctx.p)[offO + i];
    return ctx.type == ir::DType::BF16 ? wire::fromBf16(h) : wire::fromF16(h);
  };
  for (int64_t t = 0; t < s.t; ++t) {
    float acc = 0;
    for (int64_t j = 0; j < s.e; ++j)
      acc += dO[t * s.d + j] * o(t * s.d + j);
    w.dvec[t] = acc;
  }
  for (int64_t k0 = 0; k0 < s.t; k0 += kBlockK) {
    int64_t kn = std::min(kBlockK, s.t - k0);
    for (int64_t q0 = s.causal ? k0 / kBlockQ * kBlockQ : 0; q0 < s.t; q0 += kBlockQ) {
      int64_t rows = std::min(kBlockQ, s.t - q0);
      gemm(false, true, rows, kn, s.e, s.scale, q + q0 * ld, ld, k + k0 * ld, ld, 0.f, w.p, kn);
      for (int64_t i = 0; i < rows; ++i) {
        float* prow = w.p + i * kn;
        int64_t valid = visibleKeys(s, q0 + i, k0, kn);
        const uint8_t* keys = w.kept ? w.kept + bi * s.t + k0 : nullptr;
        expShifted(prow, valid, lseRow[q0 + i]);
        zeroDropped(prow, keys, valid);
        std::fill(prow + valid, prow + kn, 0.f);
      }
      gemm(true, false, kn, s.e, rows, 1.f, w.p, kn, dO + q0 * s.d, s.d, 1.f, dv + k0 * ld, ld);
      gemm(false, true, rows, kn, s.e, 1.f, dO + q0 * s.d, s.d, v + k0 * ld, ld, 0.f, w.dp, kn);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < kn; ++j)
          w.dp[i * kn + j] = w.p[i * kn + j] * (w.dp[i * kn + j] - w.dvec[q0 + i]);
      gemm(false, false, rows, s.e, kn, s.scale, w.dp, kn, k + k0 * ld, ld, 1.f, dq + q0 * ld, ld);
      gemm(true, false, kn, s.e, rows, s.scale, w.dp, kn, q + q0 * ld, ld, 1.f, dk + k0 * ld, ld);
    }
  }
}

// in = [dy, x, mask, Wqkv, bqkv, Wp, bp, y, qkv, ctx, lse], out = [dx, dmask, dWqkv, dbqkv,
// dWp, dbp] (no mask without one, and dmask is never written; no biases or their gradients
// with `bias = false`).
void attentionBackward(const KernelCall& c, const AttentionSlots& a) {
  const TensorView &dyv = c.in[0], &x = c.in[1];
  Dims s = attentionDims(c, x, c.in[a.wqkv]);
  int64_t n = s.b * s.t;
  Operand dy = operandOf(dyv), wqkv = operandOf(c.in[a.wqkv]), wp = operandOf(c.in[a.wp]);
  Operand ctx = operandOf(c.in[a.ctx]);
  const float *qkv = c.in[a.qkv].f32(), *lse = c.in[a.lse].f32();
  float *dctx = workspace(c, 1, 0, n * s.d), *dqkv = workspace(c, 2, n * s.d, n * s.ld);
  gemm(false, false, n, s.d, s.m, 1.f, dy, s.m, wp, s.d, 0.f, dctx, s.d);
  if (GradOut dwp = gradOut(c, a.dwp))
    gemm(true, false, s.m, s.d, n, 1.f, dy, s.m, ctx, s.d, dwp.beta(), dwp.p, s.d);
  if (a.dbp >= 0)
    if (GradOut dbp = gradOut(c, a.dbp)) columnSum(dy, n, s.m, dbp);
  std::memset(dqkv, 0, sizeof(float) * n * s.ld);
  // One task a k/v head: its G query heads add into its dk, dv one after another.
  int64_t g = s.group();
  std::vector<uint8_t> kept = keptKeys(c, a.mask);
  parallelFor(s.b * s.kv, 1, [&](int64_t lo, int64_t hi) {
    BackwardTiles w{scratch(3, kBlockQ * kBlockK), scratch(4, kBlockQ * kBlockK), scratch(5, s.t),
                    kept.empty() ? nullptr : kept.data()};
    for (int64_t bk = lo; bk < hi; ++bk)
      for (int64_t j = 0; j < g; ++j)
        backwardHead(s, qkv, ctx, dctx, lse, bk / s.kv, bk % s.kv * g + j, dqkv, w);
  });
  if (s.rotary) rotate(s, RotaryTable(s), dqkv, true);
  if (a.dbqkv >= 0)
    if (GradOut db = gradOut(c, a.dbqkv)) columnSum(dqkv, n, s.ld, db);
  // Under amp the two products read dqkv rounded to the half type (the bias gradient above
  // sums it unrounded).
  Operand rounded = dqkv;
  if (ir::isHalf(c.castParams))
    rounded = roundedOperand(c.castParams, dyv.dtype != ir::DType::F32, dqkv, n * s.ld,
                             workspace(c, 6, n * (s.d + s.ld), (n * s.ld + 1) / 2));
  if (GradOut dx = gradOut(c, 0))
    gemm(false, false, n, s.m, s.ld, 1.f, rounded, s.ld, wqkv, s.m, dx.beta(), dx.p, s.m);
  if (GradOut dw = gradOut(c, a.dwqkv))
    gemm(true, false, s.ld, s.m, n, 1.f, rounded, s.ld, operandOf(x), s.m, dw.beta(), dw.p, s.m);
}

} // namespace

void attention(const KernelCall& c) {
  AttentionSlots a = attentionSlots(c);
  if (!c.backward) return attentionForward(c, a);
  attentionBackward(c, a);
}

} // namespace epl::backend::cpu
