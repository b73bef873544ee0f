// embedding (a learned lookup table) and positions (a learned [seq, dim] table, added to the
// input by a broadcasting add) on the GPU, ported from backend/cpu/Embedding.cpp.
//
// The embedding gradient without atomics, in the CPU's order:
//   1. stable-sort the token ids (cub radix sort), carrying each token's index;
//   2. each run of equal ids is one table row: the thread for (run, column) adds the run's
//      dy rows into dW[id, column] in token order. Each dW element has one writer, and it
//      adds the same numbers in the same order as the CPU.
// Over a vocabulary split (KernelCall::vocabSlice) the table holds rows [first, first + V):
// the other tokens look up zero rows, and sort as id V, a run that adds nothing.
//
// Shape legend: N tokens, V vocab, D width, T positions.
#include "backend/cuda/Common.cuh"

#include "support/Assert.h"

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

namespace epl::backend::cuda {

namespace {

// A token id outside the table is a broken invariant (the trainer checks the data against
// `vocab` before it runs); the CPU aborts, the GPU traps and the next synchronize reports it.
__device__ inline int64_t checkedToken(int32_t t, int64_t v) {
  if (t < 0 || t >= v) __trap();
  return t;
}

// The rows of a vocabulary slice: first, or -1 where the table is whole.
struct Slice {
  int64_t first;
  // A token's row in the table, or -1 where another device holds it.
  __device__ int64_t row(int32_t t, int64_t v) const {
    if (first < 0) return checkedToken(t, v);
    int64_t r = t - first;
    return r >= 0 && r < v ? r : -1;
  }
};

Slice sliceOf(const KernelCall& c) {
  return Slice{c.vocabSlice ? c.vocabFirst : -1};
}

// y[i, j] = W[tokens[i], j] (0 where another device holds the token's row).
__global__ void lookupKernel(const int32_t* tok, const float* w, Slice slice, int64_t n, int64_t v,
                             int64_t d, float* y) {
  EPL_GRID_STRIDE(t, n * d) {
    int64_t i = t / d, j = t % d, r = slice.row(tok[i], v);
    y[t] = r < 0 ? 0.f : w[r * d + j];
  }
}

// The ids a vocabulary slice sorts: each token's row, V for the other devices' tokens.
__global__ void sliceIdsKernel(const int32_t* tok, Slice slice, int64_t n, int64_t v,
                               int32_t* ids) {
  EPL_GRID_STRIDE(i, n) {
    int64_t r = slice.row(tok[i], v);
    ids[i] = static_cast<int32_t>(r < 0 ? v : r);
  }
}

__global__ void iotaKernel(int32_t* idx, int64_t n) {
  EPL_GRID_STRIDE(i, n) {
    idx[i] = static_cast<int32_t>(i);
  }
}

// Step 2: the thread of (p, j) with p the first position of a run of equal sorted ids adds the
// run's dy rows into dW[id, j] in token order (dW is zeroed beforehand unless accumulating).
// `skip`: the id of a slice's tokens that other devices hold (-1: none).
__global__ void scatterRunsKernel(const int32_t* ids, const int32_t* order, const float* dy,
                                  int64_t n, int64_t v, int64_t d, int64_t skip, float* dw) {
  EPL_GRID_STRIDE(t, n * d) {
    int64_t p = t / d, j = t % d;
    int32_t id = ids[p];
    if ((p > 0 && ids[p - 1] == id) || id == skip) continue;
    float* dst = dw + checkedToken(id, v) * d + j;
    float s = *dst;
    for (int64_t q = p; q < n && ids[q] == id; ++q)
      s += dy[static_cast<int64_t>(order[q]) * d + j];
    *dst = s;
  }
}

// Bits of the largest valid id, so the sort does no more passes than the vocabulary needs.
// An id beyond them still lands in some run and traps there.
int idBits(int64_t v) {
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < v)
    ++bits;
  return bits;
}

// in = [tokens i32 [N], W [V, D]], out = [y [N, D]].
void embeddingForward(const KernelCall& c, const Ctx& ctx) {
  int64_t n = c.in[0].numel(), v = c.in[1].shape[0], d = c.in[1].shape[1];
  lookupKernel<<<blocksFor(n * d), kThreads, 0, ctx.stream>>>(c.in[0].i32(), c.in[1].f32(),
                                                              sliceOf(c), n, v, d, c.out[0].f32());
  checkLaunch("embedding");
}

// in = [dy [N, D], tokens, W, y], out = [dtokens (never), dW [V, D]].
void embeddingBackward(const KernelCall& c, const Ctx& ctx) {
  GradOut dw = gradOut(c, 1);
  if (!dw) return;
  const int32_t* tok = c.in[1].i32();
  int64_t n = c.in[1].numel(), v = c.in[2].shape[0], d = c.in[2].shape[1];
  if (!dw.acc)
    check(cudaMemsetAsync(dw.p, 0, sizeof(float) * static_cast<size_t>(v * d), ctx.stream),
          "embedding backward");
  if (n == 0) return;
  EPL_ASSERT(n <= INT32_MAX, "embedding backward: more tokens than 32-bit indices hold");
  // Scratch: the indices 0..N-1, the sorted ids, the indices in sorted order, a slice's ids
  // (the tokens are the ids of a whole table), cub's storage.
  Slice slice = sliceOf(c);
  bool sliced = slice.first >= 0;
  int bits = idBits(sliced ? v + 1 : v);
  size_t sortBytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, sortBytes, tok, static_cast<int32_t*>(nullptr),
                                        static_cast<const int32_t*>(nullptr),
                                        static_cast<int32_t*>(nullptr), n, 0, bits, ctx.stream),
        "embedding backward: sizing the sort");
  int64_t idsBytes = alignUp(static_cast<int64_t>(sizeof(int32_t)) * n);
  char* base =
      static_cast<char*>(ctx.scratch->get(4 * idsBytes + alignUp(static_cast<int64_t>(sortBytes))));
  int32_t* iota = reinterpret_cast<int32_t*>(base);
  int32_t* ids = reinterpret_cast<int32_t*>(base + idsBytes);
  int32_t* order = reinterpret_cast<int32_t*>(base + 2 * idsBytes);
  int32_t* sliceIds = reinterpret_cast<int32_t*>(base + 3 * idsBytes);
  void* sortScratch = base + 4 * idsBytes;

  iotaKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(iota, n);
  checkLaunch("embedding backward");
  const int32_t* keys = tok;
  if (sliced) {
    sliceIdsKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(tok, slice, n, v, sliceIds);
    checkLaunch("embedding backward");
    keys = sliceIds;
  }
  check(cub::DeviceRadixSort::SortPairs(sortScratch, sortBytes, keys, ids, iota, order, n, 0, bits,
                                        ctx.stream),
        "embedding backward: sorting the tokens");
  scatterRunsKernel<<<blocksFor(n * d), kThreads, 0, ctx.stream>>>(ids, order, c.in[0].f32(), n, v,
                                                                   d, sliced ? v : -1, dw.p);
  checkLaunch("embedding backward");
}

} // namespace

void embedding(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) return embeddingForward(c, ctx);
  embeddingBackward(c, ctx);
}

// Forward: in = [W [T, D]], out = [y [T, D]] = W. Backward: in = [dy, W, y], out = [dW].
void positions(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) {
    if (c.in[0].bytes() > 0 && c.out[0].data != c.in[0].data)
      check(cudaMemcpyAsync(c.out[0].data, c.in[0].data, static_cast<size_t>(c.in[0].bytes()),
                            cudaMemcpyDeviceToDevice, ctx.stream),
            "positions");
    return;
  }
  if (GradOut dw = gradOut(c, 0)) writeOrAdd(ctx, dw, c.in[0].f32(), c.in[0].numel());
}

} // namespace epl::backend::cuda
