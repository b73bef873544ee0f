// attention: fused qkv projection, scaled dot-product attention per head, output
// projection (the CUDA twin of backend/cpu/Attention.cpp; same saved tensors qkv, ctx, lse).
//
// Unlike the CPU's flash-style tiles, the scores of a group of G heads of one batch element
// are held in scratch as [G, R, K] (R queries against K keys), so each step is one
// strided-batched GEMM over the group's heads (a head's q, k, v are columns of qkv: row
// stride LD, head stride E). With fewer k/v heads than heads (kv_heads), a group stays within
// the query heads of one k/v head, whose k and v every GEMM of the batch reads (stride 0);
// the backward then takes one head at a time, each adding into its k/v head's dk and dv in
// head order. A padding mask hides keys as the causal mask does (a row with no key left
// gets probabilities 0 and lse -inf, as on the CPU); rotary turns q and k after the
// projection, and their gradients back before the projection's backward. Causal attention takes its
// queries in chunks, each against the keys up to its last query, which skips most of the scores
// above the diagonal (a quarter of them with two chunks); otherwise one chunk, R = K = T. Forward,
// for each batch element, group of heads and chunk of queries:
//   1. S = scale q k^T;
//   2. P = softmax(S) over the keys a query sees (0 for the masked ones), lse = log-sum-exp;
//   3. ctx = P v.
// Backward: Dvec = rowsum(dctx * ctx) for every head, then for each batch element and group,
// the chunks last to first:
//   P = exp(scale q k^T - lse) (0 where masked); dv += P^T dctx; dP = dctx v^T;
//   dS = P (dP - Dvec); dq = scale dS k; dk += scale dS^T q.
// The last chunk sees every key and writes dk and dv; the earlier ones, whose keys are a
// prefix of its, add into them.
// A group holds as many heads as fit in kScoreFloats (at least one), which bounds scratch.
// Every reduction runs in a fixed order, so results do not change from run to run.
// The scaled dot products run tiled instead, their scores in shared memory only
// (FlashAttention.cu), wherever flashAttentionRuns says (heads up to 128 wide): the
// projections, rotary, amp's roundings and Dvec stay here.
//
// Shape legend: B batch, T time, D width of the heads here (H E), M the model's width (x's
// and y's; D unless the heads are split over devices, each holding H of them), H heads, E head
// width, KV k/v heads (KVD = KV E wide), LD = D + 2 KVD a row of qkv, G heads in a group, R
// queries of a chunk (from Q0), K keys it sees.
#include "backend/KernelShapes.h"
#include "backend/cuda/Common.cuh"
#include "backend/cuda/FlashAttention.h"
#include "support/Assert.h"

#include <cmath>

namespace epl::backend::cuda {

namespace {

constexpr int64_t kScoreFloats = int64_t{1} << 26; // 256 MiB of scores per call at most

using Dims = AttentionDims;

// Heads per group when `buffers` score buffers of [G, T, T] share the budget.
int64_t groupHeads(const Dims& s, int64_t buffers) {
  return std::clamp<int64_t>(kScoreFloats / std::max<int64_t>(1, buffers * s.t * s.t), 1, s.h);
}

// Floats rounded up to a multiple of 256 bytes, to carve one scratch buffer into pieces.
int64_t padded(int64_t floats) {
  return (floats + 63) / 64 * 64;
}

// v reduced over the block (kThreads threads) in a fixed tree order; every thread gets it.
template <class Op> __device__ float blockReduce(float v, Op op, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + half]);
    __syncthreads();
  }
  float r = shared[0];
  __syncthreads();
  return r;
}

// Keys that query `query` sees: all t, or up to the diagonal when causal (always >= 1).
__device__ int64_t visibleKeys(int64_t query, int64_t t, bool causal) {
  return causal ? query + 1 : t;
}

// The padding mask's row of one batch element (i32 or i64, non-zero keeps a key), or none.
struct KeyMask {
  const void* p = nullptr;
  bool wide = false; // i64
  __device__ bool keeps(int64_t key) const {
    if (!p) return true;
    return wide ? static_cast<const int64_t*>(p)[key] != 0
                : static_cast<const int32_t*>(p)[key] != 0;
  }
};

// The call's mask (in[slot]; slot < 0: none), every batch element's row.
MaskRows maskOf(const KernelCall& c, int slot) {
  if (slot < 0) return {};
  const TensorView& m = c.in[slot];
  EPL_ASSERT(m.dtype == ir::DType::I32 || m.dtype == ir::DType::I64,
             "attention's mask is i32 or i64");
  return {m.data, m.dtype == ir::DType::I64};
}

// Batch element bi's row of the call's mask.
KeyMask keyMaskOf(const KernelCall& c, int slot, int64_t bi, int64_t t) {
  MaskRows m = maskOf(c, slot);
  if (!m.p) return {};
  return {static_cast<const char*>(m.p) + bi * t * (m.wide ? 8 : 4), m.wide};
}

// A chunk of queries: [q0, q0 + rows), each against keys [0, keys).
struct Chunk {
  int64_t q0, rows, keys;
  int64_t area() const { return rows * keys; }
};

// Causal attention's chunks of queries; one chunk of every query otherwise. Two chunks
// compute 3/4 of the scores (four would compute 5/8, but double the launches again).
int64_t chunkCount(const Dims& s) {
  return s.causal && s.t >= 256 ? 2 : 1;
}
Chunk chunkOf(const Dims& s, int64_t c, int64_t chunks) {
  int64_t q0 = c * s.t / chunks, rows = (c + 1) * s.t / chunks - q0;
  return {q0, rows, s.causal ? q0 + rows : s.t};
}

// Row `row` of a chunk's scores [G, R, K]: its head's place in the group times T plus its
// query, which indexes the group's rows of lse and Dvec ([G, T]).
__device__ int64_t groupRow(int64_t row, Chunk c, int64_t t) {
  return row / c.rows * t + c.q0 + row % c.rows;
}

// One block per score row of a chunk (G R rows of K): softmax over the visible keys in
// place, 0 for the masked ones, and the row's log-sum-exp into the group's lse.
__global__ void softmaxScoresKernel(float* scores, float* lse, Chunk c, int64_t t, bool causal,
                                    KeyMask keys) {
  __shared__ float shared[kThreads];
  int64_t row = blockIdx.x, visible = visibleKeys(c.q0 + row % c.rows, c.keys, causal);
  float* r = scores + row * c.keys;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < visible; j += kThreads)
    if (keys.keeps(j)) mx = fmaxf(mx, r[j]);
  mx = blockReduce(mx, Max{}, shared);
  if (mx == -INFINITY) { // the mask hides every key this query sees
    for (int64_t j = threadIdx.x; j < c.keys; j += kThreads)
      r[j] = 0.f;
    if (threadIdx.x == 0) lse[groupRow(row, c, t)] = -INFINITY;
    return;
  }
  float sum = 0;
  for (int64_t j = threadIdx.x; j < visible; j += kThreads) {
    r[j] = keys.keeps(j) ? expf(r[j] - mx) : 0.f;
    sum += r[j];
  }
  sum = blockReduce(sum, Sum{}, shared);
  float inv = 1.f / sum;
  for (int64_t j = threadIdx.x; j < c.keys; j += kThreads)
    r[j] = j < visible ? r[j] * inv : 0.f;
  if (threadIdx.x == 0) lse[groupRow(row, c, t)] = mx + logf(sum);
}

// A chunk's scores [G, R, K] to probabilities through the saved lse of each row:
// P = exp(S - lse).
__global__ void probsFromLseKernel(float* p, const float* lse, Chunk c, int64_t t, bool causal,
                                   KeyMask keys, int64_t n) {
  EPL_GRID_STRIDE(i, n) {
    int64_t row = i / c.keys, key = i % c.keys;
    p[i] = key < visibleKeys(c.q0 + row % c.rows, c.keys, causal) && keys.keeps(key)
               ? expf(p[i] - lse[groupRow(row, c, t)])
               : 0.f;
  }
}

// dS = P (dP - Dvec[row]) in place of dP, over a chunk's [G, R, K].
__global__ void scoreGradKernel(float* dp, const float* p, const float* dvec, Chunk c, int64_t t,
                                int64_t n) {
  EPL_GRID_STRIDE(i, n) {
    dp[i] = p[i] * (dp[i] - dvec[groupRow(i / c.keys, c, t)]);
  }
}

// Dvec [B, H, T] = rowsum over E of dctx * ctx, per head.
__global__ void dvecKernel(const float* dctx, const void* ctx, ir::DType type, float* dvec,
                           Dims s) {
  EPL_GRID_STRIDE(i, s.b * s.h * s.t) {
    int64_t t = i % s.t, bh = i / s.t;
    int64_t off = ((bh / s.h) * s.t + t) * s.d + (bh % s.h) * s.e;
    float acc = 0;
    for (int64_t j = 0; j < s.e; ++j)
      acc += dctx[off + j] * loadAs(ctx, off + j, type);
    dvec[i] = acc;
  }
}

// rotary's table [T, E/2] of cos, then of sin: the angle t base^(-2i / E) in double, as
// the CPU's RotaryTable.
__global__ void rotaryTableKernel(Dims s, float* cosSin) {
  int64_t half = s.e / 2;
  EPL_GRID_STRIDE(k, s.t * half) {
    int64_t t = k / half, i = k % half;
    double angle = static_cast<double>(t) *
                   pow(s.rotaryBase, -2.0 * static_cast<double>(i) / static_cast<double>(s.e));
    cosSin[k] = static_cast<float>(cos(angle));
    cosSin[s.t * half + k] = static_cast<float>(sin(angle));
  }
}

// Turns the q and k heads of every row of qkv [B, T, LD] in place by the table's angles, or
// back (`sign` -1: the transpose, how a gradient goes through the rotation); the CPU's rotate.
__global__ void rotateKernel(Dims s, const float* cosSin, float sign, float* qkv) {
  int64_t half = s.e / 2, heads = s.h + s.kv; // q's heads, then k's: the first D + KVD columns
  EPL_GRID_STRIDE(k, s.b * s.t * heads * half) {
    int64_t i = k % half, h = k / half % heads, row = k / half / heads;
    int64_t at = (row % s.t) * half + i;
    float c = cosSin[at], si = sign * cosSin[s.t * half + at];
    float* a = qkv + row * s.ld + h * s.e;
    float ai = a[i], bi = a[half + i];
    a[i] = ai * c - bi * si;
    a[half + i] = bi * c + ai * si;
  }
}

void rotate(const Ctx& ctx, const Dims& s, float* table, float* qkv, bool inverse) {
  int64_t pairs = s.b * s.t * (s.h + s.kv) * (s.e / 2);
  if (pairs == 0) return;
  rotaryTableKernel<<<blocksFor(s.t * (s.e / 2)), kThreads, 0, ctx.stream>>>(s, table);
  checkLaunch("rotary table");
  rotateKernel<<<blocksFor(pairs), kThreads, 0, ctx.stream>>>(s, table, inverse ? -1.f : 1.f, qkv);
  checkLaunch("rotary");
}

// The heads of a group starting at h0: at most g, and within h0's k/v head where they share
// one (so one k and one v serve the group's GEMMs).
int64_t groupFrom(const Dims& s, int64_t h0, int64_t g) {
  int64_t n = std::min(g, s.h - h0), group = s.group();
  return group == 1 ? n : std::min(n, (h0 / group + 1) * group - h0);
}

// Forward attention of heads [h0, h0 + g) of batch element bi: ctx columns and lse rows.
void forwardGroup(const Ctx& ctx, const Dims& s, const float* qkv, KeyMask keys, int64_t bi,
                  int64_t h0, int64_t g, float* scores, float* ctxOut, float* lse) {
  const int64_t ld = s.ld, kvStride = s.group() == 1 ? s.e : 0;
  const float* q = qkv + bi * s.t * ld + h0 * s.e;
  const float *k = qkv + bi * s.t * ld + s.d + h0 / s.group() * s.e, *v = k + s.kvd;
  float* out = ctxOut + bi * s.t * s.d + h0 * s.e;
  float* groupLse = lse + (bi * s.h + h0) * s.t;
  for (int64_t chunks = chunkCount(s), i = 0; i < chunks; ++i) {
    Chunk c = chunkOf(s, i, chunks);
    gemmBatched(ctx, false, true, c.rows, c.keys, s.e, s.scale, q + c.q0 * ld, ld, s.e, k, ld,
                kvStride, 0.f, scores, c.keys, c.area(), g);
    softmaxScoresKernel<<<static_cast<unsigned>(g * c.rows), kThreads, 0, ctx.stream>>>(
        scores, groupLse, c, s.t, s.causal, keys);
    checkLaunch("attention softmax");
    gemmBatched(ctx, false, false, c.rows, s.e, c.keys, 1.f, scores, c.keys, c.area(), v, ld,
                kvStride, 0.f, out + c.q0 * s.d, s.d, s.e, g);
  }
}

// in = [x [B, T, M], mask [B, T], Wqkv [LD, M], bqkv [LD], Wp [M, D], bp [M]] (no mask
// without one, no biases with `bias = false`), out = [y [B, T, M], qkv [B, T, LD], ctx [B,
// T, D], lse [B, H, T]].
void attentionForward(const KernelCall& c, const Ctx& ctx, const AttentionSlots& a) {
  const TensorView& x = c.in[0];
  Dims s = attentionDims(c, x, c.in[a.wqkv]);
  int64_t n = s.b * s.t, g = groupHeads(s, 1);
  float *y = c.out[0].f32(), *qkv = c.out[1].f32(), *ctxOut = c.out[2].f32();
  float* lse = c.out[3].f32();
  if (a.bqkv >= 0) broadcastRows(ctx, qkv, c.in[a.bqkv].f32(), n, s.ld);
  gemm(ctx, false, true, n, s.ld, s.m, 1.f, operandOf(x), s.m, operandOf(c.in[a.wqkv]), s.m,
       a.bqkv >= 0 ? 1.f : 0.f, qkv, s.ld);
  // The scores, then (amp, products reading the half type as it is) the rounded context.
  // Under amp the scores read q, k and v rounded to the half type, as they are stored and
  // as the backward reads them (the CPU's rule); rotary turns q and k first, as there.
  bool amp = ir::isHalf(c.castParams), asIs = x.dtype != ir::DType::F32;
  bool tiled = flashAttentionRuns(s); // no scores in scratch
  int64_t scoreBytes = tiled ? 0 : alignUp(4 * g * s.t * s.t);
  int64_t halfBytes = alignUp(asIs ? 2 * n * s.d : 0);
  char* scratch =
      static_cast<char*>(ctx.scratch->get(scoreBytes + halfBytes + (s.rotary ? 4 * s.t * s.e : 0)));
  if (s.rotary)
    rotate(ctx, s, reinterpret_cast<float*>(scratch + scoreBytes + halfBytes), qkv, false);
  if (amp) roundInPlace(ctx, c.castParams, qkv, n * s.ld);
  float* scores = reinterpret_cast<float*>(scratch);
  if (tiled) flashAttentionForward(ctx, s, qkv, amp, maskOf(c, a.mask), ctxOut, lse);
  for (int64_t bi = 0; bi < s.b && s.t > 0 && !tiled; ++bi) { // T = 0: no rows to softmax
    KeyMask keys = keyMaskOf(c, a.mask, bi, s.t);
    for (int64_t h0 = 0, heads = 0; h0 < s.h; h0 += heads) {
      heads = groupFrom(s, h0, g);
      forwardGroup(ctx, s, qkv, keys, bi, h0, heads, scores, ctxOut, lse);
    }
  }
  // Under amp the output projection reads the context rounded to the half type, as the CPU
  // does (it is stored so anyway).
  Operand context = ctxOut;
  if (amp) context = roundedOperand(ctx, c.castParams, asIs, ctxOut, n * s.d, scratch + scoreBytes);
  if (a.bp >= 0) broadcastRows(ctx, y, c.in[a.bp].f32(), n, s.m);
  gemm(ctx, false, true, n, s.m, s.d, 1.f, context, s.d, operandOf(c.in[a.wp]), s.d,
       a.bp >= 0 ? 1.f : 0.f, y, s.m);
}

// Scratch of the backward, carved from one buffer.
struct BackwardScratch {
  float *dctx, *dqkv, *dvec, *p, *dp;
  float* rotary; // rotary's table
  void* half;    // amp, products reading the half type as it is: dqkv rounded to it
};

// g: heads whose scores are held at once (0: none, the tiled kernels').
BackwardScratch backwardScratch(const Ctx& ctx, const Dims& s, int64_t g, bool half) {
  int64_t n = s.b * s.t, sizes[] = {padded(n * s.d), padded(n * s.ld), padded(s.b * s.h * s.t),
                                    padded(g * s.t * s.t), padded(s.rotary ? s.t * s.e : 0)};
  int64_t floats = sizes[0] + sizes[1] + sizes[2] + 2 * sizes[3] + sizes[4];
  float* base = static_cast<float*>(ctx.scratch->get(4 * floats + (half ? 2 * sizes[1] : 0)));
  BackwardScratch w;
  w.dctx = base;
  w.dqkv = w.dctx + sizes[0];
  w.dvec = w.dqkv + sizes[1];
  w.p = w.dvec + sizes[2];
  w.dp = w.p + sizes[3];
  w.rotary = w.dp + sizes[3];
  w.half = base + floats;
  return w;
}

// Backward through heads [h0, h0 + g) of batch element bi: writes their dq, dk, dv columns
// of dqkv (every column of dqkv is written by exactly one group).
// (every column of dq is written by exactly one group; with k/v heads shared, g is 1 and a
// k/v head's first query head writes its dk and dv, the others add in head order).
void backwardGroup(const Ctx& ctx, const Dims& s, const float* qkv, const float* lse, KeyMask keys,
                   int64_t bi, int64_t h0, int64_t g, const BackwardScratch& w) {
  const int64_t ld = s.ld, off = bi * s.t * ld + h0 * s.e, group = s.group();
  const int64_t kvOff = bi * s.t * ld + s.d + h0 / group * s.e, kvStride = group == 1 ? s.e : 0;
  const float *q = qkv + off, *k = qkv + kvOff, *v = k + s.kvd;
  float *dq = w.dqkv + off, *dk = w.dqkv + kvOff, *dv = dk + s.kvd;
  const float* dO = w.dctx + bi * s.t * s.d + h0 * s.e;
  const int64_t rows = (bi * s.h + h0) * s.t; // the group's first row of lse and Dvec
  const int64_t chunks = chunkCount(s);
  for (int64_t i = chunks - 1; i >= 0; --i) { // the last chunk sees every key: it writes dk, dv
    Chunk c = chunkOf(s, i, chunks);
    const float *qc = q + c.q0 * ld, *dOc = dO + c.q0 * s.d;
    float keysBeta = i == chunks - 1 && h0 % group == 0 ? 0.f : 1.f;
    int64_t n = g * c.area();
    gemmBatched(ctx, false, true, c.rows, c.keys, s.e, s.scale, qc, ld, s.e, k, ld, kvStride, 0.f,
                w.p, c.keys, c.area(), g);
    probsFromLseKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(w.p, lse + rows, c, s.t, s.causal,
                                                                  keys, n);
    checkLaunch("attention backward probabilities");
    gemmBatched(ctx, true, false, c.keys, s.e, c.rows, 1.f, w.p, c.keys, c.area(), dOc, s.d, s.e,
                keysBeta, dv, ld, kvStride, g);
    gemmBatched(ctx, false, true, c.rows, c.keys, s.e, 1.f, dOc, s.d, s.e, v, ld, kvStride, 0.f,
                w.dp, c.keys, c.area(), g);
    scoreGradKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(w.dp, w.p, w.dvec + rows, c, s.t, n);
    checkLaunch("attention backward score gradient");
    gemmBatched(ctx, false, false, c.rows, s.e, c.keys, s.scale, w.dp, c.keys, c.area(), k, ld,
                kvStride, 0.f, dq + c.q0 * ld, ld, s.e, g);
    gemmBatched(ctx, true, false, c.keys, s.e, c.rows, s.scale, w.dp, c.keys, c.area(), qc, ld, s.e,
                keysBeta, dk, ld, kvStride, g);
  }
}

// in = [dy, x, mask, Wqkv, bqkv, Wp, bp, y, qkv, ctx, lse], out = [dx, dmask (never), dWqkv,
// dbqkv, dWp, dbp] (no mask without one, no biases or their gradients with `bias = false`).
void attentionBackward(const KernelCall& c, const Ctx& ctx, const AttentionSlots& a) {
  const TensorView &dyv = c.in[0], &x = c.in[1];
  Dims s = attentionDims(c, x, c.in[a.wqkv]);
  // With k/v heads shared, one head at a time (each adds into its k/v head's dk and dv).
  bool tiled = flashAttentionRuns(s);
  int64_t n = s.b * s.t, g = tiled ? 0 : s.group() == 1 ? groupHeads(s, 2) : 1;
  Operand dy = operandOf(dyv), wqkv = operandOf(c.in[a.wqkv]), wp = operandOf(c.in[a.wp]);
  Operand ctxSaved = operandOf(c.in[a.ctx]);
  const float *qkv = c.in[a.qkv].f32(), *lse = c.in[a.lse].f32();
  bool amp = ir::isHalf(c.castParams), asIs = dy.type != ir::DType::F32;
  BackwardScratch w = backwardScratch(ctx, s, g, asIs);
  gemm(ctx, false, false, n, s.d, s.m, 1.f, dy, s.m, wp, s.d, 0.f, w.dctx, s.d);
  if (GradOut dwp = gradOut(c, a.dwp))
    gemm(ctx, true, false, s.m, s.d, n, 1.f, dy, s.m, ctxSaved, s.d, dwp.beta(), dwp.p, s.d);
  if (a.dbp >= 0)
    if (GradOut dbp = gradOut(c, a.dbp)) columnSum(ctx, dy, n, s.m, dbp);
  dvecKernel<<<blocksFor(s.b * s.h * s.t), kThreads, 0, ctx.stream>>>(w.dctx, ctxSaved.p,
                                                                      ctxSaved.type, w.dvec, s);
  checkLaunch("attention backward Dvec");
  // Under amp the saved q, k and v are the forward's, rounded to the half type.
  if (tiled)
    flashAttentionBackward(ctx, s, qkv, amp, lse, w.dctx, w.dvec, maskOf(c, a.mask), w.dqkv);
  for (int64_t bi = 0; bi < s.b && !tiled; ++bi) {
    KeyMask keys = keyMaskOf(c, a.mask, bi, s.t);
    for (int64_t h0 = 0, heads = 0; h0 < s.h; h0 += heads) {
      heads = std::min(g, s.h - h0);
      backwardGroup(ctx, s, qkv, lse, keys, bi, h0, heads, w);
    }
  }
  // rotary: dq and dk turned back (the saved q and k were turned).
  if (s.rotary) rotate(ctx, s, w.rotary, w.dqkv, true);
  // Under amp the two products read dqkv rounded to the half type (the bias gradient sums
  // it unrounded), as on the CPU.
  if (a.dbqkv >= 0)
    if (GradOut db = gradOut(c, a.dbqkv)) columnSum(ctx, w.dqkv, n, s.ld, db);
  Operand dqkv = w.dqkv;
  if (amp) dqkv = roundedOperand(ctx, c.castParams, asIs, w.dqkv, n * s.ld, w.half);
  if (GradOut dx = gradOut(c, 0))
    gemm(ctx, false, false, n, s.m, s.ld, 1.f, dqkv, s.ld, wqkv, s.m, dx.beta(), dx.p, s.m);
  if (GradOut dw = gradOut(c, a.dwqkv))
    gemm(ctx, true, false, s.ld, s.m, n, 1.f, dqkv, s.ld, operandOf(x), s.m, dw.beta(), dw.p, s.m);
}

} // namespace

void attention(const KernelCall& c, const Ctx& ctx) {
  AttentionSlots a = attentionSlots(c);
  if (!c.backward) return attentionForward(c, ctx, a);
  attentionBackward(c, ctx, a);
}

} // namespace epl::backend::cuda
