// Helpers shared by the CPU kernel families (beside backend/KernelArgs.h): the one sgemm
// entry point, deterministic column sums, scratch buffers and a vectorisable exp.
//
// Shape legend: N rows (every dim but the last), C columns (the last dim).
#pragma once
#include "backend/Device.h"
#include "backend/KernelArgs.h"
#include "backend/cpu/Parallel.h"
#include "support/Assert.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace epl::backend::cpu {

// Whether gemm multiplies operands of type t natively (bf16 through oneDNN's matmul, where
// oneDNN has a kernel for this CPU that is not its reference code); f32 always. gemm takes
// operands of either half type all the same, widening the others (halfProduct).
bool productsRead(ir::DType t);

// Row-major C[M, N] = alpha * op(A)[M, K] op(B)[K, N] + beta * C, in pieces on the pool,
// each through one single-threaded product: oneDNN's sgemm for big f32 pieces, OpenBLAS's
// for small ones and in a build without oneDNN; oneDNN's matmul for bf16 (on AMX or
// AVX512-BF16 where the CPU has them). Half operands the CPU does not multiply natively
// (IEEE half; bf16 elsewhere) are widened into the thread's scratch and multiplied in f32:
// each piece's own rows of A and B, and the operand that every piece reads whole (B when C
// is cut by rows) once, over the pool, before the pieces. Exact, so the product is the one
// of f32 copies of the whole operands, to the bit.
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, Operand a,
          int64_t lda, Operand b, int64_t ldb, float beta, float* c, int64_t ldc);
// gemm, then then(r0, r1) over rows [r0, r1) of C, for disjoint ranges that cover [0, M),
// on several threads: where gemm cuts C by rows, each slice right after its product, by the
// thread that wrote it and while it is in that thread's cache (a bias, an activation). An
// elementwise `then` gives the same bits whatever the ranges.
using RowsThen = std::function<void(int64_t, int64_t)>;
void gemmThen(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, Operand a,
              int64_t lda, Operand b, int64_t ldb, float beta, float* c, int64_t ldc,
              const RowsThen& then);
// y[r, :] += b for rows [r0, r1) of `cols` columns.
void addRows(float* y, const float* b, int64_t r0, int64_t r1, int64_t cols);
// y[N, O] = x[N, D] W[O, D]^T, plus b[O] on every row unless b is null (added to each slice
// of rows right after its product).
void linearRows(Operand x, Operand w, const float* b, int64_t n, int64_t o, int64_t d, float* y);

// oneDNN runs on the calling thread alone (its OpenMP threads would compete with the pool):
// each thread calls this before it first builds or runs a oneDNN primitive. Does nothing in a
// build without oneDNN.
void keepOneDnnSingleThreaded();

// Sizes the thread pool for a device using `threads` threads (0: all cores). The sgemm
// stays single-threaded: GEMMs are sliced over the pool instead (gemm above).
void initThreads(int threads);

// Elements below which a loop is not worth splitting across threads.
constexpr int64_t kParallelMin = 16384;
// Rows per parallel chunk for rows of `cols` elements.
inline int64_t rowGrain(int64_t cols) {
  return std::max<int64_t>(1, kParallelMin / std::max<int64_t>(cols, 1));
}

// y[n, :] = b for every row.
void broadcastRows(float* y, const float* b, int64_t rows, int64_t cols);
// out[c] (+)= sum over rows of x[r, c]. Columns are split among threads and each column is
// summed in a fixed blocked order, so the result does not depend on the thread count.
void columnSum(Operand x, int64_t rows, int64_t cols, GradOut out);
// dst = src rounded to the half type t (bf16 or IEEE half), n elements: amp's products read
// their operands in t, so an f32 operand computed inside a kernel is rounded to it first.
void narrowTo(ir::DType t, const float* src, void* dst, int64_t n);
// x rounded to the half type t and kept in f32, n elements in place.
void roundTo(ir::DType t, float* x, int64_t n);
// The n f32 values x a kernel computed, as the operand of products that read the half type
// t (amp): narrowed into `half` (room for n values of t) where the products read t as it
// is (`asIs`), else rounded in place.
Operand roundedOperand(ir::DType t, bool asIs, float* x, int64_t n, void* half);
// amp, in the kernels that read and write half-precision views as they are stored
// (ir::OpInfo::halfAsStored; mlp's backward for its h): runs of a view's elements converted on the
// calling thread, in cache, in place of the call's f32 copies. f32 views pass as they are. Elements
// [at, at + n) of v as f32: v's own floats, or (bf16, IEEE half) widened into tmp.
const float* f32Run(const TensorView& v, int64_t at, int64_t n, float* tmp);
// n values of the half type t widened to f32, on the calling thread.
void widenRun(ir::DType t, const uint16_t* h, float* dst, int64_t n);
// Element i of v as f32; and set to f (rounded to v's type).
float f32At(const TensorView& v, int64_t i);
void storeAt(const TensorView& v, int64_t i, float f);
// Where a kernel puts elements [at, at + n) of output v (acc: adding into them) in f32,
// indexed from `at`: v's own floats, or (half precision) tmp, holding v's values where it
// adds; storeRun then rounds tmp into v (nothing for an f32 view). The same bits as the
// f32 kernel on widened copies.
GradOut outRun(const TensorView& v, bool acc, int64_t at, int64_t n, float* tmp);
void storeRun(const TensorView& v, int64_t at, int64_t n, const GradOut& run);
// memmove and memset, in pieces over the pool where they are large (and, for a copy, the
// two do not overlap): one thread leaves a large copy at one core's bandwidth.
void copyBytes(void* dst, const void* src, int64_t bytes);
void zeroBytes(void* dst, int64_t bytes);
// dst (+)= src, elementwise.
void writeOrAdd(const GradOut& dst, const float* src, int64_t n);
// dst[i] *= src[i], n elements.
void multiplyInto(float* dst, const float* src, int64_t n);
// dst = 0 unless accumulating.
void zeroUnlessAcc(const GradOut& dst, int64_t n);

// A grow-only buffer per slot and thread, so hot kernels do not page-fault fresh memory on
// every call. Slots keep buffers that are live at the same time apart: kernels use 0 to 6
// (ConvDirect.cpp's oneDNN scratchpads 5), sumDouble uses 7, gemm 8 and 9, columnSum 10, the
// runs of half-precision views 11 to 13, a product's widened operands 14 and 15.
float* scratch(int slot, int64_t n);
// Floats [at, at + n) of the call's workspace (its layout is Module::workspaceBytes'), or
// scratch slot `slot` when the call has none.
float* workspace(const KernelCall& c, int slot, int64_t at, int64_t n);

// Sum with a fixed blocked order in double: reductions to a scalar (losses, norms).
double sumDouble(const float* x, int64_t n);

// e^xc = p 2^ni, p from a polynomial of xc - ni ln2: the part both exponentials below
// share, for xc already clamped to their range.
inline float expReduced(float xc, int32_t& ni) {
  constexpr float kShifter = 12582912.f; // 1.5 * 2^23: adding it rounds to an integer
  float t = xc * 1.44269504088896341f + kShifter;
  float n = t - kShifter;
  int32_t tb, sb;
  std::memcpy(&tb, &t, 4);
  std::memcpy(&sb, &kShifter, 4);
  ni = tb - sb;
  float r = xc - n * 0.693145751953125f; // ln2 split in two, the first part exact in n * it
  r = r - n * 1.428606765330187e-06f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.f;
}

// exp(x) within ~2 ulp, written so loops over it vectorise (no libm call, no float to int
// conversion). Below -103.9 (and for -inf) it returns exactly 0; NaN stays NaN.
inline float expf32(float x) {
  int32_t ni = 0;
  float p = expReduced(x < -103.9f ? -103.9f : (x > 88.7f ? 88.7f : x), ni);
  // 2^n in two halves, so n down to -150 stays a normal power of two.
  int32_t n1 = ni >> 1, n2 = ni - n1;
  // Unsigned: for a NaN input ni is garbage, and a signed shift of it would be undefined
  // (the product below is NaN either way).
  uint32_t b1 = static_cast<uint32_t>(n1 + 127) << 23, b2 = static_cast<uint32_t>(n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  float e = p * s1 * s2;
  return x < -103.9f ? 0.f : e;
}

// exp(x) for x clamped to [-87, 87], where it is a normal float (one power of two, no
// select): for 1 / (1 + e^x), which is 1 or 0 to a float's precision past those ends
// (within 1.7e-38 of 0). NaN stays NaN.
inline float expf32Clamped(float x) {
  int32_t ni = 0;
  float p = expReduced(x < -87.f ? -87.f : (x > 87.f ? 87.f : x), ni);
  uint32_t b = static_cast<uint32_t>(ni + 127) << 23; // unsigned: ni of a NaN is garbage
  float s;
  std::memcpy(&s, &b, 4);
  return p * s;
}

inline float sigmoidf32(float x) {
  return 1.f / (1.f + expf32(-x));
}

// tanh through exp; the absolute error is a few ulp of 1, which is what gelu needs.
inline float tanhf32(float x) {
  float e = expf32(-2.f * std::fabs(x));
  float t = (1.f - e) / (1.f + e);
  return std::copysign(t, x);
}

} // namespace epl::backend::cpu
