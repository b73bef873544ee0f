// moe: a linear router (no bias), softmax gates, top-k routing, and E gelu mlps (the CUDA
// twin of backend/cpu/Moe.cpp, with the same saved gates and h).
//
// The routing lives on the device and the host never reads it (that would synchronise), so
// the host does not know how many tokens each expert gets: each expert's mlp runs over all
// N tokens, and only the rows of the tokens routed to it are kept (forward) or count
// (backward: the other rows are zeroed before they reach a sum). That costs E / S times the
// CPU's flops; grouped GEMMs sized on the device are the way to win them back.
//
// Forward:
//   1. gates = softmax(x Wr^T) (saved).
//   2. Each token picks the k largest gates (ties: the lower expert index); its weights
//      are those gates renormalised to sum 1.
//   3. Per expert e: h = x W1_e^T + b1_e, whose routed rows go to the saved h [N, S, F];
//      out = gelu(h) W2_e^T + b2_e, whose routed rows go to ye [N, S, D].
//   4. y[token] = sum over its slots, in slot order, of weight * ye.
// Backward recomputes the routing from the saved gates; per expert, from its routed rows hr
// of h (zero elsewhere): da = dy W2_e, dL/dweight = dy . out = da . gelu(hr) + dy . b2_e;
// the weighted dy and da give dW2 and db2; dL/dh = gelu'(hr) da gives dW1, db1 and the
// slot's dx. Then the router's gradient through the renormalisation and the softmax, and
// dx = the router's path plus the slots' dx in slot order. No atomics: every sum has one
// owner thread or block and a fixed order.
//
// Shape legend: N tokens (every dim of x but the last), D width, E experts, F expert hidden
// width, S top-k slots, W the width of the rows a helper moves (D or F).
#include "backend/KernelShapes.h"
#include "backend/cuda/Common.cuh"
#include "support/Assert.h"

namespace epl::backend::cuda {

namespace {

struct Params {
  const float *wr, *w1, *b1, *w2, *b2;
};

// Floats rounded up to a multiple of 256 bytes, to carve one scratch buffer into pieces.
int64_t padded(int64_t floats) {
  return (floats + 63) / 64 * 64;
}

// The slot of a token's S chosen experts (its row of expert[N, S]) that holds `e`, or -1.
__device__ int64_t slotOf(const int32_t* chosen, int64_t s, int32_t e) {
  for (int64_t slot = 0; slot < s; ++slot)
    if (chosen[slot] == e) return slot;
  return -1;
}

// Top-k routing, one thread per token: expert[N, S] and the renormalised weight[N, S].
// Selection: strictly greater wins, so ties go to the lower expert index.
__global__ void routeKernel(const float* gates, MoeDims m, int32_t* expert, float* weight) {
  EPL_GRID_STRIDE(t, m.n) {
    const float* g = gates + t * m.e;
    int32_t* ex = expert + t * m.k;
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
      weight[t * m.k + s] = g[ex[s]] / sum;
  }
}

// dst[token, slot] = src[token] for the tokens routed to expert e in that slot; rows of W.
__global__ void keepRoutedKernel(const float* src, const int32_t* expert, int32_t e, int64_t n,
                                 int64_t s, int64_t w, float* dst) {
  EPL_GRID_STRIDE(i, n * w) {
    int64_t t = i / w, slot = slotOf(expert + t * s, s, e);
    if (slot >= 0) dst[(t * s + slot) * w + i % w] = src[i];
  }
}

// dst[token] = src[token, slot] for the tokens routed to expert e in that slot, else 0.
__global__ void gatherRoutedKernel(const float* src, const int32_t* expert, int32_t e, int64_t n,
                                   int64_t s, int64_t w, float* dst) {
  EPL_GRID_STRIDE(i, n * w) {
    int64_t t = i / w, slot = slotOf(expert + t * s, s, e);
    dst[i] = slot >= 0 ? src[(t * s + slot) * w + i % w] : 0.f;
  }
}

// y[token] = sum over its slots, in slot order, of weight * ye[token, slot].
__global__ void combineSlotsKernel(const float* ye, const float* weight, MoeDims m, float* y) {
  EPL_GRID_STRIDE(i, m.n * m.d) {
    int64_t t = i / m.d, j = i % m.d;
    float s = 0;
    for (int64_t slot = 0; slot < m.k; ++slot)
      s += weight[t * m.k + slot] * ye[(t * m.k + slot) * m.d + j];
    y[i] = s;
  }
}

// v summed over the block (kThreads threads) in a fixed tree order; every thread gets it.
__device__ double blockSum(double v) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

struct ExpertRows {
  const float *dy, *a, *b2; // dy [N, D], a = gelu(hr) [N, F], b2 of the expert [D]
  float *da, *dyr;          // da = dy W2_e [N, F] in place; dyr [N, D] out
};

// One block per token, for expert e. Routed token: dw[token, slot] = da . a + dy . b2 (the
// expert output's dot with dy, in double), then dyr = weight dy and da *= weight. Other
// tokens: da and dyr rows are zeroed, so they add nothing to the expert's sums.
__global__ void slotGradKernel(ExpertRows r, const int32_t* expert, const float* weight, int32_t e,
                               MoeDims m, float* dw) {
  int64_t t = blockIdx.x, slot = slotOf(expert + t * m.k, m.k, e);
  float *da = r.da + t * m.f, *dyr = r.dyr + t * m.d;
  const float *a = r.a + t * m.f, *dy = r.dy + t * m.d;
  if (slot < 0) { // the same branch for the whole block
    for (int64_t j = threadIdx.x; j < m.f; j += kThreads)
      da[j] = 0.f;
    for (int64_t j = threadIdx.x; j < m.d; j += kThreads)
      dyr[j] = 0.f;
    return;
  }
  double s = 0;
  for (int64_t j = threadIdx.x; j < m.f; j += kThreads)
    s += da[j] * a[j];
  for (int64_t j = threadIdx.x; j < m.d; j += kThreads)
    s += dy[j] * r.b2[j];
  s = blockSum(s);
  if (threadIdx.x == 0) dw[t * m.k + slot] = static_cast<float>(s);
  float wt = weight[t * m.k + slot];
  for (int64_t j = threadIdx.x; j < m.d; j += kThreads)
    dyr[j] = dy[j] * wt;
  for (int64_t j = threadIdx.x; j < m.f; j += kThreads)
    da[j] *= wt;
}

// dL/dlogits of the router from dL/dweight of each slot, one thread per token: through
// w_s = g_s / sum(g_sel), dL/dg_s = (dw_s - sum_t dw_t w_t) / sum(g_sel); then the softmax
// backward.
__global__ void routerGradKernel(const float* gates, const int32_t* expert, const float* weight,
                                 const float* dw, MoeDims m, float* dlogits) {
  EPL_GRID_STRIDE(t, m.n) {
    const float* g = gates + t * m.e;
    const int32_t* ex = expert + t * m.k;
    float* dl = dlogits + t * m.e;
    for (int64_t e = 0; e < m.e; ++e)
      dl[e] = 0.f;
    float sel = 0, dot = 0;
    for (int64_t s = 0; s < m.k; ++s) {
      sel += g[ex[s]];
      dot += dw[t * m.k + s] * weight[t * m.k + s];
    }
    for (int64_t s = 0; s < m.k; ++s) // dl holds dL/dgates for now
      dl[ex[s]] = (dw[t * m.k + s] - dot) / sel;
    float gdot = 0;
    for (int64_t e = 0; e < m.e; ++e)
      gdot += dl[e] * g[e];
    for (int64_t e = 0; e < m.e; ++e)
      dl[e] = g[e] * (dl[e] - gdot);
  }
}

// dx[token] (+)= dxr[token] + the token's slot rows of dxk, in slot order.
__global__ void dxCombineKernel(const float* dxr, const float* dxk, MoeDims m, float* dx,
                                bool acc) {
  EPL_GRID_STRIDE(i, m.n * m.d) {
    int64_t t = i / m.d, j = i % m.d;
    float s = dxr[i];
    for (int64_t slot = 0; slot < m.k; ++slot)
      s += dxk[(t * m.k + slot) * m.d + j];
    dx[i] = acc ? dx[i] + s : s;
  }
}

// Launches of the row helpers above, over N rows of W.
void keepRouted(const Ctx& ctx, const float* src, const int32_t* expert, int32_t e,
                const MoeDims& m, int64_t w, float* dst) {
  keepRoutedKernel<<<blocksFor(m.n * w), kThreads, 0, ctx.stream>>>(src, expert, e, m.n, m.k, w,
                                                                    dst);
  checkLaunch("moe keepRouted");
}

void gatherRouted(const Ctx& ctx, const float* src, const int32_t* expert, int32_t e,
                  const MoeDims& m, int64_t w, float* dst) {
  gatherRoutedKernel<<<blocksFor(m.n * w), kThreads, 0, ctx.stream>>>(src, expert, e, m.n, m.k, w,
                                                                      dst);
  checkLaunch("moe gatherRouted");
}

void route(const Ctx& ctx, const float* gates, const MoeDims& m, int32_t* expert, float* weight) {
  routeKernel<<<blocksFor(m.n), kThreads, 0, ctx.stream>>>(gates, m, expert, weight);
  checkLaunch("moe route");
}

// Scratch of the forward, carved from one buffer.
struct ForwardScratch {
  int32_t* expert;               // [N, S]
  float *weight, *he, *out, *ye; // [N, S], [N, F], [N, D], [N, S, D]
};

ForwardScratch forwardScratch(const Ctx& ctx, const MoeDims& m) {
  int64_t sizes[] = {padded(m.n * m.k), padded(m.n * m.k), padded(m.n * m.f), padded(m.n * m.d),
                     padded(m.n * m.k * m.d)};
  float* base = static_cast<float*>(
      ctx.scratch->get(4 * (sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4])));
  ForwardScratch w;
  w.expert = reinterpret_cast<int32_t*>(base); // int32 and float are both 4 bytes
  w.weight = base + sizes[0];
  w.he = w.weight + sizes[1];
  w.out = w.he + sizes[2];
  w.ye = w.out + sizes[3];
  return w;
}

// in = [x [N, D], Wr [E, D], W1 [E, F, D], b1 [E, F], W2 [E, D, F], b2 [E, D]],
// out = [y [N, D], gates [N, E], h [N, S, F]].
void moeForward(const KernelCall& c, const Ctx& ctx, const MoeDims& m, const Params& p) {
  const float* x = c.in[0].f32();
  float *y = c.out[0].f32(), *gates = c.out[1].f32(), *h = c.out[2].f32();
  ForwardScratch w = forwardScratch(ctx, m);
  gemm(ctx, false, true, m.n, m.e, m.d, 1.f, x, m.d, p.wr, m.d, 0.f, gates, m.e);
  softmaxRows(ctx, gates, gates, m.n, m.e);
  route(ctx, gates, m, w.expert, w.weight);
  for (int32_t e = 0; e < m.e; ++e) {
    broadcastRows(ctx, w.he, p.b1 + e * m.f, m.n, m.f);
    gemm(ctx, false, true, m.n, m.f, m.d, 1.f, x, m.d, p.w1 + e * m.f * m.d, m.d, 1.f, w.he, m.f);
    keepRouted(ctx, w.he, w.expert, e, m, m.f, h); // saved h, per (token, slot)
    actForward(ctx, Act::Gelu, w.he, w.he, m.n * m.f);
    broadcastRows(ctx, w.out, p.b2 + e * m.d, m.n, m.d);
    gemm(ctx, false, true, m.n, m.d, m.f, 1.f, w.he, m.f, p.w2 + e * m.d * m.f, m.f, 1.f, w.out,
         m.d);
    keepRouted(ctx, w.out, w.expert, e, m, m.d, w.ye);
  }
  combineSlotsKernel<<<blocksFor(m.n * m.d), kThreads, 0, ctx.stream>>>(w.ye, w.weight, m, y);
  checkLaunch("moe combine slots");
}

// Scratch of the backward, carved from one buffer.
struct BackwardScratch {
  int32_t* expert;              // [N, S]
  float *weight, *dw, *dlogits; // [N, S], [N, S], [N, E]
  float* dxk;                   // [N, S, D]
  float *hr, *a, *da, *dyr;     // [N, F] x 3, [N, D] (also dx's router path)
};

BackwardScratch backwardScratch(const Ctx& ctx, const MoeDims& m) {
  int64_t slots = padded(m.n * m.k), logits = padded(m.n * m.e), dxk = padded(m.n * m.k * m.d),
          hidden = padded(m.n * m.f), rows = padded(m.n * m.d);
  float* base =
      static_cast<float*>(ctx.scratch->get(4 * (3 * slots + logits + dxk + 3 * hidden + rows)));
  BackwardScratch w;
  w.expert = reinterpret_cast<int32_t*>(base);
  w.weight = base + slots;
  w.dw = w.weight + slots;
  w.dlogits = w.dw + slots;
  w.dxk = w.dlogits + logits;
  w.hr = w.dxk + dxk;
  w.a = w.hr + hidden;
  w.da = w.a + hidden;
  w.dyr = w.da + hidden;
  return w;
}

struct ExpertGrads {
  GradOut dw1, db1, dw2, db2;
};

// Backward of expert e over all tokens: its parameter gradients, dL/dx of its slots into
// dxk [N, S, D] and dL/dweight of its slots into dw [N, S].
void expertBackward(const Ctx& ctx, const MoeDims& m, const Params& p, int32_t e, const float* x,
                    const float* dy, const float* h, const ExpertGrads& g,
                    const BackwardScratch& w) {
  int64_t fd = m.f * m.d;
  const float *w1 = p.w1 + e * fd, *w2 = p.w2 + e * fd;
  gatherRouted(ctx, h, w.expert, e, m, m.f, w.hr);
  gemm(ctx, false, false, m.n, m.f, m.d, 1.f, dy, m.d, w2, m.f, 0.f, w.da, m.f); // unweighted
  actForward(ctx, Act::Gelu, w.hr, w.a, m.n * m.f);
  ExpertRows rows{dy, w.a, p.b2 + e * m.d, w.da, w.dyr};
  if (m.n > 0) {
    slotGradKernel<<<static_cast<unsigned>(m.n), kThreads, 0, ctx.stream>>>(rows, w.expert,
                                                                            w.weight, e, m, w.dw);
    checkLaunch("moe slot gradients");
  }
  if (g.dw2)
    gemm(ctx, true, false, m.d, m.f, m.n, 1.f, w.dyr, m.d, w.a, m.f, g.dw2.beta(), g.dw2.p + e * fd,
         m.f);
  if (g.db2) columnSum(ctx, w.dyr, m.n, m.d, GradOut{g.db2.p + e * m.d, g.db2.acc});
  actBackwardInPlace(ctx, Act::Gelu, w.hr, w.da, m.n * m.f); // da = dL/dh
  if (g.dw1)
    gemm(ctx, true, false, m.f, m.d, m.n, 1.f, w.da, m.f, x, m.d, g.dw1.beta(), g.dw1.p + e * fd,
         m.d);
  if (g.db1) columnSum(ctx, w.da, m.n, m.f, GradOut{g.db1.p + e * m.f, g.db1.acc});
  gemm(ctx, false, false, m.n, m.d, m.f, 1.f, w.da, m.f, w1, m.d, 0.f, w.dyr, m.d);
  keepRouted(ctx, w.dyr, w.expert, e, m, m.d, w.dxk);
}

// in = [dy, x, Wr, W1, b1, W2, b2, y, gates, h], out = [dx, dWr, dW1, db1, dW2, db2].
void moeBackward(const KernelCall& c, const Ctx& ctx, const MoeDims& m, const Params& p) {
  const float *dy = c.in[0].f32(), *x = c.in[1].f32(), *gates = c.in[8].f32(), *h = c.in[9].f32();
  BackwardScratch w = backwardScratch(ctx, m);
  route(ctx, gates, m, w.expert, w.weight);
  ExpertGrads g{gradOut(c, 2), gradOut(c, 3), gradOut(c, 4), gradOut(c, 5)};
  for (int32_t e = 0; e < m.e; ++e)
    expertBackward(ctx, m, p, e, x, dy, h, g, w);
  routerGradKernel<<<blocksFor(m.n), kThreads, 0, ctx.stream>>>(gates, w.expert, w.weight, w.dw, m,
                                                                w.dlogits);
  checkLaunch("moe router gradient");
  if (GradOut dwr = gradOut(c, 1))
    gemm(ctx, true, false, m.e, m.d, m.n, 1.f, w.dlogits, m.e, x, m.d, dwr.beta(), dwr.p, m.d);
  GradOut dx = gradOut(c, 0);
  if (!dx) return;
  float* dxr = w.dyr; // the router's path to dx
  gemm(ctx, false, false, m.n, m.d, m.e, 1.f, w.dlogits, m.e, p.wr, m.d, 0.f, dxr, m.d);
  dxCombineKernel<<<blocksFor(m.n * m.d), kThreads, 0, ctx.stream>>>(dxr, w.dxk, m, dx.p, dx.acc);
  checkLaunch("moe dx");
}

} // namespace

void moe(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward)
    expectArity(c, 6, 3);
  else
    expectArity(c, 10, 6);
  MoeDims m = moeDims(c);
  int base = c.backward ? 2 : 1;
  Params p{c.in[base].f32(), c.in[base + 1].f32(), c.in[base + 2].f32(), c.in[base + 3].f32(),
           c.in[base + 4].f32()};
  if (!c.backward) return moeForward(c, ctx, m, p);
  moeBackward(c, ctx, m, p);
}

} // namespace epl::backend::cuda
