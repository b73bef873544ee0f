// amp's products that read bf16 as it is stored (backend/cpu/KernelUtil.h, productsRead;
// backend/HalfStaging.h, directInputs): the same results as the f32 products of the
// widened operands up to the order of additions, in every layout and cut the CPU's gemm
// makes; and mlp's hidden rounded to the half type before its second product, whichever
// way its products read it.
#include "backend/Device.h"
#include "backend/comm/Wire.h"
#include "backend/cpu/KernelUtil.h"

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace {

namespace wire = epl::backend::wire;
using epl::ir::DType;

std::vector<float> pattern(int64_t n, float step, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = std::sin(step * static_cast<float>(i) + 0.3f) * scale;
  return v;
}

// v rounded to the half type t, and back.
std::vector<uint16_t> toHalf(DType t, const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    h[i] = t == DType::BF16 ? wire::toBf16(v[i]) : wire::toF16(v[i]);
  return h;
}

std::vector<float> widenedAs(DType t, const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i)
    v[i] = t == DType::BF16 ? wire::fromBf16(h[i]) : wire::fromF16(h[i]);
  return v;
}

// The f32 values of every top half (16 bits) with each of these low halves.
std::vector<float> everyTop(std::initializer_list<uint32_t> lows) {
  std::vector<float> x;
  for (uint32_t top = 0; top < 0x10000u; ++top)
    for (uint32_t low : lows) {
      uint32_t bits = top << 16 | low;
      float v;
      std::memcpy(&v, &bits, 4);
      x.push_back(v);
    }
  return x;
}

// The largest |a - b| over the largest |b|.
double relativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return err / scale;
}

// One row of y = gelu(x W1^T + b1) W2^T + b2 (tanh gelu) in float64, on the weights rounded
// to bf16 (w1 [F, D], b1 [F], w2 [D, F], b2 [D]): into rounded[0, D) with the hidden
// rounded to bf16 before the second product, into unrounded without.
void mlpReferenceRow(const std::vector<double>& x, const float* w1, const float* b1,
                     const float* w2, const float* b2, int64_t d, int64_t f, float* rounded,
                     float* unrounded) {
  auto round = [](double v) { return wire::fromBf16(wire::toBf16(static_cast<float>(v))); };
  std::vector<double> hid(static_cast<size_t>(f));
  for (int64_t j = 0; j < f; ++j) {
    double s = round(b1[j]);
    for (int64_t k = 0; k < d; ++k)
      s += x[k] * round(w1[j * d + k]);
    hid[j] = 0.5 * s * (1 + std::tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
  }
  for (int64_t i = 0; i < d; ++i) {
    double with = round(b2[i]), without = with;
    for (int64_t j = 0; j < f; ++j) {
      with += round(hid[j]) * round(w2[i * f + j]);
      without += hid[j] * round(w2[i * f + j]);
    }
    rounded[i] = static_cast<float>(with);
    unrounded[i] = static_cast<float>(without);
  }
}

struct ProductShape {
  int64_t m, n, k;
  bool transA, transB;
  float alpha, beta;
};
// Small (one call), row slices, column slices and split K (k >= 4 max(m, n)), in the
// layouts the kernels use, with alpha and an accumulating beta.
const ProductShape kProductShapes[] = {
    {5, 3, 7, false, true, 1.f, 0.f},         {300, 96, 64, false, true, 1.f, 0.f},
    {300, 96, 64, false, false, 1.f, 1.f},    {40, 520, 64, false, false, 0.5f, 0.f},
    {48, 64, 2048, true, false, 1.f, 1.f},    {96, 80, 300, true, false, 1.f, 0.f},
    {130, 70, 90, false, true, 0.25f, 0.75f},
};

} // namespace

TEST_CASE("half products match the f32 products of the widened operands") {
  // bf16 through oneDNN's bf16 kernels where the CPU has them: the same up to the order of
  // additions. IEEE half (no CPU multiplies it natively here), and bf16 elsewhere: gemm
  // widens each piece's operands into the thread's scratch, so the result is the f32
  // product's to the bit, cut into the same pieces; column sums of them too.
  using epl::backend::Operand;
  using epl::backend::cpu::gemm;
  REQUIRE_FALSE(epl::backend::cpu::productsRead(DType::F16));
  epl::backend::cpu::initThreads(2);
  for (DType t : {DType::BF16, DType::F16}) {
    bool exact = !epl::backend::cpu::productsRead(t);
    INFO("type " << static_cast<int>(t) << (exact ? ", widened" : ", native"));
    for (const ProductShape& s : kProductShapes) {
      INFO("m " << s.m << " n " << s.n << " k " << s.k << " transA " << s.transA << " transB "
                << s.transB);
      // Leading dimensions wider than the operands, so a piece's rows are not contiguous.
      int64_t lda = (s.transA ? s.m : s.k) + 3, ldb = (s.transB ? s.k : s.n) + 5;
      int64_t aRows = s.transA ? s.k : s.m, bRows = s.transB ? s.n : s.k;
      auto ah = toHalf(t, pattern(aRows * lda, 0.37f, 1.3f)),
           bh = toHalf(t, pattern(bRows * ldb, 0.71f, 0.9f));
      auto a = widenedAs(t, ah), b = widenedAs(t, bh);
      auto c0 = pattern(s.m * s.n, 0.13f, 0.5f);
      std::vector<float> half = c0, full = c0;
      gemm(s.transA, s.transB, s.m, s.n, s.k, s.alpha, Operand(ah.data(), t), lda,
           Operand(bh.data(), t), ldb, s.beta, half.data(), s.n);
      gemm(s.transA, s.transB, s.m, s.n, s.k, s.alpha, a.data(), lda, b.data(), ldb, s.beta,
           full.data(), s.n);
      if (exact)
        CHECK(std::memcmp(half.data(), full.data(), 4 * half.size()) == 0);
      else
        CHECK(relativeError(half, full) < 1e-5);
    }
    const int64_t rows = 150, cols = 37;
    auto xh = toHalf(t, pattern(rows * cols, 0.53f, 2.f));
    auto x = widenedAs(t, xh);
    std::vector<float> half(cols, 1.f), full(cols, 1.f);
    epl::backend::cpu::columnSum(Operand(xh.data(), t), rows, cols, {half.data(), true});
    epl::backend::cpu::columnSum(x.data(), rows, cols, {full.data(), true});
    CHECK(std::memcmp(half.data(), full.data(), 4 * half.size()) == 0);
  }
}

TEST_CASE("under amp, mlp rounds its hidden to the half type before the second product") {
  auto dev = epl::backend::makeCpuDevice(2);
  const int64_t n = 70, d = 24, f = 96;
  auto x = toHalf(DType::BF16, pattern(n * d, 0.41f, 1.7f));
  auto w1 = pattern(f * d, 0.77f, 0.4f), b1 = pattern(f, 0.5f, 0.1f);
  auto w2 = pattern(d * f, 0.93f, 0.3f), b2 = pattern(d, 0.6f, 0.1f);
  epl::ir::Attrs attrs{{"act", std::string("gelu")}, {"hidden", int64_t{f}}};
  std::vector<float> y(n * d), h(n * f);
  epl::backend::KernelCall c;
  c.kind = epl::ir::OpKind::Mlp;
  c.attrs = &attrs;
  c.in = {{x.data(), DType::BF16, {n, d}},
          {w1.data(), DType::F32, {f, d}},
          {b1.data(), DType::F32, {f}},
          {w2.data(), DType::F32, {d, f}},
          {b2.data(), DType::F32, {d}}};
  c.out = {{y.data(), DType::F32, {n, d}}, {h.data(), DType::F32, {n, f}}};
  c.castParams = DType::BF16;
  c.firstParam = 1;
  c.paramCount = 4;
  dev->launch(c);
  // The reference in double on the rounded operands, the hidden rounded or not.
  std::vector<float> rounded(n * d), unrounded(n * d);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<double> row(d);
    for (int64_t k = 0; k < d; ++k)
      row[k] = wire::fromBf16(x[r * d + k]);
    mlpReferenceRow(row, w1.data(), b1.data(), w2.data(), b2.data(), d, f, rounded.data() + r * d,
                    unrounded.data() + r * d);
  }
  double err = relativeError(y, rounded), apart = relativeError(unrounded, rounded);
  INFO("error " << err << ", the two references " << apart << " apart");
  CHECK(err < 1e-4);
  CHECK(apart > 10 * err);
}

TEST_CASE("moe's experts under amp: the hidden rounded before the second product, as mlp's") {
  // Two experts of 30 and 25 rows (and 5 rows after them): each block against a double
  // reference on the rounded weights, its gelu(h) rounded to bf16 or not; the kernel's
  // output follows the rounded one.
  auto dev = epl::backend::makeCpuDevice(2);
  const int64_t el = 2, m = 60, d = 16, f = 40;
  std::vector<int32_t> counts{30, 25};
  auto x = pattern(m * d, 0.41f, 1.7f);
  auto w1 = pattern(el * f * d, 0.77f, 0.4f), b1 = pattern(el * f, 0.5f, 0.1f);
  auto w2 = pattern(el * d * f, 0.93f, 0.3f), b2 = pattern(el * d, 0.6f, 0.1f);
  epl::ir::Attrs attrs{{"experts", int64_t{el}}, {"hidden", int64_t{f}}};
  std::vector<float> y(m * d), h(m * f);
  epl::backend::KernelCall c;
  c.kind = epl::ir::OpKind::MoeExperts;
  c.attrs = &attrs;
  c.in = {{x.data(), DType::F32, {m, d}},      {counts.data(), DType::I32, {el}},
          {w1.data(), DType::F32, {el, f, d}}, {b1.data(), DType::F32, {el, f}},
          {w2.data(), DType::F32, {el, d, f}}, {b2.data(), DType::F32, {el, d}}};
  c.out = {{y.data(), DType::F32, {m, d}}, {h.data(), DType::F32, {m, f}}};
  c.castParams = DType::BF16;
  c.firstParam = 2;
  c.paramCount = 4;
  dev->launch(c);
  std::vector<float> rounded(m * d, 0.f), unrounded(m * d, 0.f);
  for (int64_t e = 0, r = 0; e < el; ++e)
    for (int64_t end = r + counts[e]; r < end; ++r)
      mlpReferenceRow(std::vector<double>(x.begin() + r * d, x.begin() + (r + 1) * d),
                      w1.data() + e * f * d, b1.data() + e * f, w2.data() + e * d * f,
                      b2.data() + e * d, d, f, rounded.data() + r * d, unrounded.data() + r * d);
  double err = relativeError(y, rounded), apart = relativeError(unrounded, rounded);
  INFO("error " << err << ", the two references " << apart << " apart");
  CHECK(err < 1e-4);
  CHECK(apart > 10 * err);
}

TEST_CASE("mlp's backward under amp: the same with products on bf16 as on f32 copies") {
  // dy, x and the saved h given as bf16 views the products read as they are (where the CPU
  // has bf16 kernels; h then widened by the kernel a piece at a time), or as f32 views of
  // the same values, which are widened alike: the two differ only by the products' order
  // of additions.
  auto dev = epl::backend::makeCpuDevice(2);
  const int64_t n = 70, d = 24, f = 96;
  auto xh = toHalf(DType::BF16, pattern(n * d, 0.41f, 1.7f)),
       dyh = toHalf(DType::BF16, pattern(n * d, 0.29f, 0.8f));
  auto x = widenedAs(DType::BF16, xh), dy = widenedAs(DType::BF16, dyh);
  auto w1 = pattern(f * d, 0.77f, 0.4f), b1 = pattern(f, 0.5f, 0.1f);
  auto w2 = pattern(d * f, 0.93f, 0.3f), b2 = pattern(d, 0.6f, 0.1f);
  auto hh = toHalf(DType::BF16, pattern(n * f, 0.17f, 2.f));
  auto h = widenedAs(DType::BF16, hh);
  epl::ir::Attrs attrs{{"act", std::string("gelu")}, {"hidden", int64_t{f}}};
  struct Grads {
    std::vector<float> dx, dw1, db1, dw2, db2;
  };
  // withDw2 false: W2's gradient not wanted (the kernel's other way to dL/dh).
  auto backward = [&](void* xd, void* dyd, void* hd, DType t, bool withDw2) {
    Grads g{std::vector<float>(n * d), std::vector<float>(f * d), std::vector<float>(f),
            std::vector<float>(d * f), std::vector<float>(d)};
    epl::backend::KernelCall c;
    c.kind = epl::ir::OpKind::Mlp;
    c.backward = true;
    c.attrs = &attrs;
    c.in = {{dyd, t, {n, d}},
            {xd, t, {n, d}},
            {w1.data(), DType::F32, {f, d}},
            {b1.data(), DType::F32, {f}},
            {w2.data(), DType::F32, {d, f}},
            {b2.data(), DType::F32, {d}},
            {nullptr, DType::F32, {n, d}},
            {hd, t, {n, f}}};
    c.out = {{g.dx.data(), DType::F32, {n, d}},
             {g.dw1.data(), DType::F32, {f, d}},
             {g.db1.data(), DType::F32, {f}},
             {g.dw2.data(), DType::F32, {d, f}},
             {g.db2.data(), DType::F32, {d}}};
    if (!withDw2) c.out[3].data = nullptr;
    c.accumulate.assign(5, false);
    c.castParams = DType::BF16;
    c.firstParam = 2;
    c.paramCount = 4;
    dev->launch(c);
    return g;
  };
  for (bool withDw2 : {true, false}) {
    INFO("W2's gradient wanted: " << withDw2);
    Grads half = backward(xh.data(), dyh.data(), hh.data(), DType::BF16, withDw2);
    Grads full = backward(x.data(), dy.data(), h.data(), DType::F32, withDw2);
    CHECK(relativeError(half.dx, full.dx) < 1e-4);
    CHECK(relativeError(half.dw1, full.dw1) < 1e-4);
    CHECK(relativeError(half.db1, full.db1) < 1e-5);
    if (withDw2) CHECK(relativeError(half.dw2, full.dw2) < 1e-4);
    CHECK(relativeError(half.db2, full.db2) < 1e-5);
  }
}

TEST_CASE("attention under amp: the same with products on half views as on f32 copies") {
  // As for mlp: x, dy and the saved context as bf16 or IEEE half views the projections read
  // as they are, or as f32 views of the same values, widened alike.
  for (DType type : {DType::BF16, DType::F16}) {
    INFO("type " << static_cast<int>(type));
    auto dev = epl::backend::makeCpuDevice(2);
    const int64_t b = 2, t = 20, m = 32, h = 2, ld = 3 * m;
    auto xh = toHalf(type, pattern(b * t * m, 0.41f, 1.7f)),
         dyh = toHalf(type, pattern(b * t * m, 0.29f, 0.8f));
    auto ctxh = toHalf(type, pattern(b * t * m, 0.53f, 0.6f));
    auto x = widenedAs(type, xh), dy = widenedAs(type, dyh), ctx = widenedAs(type, ctxh);
    auto wqkv = pattern(ld * m, 0.77f, 0.3f), bqkv = pattern(ld, 0.5f, 0.1f);
    auto wp = pattern(m * m, 0.93f, 0.3f), bp = pattern(m, 0.6f, 0.1f);
    // Small scores, and each row's log-sum-exp near log(its visible keys): probabilities of
    // about 1 / (t + 1), as the forward would save them.
    auto qkv = pattern(b * t * ld, 0.19f, 0.3f);
    std::vector<float> lse(b * h * t);
    for (size_t i = 0; i < lse.size(); ++i)
      lse[i] = std::log(static_cast<float>(i % t + 1));
    epl::ir::Attrs attrs{{"heads", int64_t{h}},   {"kv_heads", int64_t{h}}, {"causal", true},
                         {"bias", true},          {"mask", false},          {"rotary", false},
                         {"rotary_base", 10000.0}};
    using Views = std::vector<epl::backend::TensorView>;
    auto launch = [&](bool backward, Views in, Views out) {
      epl::backend::KernelCall c;
      c.kind = epl::ir::OpKind::Attention;
      c.backward = backward;
      c.attrs = &attrs;
      c.in = std::move(in);
      c.out = std::move(out);
      c.accumulate.assign(c.out.size(), false);
      c.castParams = type;
      c.firstParam = backward ? 2 : 1;
      c.paramCount = 4;
      dev->launch(c);
    };
    auto forward = [&](void* xd, DType type) {
      std::vector<std::vector<float>> o{
          std::vector<float>(b * t * m), std::vector<float>(b * t * ld),
          std::vector<float>(b * t * m), std::vector<float>(b * h * t)};
      launch(false,
             {{xd, type, {b, t, m}},
              {wqkv.data(), DType::F32, {ld, m}},
              {bqkv.data(), DType::F32, {ld}},
              {wp.data(), DType::F32, {m, m}},
              {bp.data(), DType::F32, {m}}},
             {{o[0].data(), DType::F32, {b, t, m}},
              {o[1].data(), DType::F32, {b, t, ld}},
              {o[2].data(), DType::F32, {b, t, m}},
              {o[3].data(), DType::F32, {b, h, t}}});
      return o;
    };
    auto backward = [&](void* dyd, void* xd, void* ctxd, DType type) {
      std::vector<std::vector<float>> g{std::vector<float>(b * t * m), std::vector<float>(ld * m),
                                        std::vector<float>(ld), std::vector<float>(m * m),
                                        std::vector<float>(m)};
      launch(true,
             {{dyd, type, {b, t, m}},
              {xd, type, {b, t, m}},
              {wqkv.data(), DType::F32, {ld, m}},
              {bqkv.data(), DType::F32, {ld}},
              {wp.data(), DType::F32, {m, m}},
              {bp.data(), DType::F32, {m}},
              {nullptr, DType::F32, {b, t, m}},
              {qkv.data(), DType::F32, {b, t, ld}},
              {ctxd, type, {b, t, m}},
              {lse.data(), DType::F32, {b, h, t}}},
             {{g[0].data(), DType::F32, {b, t, m}},
              {g[1].data(), DType::F32, {ld, m}},
              {g[2].data(), DType::F32, {ld}},
              {g[3].data(), DType::F32, {m, m}},
              {g[4].data(), DType::F32, {m}}});
      return g;
    };
    auto half = forward(xh.data(), type), full = forward(x.data(), DType::F32);
    CHECK(relativeError(half[0], full[0]) < 1e-4);
    CHECK(relativeError(half[1], full[1]) < 1e-4);
    // The context is stored in the half type under amp: the same values there (one path rounds its
    // f32 copy in place, the other reads a rounded one).
    CHECK(relativeError(widenedAs(type, toHalf(type, half[2])),
                        widenedAs(type, toHalf(type, full[2]))) < 1e-4);
    auto dhalf = backward(dyh.data(), xh.data(), ctxh.data(), type);
    auto dfull = backward(dy.data(), x.data(), ctx.data(), DType::F32);
    for (size_t i = 0; i < dhalf.size(); ++i) {
      INFO("gradient " << i);
      CHECK(relativeError(dhalf[i], dfull[i]) < 1e-4);
    }
  }
}

TEST_CASE("attention under amp: the scores read q, k and v rounded, as they are saved") {
  // The forward's saved qkv holds bf16 values, and its context (rounded to bf16 itself, as
  // the output projection reads it) is causal attention over those rounded values (a
  // float64 reference from them), not over the unrounded ones (the same reference from q,
  // k and v computed in float64): the backward, which reads the saved qkv, then
  // differentiates the function the forward ran.
  auto dev = epl::backend::makeCpuDevice(2);
  const int64_t b = 2, t = 24, m = 32, h = 2, e = m / h, ld = 3 * m;
  auto x = pattern(b * t * m, 0.41f, 1.7f), wqkv = pattern(ld * m, 0.77f, 0.3f);
  auto bqkv = pattern(ld, 0.5f, 0.1f), wp = pattern(m * m, 0.93f, 0.3f),
       bp = pattern(m, 0.6f, 0.1f);
  epl::ir::Attrs attrs{{"heads", int64_t{h}},   {"kv_heads", int64_t{h}}, {"causal", true},
                       {"bias", true},          {"mask", false},          {"rotary", false},
                       {"rotary_base", 10000.0}};
  std::vector<float> y(b * t * m), qkv(b * t * ld), ctx(b * t * m), lse(b * h * t);
  epl::backend::KernelCall c;
  c.kind = epl::ir::OpKind::Attention;
  c.attrs = &attrs;
  c.in = {{x.data(), DType::F32, {b, t, m}},
          {wqkv.data(), DType::F32, {ld, m}},
          {bqkv.data(), DType::F32, {ld}},
          {wp.data(), DType::F32, {m, m}},
          {bp.data(), DType::F32, {m}}};
  c.out = {{y.data(), DType::F32, {b, t, m}},
           {qkv.data(), DType::F32, {b, t, ld}},
           {ctx.data(), DType::F32, {b, t, m}},
           {lse.data(), DType::F32, {b, h, t}}};
  c.accumulate.assign(4, false);
  c.castParams = DType::BF16;
  c.firstParam = 1;
  c.paramCount = 4;
  dev->launch(c);
  for (float v : qkv)
    REQUIRE(wire::fromBf16(wire::toBf16(v)) == v);
  // q, k and v in float64 from x and the rounded weights, unrounded.
  std::vector<double> exact(b * t * ld);
  for (int64_t r = 0; r < b * t; ++r)
    for (int64_t o = 0; o < ld; ++o) {
      double acc = bqkv[o];
      for (int64_t i = 0; i < m; ++i)
        acc += static_cast<double>(x[r * m + i]) * wire::fromBf16(wire::toBf16(wqkv[o * m + i]));
      exact[r * ld + o] = acc;
    }
  auto attend = [&](auto&& at) { // causal attention over qkv values at(row, column)
    std::vector<float> out(b * t * m);
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hd = 0; hd < h; ++hd)
        for (int64_t i = 0; i < t; ++i) {
          std::vector<double> p(i + 1);
          double top = -1e300, sum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            double sc = 0;
            for (int64_t k = 0; k < e; ++k)
              sc += at(bi * t + i, hd * e + k) * at(bi * t + j, m + hd * e + k);
            p[j] = sc / std::sqrt(static_cast<double>(e));
            top = std::max(top, p[j]);
          }
          for (double& v : p)
            sum += v = std::exp(v - top);
          for (int64_t k = 0; k < e; ++k) {
            double acc = 0;
            for (int64_t j = 0; j <= i; ++j)
              acc += p[j] / sum * at(bi * t + j, 2 * m + hd * e + k);
            out[(bi * t + i) * m + hd * e + k] =
                wire::fromBf16(wire::toBf16(static_cast<float>(acc)));
          }
        }
    return out;
  };
  auto rounded =
      attend([&](int64_t r, int64_t col) { return static_cast<double>(qkv[r * ld + col]); });
  auto unrounded = attend([&](int64_t r, int64_t col) { return exact[r * ld + col]; });
  double err = relativeError(ctx, rounded), apart = relativeError(unrounded, rounded);
  INFO("error " << err << ", the two references " << apart << " apart");
  CHECK(err < 1e-2 * apart);
}

TEST_CASE("linear under amp writes its bf16 output a block of rows at a time") {
  // y = x W^T + b with x in bf16 and W, b cast to it (amp's call), y in bf16 as the device
  // writes it against y in f32 rounded after: the same bits where the output is one block
  // (ir::halfOutputRows), within rounding where it is cut into blocks (o = 2^22 columns:
  // blocks of 4 rows and a last one of 1). NaN bits beforehand show a row left unwritten.
  auto dev = epl::backend::makeCpuDevice(2);
  for (const auto& shape : {std::array<int64_t, 3>{70, 24, 40}, {5, 3, int64_t{1} << 22}}) {
    const int64_t n = shape[0], d = shape[1], o = shape[2];
    INFO("n " << n << ", d " << d << ", o " << o);
    epl::ir::Attrs attrs{{"bias", true}, {"out", o}};
    REQUIRE(epl::ir::halfOutputRows(n, o) == (o > 40 ? 4 : n));
    auto x = toHalf(DType::BF16, pattern(n * d, 0.41f, 1.7f));
    auto w = pattern(o * d, 0.77f, 0.4f), b = pattern(o, 0.5f, 0.3f);
    std::vector<float> wide(n * o);
    std::vector<uint16_t> half(n * o, 0x7fc0); // NaN
    auto launch = [&](void* y, DType t) {
      epl::backend::KernelCall c;
      c.kind = epl::ir::OpKind::Linear;
      c.attrs = &attrs;
      c.in = {{x.data(), DType::BF16, {n, d}},
              {w.data(), DType::F32, {o, d}},
              {b.data(), DType::F32, {o}}};
      c.out = {{y, t, {n, o}}};
      c.castParams = DType::BF16;
      c.firstParam = 1;
      c.paramCount = 2;
      dev->launch(c);
    };
    launch(wide.data(), DType::F32);
    launch(half.data(), DType::BF16);
    int64_t differ = 0, far = 0;
    for (int64_t i = 0; i < n * o; ++i) {
      uint16_t want = wire::toBf16(wide[i]);
      differ += half[i] != want;
      // Within a unit of bf16's last place (the blocks' products may add in another order).
      float got = wire::fromBf16(half[i]), close = wire::fromBf16(want);
      far += !(std::fabs(got - close) <= std::fabs(close) / 128 + 1e-6f);
    }
    CHECK(far == 0);
    if (o == 40) CHECK(differ == 0);
  }
}

TEST_CASE("the CPU's bf16 rounding is the wire's, bit for bit") {
  // amp's vectorised, parallel loops (narrowTo, roundTo) against the scalar conversion,
  // which tests/comm/WireTest.cpp checks against nearest-even rounding itself.
  // Every top half with the low halves that decide a rounding: exact, just above, just
  // below, at and past the tie, and all ones (NaNs, infinities and the carry into them).
  std::vector<float> x = everyTop({0x0u, 0x1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu});
  std::vector<uint16_t> narrowed(x.size());
  epl::backend::cpu::narrowTo(DType::BF16, x.data(), narrowed.data(),
                              static_cast<int64_t>(x.size()));
  std::vector<float> rounded = x;
  epl::backend::cpu::roundTo(DType::BF16, rounded.data(), static_cast<int64_t>(rounded.size()));
  int64_t wrong = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t want = wire::toBf16(x[i]);
    float back = wire::fromBf16(want);
    if (narrowed[i] != want || std::memcmp(&rounded[i], &back, 4) != 0) ++wrong;
  }
  CHECK(wrong == 0);
}

TEST_CASE("the CPU's IEEE half conversions are the wire's, bit for bit") {
  // Vectorised where the CPU converts half itself (F16C): every pattern whose rounding to
  // half differs in its low bits (ties, carries, subnormal results, overflow to infinity),
  // with NaNs and infinities among them, and every half value widened back (a NaN to a NaN:
  // the wire's own decode quiets a signalling one); the lengths leave tails and groups of 8
  // holding a NaN.
  std::vector<float> x = everyTop({0x0u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu, 0x2000u});
  x.resize(x.size() - 3); // not a multiple of 8
  std::vector<uint16_t> narrowed(x.size());
  epl::backend::cpu::narrowTo(DType::F16, x.data(), narrowed.data(),
                              static_cast<int64_t>(x.size()));
  int64_t wrong = 0;
  for (size_t i = 0; i < x.size(); ++i)
    wrong += narrowed[i] != wire::toF16(x[i]);
  CHECK(wrong == 0);
  std::vector<uint16_t> halves(0x10000 + 5);
  for (size_t i = 0; i < halves.size(); ++i)
    halves[i] = static_cast<uint16_t>(i * 7919 % 0x10000); // every value, shuffled
  std::vector<float> widened(halves.size());
  epl::backend::cpu::widenRun(DType::F16, halves.data(), widened.data(),
                              static_cast<int64_t>(halves.size()));
  wrong = 0;
  for (size_t i = 0; i < halves.size(); ++i) { // a NaN as a NaN (either may quiet it)
    float want = wire::fromF16(halves[i]);
    wrong += std::isnan(want) ? !std::isnan(widened[i]) : std::memcmp(&widened[i], &want, 4) != 0;
  }
  CHECK(wrong == 0);
}
