// The CUDA attention's tiled kernels (backend/cuda/FlashTiles.cuh) run on the host through
// CudaEmulation.h, against attention written plainly in double: ctx and lse forward, every
// column of dqkv backward, over head widths of each padding (32, 64, 128), sequences that
// end inside a tile, causal masks, padding masks (i32 and i64) that leave queries no key,
// and k/v heads shared by several query heads. With the products' TF32 rounding off the
// kernels must match to f32's rounding; with it on (as on a GPU), to TF32's, and their fp32
// products (each three TF32 ones) to f32's again.
//
// Shape legend: B batch, T time, H heads, KV k/v heads, E head width, D = H E, LD = D + 2 KV E.
#include "CudaEmulation.h"

#include "backend/cuda/FlashTiles.cuh"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

namespace {

using namespace epl::backend::cuda;
using namespace epl::backend::cuda::flash;

struct Case {
  int64_t b, t, h, kv, e;
  bool causal;
  int maskKind; // 0 none, 1 i32, 2 i64
  int64_t d() const { return h * e; }
  int64_t ld() const { return d() + 2 * kv * e; }
};

struct Inputs {
  std::vector<float> qkv, dctx;
  std::vector<int32_t> mask32;
  std::vector<int64_t> mask64;
  MaskRows mask;
};

// Random q, k, v and dctx; a mask that hides some keys of every row and, in batch element
// 0, the first keys (so that its first causal queries see none).
Inputs inputsOf(const Case& c, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Inputs in;
  in.qkv.resize(static_cast<size_t>(c.b * c.t * c.ld()));
  in.dctx.resize(static_cast<size_t>(c.b * c.t * c.d()));
  for (float& v : in.qkv)
    v = normal(rng);
  for (float& v : in.dctx)
    v = normal(rng);
  if (c.maskKind == 0) return in;
  std::vector<int64_t> keep(static_cast<size_t>(c.b * c.t));
  for (int64_t i = 0; i < c.b * c.t; ++i) {
    int64_t bi = i / c.t, key = i % c.t;
    keep[static_cast<size_t>(i)] = (bi == 0 && key < 3) ? 0 : (key % 5 == 2 ? 0 : 1);
  }
  if (c.maskKind == 1) {
    in.mask32.assign(keep.begin(), keep.end());
    in.mask = {in.mask32.data(), false};
  } else {
    in.mask64 = keep;
    in.mask = {in.mask64.data(), true};
  }
  return in;
}

bool keeps(const Case& c, const Inputs& in, int64_t bi, int64_t key) {
  if (c.maskKind == 0) return true;
  size_t i = static_cast<size_t>(bi * c.t + key);
  return c.maskKind == 1 ? in.mask32[i] != 0 : in.mask64[i] != 0;
}

struct Reference {
  std::vector<double> ctx, lse, dvec, dqkv;
};

// Attention plainly, in double: P = softmax over the keys a query sees, ctx = P v; then
// dP = dctx v^T, dS = P (dP - Dvec), dq = scale dS k, dk = scale dS^T q, dv = P^T dctx.
Reference referenceOf(const Case& c, const Inputs& in) {
  const int64_t t = c.t, e = c.e, d = c.d(), ld = c.ld(), kvd = c.kv * e, group = c.h / c.kv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(e));
  Reference r;
  r.ctx.assign(static_cast<size_t>(c.b * t * d), 0.0);
  r.lse.assign(static_cast<size_t>(c.b * c.h * t), -INFINITY);
  r.dvec.assign(r.lse.size(), 0.0);
  r.dqkv.assign(in.qkv.size(), 0.0);
  auto q = [&](int64_t bi, int64_t h, int64_t i, int64_t j) {
    return static_cast<double>(in.qkv[static_cast<size_t>((bi * t + i) * ld + h * e + j)]);
  };
  auto k = [&](int64_t bi, int64_t h, int64_t i, int64_t j) {
    return static_cast<double>(in.qkv[static_cast<size_t>((bi * t + i) * ld + d + h * e + j)]);
  };
  auto v = [&](int64_t bi, int64_t h, int64_t i, int64_t j) {
    return static_cast<double>(
        in.qkv[static_cast<size_t>((bi * t + i) * ld + d + kvd + h * e + j)]);
  };
  for (int64_t bi = 0; bi < c.b; ++bi)
    for (int64_t h = 0; h < c.h; ++h) {
      const int64_t kvh = h / group;
      std::vector<double> p(static_cast<size_t>(t * t), 0.0);
      for (int64_t i = 0; i < t; ++i) {
        double m = -INFINITY;
        std::vector<double> s(static_cast<size_t>(t), -INFINITY);
        for (int64_t j = 0; j < t; ++j) {
          if ((c.causal && j > i) || !keeps(c, in, bi, j)) continue;
          double dot = 0;
          for (int64_t x = 0; x < e; ++x)
            dot += q(bi, h, i, x) * k(bi, kvh, j, x);
          s[static_cast<size_t>(j)] = scale * dot;
          m = std::max(m, s[static_cast<size_t>(j)]);
        }
        if (m == -INFINITY) continue;
        double l = 0;
        for (int64_t j = 0; j < t; ++j)
          l += std::exp(s[static_cast<size_t>(j)] - m);
        r.lse[static_cast<size_t>((bi * c.h + h) * t + i)] = m + std::log(l);
        for (int64_t j = 0; j < t; ++j)
          p[static_cast<size_t>(i * t + j)] = std::exp(s[static_cast<size_t>(j)] - m) / l;
        for (int64_t x = 0; x < e; ++x) {
          double acc = 0;
          for (int64_t j = 0; j < t; ++j)
            acc += p[static_cast<size_t>(i * t + j)] * v(bi, kvh, j, x);
          r.ctx[static_cast<size_t>((bi * t + i) * d + h * e + x)] = acc;
        }
      }
      auto dctx = [&](int64_t i, int64_t x) {
        return static_cast<double>(in.dctx[static_cast<size_t>((bi * t + i) * d + h * e + x)]);
      };
      for (int64_t i = 0; i < t; ++i) {
        double dv = 0;
        for (int64_t x = 0; x < e; ++x)
          dv += dctx(i, x) * r.ctx[static_cast<size_t>((bi * t + i) * d + h * e + x)];
        r.dvec[static_cast<size_t>((bi * c.h + h) * t + i)] = dv;
      }
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < t; ++j) {
          double pij = p[static_cast<size_t>(i * t + j)];
          if (pij == 0) continue;
          double dp = 0;
          for (int64_t x = 0; x < e; ++x)
            dp += dctx(i, x) * v(bi, kvh, j, x);
          double ds = pij * (dp - r.dvec[static_cast<size_t>((bi * c.h + h) * t + i)]);
          for (int64_t x = 0; x < e; ++x) {
            r.dqkv[static_cast<size_t>((bi * t + i) * ld + h * e + x)] +=
                scale * ds * k(bi, kvh, j, x);
            r.dqkv[static_cast<size_t>((bi * t + j) * ld + d + kvh * e + x)] +=
                scale * ds * q(bi, h, i, x);
            r.dqkv[static_cast<size_t>((bi * t + j) * ld + d + kvd + kvh * e + x)] +=
                pij * dctx(i, x);
          }
        }
    }
  return r;
}

// max |ours - ref| / max |ref| (infinities equal to each other count 0); NaN if any is NaN.
double relError(const std::vector<float>& ours, const std::vector<double>& ref) {
  double worst = 0, largest = 1e-6;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ours[i])) return NAN;
    if (std::isinf(ref[i]) && static_cast<double>(ours[i]) == ref[i]) continue;
    if (std::isfinite(ref[i])) largest = std::max(largest, std::abs(ref[i]));
    worst = std::max(worst, std::abs(static_cast<double>(ours[i]) - ref[i]));
  }
  return worst / largest;
}

// What the kernels wrote.
struct Outputs {
  std::vector<float> ctx, lse, dqkv;
};

template <int EP, bool Fp32>
Outputs run(const Case& c, const Inputs& in, const Reference& ref, double tol, bool qkvTf32) {
  Flash f;
  f.qkvTf32 = qkvTf32;
  f.qkv = in.qkv.data();
  f.mask = in.mask;
  f.t = c.t;
  f.h = c.h;
  f.e = c.e;
  f.group = c.h / c.kv;
  f.d = c.d();
  f.kvd = c.kv * c.e;
  f.ld = c.ld();
  f.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.e)));
  f.causal = c.causal;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> ctx(ref.ctx.size(), nan), lse(ref.lse.size(), nan);
  f.ctx = ctx.data();
  f.lse = lse.data();
  auto tiles = [](int64_t n, int64_t tile) { return static_cast<unsigned>((n + tile - 1) / tile); };
  const unsigned b = static_cast<unsigned>(c.b), h = static_cast<unsigned>(c.h);
  epl::emu::launch({tiles(c.t, kQT), h, b}, 4 * kWarp, 4 * forwardFloats<EP>(),
                   forwardKernel<EP, Fp32>, f);
  CHECK(relError(ctx, ref.ctx) <= tol);
  CHECK(relError(lse, ref.lse) <= tol);

  // The backward from the reference's lse and Dvec; every element of dqkv must be written.
  std::vector<float> lseIn(ref.lse.begin(), ref.lse.end()), dvec(ref.dvec.begin(), ref.dvec.end());
  std::vector<float> dqkv(ref.dqkv.size(), nan);
  f.lseIn = lseIn.data();
  f.dvec = dvec.data();
  f.dctx = in.dctx.data();
  f.dqkv = dqkv.data();
  epl::emu::launch({tiles(c.t, kKT), static_cast<unsigned>(c.kv), b}, 8 * kWarp,
                   4 * keysFloats<EP>(), keysKernel<EP, Fp32>, f);
  epl::emu::launch({tiles(c.t, kQT), h, b}, 8 * kWarp, 4 * queriesFloats<EP>(),
                   queriesKernel<EP, Fp32>, f);
  CHECK(relError(dqkv, ref.dqkv) <= tol);
  return {ctx, lse, dqkv};
}

// The kernels at c's padded width.
template <bool Fp32>
Outputs runAt(const Case& c, const Inputs& in, const Reference& ref, double tol,
              bool qkvTf32 = false) {
  INFO("B " << c.b << ", T " << c.t << ", H " << c.h << ", KV " << c.kv << ", E " << c.e
            << (c.causal ? ", causal" : "") << ", mask " << c.maskKind << ", tolerance " << tol
            << (qkvTf32 ? ", q, k and v TF32 values" : ""));
  switch (paddedWidth(c.e)) {
  case 32:
    return run<32, Fp32>(c, in, ref, tol, qkvTf32);
  case 64:
    return run<64, Fp32>(c, in, ref, tol, qkvTf32);
  default:
    return run<128, Fp32>(c, in, ref, tol, qkvTf32);
  }
}

unsigned seedOf(const Case& c) {
  return static_cast<unsigned>(c.t * 131 + c.e);
}

template <bool Fp32> void check(const Case& c, double tol) {
  Inputs in = inputsOf(c, seedOf(c));
  runAt<Fp32>(c, in, referenceOf(c, in), tol);
}

// x rounded to bf16 (nearest even), as amp rounds q, k and v: a TF32 value.
float bf16Of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + (u >> 16 & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// Each width's padding; T in one tile, ending inside a tile, and over several; GQA and MQA.
const Case kCases[] = {
    {2, 32, 4, 4, 16, true, 0},   // the char GPT of tests/parallel (E 16: padded to 32)
    {1, 130, 2, 1, 64, false, 1}, // one k/v head for two query heads; three key tiles
    {2, 70, 3, 3, 24, true, 2},   // an i64 mask hiding batch element 0's first keys
    {1, 65, 2, 2, 128, true, 0},  // the widest head; T one past a tile
    {1, 20, 2, 1, 100, false, 1}, // E 100 padded to 128
    {1, 100, 4, 2, 32, true, 1},  // two k/v heads, each for two query heads, causal, masked
};

} // namespace

TEST_CASE("The tiled attention kernels match attention in double, their products in f32") {
  epl::emu::tf32Rounding() = false;
  for (const Case& c : kCases)
    check<false>(c, 1e-5); // 9.7e-7 at most when written
}

TEST_CASE("The tiled attention kernels match attention in double within TF32's rounding") {
  epl::emu::tf32Rounding() = true;
  for (const Case& c : kCases)
    check<false>(c, 2e-3); // 5.6e-4 at most when written
}

TEST_CASE("The tiled attention kernels' fp32 products, three TF32 ones each, are fp32's") {
  epl::emu::tf32Rounding() = true;
  for (const Case& c : kCases)
    check<true>(c, 1e-5); // 1.05e-6 at most when written
}

TEST_CASE("The fp32 products leave out those of amp's q, k and v's zero low parts: the same "
          "sums") {
  epl::emu::tf32Rounding() = true;
  for (const Case& c : kCases) {
    Inputs in = inputsOf(c, seedOf(c));
    for (float& v : in.qkv)
      v = bf16Of(v);
    Reference ref = referenceOf(c, in);
    Outputs every = runAt<true>(c, in, ref, 1e-5), fewer = runAt<true>(c, in, ref, 1e-5, true);
    CHECK(every.ctx == fewer.ctx);
    CHECK(every.lse == fewer.lse);
    CHECK(every.dqkv == fewer.dqkv);
  }
}

TEST_CASE("The emulation refuses a barrier some threads never reach") {
  auto kernel = [] {
    if (threadIdx.x < 64) __syncthreads();
  };
  CHECK_THROWS_WITH(epl::emu::launch({1, 1, 1}, 128, 0, +kernel),
                    Catch::Contains("a barrier that not every thread"));
}
