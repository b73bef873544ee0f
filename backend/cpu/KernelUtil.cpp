// Helpers shared by the CPU kernel families (see KernelUtil.h).
//
// Shape legend: N rows, C columns.
#include "backend/cpu/KernelUtil.h"

#include <algorithm>
#include <cblas.h>
#include <cstdlib>
#include <memory>
#include <variant>
#ifdef EPL_HAVE_ONEDNN
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#endif

namespace epl::backend::cpu {

namespace {

void openBlasSgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                   int64_t ldc) {
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

#ifdef EPL_HAVE_ONEDNN
// oneDNN's OpenMP runtime would start threads of its own inside each call, competing with the
// pool that already runs the pieces in parallel. OpenMP's thread count is a setting of each
// calling thread, so every thread sets it to 1 before its first call. The runtime is
// whichever one oneDNN was built with (looked up by name, so nothing links it here); a
// oneDNN without OpenMP has no such symbol and nothing to set.
void keepOneDnnSingleThreaded() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  using SetNumThreads = void (*)(int);
  static const auto setNumThreads =
      reinterpret_cast<SetNumThreads>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (setNumThreads) setNumThreads(1);
}

// On a CPU with AVX-512 (oneDNN's avx512_core kernels) oneDNN runs every product: there it
// was the faster in every layout on the char GPT's pieces (one thread, Intel Xeon: 1.01 to
// 1.15 times OpenBLAS's rate; A B^T at 512 x 1024 x 256, 161 against 144 GFLOP/s; A^T B at
// 256 x 1024 x 512, 156 against 136), and its step took 8% less time at one thread, 5-8%
// less at two (1301 -> 1194 ms, 670 -> 627 ms). Elsewhere (AVX2, measured on AMD EPYC):
// oneDNN runs the products of A B^T (a layer's forward, x W^T) of at least kOneDnnMin
// multiply-adds (m n k), and every product of fewer than kOneDnnSmallMax; OpenBLAS runs the
// rest. Between the two, products cost less to set up through OpenBLAS: the MLP's pieces
// (64 x 256 x 784) step ~20% faster there, the char-GPT's (512 x 768 x 256) ~8% faster
// through oneDNN. oneDNN 2.6's other layouts run at half OpenBLAS's rate on many of those
// shapes (one thread, AMD EPYC: A^T B at 256 x 1024 x 512, a weight gradient's piece, 40
// against 84 GFLOP/s; A B at 256 x 1024 x 512, 35 against 69). Below 2^18 oneDNN was the
// faster on every shape measured, in each layout (1.14 to 1.63 times OpenBLAS's rate):
// attention's tiles (64 x 64 x 32 and 64 x 32 x 64 on heads of 32) at 1.3 to 1.6, and the
// char GPT's attention took 10-12% less time. The choice depends on the call alone, so
// results still do not depend on the threads.
constexpr int64_t kOneDnnMin = int64_t{1} << EPL_ONEDNN_MIN_LOG2;
constexpr int64_t kOneDnnSmallMax = int64_t{1} << 18;

bool oneDnnLeadsEverywhere() {
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
}

// oneDNN 2.6's JIT kernels (Debian 12's) point the stack pointer into their heap workspace,
// and a signal handler's frame is pushed just below it: no thread that calls this may
// handle a signal (the pool's workers block them, interp/StopSignals.cpp the stop signals).
void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  int64_t volume = m * n * k;
  static const bool everywhere = oneDnnLeadsEverywhere();
  bool viaOneDnn =
      everywhere || volume < kOneDnnSmallMax || (!transA && transB && volume >= kOneDnnMin);
  if (!viaOneDnn)
    return openBlasSgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  keepOneDnnSingleThreaded();
  dnnl_status_t status = dnnl_sgemm(transA ? 'T' : 'N', transB ? 'T' : 'N', m, n, k, alpha, a, lda,
                                    b, ldb, beta, c, ldc);
  EPL_ASSERT(status == dnnl_success, "oneDNN's sgemm failed (out of memory for its workspace?)");
}
#else
void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  openBlasSgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

// C = alpha A B + beta C with K (the reduction, e.g. the rows of a weight gradient) cut into
// `parts` pieces: each piece is one sgemm into its own buffer, then the buffers are added
// in order. Packing costs what one sgemm's would, unlike slices of M or N, which would
// each pack the whole other operand again.
void gemmSplitK(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc, int64_t parts) {
  int64_t chunk = ((k + parts - 1) / parts + 15) / 16 * 16;
  parts = (k + chunk - 1) / chunk;
  float* partial = scratch(8, parts * m * n);
  parallelFor(parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t part = p0; part < p1; ++part) {
      int64_t lo = part * chunk, cnt = std::min(chunk, k - lo);
      sgemm(transA, transB, m, n, cnt, 1.f, transA ? a + lo * lda : a + lo, lda,
            transB ? b + lo : b + lo * ldb, ldb, 0.f, partial + part * m * n, n);
    }
  });
  // Each element adds its pieces from 0 in piece order; a row at a time, so that the loops
  // over its columns vectorise.
  parallelFor(m, rowGrain(n * parts), [&](int64_t r0, int64_t r1) {
    float* sum = scratch(9, n);
    for (int64_t r = r0; r < r1; ++r) {
      std::fill(sum, sum + n, 0.f);
      for (int64_t part = 0; part < parts; ++part) {
        const float* row = partial + (part * m + r) * n;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j)
          sum[j] += row[j];
      }
      float* out = c + r * ldc;
      if (beta == 0.f) {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j)
          out[j] = alpha * sum[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j)
          out[j] = beta * out[j] + alpha * sum[j];
      }
    }
  });
}

// Big GEMMs are cut into up to 8 pieces that threads of the pool claim, each through one
// single-threaded sgemm: pieces of K when K dominates (weight gradients), else slices of
// the rows of C (or of its columns, when there are fewer rows). The cut depends on the
// shapes only, never on the thread count, so neither does the result. `then`, when given,
// runs on each slice of rows right after its sgemm, else on the whole product's rows in
// parallel.
void gemmImpl(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc, const RowsThen* then) {
  constexpr int64_t kMaxPieces = 8;
  if (m == 0) return;
  auto afterAll = [&] {
    if (then) parallelFor(m, rowGrain(n), *then);
  };
  if (n == 0) return afterAll();
  if (m * n * k < (int64_t{1} << 18)) {
    sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return afterAll();
  }
  if (k >= 4 * std::max(m, n) && k >= 1024) {
    gemmSplitK(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
               std::clamp<int64_t>(k / 512, 2, kMaxPieces));
    return afterAll();
  }
  bool byRows = m >= n;
  int64_t len = byRows ? m : n;
  int64_t parts = std::clamp<int64_t>(len / 64, 1, kMaxPieces);
  int64_t chunk = ((len + parts - 1) / parts + 15) / 16 * 16;
  parts = (len + chunk - 1) / chunk;
  parallelFor(parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t part = p0; part < p1; ++part) {
      int64_t lo = part * chunk, cnt = std::min(chunk, len - lo);
      if (byRows) {
        sgemm(transA, transB, cnt, n, k, alpha, transA ? a + lo : a + lo * lda, lda, b, ldb, beta,
              c + lo * ldc, ldc);
        if (then) (*then)(lo, lo + cnt); // while the slice is in this thread's cache
      } else {
        sgemm(transA, transB, m, cnt, k, alpha, a, lda, transB ? b + lo * ldb : b + lo, ldb, beta,
              c + lo, ldc);
      }
    }
  });
  if (!byRows) afterAll();
}

} // namespace

void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemmImpl(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, nullptr);
}

void gemmThen(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc, const RowsThen& then) {
  gemmImpl(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, &then);
}

void linearRows(const float* x, const float* w, const float* b, int64_t n, int64_t o, int64_t d,
                float* y) {
  if (!b) return gemm(false, true, n, o, d, 1.f, x, d, w, d, 0.f, y, o);
  gemmThen(false, true, n, o, d, 1.f, x, d, w, d, 0.f, y, o,
           [&](int64_t r0, int64_t r1) { addRows(y, b, r0, r1, o); });
}

void addRows(float* y, const float* b, int64_t r0, int64_t r1, int64_t cols) {
  for (int64_t r = r0; r < r1; ++r) {
    float* row = y + r * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j)
      row[j] += b[j];
  }
}

void initThreads(int threads) {
  openblas_set_num_threads(1); // the pool runs GEMM slices in parallel instead
  setThreads(threads);
}

void broadcastRows(float* y, const float* b, int64_t rows, int64_t cols) {
  parallelFor(rows, rowGrain(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      std::memcpy(y + r * cols, b, sizeof(float) * cols);
  });
}

// Each column sums its rows in blocks of 64 (from 0, down the block), then the blocks' sums
// from 0 in block order. The blocks run a whole row at a time into a row of partial sums
// (reading x in order, the loops over the columns long and vectorised); the columns then
// add their partials. The order is the shapes', whatever the threads.
void columnSum(const float* x, int64_t rows, int64_t cols, GradOut out) {
  constexpr int64_t kRows = 64;
  int64_t blocks = (rows + kRows - 1) / kRows;
  float* part = scratch(10, std::max<int64_t>(blocks, 1) * cols);
  if (blocks == 0) std::fill(part, part + cols, 0.f); // no rows: sums of 0
  parallelFor(blocks, std::max<int64_t>(1, rowGrain(cols) / kRows), [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      float* sum = part + b * cols;
      std::fill(sum, sum + cols, 0.f);
      for (int64_t r = b * kRows; r < std::min(rows, (b + 1) * kRows); ++r) {
        const float* row = x + r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j)
          sum[j] += row[j];
      }
    }
  });
  // The totals in the first block's row, each column's own: 0 + its first block's sum (as a
  // sum from 0 would make a -0 +0), then the other blocks in order.
  parallelFor(cols, std::max<int64_t>(1, kParallelMin / std::max<int64_t>(blocks, 1)),
              [&](int64_t lo, int64_t hi) {
                float* total = part;
#pragma omp simd
                for (int64_t j = lo; j < hi; ++j)
                  total[j] = 0.f + total[j];
                for (int64_t b = 1; b < blocks; ++b) {
                  const float* sum = part + b * cols;
#pragma omp simd
                  for (int64_t j = lo; j < hi; ++j)
                    total[j] += sum[j];
                }
                for (int64_t j = lo; j < hi; ++j)
                  out.put(j, total[j]);
              });
}

namespace {
constexpr int64_t kBytePiece = int64_t{1} << 18; // 256 KiB
}

void copyBytes(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0 || dst == src) return;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if ((d < s + bytes && s < d + bytes) || bytes < 4 * kBytePiece)
    return static_cast<void>(std::memmove(d, s, static_cast<size_t>(bytes)));
  parallelFor((bytes + kBytePiece - 1) / kBytePiece, 1, [&](int64_t lo, int64_t hi) {
    int64_t from = lo * kBytePiece, to = std::min(bytes, hi * kBytePiece);
    std::memcpy(d + from, s + from, static_cast<size_t>(to - from));
  });
}

void zeroBytes(void* dst, int64_t bytes) {
  if (bytes <= 0) return;
  auto* d = static_cast<char*>(dst);
  if (bytes < 4 * kBytePiece)
    return static_cast<void>(std::memset(d, 0, static_cast<size_t>(bytes)));
  parallelFor((bytes + kBytePiece - 1) / kBytePiece, 1, [&](int64_t lo, int64_t hi) {
    int64_t from = lo * kBytePiece, to = std::min(bytes, hi * kBytePiece);
    std::memset(d + from, 0, static_cast<size_t>(to - from));
  });
}

void writeOrAdd(const GradOut& dst, const float* src, int64_t n) {
  if (!dst.acc) return copyBytes(dst.p, src, static_cast<int64_t>(sizeof(float)) * n);
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i)
      dst.p[i] += src[i];
  });
}

void multiplyInto(float* dst, const float* src, int64_t n) {
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i)
      dst[i] *= src[i];
  });
}

void zeroUnlessAcc(const GradOut& dst, int64_t n) {
  if (!dst.acc) zeroBytes(dst.p, static_cast<int64_t>(sizeof(float)) * n);
}

namespace {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

struct ScratchSlot {
  std::unique_ptr<float, FreeDeleter> data;
  int64_t capacity = 0;
};

constexpr int kScratchSlots = 11;

} // namespace

float* scratch(int slot, int64_t n) {
  thread_local ScratchSlot slots[kScratchSlots];
  EPL_ASSERT(slot >= 0 && slot < kScratchSlots, "scratch slot out of range");
  ScratchSlot& s = slots[slot];
  if (n > s.capacity) {
    int64_t bytes = (std::max<int64_t>(n, 16) * 4 + 63) / 64 * 64;
    s.data.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    EPL_ASSERT(s.data, "out of memory for kernel scratch");
    s.capacity = bytes / 4;
  }
  return s.data.get();
}

float* workspace(const KernelCall& c, int slot, int64_t at, int64_t n) {
  if (!c.workspace) return scratch(slot, n);
  EPL_ASSERT(at + n <= c.workspaceFloats, "a kernel's workspace is smaller than it needs");
  return c.workspace + at;
}

double sumDouble(const float* x, int64_t n) {
  constexpr int64_t kBlock = 4096;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  double* part = reinterpret_cast<double*>(scratch(7, 2 * blocks));
  parallelFor(blocks, kParallelMin / kBlock, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      double s = 0;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
        s += x[i];
      part[b] = s;
    }
  });
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b)
    total += part[b];
  return total;
}

} // namespace epl::backend::cpu
