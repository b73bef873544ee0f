// The geometry of a kernel call (KernelShapes.h).
#include "backend/KernelShapes.h"

#include "backend/KernelArgs.h"

#include "support/Assert.h"

#include <cmath>

namespace epl::backend {

AttentionDims attentionDims(const KernelCall& c, const TensorView& x, const TensorView& wqkv) {
  EPL_ASSERT(x.shape.size() == 3, "attention input must be [B, T, D]");
  int64_t h = attrInt(c, "heads"), kv = attrInt(c, "kv_heads");
  EPL_ASSERT(h > 0 && kv > 0 && h % kv == 0, "attention's kv_heads must divide its heads");
  EPL_ASSERT(wqkv.shape.size() == 2 && wqkv.shape[0] % (h + 2 * kv) == 0,
             "attention's Wqkv is [D + 2 KV E, M]");
  AttentionDims s{x.shape[0], x.shape[1],           0, h, wqkv.shape[0] / (h + 2 * kv), x.shape[2],
                  0.f,        attrBool(c, "causal")};
  s.d = s.h * s.e;
  s.kv = kv;
  s.kvd = kv * s.e;
  s.ld = s.d + 2 * s.kvd;
  s.rotary = attrBool(c, "rotary");
  s.rotaryBase = attrFloat(c, "rotary_base");
  EPL_ASSERT(!s.rotary || s.e % 2 == 0, "rotary attention needs an even head width");
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.e)));
  return s;
}

AttentionSlots attentionSlots(const KernelCall& c) {
  return ir::attentionSlots(attrsOf(c), c.backward);
}

PoolWindow poolWindow(const KernelCall& c, const TensorView& x) {
  EPL_ASSERT(x.shape.size() == 4, "pooling takes [B, C, H, W]");
  PoolWindow g{x.shape[0] * x.shape[1], x.shape[2], x.shape[3], attrInt(c, "kernel"), 0, 0, 0};
  g.stride = attrInt(c, "stride") == 0 ? g.k : attrInt(c, "stride");
  g.ho = (g.h - g.k) / g.stride + 1;
  g.wo = (g.w - g.k) / g.stride + 1;
  return g;
}

ConvGeometry convGeometry(const KernelCall& c, const TensorView& x, const TensorView& w) {
  EPL_ASSERT(x.shape.size() == 4 && w.shape.size() == 4, "conv2d takes [B, C, H, W]");
  ConvGeometry g{x.shape[0], x.shape[1], x.shape[2],           x.shape[3],
                 w.shape[0], w.shape[2], attrInt(c, "stride"), attrInt(c, "padding"),
                 0,          0};
  g.ho = (g.h + 2 * g.pad - g.k) / g.stride + 1;
  g.wo = (g.w + 2 * g.pad - g.k) / g.stride + 1;
  return g;
}

MoeRouting moeRouting(const KernelCall& c) {
  // Forward: [x or rows, gates]; backward: [d out, x or rows, gates, …]. The gates give
  // the tokens: [B, ..., E].
  const TensorView& g = c.in[c.backward ? 2 : 1];
  MoeRouting m{rowsOf(g),           0, lastDim(c.in[c.backward ? 1 : 0]), lastDim(g),
               attrInt(c, "top_k"), 0, attrFloat(c, "aux_weight")};
  EPL_ASSERT(m.k >= 1 && m.k <= m.e, "moe top_k must be in [1, experts]");
  int64_t samples = g.shape.empty() ? 1 : g.shape[0];
  m.t = samples > 0 ? m.n / samples : 0;
  double factor = attrFloat(c, "capacity_factor");
  m.cap = factor > 0 ? static_cast<int64_t>(std::ceil(factor * static_cast<double>(m.t * m.k) /
                                                      static_cast<double>(m.e)))
                     : m.t * m.k;
  return m;
}

TransposeDims transposeDims(const KernelCall& c, const TensorView& src) {
  int64_t rank = static_cast<int64_t>(src.shape.size());
  int64_t d0 = attrInt(c, "dim0"), d1 = attrInt(c, "dim1");
  d0 = d0 < 0 ? d0 + rank : d0;
  d1 = d1 < 0 ? d1 + rank : d1;
  if (d0 > d1) std::swap(d0, d1);
  auto prod = [&](int64_t from, int64_t to) {
    int64_t p = 1;
    for (int64_t i = from; i < to; ++i)
      p *= src.shape[i];
    return p;
  };
  if (d0 == d1) return TransposeDims{prod(0, rank), 1, 1, 1, 1, true};
  return TransposeDims{prod(0, d0),   src.shape[d0],      prod(d0 + 1, d1),
                       src.shape[d1], prod(d1 + 1, rank), false};
}

Act parseAct(const std::string& word) {
  if (word == "gelu") return Act::Gelu;
  if (word == "gelu_exact") return Act::GeluExact;
  if (word == "relu") return Act::Relu;
  EPL_ASSERT(word == "silu", "unknown activation");
  return Act::Silu;
}

Act geluForm(const KernelCall& c) {
  return attrWord(c, "approx") == "none" ? Act::GeluExact : Act::Gelu;
}

namespace {

std::vector<int64_t> padTo(const std::vector<int64_t>& s, size_t rank) {
  std::vector<int64_t> p(rank - s.size(), 1);
  p.insert(p.end(), s.begin(), s.end());
  return p;
}

std::vector<int64_t> stridesOf(const std::vector<int64_t>& s, const std::vector<int64_t>& out) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = (s[i] == 1 && out[i] != 1) ? 0 : acc;
    acc *= s[i];
  }
  return st;
}

} // namespace

BroadcastNest broadcastNest(const std::vector<int64_t>& out, const std::vector<int64_t>& a,
                            const std::vector<int64_t>& b) {
  auto pa = padTo(a, out.size()), pb = padTo(b, out.size());
  auto sa = stridesOf(pa, out), sb = stridesOf(pb, out);
  BroadcastNest n;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 1) continue;
    bool merge = !n.dims.empty() && n.sa.back() == sa[i] * out[i] && n.sb.back() == sb[i] * out[i];
    if (merge) {
      n.dims.back() *= out[i];
      n.sa.back() = sa[i];
      n.sb.back() = sb[i];
    } else {
      n.dims.push_back(out[i]);
      n.sa.push_back(sa[i]);
      n.sb.push_back(sb[i]);
    }
  }
  if (n.dims.empty()) n = BroadcastNest{{1}, {1}, {1}};
  return n;
}

bool sameShape(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t rank = std::max(a.size(), b.size());
  return padTo(a, rank) == padTo(b, rank);
}

AroundDim aroundDim(const KernelCall& c, const std::vector<int64_t>& x) {
  int64_t r = static_cast<int64_t>(x.size()), d = attrInt(c, "dim");
  if (d < 0) d += r;
  EPL_ASSERT(d >= 0 && d < r, "the shape rule let a dim out of range through");
  AroundDim a;
  for (int64_t k = 0; k < r; ++k)
    (k < d ? a.o : k == d ? a.n : a.i) *= x[static_cast<size_t>(k)];
  return a;
}

KeptRun keptRun(const KernelCall& c, int64_t n) {
  bool select = c.kind == ir::OpKind::Select;
  KeptRun run{attrInt(c, select ? "index" : "start"), select ? 1 : attrInt(c, "length")};
  if (run.start < 0) run.start += n;
  EPL_ASSERT(run.start >= 0 && run.start + run.len <= n,
             "the shape rule let an index out of range through");
  return run;
}

} // namespace epl::backend
