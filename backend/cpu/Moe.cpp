// moe: a linear router (no bias), softmax gates, top-k routing, and E gelu mlps.
//
// Forward:
//   1. gates = softmax(x Wr^T) (saved).
//   2. Each token picks the k largest gates (ties: the lower expert index); its weights
//      are those gates renormalised to sum 1.
//   3. Per expert e, over the tokens routed to it in token order (gathered rows):
//      h = x W1_e^T + b1_e (saved per (token, slot)), out_e = gelu(h) W2_e^T + b2_e.
//   4. y[token] = sum over its slots, in slot order, of weight * out_e.
// Backward recomputes the routing from the saved gates, and per expert gelu(h) and the
// expert output's dot with dy (for the weights' gradient), then flows through the
// renormalisation and the softmax into the router. Every sum runs in a fixed order.
//
// Shape legend: N tokens (every dim of x but the last), D width, E experts, F expert hidden
// width, S top-k slots, M tokens routed to one expert.
#include "backend/KernelShapes.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

#include <algorithm>
#include <vector>

namespace epl::backend::cpu {

namespace {

// Top-k routing: expert[n S + s] and normalised weight[n S + s] of each token's slots.
struct Routing {
  std::vector<int32_t> expert;
  std::vector<float> weight;
  std::vector<std::vector<int64_t>> rows; // per expert: the (token * S + slot) routed to it
};

Routing route(const MoeDims& m, const float* gates) {
  Routing r;
  r.expert.resize(m.n * m.k);
  r.weight.resize(m.n * m.k);
  parallelFor(m.n, rowGrain(m.e), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* g = gates + t * m.e;
      int32_t* ex = r.expert.data() + t * m.k;
      float sum = 0;
      for (int64_t s = 0; s < m.k; ++s) { // selection: strictly greater wins, so ties go low
        int32_t best = -1;
        for (int64_t e = 0; e < m.e; ++e) {
          if (std::find(ex, ex + s, static_cast<int32_t>(e)) != ex + s) continue;
          if (best < 0 || g[e] > g[best]) best = static_cast<int32_t>(e);
        }
        ex[s] = best;
        sum += g[best];
      }
      for (int64_t s = 0; s < m.k; ++s)
        r.weight[t * m.k + s] = g[ex[s]] / sum;
    }
  });
  r.rows.resize(m.e);
  for (int64_t i = 0; i < m.n * m.k; ++i)
    r.rows[r.expert[i]].push_back(i);
  return r;
}

// dst[i] = src[rows[i] / S] for each routed row, width w.
void gatherTokens(const float* src, const std::vector<int64_t>& rows, int64_t s, int64_t w,
                  float* dst) {
  int64_t m = static_cast<int64_t>(rows.size());
  parallelFor(m, rowGrain(w), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      std::memcpy(dst + i * w, src + rows[i] / s * w, sizeof(float) * w);
  });
}

void softmaxRows(float* x, int64_t rows, int64_t cols) {
  parallelFor(rows, rowGrain(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float* row = x + r * cols;
      float mx = *std::max_element(row, row + cols), s = 0;
      for (int64_t j = 0; j < cols; ++j) {
        row[j] = expf32(row[j] - mx);
        s += row[j];
      }
      for (int64_t j = 0; j < cols; ++j)
        row[j] /= s;
    }
  });
}

struct Params {
  const float *wr, *w1, *b1, *w2, *b2;
};

// in = [x [N, D], Wr [E, D], W1 [E, F, D], b1 [E, F], W2 [E, D, F], b2 [E, D]],
// out = [y [N, D], gates [N, E], h [N, S, F]].
void moeForward(const KernelCall& c, const MoeDims& m, const Params& p) {
  const float* x = c.in[0].f32();
  float *y = c.out[0].f32(), *gates = c.out[1].f32(), *h = c.out[2].f32();
  gemm(false, true, m.n, m.e, m.d, 1.f, x, m.d, p.wr, m.d, 0.f, gates, m.e);
  softmaxRows(gates, m.n, m.e);
  Routing r = route(m, gates);
  float *xe = scratch(0, m.n * m.d), *he = scratch(1, m.n * m.f), *ye = scratch(2, m.n * m.k * m.d);
  for (int64_t e = 0; e < m.e; ++e) {
    const auto& rows = r.rows[e];
    int64_t cnt = static_cast<int64_t>(rows.size());
    if (cnt == 0) continue;
    gatherTokens(x, rows, m.k, m.d, xe);
    broadcastRows(he, p.b1 + e * m.f, cnt, m.f);
    gemm(false, true, cnt, m.f, m.d, 1.f, xe, m.d, p.w1 + e * m.f * m.d, m.d, 1.f, he, m.f);
    for (int64_t i = 0; i < cnt; ++i) // saved h, per (token, slot)
      std::memcpy(h + rows[i] * m.f, he + i * m.f, sizeof(float) * m.f);
    actForward(Act::Gelu, he, he, cnt * m.f);
    float* out = xe; // reuse: the expert's outputs, [M, D]
    broadcastRows(out, p.b2 + e * m.d, cnt, m.d);
    gemm(false, true, cnt, m.d, m.f, 1.f, he, m.f, p.w2 + e * m.d * m.f, m.f, 1.f, out, m.d);
    for (int64_t i = 0; i < cnt; ++i)
      std::memcpy(ye + rows[i] * m.d, out + i * m.d, sizeof(float) * m.d);
  }
  parallelFor(m.n, rowGrain(m.d), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      for (int64_t j = 0; j < m.d; ++j) {
        float s = 0;
        for (int64_t slot = 0; slot < m.k; ++slot)
          s += r.weight[t * m.k + slot] * ye[(t * m.k + slot) * m.d + j];
        y[t * m.d + j] = s;
      }
  });
}

// Backward of one expert: parameter gradients, dL/dx of its rows into dxk [N S, D], and
// dL/dweight of its rows into dw [N S].
struct ExpertGrads {
  GradOut dw1, db1, dw2, db2;
};

void expertBackward(const MoeDims& m, const Params& p, int64_t e, const std::vector<int64_t>& rows,
                    const Routing& r, const float* x, const float* dy, const float* h,
                    const ExpertGrads& g, float* dxk, float* dw) {
  int64_t cnt = static_cast<int64_t>(rows.size());
  int64_t fd = m.f * m.d;
  auto zeroSlice = [&](const GradOut& o, int64_t off, int64_t len) {
    if (o && !o.acc) std::fill(o.p + off, o.p + off + len, 0.f);
  };
  if (cnt == 0) {
    zeroSlice(g.dw1, e * fd, fd), zeroSlice(g.db1, e * m.f, m.f);
    zeroSlice(g.dw2, e * fd, fd), zeroSlice(g.db2, e * m.d, m.d);
    return;
  }
  float *hRows = scratch(4, cnt * m.f), *a = scratch(0, cnt * m.f), *dyr = scratch(1, cnt * m.d),
        *da = scratch(2, cnt * m.f), *xe = scratch(3, cnt * m.d);
  for (int64_t i = 0; i < cnt; ++i)
    std::memcpy(hRows + i * m.f, h + rows[i] * m.f, sizeof(float) * m.f);
  gatherTokens(dy, rows, m.k, m.d, dyr); // unweighted dy rows
  const float *w1 = p.w1 + e * fd, *w2 = p.w2 + e * fd, *b2 = p.b2 + e * m.d;
  gemm(false, false, cnt, m.f, m.d, 1.f, dyr, m.d, w2, m.f, 0.f, da, m.f); // dy W2, unweighted
  actForward(Act::Gelu, hRows, a, cnt * m.f);
  parallelFor(cnt, rowGrain(m.f), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) { // dL/dweight = dy . (gelu(h) W2^T + b2)
      double s = 0;
      for (int64_t j = 0; j < m.f; ++j)
        s += da[i * m.f + j] * a[i * m.f + j];
      for (int64_t j = 0; j < m.d; ++j)
        s += dyr[i * m.d + j] * b2[j];
      dw[rows[i]] = static_cast<float>(s);
      float wt = r.weight[rows[i]];
      for (int64_t j = 0; j < m.d; ++j)
        dyr[i * m.d + j] *= wt; // now the weighted dy
      for (int64_t j = 0; j < m.f; ++j)
        da[i * m.f + j] *= wt;
    }
  });
  if (g.dw2)
    gemm(true, false, m.d, m.f, cnt, 1.f, dyr, m.d, a, m.f, g.dw2.beta(), g.dw2.p + e * fd, m.f);
  if (g.db2) columnSum(dyr, cnt, m.d, GradOut{g.db2.p + e * m.d, g.db2.acc});
  actBackwardInPlace(Act::Gelu, hRows, da, cnt * m.f); // da = dL/dh
  gatherTokens(x, rows, m.k, m.d, xe);
  if (g.dw1)
    gemm(true, false, m.f, m.d, cnt, 1.f, da, m.f, xe, m.d, g.dw1.beta(), g.dw1.p + e * fd, m.d);
  if (g.db1) columnSum(da, cnt, m.f, GradOut{g.db1.p + e * m.f, g.db1.acc});
  gemm(false, false, cnt, m.d, m.f, 1.f, da, m.f, w1, m.d, 0.f, xe, m.d);
  for (int64_t i = 0; i < cnt; ++i)
    std::memcpy(dxk + rows[i] * m.d, xe + i * m.d, sizeof(float) * m.d);
}

// dL/dlogits of the router from dL/dweight of each slot: through w_s = g_s / sum(g_sel),
// dL/dg_s = (dw_s - sum_t dw_t w_t) / sum(g_sel); then the softmax backward.
void routerGrad(const MoeDims& m, const Routing& r, const float* gates, const float* dw,
                float* dlogits) {
  parallelFor(m.n, rowGrain(m.e), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* g = gates + t * m.e;
      float* dl = dlogits + t * m.e;
      std::fill(dl, dl + m.e, 0.f);
      float sel = 0, dot = 0;
      for (int64_t s = 0; s < m.k; ++s) {
        sel += g[r.expert[t * m.k + s]];
        dot += dw[t * m.k + s] * r.weight[t * m.k + s];
      }
      for (int64_t s = 0; s < m.k; ++s) // dl holds dL/dgates for now
        dl[r.expert[t * m.k + s]] = (dw[t * m.k + s] - dot) / sel;
      float gdot = 0;
      for (int64_t e = 0; e < m.e; ++e)
        gdot += dl[e] * g[e];
      for (int64_t e = 0; e < m.e; ++e)
        dl[e] = g[e] * (dl[e] - gdot);
    }
  });
}

// in = [dy, x, Wr, W1, b1, W2, b2, y, gates, h], out = [dx, dWr, dW1, db1, dW2, db2].
void moeBackward(const KernelCall& c, const MoeDims& m, const Params& p) {
  const float *dy = c.in[0].f32(), *x = c.in[1].f32(), *gates = c.in[8].f32(), *h = c.in[9].f32();
  Routing r = route(m, gates);
  std::vector<float> dxk(m.n * m.k * m.d), dw(m.n * m.k), dlogits(m.n * m.e);
  ExpertGrads g{gradOut(c, 2), gradOut(c, 3), gradOut(c, 4), gradOut(c, 5)};
  for (int64_t e = 0; e < m.e; ++e)
    expertBackward(m, p, e, r.rows[e], r, x, dy, h, g, dxk.data(), dw.data());
  routerGrad(m, r, gates, dw.data(), dlogits.data());
  if (GradOut dwr = gradOut(c, 1))
    gemm(true, false, m.e, m.d, m.n, 1.f, dlogits.data(), m.e, x, m.d, dwr.beta(), dwr.p, m.d);
  GradOut dx = gradOut(c, 0);
  if (!dx) return;
  float* dxr = scratch(0, m.n * m.d); // router path, then the experts' slots in order
  gemm(false, false, m.n, m.d, m.e, 1.f, dlogits.data(), m.e, p.wr, m.d, 0.f, dxr, m.d);
  parallelFor(m.n, rowGrain(m.d), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      for (int64_t j = 0; j < m.d; ++j) {
        float s = dxr[t * m.d + j];
        for (int64_t slot = 0; slot < m.k; ++slot)
          s += dxk[(t * m.k + slot) * m.d + j];
        dx.put(t * m.d + j, s);
      }
  });
}

} // namespace

void moe(const KernelCall& c) {
  MoeDims m = moeDims(c);
  int base = c.backward ? 2 : 1;
  Params p{c.in[base].f32(), c.in[base + 1].f32(), c.in[base + 2].f32(), c.in[base + 3].f32(),
           c.in[base + 4].f32()};
  if (!c.backward) {
    expectArity(c, 6, 3);
    return moeForward(c, m, p);
  }
  expectArity(c, 10, 6);
  moeBackward(c, m, p);
}

} // namespace epl::backend::cpu
