// moe's four ops (docs/language.md, "moe"): the router, the dispatch that routes each
// token's copies to its top-k experts under a capacity, the experts' gelu mlps over their
// rows, and the combine that weights the rows back into their tokens. Between the dispatch
// and the experts an all-to-all moves the rows to the devices owning their experts when
// the experts are split (Executor::moeExchange); the kernels never communicate.
//
// Routing (the dispatch and the combine compute it alike from the gates, forward and
// backward, so nothing but the gates is kept):
//   1. Each token picks the k largest gates (ties: the lower expert index); its weights
//      are those gates renormalised to sum 1.
//   2. Within each sample (the T tokens of one batch row), each expert takes at most
//      `cap` copies, first choices first: slot 0 of every token in token order, then slot
//      1, … (GShard's and Switch's priority). A copy past the capacity is dropped: it adds
//      nothing to its token, whose other copies keep their weights.
//   3. The kept copies are laid out by expert, then sample, slot and token: the rows
//      expert e owns are one block, in the order one device would hold them however the
//      batch is spread, and the blocks of a device's experts are contiguous.
// The load-balancing loss of a sample (Switch Transformer): E x sum over e of f_e P_e,
// f_e the share of the sample's T k choices (before the capacity) that went to e, P_e the
// mean gate of e over its tokens. Per sample, so it adds up over samples like the loss.
//
// Shape legend: N tokens (every dim but the last; B samples of T), D width, E experts
// (El of them on this device), F expert hidden width, K top-k slots, M rows.
#include "backend/KernelShapes.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

#include <algorithm>
#include <vector>

namespace epl::backend::cpu {

namespace {

// Each token's choices and where its copies went.
struct Routing {
  std::vector<int32_t> expert; // [N K]: the expert of slot s of token t
  std::vector<float> weight;   // [N K]: its renormalised gate
  std::vector<int64_t> row;    // [N K]: its row among the dispatched rows, -1 when dropped
  std::vector<int64_t> counts; // [E]: rows of each expert
  std::vector<float> share;    // [N E]: f_e of the token's sample (the load-balancing loss)
  int64_t dropped = 0;
};

Routing route(const MoeRouting& m, const float* gates) {
  Routing r;
  int64_t nk = m.n * m.k, samples = m.t > 0 ? m.n / m.t : 0;
  r.expert.resize(nk);
  r.weight.resize(nk);
  r.row.assign(nk, -1);
  r.counts.assign(m.e, 0);
  r.share.assign(m.n * m.e, 0.f);
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
  // The capacity, per sample, first choices first; then each kept copy's place in its
  // expert's block (expert, sample, slot, token).
  std::vector<int64_t> kept(m.e), chosen(m.e);
  std::vector<std::vector<int64_t>> byExpert(m.e); // kept (token K + slot), in order
  for (int64_t b = 0; b < samples; ++b) {
    std::fill(kept.begin(), kept.end(), 0);
    std::fill(chosen.begin(), chosen.end(), 0);
    for (int64_t s = 0; s < m.k; ++s)
      for (int64_t t = b * m.t; t < (b + 1) * m.t; ++t) {
        int32_t e = r.expert[t * m.k + s];
        ++chosen[e];
        if (kept[e] == m.cap) {
          ++r.dropped;
          continue;
        }
        ++kept[e];
        byExpert[e].push_back(t * m.k + s);
      }
    for (int64_t t = b * m.t; t < (b + 1) * m.t; ++t)
      for (int64_t e = 0; e < m.e; ++e)
        r.share[t * m.e + e] = static_cast<float>(chosen[e]) / static_cast<float>(m.t * m.k);
  }
  int64_t next = 0;
  for (int64_t e = 0; e < m.e; ++e) {
    for (int64_t slot : byExpert[e])
      r.row[slot] = next++;
    r.counts[e] = static_cast<int64_t>(byExpert[e].size());
  }
  return r;
}

// in = [x [N, D], Wr [E, D]], out = [gates [N, E]]; backward in = [dgates, x, Wr, gates],
// out = [dx, dWr].
void router(const KernelCall& c) {
  if (!c.backward) {
    const TensorView &x = c.in[0], &wr = c.in[1];
    int64_t n = rowsOf(x), d = lastDim(x), e = wr.shape[0];
    float* gates = c.out[0].f32();
    gemm(false, true, n, e, d, 1.f, x.f32(), d, wr.f32(), d, 0.f, gates, e);
    parallelFor(n, rowGrain(e), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        float* row = gates + r * e;
        float mx = *std::max_element(row, row + e), s = 0;
        for (int64_t j = 0; j < e; ++j) {
          row[j] = expf32(row[j] - mx);
          s += row[j];
        }
        for (int64_t j = 0; j < e; ++j)
          row[j] /= s;
      }
    });
    return;
  }
  const TensorView &x = c.in[1], &wr = c.in[2];
  const float *dg = c.in[0].f32(), *g = c.in[3].f32();
  int64_t n = rowsOf(x), d = lastDim(x), e = wr.shape[0];
  float* dl = scratch(0, n * e); // d loss / d logits: g (dg - sum dg g)
  parallelFor(n, rowGrain(e), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float dot = 0;
      for (int64_t j = 0; j < e; ++j)
        dot += dg[r * e + j] * g[r * e + j];
      for (int64_t j = 0; j < e; ++j)
        dl[r * e + j] = g[r * e + j] * (dg[r * e + j] - dot);
    }
  });
  if (GradOut dwr = gradOut(c, 1))
    gemm(true, false, e, d, n, 1.f, dl, e, x.f32(), d, dwr.beta(), dwr.p, d);
  if (GradOut dx = gradOut(c, 0))
    gemm(false, false, n, d, e, 1.f, dl, e, wr.f32(), d, dx.beta(), dx.p, d);
}

// in = [x [N, D], gates [N, E]], out = [rows [N K, D], counts i32[E], stats f32[4]]: the
// kept copies grouped by expert (zeros after them), rows per expert, and (the sum over
// samples of their load-balancing loss, copies dropped, copies, samples).
// Backward in = [drows, x, gates, rows], out = [dx, dgates]: each token's copies' gradients
// in slot order, and the load-balancing loss's gradient of the gates.
void dispatch(const KernelCall& c) {
  MoeRouting m = moeRouting(c);
  int64_t samples = m.t > 0 ? m.n / m.t : 0;
  if (!c.backward) {
    const float *x = c.in[0].f32(), *gates = c.in[1].f32();
    Routing r = route(m, gates);
    float* rows = c.out[0].f32();
    std::fill(rows, rows + m.n * m.k * m.d, 0.f);
    parallelFor(m.n, rowGrain(m.k * m.d), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t)
        for (int64_t s = 0; s < m.k; ++s)
          if (int64_t at = r.row[t * m.k + s]; at >= 0)
            std::memcpy(rows + at * m.d, x + t * m.d, sizeof(float) * m.d);
    });
    int32_t* counts = static_cast<int32_t*>(c.out[1].data);
    for (int64_t e = 0; e < m.e; ++e)
      counts[e] = static_cast<int32_t>(r.counts[e]);
    double aux = 0; // sum over samples of E sum_e f_e P_e, P_e = the mean gate
    for (int64_t b = 0; b < samples; ++b)
      for (int64_t e = 0; e < m.e; ++e) {
        double p = 0;
        for (int64_t t = b * m.t; t < (b + 1) * m.t; ++t)
          p += gates[t * m.e + e];
        aux += static_cast<double>(m.e) * r.share[b * m.t * m.e + e] * p / static_cast<double>(m.t);
      }
    float* stats = c.out[2].f32();
    stats[0] = static_cast<float>(aux);
    stats[1] = static_cast<float>(r.dropped);
    stats[2] = static_cast<float>(m.n * m.k);
    stats[3] = static_cast<float>(samples);
    return;
  }
  const float *drows = c.in[0].f32(), *gates = c.in[2].f32();
  Routing r = route(m, gates);
  if (GradOut dx = gradOut(c, 0))
    parallelFor(m.n, rowGrain(m.d), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t)
        for (int64_t j = 0; j < m.d; ++j) {
          float s = 0;
          for (int64_t slot = 0; slot < m.k; ++slot)
            if (int64_t at = r.row[t * m.k + slot]; at >= 0) s += drows[at * m.d + j];
          dx.put(t * m.d + j, s);
        }
    });
  // d(aux_weight x sample weight x aux) / d gates[t, e] = that scale x E f_e / T.
  if (GradOut dg = gradOut(c, 1)) {
    float scale = static_cast<float>(m.auxWeight) * c.sampleWeight * static_cast<float>(m.e) /
                  static_cast<float>(m.t);
    for (int64_t i = 0; i < m.n * m.e; ++i)
      dg.put(i, scale * r.share[i]);
  }
}

// in = [rows [M, D], counts i32[El], W1 [El, F, D], b1 [El, F], W2 [El, D, F], b2 [El, D]],
// out = [y [M, D], h [M, F]]: expert e's block of rows (after the blocks of experts
// before it) through gelu(rows W1_e^T + b1_e) W2_e^T + b2_e; rows after the blocks give 0.
// Backward in = [dy, rows, counts, W1, b1, W2, b2, y, h], out = [drows, (counts: none),
// dW1, db1, dW2, db2]. Under amp, as mlp's: gelu(h) and dL/dh are rounded to the half type
// before the products that read them (db1 sums dL/dh unrounded).
void experts(const KernelCall& c) {
  int base = c.backward ? 1 : 0;
  const TensorView &rows = c.in[base], &w1v = c.in[base + 2];
  const int32_t* counts = static_cast<const int32_t*>(c.in[base + 1].data);
  int64_t m = rowsOf(rows), d = lastDim(rows), el = w1v.shape[0], f = w1v.shape[1], fd = f * d;
  const float *x = rows.f32(), *w1 = w1v.f32(), *b1 = c.in[base + 3].f32(),
              *w2 = c.in[base + 4].f32(), *b2 = c.in[base + 5].f32();
  std::vector<int64_t> first(el + 1, 0);
  for (int64_t e = 0; e < el; ++e)
    first[e + 1] = first[e] + counts[e];
  EPL_ASSERT(first[el] <= m, "moe_experts: the counts name more rows than the buffer holds");
  int64_t used = first[el];
  if (!c.backward) {
    float *y = c.out[0].f32(), *h = c.out[1].f32();
    for (int64_t e = 0; e < el; ++e) {
      int64_t n = first[e + 1] - first[e], at = first[e];
      if (n == 0) continue;
      float *he = h + at * f, *ye = y + at * d;
      broadcastRows(he, b1 + e * f, n, f);
      gemm(false, true, n, f, d, 1.f, x + at * d, d, w1 + e * fd, d, 1.f, he, f);
      float* a = workspace(c, 0, 0, n * f); // Module::workspaceBytes
      actForward(Act::Gelu, he, a, n * f);
      if (ir::isHalf(c.castParams)) roundTo(c.castParams, a, n * f);
      broadcastRows(ye, b2 + e * d, n, d);
      gemm(false, true, n, d, f, 1.f, a, f, w2 + e * fd, f, 1.f, ye, d);
    }
    std::fill(y + used * d, y + m * d, 0.f);
    std::fill(h + used * f, h + m * f, 0.f);
    return;
  }
  const float *dy = c.in[0].f32(), *h = c.in[8].f32();
  GradOut dx = gradOut(c, 0), dw1 = gradOut(c, 2), db1 = gradOut(c, 3), dw2 = gradOut(c, 4),
          db2 = gradOut(c, 5);
  for (int64_t e = 0; e < el; ++e) {
    int64_t n = first[e + 1] - first[e], at = first[e];
    GradOut gw1{dw1.p ? dw1.p + e * fd : nullptr, dw1.acc},
        gb1{db1.p ? db1.p + e * f : nullptr, db1.acc},
        gw2{dw2.p ? dw2.p + e * fd : nullptr, dw2.acc},
        gb2{db2.p ? db2.p + e * d : nullptr, db2.acc};
    if (n == 0) { // no rows: its wanted gradients are zero
      for (auto [g, len] : {std::pair{gw1, fd}, {gb1, f}, {gw2, fd}, {gb2, d}})
        if (g) zeroUnlessAcc(g, len);
      continue;
    }
    const float *dye = dy + at * d, *xe = x + at * d, *he = h + at * f;
    float *a = workspace(c, 0, 0, n * f), *da = workspace(c, 1, n * f, n * f);
    // gelu(h) and gelu'(h) in one pass (mlp's backward does the same), then dL/da in a.
    actForwardAndGrad(Act::Gelu, he, a, da, n * f);
    if (ir::isHalf(c.castParams)) roundTo(c.castParams, a, n * f);
    if (gw2) gemm(true, false, d, f, n, 1.f, dye, d, a, f, gw2.beta(), gw2.p, f);
    if (gb2) columnSum(dye, n, d, gb2);
    gemm(false, false, n, f, d, 1.f, dye, d, w2 + e * fd, f, 0.f, a, f);
    multiplyInto(da, a, n * f); // da = d loss / d h
    if (gb1) columnSum(da, n, f, gb1);
    if (ir::isHalf(c.castParams)) roundTo(c.castParams, da, n * f);
    if (gw1) gemm(true, false, f, d, n, 1.f, da, f, xe, d, gw1.beta(), gw1.p, d);
    if (dx) gemm(false, false, n, d, f, 1.f, da, f, w1 + e * fd, d, dx.beta(), dx.p + at * d, d);
  }
  if (dx && !dx.acc) std::fill(dx.p + used * d, dx.p + m * d, 0.f);
}

// in = [rows [N K, D], gates [N, E]], out = [y [N, D]]: each token's kept copies' rows times
// their weights, in slot order. Backward in = [dy, rows, gates, y], out = [drows, dgates]:
// drows of a copy = its weight x dy of its token; the weights' gradient dy . row goes
// through the renormalisation w_s = g_s / sum(g_sel) into the gates.
void combine(const KernelCall& c) {
  MoeRouting m = moeRouting(c);
  if (!c.backward) {
    const float *rows = c.in[0].f32(), *gates = c.in[1].f32();
    Routing r = route(m, gates);
    float* y = c.out[0].f32();
    parallelFor(m.n, rowGrain(m.d), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t)
        for (int64_t j = 0; j < m.d; ++j) {
          float s = 0;
          for (int64_t slot = 0; slot < m.k; ++slot)
            if (int64_t at = r.row[t * m.k + slot]; at >= 0)
              s += r.weight[t * m.k + slot] * rows[at * m.d + j];
          y[t * m.d + j] = s;
        }
    });
    return;
  }
  const float *dy = c.in[0].f32(), *rows = c.in[1].f32(), *gates = c.in[2].f32();
  Routing r = route(m, gates);
  if (GradOut drows = gradOut(c, 0)) {
    int64_t total = m.n * m.k;
    if (!drows.acc) std::fill(drows.p, drows.p + total * m.d, 0.f);
    parallelFor(m.n, rowGrain(m.k * m.d), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t)
        for (int64_t slot = 0; slot < m.k; ++slot)
          if (int64_t at = r.row[t * m.k + slot]; at >= 0)
            for (int64_t j = 0; j < m.d; ++j)
              drows.p[at * m.d + j] += r.weight[t * m.k + slot] * dy[t * m.d + j];
    });
  }
  GradOut dg = gradOut(c, 1);
  if (!dg) return;
  parallelFor(m.n, rowGrain(m.e + m.k * m.d), [&](int64_t lo, int64_t hi) {
    std::vector<float> dw(m.k), out(m.e);
    for (int64_t t = lo; t < hi; ++t) {
      const float* g = gates + t * m.e;
      float sel = 0, dot = 0;
      for (int64_t s = 0; s < m.k; ++s) {
        int64_t at = r.row[t * m.k + s];
        double v = 0;
        if (at >= 0)
          for (int64_t j = 0; j < m.d; ++j)
            v += static_cast<double>(dy[t * m.d + j]) * rows[at * m.d + j];
        dw[s] = static_cast<float>(v);
        sel += g[r.expert[t * m.k + s]];
        dot += dw[s] * r.weight[t * m.k + s];
      }
      std::fill(out.begin(), out.end(), 0.f);
      for (int64_t s = 0; s < m.k; ++s)
        out[r.expert[t * m.k + s]] = (dw[s] - dot) / sel;
      for (int64_t e = 0; e < m.e; ++e)
        dg.put(t * m.e + e, out[e]);
    }
  });
}

} // namespace

void moe(const KernelCall& c) {
  switch (c.kind) {
  case ir::OpKind::MoeRouter:
    return router(c);
  case ir::OpKind::MoeDispatch:
    return dispatch(c);
  case ir::OpKind::MoeExperts:
    return experts(c);
  case ir::OpKind::MoeCombine:
    return combine(c);
  default:
    EPL_ASSERT(false, "not one of moe's ops");
  }
}

} // namespace epl::backend::cpu
