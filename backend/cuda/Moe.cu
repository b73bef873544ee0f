// moe's four ops on the GPU: the router, the dispatch, the experts and the combine (the
// CUDA twin of backend/cpu/Moe.cpp, which states the routing and is the oracle).
//
// Routing, recomputed from the gates by the dispatch and the combine, forward and backward:
//   1. One thread per token picks its k largest gates (ties: the lower expert index) and
//      renormalises them into its weights.
//   2. One thread per (sample, expert) walks the sample's copies in priority order (slot 0
//      of every token, then slot 1, ...), counting those that chose its expert: the first
//      `cap` are kept, each with its place among them, the rest dropped.
//   3. One block scans the kept counts into each (expert, sample)'s first row, expert-major
//      (and writes the experts' row counts).
//   4. One thread per copy adds its place to its (expert, sample)'s first row, and marks the
//      row as holding it; rows no copy holds stay zero.
// The experts need each expert's row count to size its GEMMs: moe_experts copies the El
// counts to the host and waits for the stream, once a call (the one host synchronisation of
// the CUDA kernels; a grouped GEMM sized on the device would avoid it). Then one cuBLAS GEMM
// per expert over its rows, as on the CPU.
// No atomics: every sum has one owner thread or block and a fixed order.
//
// Shape legend: N tokens (B samples of T), D width, E experts (El of them on this device),
// F expert hidden width, K top-k slots, M rows (N K from the dispatch).
#include "backend/KernelShapes.h"
#include "backend/cuda/Common.cuh"
#include "support/Assert.h"

#include <vector>

namespace epl::backend::cuda {

namespace {

// The routing of N tokens, in device scratch memory.
struct Routing {
  int32_t* expert;        // [N K]: the expert of slot s of token t
  float* weight;          // [N K]: its renormalised gate
  int64_t* place;         // [N K]: its place among its expert's kept copies of its sample, or -1
  int64_t *kept, *chosen; // [B E]: copies each expert kept, and was chosen by (f_e T K)
  int64_t* first;         // [B E]: the row of expert e's first kept copy from sample b
  int64_t* blockFirst;    // [E]: the row of expert e's first copy
  int64_t* row;           // [N K]: the copy's row, -1 when dropped
  int64_t* copy;          // [N K]: the copy (token K + slot) a row holds, -1 for a zero row
  double* aux;            // [B E]: the load-balancing loss's terms
};

int64_t samplesOf(const MoeRouting& m) {
  return m.t > 0 ? m.n / m.t : 0;
}

// Pieces of one scratch buffer, each at a multiple of kScratchAlign; with a null base it only
// measures.
struct Carver {
  char* base = nullptr;
  int64_t used = 0;
  template <class T> T* take(int64_t count) {
    T* p = base ? reinterpret_cast<T*>(base + used) : nullptr;
    used += alignUp(count * static_cast<int64_t>(sizeof(T)));
    return p;
  }
};

Routing carveRouting(Carver& c, const MoeRouting& m) {
  int64_t nk = m.n * m.k, be = samplesOf(m) * m.e;
  Routing r;
  r.expert = c.take<int32_t>(nk);
  r.weight = c.take<float>(nk);
  r.place = c.take<int64_t>(nk);
  r.kept = c.take<int64_t>(be);
  r.chosen = c.take<int64_t>(be);
  r.first = c.take<int64_t>(be);
  r.blockFirst = c.take<int64_t>(m.e);
  r.row = c.take<int64_t>(nk);
  r.copy = c.take<int64_t>(nk);
  r.aux = c.take<double>(be);
  return r;
}

// The slot of a token's first s choices that holds `e`, or -1.
__device__ int64_t slotOf(const int32_t* chosen, int64_t s, int32_t e) {
  for (int64_t slot = 0; slot < s; ++slot)
    if (chosen[slot] == e) return slot;
  return -1;
}

// v summed over the block (kThreads threads) in a fixed tree order; every thread gets it.
__device__ double blockSum(double v) {
  __shared__ double part[kThreads];
  __syncthreads(); // a previous call may still be reading part[0]
  part[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  return part[0];
}

// Step 1, one thread per token. Selection: strictly greater wins, so ties go low.
__global__ void topKKernel(const float* gates, MoeRouting m, Routing r) {
  EPL_GRID_STRIDE(t, m.n) {
    const float* g = gates + t * m.e;
    int32_t* ex = r.expert + t * m.k;
    float sum = 0;
    for (int64_t s = 0; s < m.k; ++s) {
      int32_t best = -1;
      for (int32_t e = 0; e < m.e; ++e) {
        if (slotOf(ex, s, e) >= 0) continue;
        if (best < 0 || g[e] > g[best]) best = e;
      }
      ex[s] = best;
      sum += g[best];
    }
    for (int64_t s = 0; s < m.k; ++s)
      r.weight[t * m.k + s] = g[ex[s]] / sum;
  }
}

// Step 2, one thread per (sample b, expert e): b's copies that chose e, first choices first.
__global__ void capacityKernel(MoeRouting m, int64_t samples, Routing r) {
  EPL_GRID_STRIDE(i, samples * m.e) {
    int64_t b = i / m.e, kept = 0, chosen = 0;
    int32_t e = static_cast<int32_t>(i % m.e);
    for (int64_t s = 0; s < m.k; ++s)
      for (int64_t t = b * m.t; t < (b + 1) * m.t; ++t) {
        int64_t at = t * m.k + s;
        if (r.expert[at] != e) continue;
        ++chosen;
        r.place[at] = kept == m.cap ? -1 : kept++;
      }
    r.kept[i] = kept;
    r.chosen[i] = chosen;
  }
}

// Step 3, one block: first[b, e] = the rows of experts before e plus e's rows from samples
// before b; counts[e] (when wanted) = e's rows.
__global__ void layoutKernel(MoeRouting m, int64_t samples, Routing r, int32_t* counts) {
  for (int64_t e = threadIdx.x; e < m.e; e += blockDim.x) {
    int64_t run = 0;
    for (int64_t b = 0; b < samples; ++b) {
      r.first[b * m.e + e] = run;
      run += r.kept[b * m.e + e];
    }
    r.blockFirst[e] = run; // for now: e's rows
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t run = 0;
    for (int64_t e = 0; e < m.e; ++e) {
      int64_t rows = r.blockFirst[e];
      if (counts) counts[e] = static_cast<int32_t>(rows);
      r.blockFirst[e] = run;
      run += rows;
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < samples * m.e; i += blockDim.x)
    r.first[i] += r.blockFirst[i % m.e];
}

// Step 4, one thread per copy (r.copy is all -1 before).
__global__ void rowKernel(MoeRouting m, Routing r) {
  EPL_GRID_STRIDE(at, m.n * m.k) {
    int64_t place = r.place[at];
    if (place < 0) {
      r.row[at] = -1;
      continue;
    }
    int64_t b = at / m.k / m.t, row = r.first[b * m.e + r.expert[at]] + place;
    r.row[at] = row;
    r.copy[row] = at;
  }
}

// The routing of the tokens whose gates these are; counts [E] (when wanted) gets the rows
// of each expert.
Routing route(const Ctx& ctx, const MoeRouting& m, const float* gates, int32_t* counts) {
  int64_t samples = samplesOf(m), nk = m.n * m.k;
  Carver size;
  carveRouting(size, m);
  Carver at{static_cast<char*>(ctx.scratch->get(size.used))};
  Routing r = carveRouting(at, m);
  topKKernel<<<blocksFor(m.n), kThreads, 0, ctx.stream>>>(gates, m, r);
  checkLaunch("moe top-k");
  capacityKernel<<<blocksFor(samples * m.e), kThreads, 0, ctx.stream>>>(m, samples, r);
  checkLaunch("moe capacity");
  layoutKernel<<<1, kThreads, 0, ctx.stream>>>(m, samples, r, counts);
  checkLaunch("moe layout");
  check(cudaMemsetAsync(r.copy, 0xff, sizeof(int64_t) * nk, ctx.stream), "moe rows"); // all -1
  rowKernel<<<blocksFor(nk), kThreads, 0, ctx.stream>>>(m, r);
  checkLaunch("moe rows");
  return r;
}

void zeroFloats(const Ctx& ctx, float* p, int64_t n) {
  if (n > 0) check(cudaMemsetAsync(p, 0, sizeof(float) * n, ctx.stream), "moe zero rows");
}

// ---- moe_router -------------------------------------------------------------------------

// d loss / d logits = g (dg - sum dg g), one thread per token.
__global__ void softmaxGradKernel(const float* dg, const float* g, int64_t n, int64_t e,
                                  float* dl) {
  EPL_GRID_STRIDE(t, n) {
    float dot = 0;
    for (int64_t j = 0; j < e; ++j)
      dot += dg[t * e + j] * g[t * e + j];
    for (int64_t j = 0; j < e; ++j)
      dl[t * e + j] = g[t * e + j] * (dg[t * e + j] - dot);
  }
}

// in = [x [N, D], Wr [E, D]], out = [gates [N, E]]; backward in = [dgates, x, Wr, gates],
// out = [dx, dWr].
void router(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) {
    const TensorView &x = c.in[0], &wr = c.in[1];
    int64_t n = rowsOf(x), d = lastDim(x), e = wr.shape[0];
    float* gates = c.out[0].f32();
    gemm(ctx, false, true, n, e, d, 1.f, x.f32(), d, wr.f32(), d, 0.f, gates, e);
    return softmaxRows(ctx, gates, gates, n, e);
  }
  const TensorView &x = c.in[1], &wr = c.in[2];
  int64_t n = rowsOf(x), d = lastDim(x), e = wr.shape[0];
  float* dl = static_cast<float*>(ctx.scratch->get(alignUp(sizeof(float) * n * e)));
  softmaxGradKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(c.in[0].f32(), c.in[3].f32(), n, e,
                                                               dl);
  checkLaunch("moe router backward");
  if (GradOut dwr = gradOut(c, 1))
    gemm(ctx, true, false, e, d, n, 1.f, dl, e, x.f32(), d, dwr.beta(), dwr.p, d);
  if (GradOut dx = gradOut(c, 0))
    gemm(ctx, false, false, n, d, e, 1.f, dl, e, wr.f32(), d, dx.beta(), dx.p, d);
}

// ---- moe_dispatch -----------------------------------------------------------------------

// rows[row] = x of the token whose copy the row holds, or 0.
__global__ void gatherRowsKernel(const float* x, Routing r, MoeRouting m, float* rows) {
  EPL_GRID_STRIDE(i, m.n * m.k * m.d) {
    int64_t at = r.copy[i / m.d];
    rows[i] = at >= 0 ? x[at / m.k * m.d + i % m.d] : 0.f;
  }
}

// aux[b, e] = E f_e P_e, computed as the CPU does: E x f_e (a float) x the sum of e's gates
// over b's tokens (in double, token order) / T.
__global__ void auxTermsKernel(const float* gates, Routing r, MoeRouting m, int64_t samples) {
  EPL_GRID_STRIDE(i, samples * m.e) {
    int64_t b = i / m.e, e = i % m.e;
    double p = 0;
    for (int64_t t = b * m.t; t < (b + 1) * m.t; ++t)
      p += gates[t * m.e + e];
    float share = static_cast<float>(r.chosen[i]) / static_cast<float>(m.t * m.k);
    r.aux[i] = static_cast<double>(m.e) * share * p / static_cast<double>(m.t);
  }
}

// One block: stats = (the sum of the aux terms, copies dropped, copies, samples).
__global__ void statsKernel(Routing r, MoeRouting m, int64_t samples, float* stats) {
  double aux = 0, dropped = 0;
  for (int64_t i = threadIdx.x; i < samples * m.e; i += blockDim.x) {
    aux += r.aux[i];
    dropped += static_cast<double>(r.chosen[i] - r.kept[i]);
  }
  aux = blockSum(aux);
  dropped = blockSum(dropped);
  if (threadIdx.x != 0) return;
  stats[0] = static_cast<float>(aux);
  stats[1] = static_cast<float>(dropped);
  stats[2] = static_cast<float>(m.n * m.k);
  stats[3] = static_cast<float>(samples);
}

// dx[t] (+)= the token's copies' rows of drows, in slot order (dropped copies add nothing).
__global__ void dispatchDxKernel(const float* drows, Routing r, MoeRouting m, GradOut dx) {
  EPL_GRID_STRIDE(i, m.n * m.d) {
    int64_t t = i / m.d, j = i % m.d;
    float s = 0;
    for (int64_t slot = 0; slot < m.k; ++slot)
      if (int64_t at = r.row[t * m.k + slot]; at >= 0) s += drows[at * m.d + j];
    dx.put(i, s);
  }
}

// dgates[t, e] (+)= scale x f_e of t's sample.
__global__ void auxGradKernel(Routing r, MoeRouting m, float scale, GradOut dg) {
  EPL_GRID_STRIDE(i, m.n * m.e) {
    int64_t t = i / m.e, e = i % m.e;
    float share = static_cast<float>(r.chosen[t / m.t * m.e + e]) / static_cast<float>(m.t * m.k);
    dg.put(i, scale * share);
  }
}

// in = [x [N, D], gates [N, E]], out = [rows [N K, D], counts i32[E], stats f32[4]].
void dispatchForward(const KernelCall& c, const Ctx& ctx) {
  MoeRouting m = moeRouting(c);
  const float* gates = c.in[1].f32();
  int64_t samples = samplesOf(m);
  Routing r = route(ctx, m, gates, c.out[1].i32());
  gatherRowsKernel<<<blocksFor(m.n * m.k * m.d), kThreads, 0, ctx.stream>>>(c.in[0].f32(), r, m,
                                                                            c.out[0].f32());
  checkLaunch("moe dispatch");
  auxTermsKernel<<<blocksFor(samples * m.e), kThreads, 0, ctx.stream>>>(gates, r, m, samples);
  checkLaunch("moe load-balancing loss");
  statsKernel<<<1, kThreads, 0, ctx.stream>>>(r, m, samples, c.out[2].f32());
  checkLaunch("moe stats");
}

// Backward in = [drows, x, gates, rows], out = [dx, dgates]; dgates is the load-balancing
// loss's: d(aux_weight x sample weight x aux) / d gates[t, e] = that scale x E f_e / T.
void dispatchBackward(const KernelCall& c, const Ctx& ctx) {
  MoeRouting m = moeRouting(c);
  Routing r = route(ctx, m, c.in[2].f32(), nullptr);
  if (GradOut dx = gradOut(c, 0)) {
    dispatchDxKernel<<<blocksFor(m.n * m.d), kThreads, 0, ctx.stream>>>(c.in[0].f32(), r, m, dx);
    checkLaunch("moe dispatch backward");
  }
  if (GradOut dg = gradOut(c, 1)) {
    float scale = static_cast<float>(m.auxWeight) * c.sampleWeight * static_cast<float>(m.e) /
                  static_cast<float>(m.t);
    auxGradKernel<<<blocksFor(m.n * m.e), kThreads, 0, ctx.stream>>>(r, m, scale, dg);
    checkLaunch("moe load-balancing gradient");
  }
}

// ---- moe_experts ------------------------------------------------------------------------

// rows [M, D] and the parameters, with each expert's first row.
struct ExpertRows {
  const float *x, *w1, *b1, *w2, *b2;
  int64_t m, d, el, f;
  std::vector<int64_t> first; // [El + 1]
  int64_t most = 0;           // rows of the largest expert
  int64_t used() const { return first[el]; }
};

// From in[base...] = [rows, counts, W1, b1, W2, b2]. Reading the counts waits for the stream.
ExpertRows expertRows(const KernelCall& c, const Ctx& ctx, int base) {
  const TensorView &rows = c.in[base], &w1 = c.in[base + 2];
  ExpertRows x{rows.f32(),           w1.f32(),     c.in[base + 3].f32(), c.in[base + 4].f32(),
               c.in[base + 5].f32(), rowsOf(rows), lastDim(rows),        w1.shape[0],
               w1.shape[1]};
  std::vector<int32_t> counts(x.el);
  if (x.el > 0) {
    check(cudaMemcpyAsync(counts.data(), c.in[base + 1].data, sizeof(int32_t) * x.el,
                          cudaMemcpyDeviceToHost, ctx.stream),
          "moe_experts: reading the counts");
    check(cudaStreamSynchronize(ctx.stream), "moe_experts: reading the counts");
  }
  x.first.assign(x.el + 1, 0);
  for (int64_t e = 0; e < x.el; ++e) {
    x.first[e + 1] = x.first[e] + counts[e];
    x.most = std::max<int64_t>(x.most, counts[e]);
  }
  EPL_ASSERT(x.first[x.el] <= x.m, "moe_experts: the counts name more rows than the buffer holds");
  return x;
}

// out = [y [M, D], h [M, F]]: expert e's block through gelu(rows W1_e^T + b1_e) W2_e^T + b2_e;
// rows after the blocks give 0.
void expertsForward(const KernelCall& c, const Ctx& ctx) {
  ExpertRows x = expertRows(c, ctx, 0);
  int64_t d = x.d, f = x.f, fd = f * d;
  float *y = c.out[0].f32(), *h = c.out[1].f32();
  float* a = static_cast<float*>(ctx.scratch->get(alignUp(sizeof(float) * x.most * f)));
  for (int64_t e = 0; e < x.el; ++e) {
    int64_t n = x.first[e + 1] - x.first[e], at = x.first[e];
    if (n == 0) continue;
    float *he = h + at * f, *ye = y + at * d;
    broadcastRows(ctx, he, x.b1 + e * f, n, f);
    gemm(ctx, false, true, n, f, d, 1.f, x.x + at * d, d, x.w1 + e * fd, d, 1.f, he, f);
    actForward(ctx, Act::Gelu, he, a, n * f);
    if (ir::isHalf(c.castParams)) roundInPlace(ctx, c.castParams, a, n * f); // the CPU's rule
    broadcastRows(ctx, ye, x.b2 + e * d, n, d);
    gemm(ctx, false, true, n, d, f, 1.f, a, f, x.w2 + e * fd, f, 1.f, ye, d);
  }
  zeroFloats(ctx, y + x.used() * d, (x.m - x.used()) * d);
  zeroFloats(ctx, h + x.used() * f, (x.m - x.used()) * f);
}

struct ExpertGrads {
  GradOut dx, dw1, db1, dw2, db2; // whole tensors
};

void zeroUnlessAcc(const Ctx& ctx, const GradOut& g, int64_t n) {
  if (g && !g.acc) zeroFloats(ctx, g.p, n);
}

// Expert e's part of the backward; a and da are scratch of its rows x F. Under amp (`half`)
// gelu(h) and dL/dh are rounded to the half type before the products that read them, as
// on the CPU (db1 sums dL/dh unrounded).
void expertBackward(const Ctx& ctx, const ExpertRows& x, const float* dy, const float* h,
                    const ExpertGrads& g, int64_t e, float* a, float* da, ir::DType half) {
  int64_t n = x.first[e + 1] - x.first[e], at = x.first[e], d = x.d, f = x.f, fd = f * d;
  auto part = [](const GradOut& whole, int64_t offset) {
    return GradOut{whole.p ? whole.p + offset : nullptr, whole.acc};
  };
  GradOut gw1 = part(g.dw1, e * fd), gb1 = part(g.db1, e * f), gw2 = part(g.dw2, e * fd),
          gb2 = part(g.db2, e * d);
  if (n == 0) {
    zeroUnlessAcc(ctx, gw1, fd), zeroUnlessAcc(ctx, gb1, f), zeroUnlessAcc(ctx, gw2, fd),
        zeroUnlessAcc(ctx, gb2, d);
    return;
  }
  const float *dye = dy + at * d, *xe = x.x + at * d, *he = h + at * f;
  actForward(ctx, Act::Gelu, he, a, n * f);
  if (ir::isHalf(half)) roundInPlace(ctx, half, a, n * f);
  if (gw2) gemm(ctx, true, false, d, f, n, 1.f, dye, d, a, f, gw2.beta(), gw2.p, f);
  if (gb2) columnSum(ctx, dye, n, d, gb2);
  gemm(ctx, false, false, n, f, d, 1.f, dye, d, x.w2 + e * fd, f, 0.f, da, f);
  actBackwardInPlace(ctx, Act::Gelu, he, da, n * f); // da = d loss / d h
  if (gb1) columnSum(ctx, da, n, f, gb1);
  if (ir::isHalf(half)) roundInPlace(ctx, half, da, n * f);
  if (gw1) gemm(ctx, true, false, f, d, n, 1.f, da, f, xe, d, gw1.beta(), gw1.p, d);
  if (g.dx)
    gemm(ctx, false, false, n, d, f, 1.f, da, f, x.w1 + e * fd, d, g.dx.beta(), g.dx.p + at * d, d);
}

// Backward in = [dy, rows, counts, W1, b1, W2, b2, y, h], out = [drows, (counts: none), dW1,
// db1, dW2, db2].
void expertsBackward(const KernelCall& c, const Ctx& ctx) {
  ExpertRows x = expertRows(c, ctx, 1);
  ExpertGrads g{gradOut(c, 0), gradOut(c, 2), gradOut(c, 3), gradOut(c, 4), gradOut(c, 5)};
  int64_t hiddenBytes = alignUp(sizeof(float) * x.most * x.f);
  char* base = static_cast<char*>(ctx.scratch->get(2 * hiddenBytes));
  float *a = reinterpret_cast<float*>(base), *da = reinterpret_cast<float*>(base + hiddenBytes);
  for (int64_t e = 0; e < x.el; ++e)
    expertBackward(ctx, x, c.in[0].f32(), c.in[8].f32(), g, e, a, da, c.castParams);
  if (g.dx && !g.dx.acc) zeroFloats(ctx, g.dx.p + x.used() * x.d, (x.m - x.used()) * x.d);
}

// ---- moe_combine ------------------------------------------------------------------------

// y[t] = the token's kept copies' rows times their weights, in slot order.
__global__ void combineKernel(const float* rows, Routing r, MoeRouting m, float* y) {
  EPL_GRID_STRIDE(i, m.n * m.d) {
    int64_t t = i / m.d, j = i % m.d;
    float s = 0;
    for (int64_t slot = 0; slot < m.k; ++slot)
      if (int64_t at = r.row[t * m.k + slot]; at >= 0)
        s += r.weight[t * m.k + slot] * rows[at * m.d + j];
    y[i] = s;
  }
}

// drows[row] (+)= the weight of the copy it holds x dy of its token; rows with no copy get 0.
__global__ void combineDrowsKernel(const float* dy, Routing r, MoeRouting m, GradOut drows) {
  EPL_GRID_STRIDE(i, m.n * m.k * m.d) {
    int64_t at = r.copy[i / m.d];
    if (at >= 0)
      drows.put(i, r.weight[at] * dy[at / m.k * m.d + i % m.d]);
    else if (!drows.acc)
      drows.p[i] = 0.f;
  }
}

// One block per token (kThreads threads, K floats of dynamic shared memory): dw_s = dy . the
// row of slot s (0 when dropped), then through w_s = g_s / sum(g_sel):
// dgates[e of slot s] = (dw_s - sum_u dw_u w_u) / sum(g_sel), the other gates 0.
__global__ void combineDgatesKernel(const float* dy, const float* rows, const float* gates,
                                    Routing r, MoeRouting m, GradOut dg) {
  extern __shared__ float dw[];
  for (int64_t t = blockIdx.x; t < m.n; t += gridDim.x) {
    for (int64_t s = 0; s < m.k; ++s) {
      int64_t at = r.row[t * m.k + s]; // the same for the whole block
      double v = 0;
      if (at >= 0)
        for (int64_t j = threadIdx.x; j < m.d; j += blockDim.x)
          v += static_cast<double>(dy[t * m.d + j]) * rows[at * m.d + j];
      v = blockSum(v);
      if (threadIdx.x == 0) dw[s] = static_cast<float>(v);
    }
    __syncthreads();
    const int32_t* ex = r.expert + t * m.k;
    float sel = 0, dot = 0;
    for (int64_t s = 0; s < m.k; ++s) {
      sel += gates[t * m.e + ex[s]];
      dot += dw[s] * r.weight[t * m.k + s];
    }
    for (int32_t e = threadIdx.x; e < m.e; e += blockDim.x) {
      int64_t s = slotOf(ex, m.k, e);
      dg.put(t * m.e + e, s >= 0 ? (dw[s] - dot) / sel : 0.f);
    }
    __syncthreads(); // every thread has read dw before the next token writes it
  }
}

// in = [rows [N K, D], gates [N, E]], out = [y [N, D]].
void combineForward(const KernelCall& c, const Ctx& ctx) {
  MoeRouting m = moeRouting(c);
  Routing r = route(ctx, m, c.in[1].f32(), nullptr);
  combineKernel<<<blocksFor(m.n * m.d), kThreads, 0, ctx.stream>>>(c.in[0].f32(), r, m,
                                                                   c.out[0].f32());
  checkLaunch("moe combine");
}

// Backward in = [dy, rows, gates, y], out = [drows, dgates].
void combineBackward(const KernelCall& c, const Ctx& ctx) {
  MoeRouting m = moeRouting(c);
  const float *dy = c.in[0].f32(), *gates = c.in[2].f32();
  Routing r = route(ctx, m, gates, nullptr);
  if (GradOut drows = gradOut(c, 0)) {
    combineDrowsKernel<<<blocksFor(m.n * m.k * m.d), kThreads, 0, ctx.stream>>>(dy, r, m, drows);
    checkLaunch("moe combine backward rows");
  }
  GradOut dg = gradOut(c, 1);
  if (!dg || m.n == 0) return;
  unsigned blocks = static_cast<unsigned>(std::min<int64_t>(m.n, int64_t{65535} * 16));
  // dw rounded up to whole groups of 4 floats: ptxas reads the remainder of the unrolled loop
  // over dw (k mod 4 floats) in one wider load, which with k = 1 read 8 bytes past a
  // 4-byte array (compute-sanitizer's memcheck reported it on an H200; harmless on the
  // hardware, whose shared memory comes in larger granules, but out of bounds).
  size_t dwBytes = sizeof(float) * static_cast<size_t>((m.k + 3) / 4 * 4);
  combineDgatesKernel<<<blocks, kThreads, dwBytes, ctx.stream>>>(dy, c.in[1].f32(), gates, r, m,
                                                                 dg);
  checkLaunch("moe combine backward gates");
}

} // namespace

void moe(const KernelCall& c, const Ctx& ctx) {
  switch (c.kind) {
  case ir::OpKind::MoeRouter:
    return router(c, ctx);
  case ir::OpKind::MoeDispatch:
    return c.backward ? dispatchBackward(c, ctx) : dispatchForward(c, ctx);
  case ir::OpKind::MoeExperts:
    return c.backward ? expertsBackward(c, ctx) : expertsForward(c, ctx);
  case ir::OpKind::MoeCombine:
    return c.backward ? combineBackward(c, ctx) : combineForward(c, ctx);
  default:
    EPL_ASSERT(false, "not one of moe's ops");
  }
}

} // namespace epl::backend::cuda
