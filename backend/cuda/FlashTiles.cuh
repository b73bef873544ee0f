// attention's scaled dot products on tensor cores, a tile at a time: the scores of a tile of
// queries against a tile of keys live in shared memory only (the flash-attention scheme),
// where Attention.cu's cuBLAS path writes each group of heads' [T, T] scores to device
// memory and reads them back three times. Products go through WMMA fragments of 16 x 16 x 8
// (TF32 operands, f32 sums): once each under `matmul = tf32`, three times in fp32's
// precision otherwise (Fp32: mmaSteps; under amp, whose q, k and v are TF32 values already,
// a product with one of them as an operand takes two, with both one: Flash::qkvTf32);
// softmax, masks and the rescaling run on f32 values in shared memory.
//
// Forward: one block per tile of 64 queries of one head of one batch element (4 warps, 16
// query rows each), over the tiles of 64 keys its queries see (causal: up to its last query):
//   1. S = q k^T (each warp its rows), scaled; -inf where a key is masked, past T or, causal,
//      after the query;
//   2. m' = max(m, rowmax S); P = exp(S - m'); l = l e^(m - m') + rowsum P;
//      O = O e^(m - m') + P v;
// then ctx = O / l and lse = m + log l; a query whose every key is masked gets ctx 0 and
// lse -inf, as on the CPU.
// Backward, in two kernels so that no two blocks write one value (no atomics: the same bits
// on every run), each recomputing P = exp(scale q k^T - lse) and dS = P (dctx v^T - Dvec):
//   keys:    one block per tile of 64 keys of one k/v head (8 warps), over the query heads
//            that share it and their tiles of 32 queries: dv += P^T dctx, dk += scale dS^T q,
//            held in fragments until the end;
//   queries: one block per tile of 64 queries of one head (8 warps), over the key tiles its
//            queries see: dq += scale dS k.
// Heads are padded with zeros to EP columns (32, 64 or 128) in shared memory: the zero
// columns of q and k add nothing to S, and those of v, dctx and the results are not written.
// Blocks take the longest tiles first (causal: the last queries, the first keys).
//
// Shape legend: B batch, T time, H heads, KV k/v heads, E head width (EP padded), D = H E,
// KVD = KV E, LD = D + 2 KVD a row of qkv; tiles of QT queries and KT keys.
//
// The device code alone, for FlashAttention.cu's launches and for the test that runs it on
// the host (tests/emulated/FlashTilesTest.cpp, through tests/emulated/CudaEmulation.h, which
// defines EPL_CUDA_EMULATION and what CUDA gives the kernels).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#ifndef EPL_CUDA_EMULATION
#include <mma.h>
#define EPL_DYNAMIC_SHARED(name) extern __shared__ __align__(128) float name[]
// Loops over arrays of fragments are unrolled, so the fragments stay in registers.
#define EPL_UNROLL _Pragma("unroll")
#endif

namespace epl::backend::cuda {

// The padding mask [B, T] of an attention (i32 or i64, non-zero keeps a key), or none.
struct MaskRows {
  const void* p = nullptr;
  bool wide = false; // i64
};

namespace flash {

namespace wmma = nvcuda::wmma;

constexpr int kWarp = 32;
constexpr int kQT = 64;       // queries of a forward tile and of the dq kernel's
constexpr int kKT = 64;       // keys of a tile
constexpr int kKeysQT = 32;   // queries of a tile in the dk/dv kernel
constexpr int kLds = kKT + 4; // a row of scores in shared memory (padded: fewer bank conflicts)
constexpr int kMaxE = 128;

// The width a head of E columns is padded to: 32, 64 or 128 (E at most kMaxE).
inline int paddedWidth(int64_t e) {
  return e <= 32 ? 32 : e <= 64 ? 64 : 128;
}

// What the kernels read of the call: pointers are device memory, sizes elements.
struct Flash {
  const float* qkv = nullptr;
  float* ctx = nullptr;
  float* lse = nullptr;         // the forward's
  const float* lseIn = nullptr; // the backward's
  const float* dctx = nullptr;
  const float* dvec = nullptr;
  float* dqkv = nullptr;
  MaskRows mask;
  int64_t t = 0, h = 0, e = 0, group = 1, d = 0, kvd = 0, ld = 0;
  float scale = 1.f;
  bool causal = false;
  // q, k and v hold TF32 values already (amp rounded them to bf16 or fp16, whose values
  // TF32 has): their low parts are zero, and fp32's products skip the products of those.
  bool qkvTf32 = false;
};

// WMMA's fragments of TF32 products: A [16, 8], B [8, 16], the f32 sums [16, 16].
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragAt = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;

// An operand fragment from shared memory, its values rounded to TF32 (WMMA's rule: the
// fragment's elements must be TF32 before mma_sync).
template <class Frag> __device__ void loadTf32(Frag& f, const float* p, unsigned ld) {
  wmma::load_matrix_sync(f, p, ld);
  EPL_UNROLL
  for (int i = 0; i < f.num_elements; ++i)
    f.x[i] = wmma::__float_to_tf32(f.x[i]);
}

// An operand fragment from shared memory as two of TF32 values, hi = tf32(x) and lo =
// tf32(x - hi): hi + lo is x to 2^-22 (the fp32 products, below).
template <class Frag> __device__ void loadSplit(Frag& hi, Frag& lo, const float* p, unsigned ld) {
  wmma::load_matrix_sync(hi, p, ld);
  EPL_UNROLL
  for (int i = 0; i < hi.num_elements; ++i) {
    float x = hi.x[i], h = wmma::__float_to_tf32(x);
    hi.x[i] = h;
    lo.x[i] = wmma::__float_to_tf32(x - h);
  }
}

// acc += A B over `steps` steps of 8 along the shared dimension: the step's A fragment at
// a + i aStep (lda), its B fragment at b + i bStep (ldb). FA and FB give the layouts: a
// row-major A, or a transposed one (FragAt: A's [16, 8] block is the transpose of the
// [8, 16] block at its place), and likewise for B. Fp32: each product in fp32's precision,
// as three on TF32 operands, A_lo B_hi + A_hi B_lo + A_hi B_hi (A_lo B_lo, 2^-22 of it,
// left out; a product of two TF32 values is exact in the f32 sums). aExact, bExact: that
// operand's values are TF32 values (Flash::qkvTf32), its low part zero: the product of it is
// left out, which adds nothing (the same sums).
template <class FA, class FB, bool Fp32>
__device__ void mmaSteps(Acc& acc, const float* a, unsigned lda, int aStep, const float* b,
                         unsigned ldb, int bStep, int steps, bool aExact = false,
                         bool bExact = false) {
  for (int i = 0; i < steps; ++i) {
    FA fa;
    FB fb;
    if constexpr (Fp32) {
      FA faLo;
      FB fbLo;
      if (aExact)
        loadTf32(fa, a + i * aStep, lda);
      else
        loadSplit(fa, faLo, a + i * aStep, lda);
      if (bExact)
        loadTf32(fb, b + i * bStep, ldb);
      else
        loadSplit(fb, fbLo, b + i * bStep, ldb);
      if (!aExact) wmma::mma_sync(acc, faLo, fb, acc);
      if (!bExact) wmma::mma_sync(acc, fa, fbLo, acc);
    } else {
      loadTf32(fa, a + i * aStep, lda);
      loadTf32(fb, b + i * bStep, ldb);
    }
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

inline __device__ float warpMax(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
inline __device__ float warpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Whether `query` of batch element b sees `key`: a key of the sequence, not after the query
// when causal, kept by the padding mask.
inline __device__ bool sees(const Flash& f, int64_t b, int64_t query, int64_t key) {
  if (key >= f.t || (f.causal && key > query)) return false;
  if (!f.mask.p) return true;
  int64_t i = b * f.t + key;
  return f.mask.wide ? static_cast<const int64_t*>(f.mask.p)[i] != 0
                     : static_cast<const int32_t*>(f.mask.p)[i] != 0;
}

// Rows [r0, r0 + rows) of one head's E columns (at `src`, rows `ld` apart) into a tile of
// shared memory [rows, EP + 4]: zero past T and past E.
template <int EP>
__device__ void loadTile(float* tile, int rows, const float* src, int64_t ld, int64_t r0, int64_t t,
                         int64_t e) {
  constexpr int kLd = EP + 4;
  for (int i = threadIdx.x; i < rows * EP; i += blockDim.x) {
    int r = i / EP, j = i % EP;
    int64_t row = r0 + r;
    tile[r * kLd + j] = row < t && j < e ? src[row * ld + j] : 0.f;
  }
}

// Shared memory of each kernel, in floats (the pieces' order in the kernels).
template <int EP> constexpr int64_t forwardFloats() {
  return 4 * kQT * (EP + 4) + kQT * kLds + 3 * kQT;
}
template <int EP> constexpr int64_t keysFloats() {
  return 2 * kKT * (EP + 4) + 2 * kKeysQT * (EP + 4) + 2 * kKeysQT * kLds + 2 * kKeysQT;
}
template <int EP> constexpr int64_t queriesFloats() {
  return 4 * kQT * (EP + 4) + 2 * kQT * kLds + 2 * kQT;
}

// Grid: (query tiles, H, B); 4 warps. Fp32: products in fp32's precision (mmaSteps).
template <int EP, bool Fp32> __global__ void __launch_bounds__(4 * kWarp) forwardKernel(Flash f) {
  constexpr int kLd = EP + 4;
  EPL_DYNAMIC_SHARED(smem);
  float *qs = smem, *ks = qs + kQT * kLd, *vs = ks + kKT * kLd, *os = vs + kKT * kLd;
  float *ss = os + kQT * kLd, *rowMax = ss + kQT * kLds, *rowSum = rowMax + kQT;
  float* rowScale = rowSum + kQT;
  const int64_t q0 = (static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x) * kQT;
  const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / f.group;
  const float* rows = f.qkv + b * f.t * f.ld;
  const float *k = rows + f.d + kvh * f.e, *v = k + f.kvd;
  loadTile<EP>(qs, kQT, rows + h * f.e, f.ld, q0, f.t, f.e);
  for (int i = threadIdx.x; i < kQT * kLd; i += blockDim.x)
    os[i] = 0.f;
  if (threadIdx.x < kQT) {
    rowMax[threadIdx.x] = -INFINITY;
    rowSum[threadIdx.x] = 0.f;
  }
  __syncthreads();
  const int lane = threadIdx.x % kWarp, r0 = threadIdx.x / kWarp * 16; // the warp's rows
  // TF32: the warp's q rows held in fragments for every key tile (Fp32's two parts each would
  // take too many registers: read from shared memory each time).
  [[maybe_unused]] FragA qa[Fp32 ? 1 : EP / 8];
  if constexpr (!Fp32) {
    EPL_UNROLL
    for (int i = 0; i < EP / 8; ++i)
      loadTf32(qa[i], qs + r0 * kLd + 8 * i, kLd);
  }
  const int64_t keyEnd = f.causal ? std::min(f.t, q0 + kQT) : f.t;
  for (int64_t k0 = 0; k0 < keyEnd; k0 += kKT) {
    loadTile<EP>(ks, kKT, k, f.ld, k0, f.t, f.e);
    loadTile<EP>(vs, kKT, v, f.ld, k0, f.t, f.e);
    __syncthreads();
    // 1. The warp's scores [16, KT].
    for (int n = 0; n < kKT / 16; ++n) {
      Acc acc;
      wmma::fill_fragment(acc, 0.f);
      if constexpr (Fp32) {
        mmaSteps<FragA, FragBt, true>(acc, qs + r0 * kLd, kLd, 8, ks + n * 16 * kLd, kLd, 8, EP / 8,
                                      f.qkvTf32, f.qkvTf32);
      } else {
        EPL_UNROLL
        for (int i = 0; i < EP / 8; ++i) {
          FragBt kb; // k^T's [8, 16] block: rows n*16.. of the key tile, columns 8i..
          loadTf32(kb, ks + n * 16 * kLd + 8 * i, kLd);
          wmma::mma_sync(acc, qa[i], kb, acc);
        }
      }
      wmma::store_matrix_sync(ss + r0 * kLds + n * 16, acc, kLds, wmma::mem_row_major);
    }
    __syncwarp();
    // 2. Online softmax, a row at a time over the warp's lanes (keys lane and lane + 32).
    for (int rr = 0; rr < 16; ++rr) {
      const int r = r0 + rr;
      const int64_t query = q0 + r;
      float* srow = ss + r * kLds;
      float s0 = sees(f, b, query, k0 + lane) ? srow[lane] * f.scale : -INFINITY;
      float s1 = sees(f, b, query, k0 + lane + kWarp) ? srow[lane + kWarp] * f.scale : -INFINITY;
      const float before = rowMax[r]; // read by every lane before the shuffle, written after it
      const float m = fmaxf(before, warpMax(fmaxf(s0, s1)));
      const float p0 = m == -INFINITY ? 0.f : expf(s0 - m);
      const float p1 = m == -INFINITY ? 0.f : expf(s1 - m);
      const float alpha = m == -INFINITY ? 1.f : expf(before - m);
      const float sum = warpSum(p0 + p1);
      srow[lane] = p0;
      srow[lane + kWarp] = p1;
      if (lane == 0) {
        rowMax[r] = m;
        rowSum[r] = rowSum[r] * alpha + sum;
        rowScale[r] = alpha;
      }
    }
    __syncwarp();
    for (int i = lane; i < 16 * EP; i += kWarp) {
      int r = r0 + i / EP;
      os[r * kLd + i % EP] *= rowScale[r];
    }
    __syncwarp();
    // 3. O += P v, the warp's rows.
    for (int n = 0; n < EP / 16; ++n) {
      Acc acc;
      wmma::load_matrix_sync(acc, os + r0 * kLd + n * 16, kLd, wmma::mem_row_major);
      mmaSteps<FragA, FragB, Fp32>(acc, ss + r0 * kLds, kLds, 8, vs + n * 16, kLd, 8 * kLd, kKT / 8,
                                   false, f.qkvTf32);
      wmma::store_matrix_sync(os + r0 * kLd + n * 16, acc, kLd, wmma::mem_row_major);
    }
    __syncthreads(); // every warp is done with this key tile
  }
  for (int64_t i = threadIdx.x; i < kQT * f.e; i += blockDim.x) {
    int64_t r = i / f.e, j = i % f.e, query = q0 + r;
    if (query >= f.t) continue;
    float l = rowSum[r];
    f.ctx[(b * f.t + query) * f.d + h * f.e + j] = l > 0.f ? os[r * kLd + j] / l : 0.f;
  }
  if (threadIdx.x < kQT && q0 + threadIdx.x < f.t) {
    float l = rowSum[threadIdx.x];
    f.lse[(b * f.h + h) * f.t + q0 + threadIdx.x] =
        l > 0.f ? rowMax[threadIdx.x] + logf(l) : -INFINITY;
  }
}

// The backward's [16, 16] tiles at row tr, column tc of S = q k^T (into ps) and of dP =
// dctx v^T (into dss), from the query rows qs and dos and the key rows ks and vs (EP + 4
// apart; rows KT + 4 apart in ps and dss); qkvTf32 as Flash's.
template <int EP, bool Fp32>
__device__ void scoreTiles(int tr, int tc, const float* qs, const float* dos, const float* ks,
                           const float* vs, float* ps, float* dss, bool qkvTf32) {
  constexpr int kLd = EP + 4;
  Acc s, dp;
  wmma::fill_fragment(s, 0.f);
  wmma::fill_fragment(dp, 0.f);
  mmaSteps<FragA, FragBt, Fp32>(s, qs + tr * kLd, kLd, 8, ks + tc * kLd, kLd, 8, EP / 8, qkvTf32,
                                qkvTf32);
  mmaSteps<FragA, FragBt, Fp32>(dp, dos + tr * kLd, kLd, 8, vs + tc * kLd, kLd, 8, EP / 8, false,
                                qkvTf32);
  wmma::store_matrix_sync(ps + tr * kLds + tc, s, kLds, wmma::mem_row_major);
  wmma::store_matrix_sync(dss + tr * kLds + tc, dp, kLds, wmma::mem_row_major);
}

// P and dS of a tile of queries [rows, KT] in place of the scores S (ps) and of dP = dctx v^T
// (dss): P = exp(scale S - lse) where the query sees the key (0 elsewhere), dS = P (dP - Dvec).
inline __device__ void probsAndScoreGrads(const Flash& f, int64_t b, int64_t q0, int64_t k0,
                                          int rows, const float* lse, const float* dvec, float* ps,
                                          float* dss) {
  for (int i = threadIdx.x; i < rows * kKT; i += blockDim.x) {
    int r = i / kKT, c = i % kKT;
    int64_t query = q0 + r;
    float p = 0.f;
    if (query < f.t && lse[r] != -INFINITY && sees(f, b, query, k0 + c))
      p = expf(ps[r * kLds + c] * f.scale - lse[r]);
    ps[r * kLds + c] = p;
    dss[r * kLds + c] = p * (dss[r * kLds + c] - dvec[r]);
  }
}

// lse and Dvec of rows [q0, q0 + rows) of head h into shared memory (-inf and 0 past T).
inline __device__ void loadRowStats(const Flash& f, int64_t b, int64_t h, int64_t q0, int rows,
                                    float* lse, float* dvec) {
  for (int i = threadIdx.x; i < rows; i += blockDim.x) {
    int64_t query = q0 + i, at = (b * f.h + h) * f.t + query;
    lse[i] = query < f.t ? f.lseIn[at] : -INFINITY;
    dvec[i] = query < f.t ? f.dvec[at] : 0.f;
  }
}

// A tile's results [rows, EP] (staged row-major in shared memory, kLd apart) into E columns
// of dqkv from `col`, rows [r0, r0 + rows) of batch element b.
template <int EP>
__device__ void writeTile(const Flash& f, const float* tile, int rows, int64_t b, int64_t r0,
                          int64_t col) {
  constexpr int kLd = EP + 4;
  for (int64_t i = threadIdx.x; i < rows * f.e; i += blockDim.x) {
    int64_t r = i / f.e, j = i % f.e;
    if (r0 + r < f.t) f.dqkv[(b * f.t + r0 + r) * f.ld + col + j] = tile[r * kLd + j];
  }
}

// dk and dv. Grid: (key tiles, KV, B); 8 warps, each holding kTiles of dk's and of dv's
// [16, 16] tiles of the key tile's [KT, EP].
template <int EP, bool Fp32> __global__ void __launch_bounds__(8 * kWarp) keysKernel(Flash f) {
  constexpr int kLd = EP + 4, kTiles = (kKT / 16) * (EP / 16) / 8;
  EPL_DYNAMIC_SHARED(smem);
  float *ks = smem, *vs = ks + kKT * kLd, *qs = vs + kKT * kLd, *dos = qs + kKeysQT * kLd;
  float *ps = dos + kKeysQT * kLd, *dss = ps + kKeysQT * kLds, *lse = dss + kKeysQT * kLds;
  float* dvec = lse + kKeysQT;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kKT, kvh = blockIdx.y, b = blockIdx.z;
  const float* rows = f.qkv + b * f.t * f.ld;
  loadTile<EP>(ks, kKT, rows + f.d + kvh * f.e, f.ld, k0, f.t, f.e);
  loadTile<EP>(vs, kKT, rows + f.d + f.kvd + kvh * f.e, f.ld, k0, f.t, f.e);
  __syncthreads();
  const int warp = threadIdx.x / kWarp;
  Acc dk[kTiles], dv[kTiles];
  EPL_UNROLL
  for (int i = 0; i < kTiles; ++i) {
    wmma::fill_fragment(dk[i], 0.f);
    wmma::fill_fragment(dv[i], 0.f);
  }
  const int64_t qStart = f.causal ? k0 / kKeysQT * kKeysQT : 0; // earlier queries see none
  for (int64_t h = kvh * f.group; h < (kvh + 1) * f.group; ++h)
    for (int64_t q0 = qStart; q0 < f.t; q0 += kKeysQT) {
      loadTile<EP>(qs, kKeysQT, rows + h * f.e, f.ld, q0, f.t, f.e);
      loadTile<EP>(dos, kKeysQT, f.dctx + b * f.t * f.d + h * f.e, f.d, q0, f.t, f.e);
      loadRowStats(f, b, h, q0, kKeysQT, lse, dvec);
      __syncthreads();
      // S = q k^T and dP = dctx v^T: [QT, KT] is 2 x 4 tiles, one a warp.
      scoreTiles<EP, Fp32>(warp / 4 * 16, warp % 4 * 16, qs, dos, ks, vs, ps, dss, f.qkvTf32);
      __syncthreads();
      probsAndScoreGrads(f, b, q0, k0, kKeysQT, lse, dvec, ps, dss);
      __syncthreads();
      // dv += P^T dctx, dk += dS^T q (the scale at the end): P^T's [16, 8] blocks are the
      // transposes of P's [8, 16] ones.
      EPL_UNROLL
      for (int i = 0; i < kTiles; ++i) {
        const int tile = warp + 8 * i, tr = tile / (EP / 16) * 16, tc = tile % (EP / 16) * 16;
        mmaSteps<FragAt, FragB, Fp32>(dv[i], ps + tr, kLds, 8 * kLds, dos + tc, kLd, 8 * kLd,
                                      kKeysQT / 8);
        mmaSteps<FragAt, FragB, Fp32>(dk[i], dss + tr, kLds, 8 * kLds, qs + tc, kLd, 8 * kLd,
                                      kKeysQT / 8, false, f.qkvTf32);
      }
      __syncthreads(); // before the next tile's loads
    }
  // Stage the results where k and v were (no longer read), then write them.
  EPL_UNROLL
  for (int i = 0; i < kTiles; ++i) {
    const int tile = warp + 8 * i, tr = tile / (EP / 16) * 16, tc = tile % (EP / 16) * 16;
    EPL_UNROLL
    for (int j = 0; j < dk[i].num_elements; ++j)
      dk[i].x[j] *= f.scale;
    wmma::store_matrix_sync(ks + tr * kLd + tc, dk[i], kLd, wmma::mem_row_major);
    wmma::store_matrix_sync(vs + tr * kLd + tc, dv[i], kLd, wmma::mem_row_major);
  }
  __syncthreads();
  writeTile<EP>(f, ks, kKT, b, k0, f.d + kvh * f.e);
  writeTile<EP>(f, vs, kKT, b, k0, f.d + f.kvd + kvh * f.e);
}

// dq. Grid: (query tiles, H, B); 8 warps, each holding kTiles of dq's [16, 16] tiles of the
// query tile's [QT, EP].
template <int EP, bool Fp32> __global__ void __launch_bounds__(8 * kWarp) queriesKernel(Flash f) {
  constexpr int kLd = EP + 4, kTiles = (kQT / 16) * (EP / 16) / 8;
  EPL_DYNAMIC_SHARED(smem);
  float *qs = smem, *dos = qs + kQT * kLd, *ks = dos + kQT * kLd, *vs = ks + kKT * kLd;
  float *ps = vs + kKT * kLd, *dss = ps + kQT * kLds, *lse = dss + kQT * kLds;
  float* dvec = lse + kQT;
  const int64_t q0 = (static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x) * kQT;
  const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / f.group;
  const float* rows = f.qkv + b * f.t * f.ld;
  const float *k = rows + f.d + kvh * f.e, *v = k + f.kvd;
  loadTile<EP>(qs, kQT, rows + h * f.e, f.ld, q0, f.t, f.e);
  loadTile<EP>(dos, kQT, f.dctx + b * f.t * f.d + h * f.e, f.d, q0, f.t, f.e);
  loadRowStats(f, b, h, q0, kQT, lse, dvec);
  const int warp = threadIdx.x / kWarp;
  Acc dq[kTiles];
  EPL_UNROLL
  for (int i = 0; i < kTiles; ++i)
    wmma::fill_fragment(dq[i], 0.f);
  const int64_t keyEnd = f.causal ? std::min(f.t, q0 + kQT) : f.t;
  for (int64_t k0 = 0; k0 < keyEnd; k0 += kKT) {
    loadTile<EP>(ks, kKT, k, f.ld, k0, f.t, f.e);
    loadTile<EP>(vs, kKT, v, f.ld, k0, f.t, f.e);
    __syncthreads();
    // S and dP: [QT, KT] is 4 x 4 tiles, two a warp.
    for (int i = 0; i < 2; ++i) {
      const int tile = warp + 8 * i;
      scoreTiles<EP, Fp32>(tile / 4 * 16, tile % 4 * 16, qs, dos, ks, vs, ps, dss, f.qkvTf32);
    }
    __syncthreads();
    probsAndScoreGrads(f, b, q0, k0, kQT, lse, dvec, ps, dss);
    __syncthreads();
    // dq += dS k (the scale at the end).
    EPL_UNROLL
    for (int i = 0; i < kTiles; ++i) {
      const int tile = warp + 8 * i, tr = tile / (EP / 16) * 16, tc = tile % (EP / 16) * 16;
      mmaSteps<FragA, FragB, Fp32>(dq[i], dss + tr * kLds, kLds, 8, ks + tc, kLd, 8 * kLd, kKT / 8,
                                   false, f.qkvTf32);
    }
    __syncthreads(); // before the next tile's loads
  }
  EPL_UNROLL
  for (int i = 0; i < kTiles; ++i) {
    const int tile = warp + 8 * i, tr = tile / (EP / 16) * 16, tc = tile % (EP / 16) * 16;
    EPL_UNROLL
    for (int j = 0; j < dq[i].num_elements; ++j)
      dq[i].x[j] *= f.scale;
    wmma::store_matrix_sync(qs + tr * kLd + tc, dq[i], kLd, wmma::mem_row_major);
  }
  __syncthreads();
  writeTile<EP>(f, qs, kQT, b, q0, h * f.e);
}

} // namespace flash

} // namespace epl::backend::cuda
