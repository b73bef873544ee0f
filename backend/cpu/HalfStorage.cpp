// amp on the CPU device: tensors stored in bf16 or IEEE half, computed in f32. A call that
// reads or writes a half view runs its f32 kernel on widened copies (kept in one grow-only
// buffer), and its half outputs are rounded back to nearest even; a call that casts its
// weights (KernelCall::castParams) reads them rounded to the half type. The arithmetic is
// the f32 kernels' own, so a GPU's half-precision kernels differ from it only by their
// accumulation order. The memory plan places the widened copies (Module::ampStagingBytes)
// in the call's workspace; the CUDA device does the same (backend/cuda/HalfStorage.cu).
#include "backend/HalfStaging.h"
#include "backend/comm/Wire.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"
#include "backend/cpu/Parallel.h"
#include "support/Assert.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#ifdef __F16C__
#include <immintrin.h>
#endif

namespace epl::backend::cpu {

namespace {

constexpr int64_t kGrain = 1 << 14;

// IEEE half through the CPU's conversion instructions (F16C), 8 values at a time, where
// it has them: nearest even, as wire::toF16 and fromF16 (exact) convert, to the bit
// (tests/unit/HalfProductsTest.cpp). A group holding a NaN or infinity goes through the wire's
// conversions, which give every NaN one quiet pattern. Returns the values done (none in a
// build for CPUs without F16C: the portable one).
int64_t narrowF16([[maybe_unused]] const float* src, [[maybe_unused]] uint16_t* h,
                  [[maybe_unused]] int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(src + i);
    __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
    // |x| < inf is false for infinities and NaNs
    if (_mm256_movemask_ps(
            _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), x), inf, _CMP_LT_OQ)) != 0xff)
      return i;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  return i;
}

int64_t widenF16([[maybe_unused]] const uint16_t* h, [[maybe_unused]] float* dst,
                 [[maybe_unused]] int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    // exponent bits all set: an infinity or NaN
    __m128i top = _mm_and_si128(v, _mm_set1_epi16(0x7c00));
    if (_mm_movemask_epi8(_mm_cmpeq_epi16(top, _mm_set1_epi16(0x7c00))) != 0) return i;
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(v));
  }
#endif
  return i;
}

// n values converted to or from IEEE half: `vector` (narrowF16, widenF16) as far as it
// goes, then `wire` (the wire's encode or decode) the group it stopped at, or the tail.
template <class From, class To, class Vector, class Wire>
void f16Run(const From* src, To* dst, int64_t n, Vector&& vector, Wire&& wire) {
  for (int64_t i = 0; i < n;) {
    i += vector(src + i, dst + i, n - i);
    int64_t rest = std::min<int64_t>(8, n - i);
    wire(src + i, dst + i, rest);
    i += rest;
  }
}

// n f32 values rounded to the half type t, on this thread.
void narrowRun(ir::DType t, const float* src, uint16_t* h, int64_t n) {
  if (t != ir::DType::BF16)
    return f16Run(src, h, n, narrowF16, [](const float* s, uint16_t* d, int64_t k) {
      wire::encode(WireType::F16, s, d, k, 1.f);
    });
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    h[i] = wire::toBf16(src[i]);
}

} // namespace

void widenRun(ir::DType t, const uint16_t* h, float* dst, int64_t n) {
  if (t != ir::DType::BF16)
    return f16Run(h, dst, n, widenF16, [](const uint16_t* s, float* d, int64_t k) {
      wire::decode(WireType::F16, s, d, k, 1.f);
    });
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    dst[i] = wire::fromBf16(h[i]);
}

namespace {

void widen(ir::DType t, const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  parallelFor(n, kGrain, [&](int64_t a, int64_t b) { widenRun(t, h + a, dst + a, b - a); });
}

void narrow(ir::DType t, const float* src, void* dst, int64_t n) {
  uint16_t* h = static_cast<uint16_t*>(dst);
  parallelFor(n, kGrain, [&](int64_t a, int64_t b) { narrowRun(t, src + a, h + a, b - a); });
}

uint16_t* halves(const TensorView& v) {
  return static_cast<uint16_t*>(v.data);
}

// dst = src rounded to the half type t and back.
void round(ir::DType t, const float* src, float* dst, int64_t n) {
  parallelFor(n, kGrain, [&](int64_t a, int64_t b) {
    if (t == ir::DType::BF16) {
#pragma omp simd
      for (int64_t i = a; i < b; ++i)
        dst[i] = wire::fromBf16(wire::toBf16(src[i]));
    } else {
      for (int64_t i = a; i < b; ++i)
        dst[i] = wire::fromF16(wire::toF16(src[i]));
    }
  });
}

// The widened copies of one call, side by side, each 64-byte aligned.
float* stagingBuffer(int64_t floats) {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<float, Free> buffer;
  thread_local int64_t capacity = 0;
  if (floats > capacity) {
    int64_t bytes = (floats * 4 + 63) / 64 * 64;
    buffer.reset(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(bytes))));
    EPL_ASSERT(buffer, "out of memory for amp's f32 copies");
    capacity = bytes / 4;
  }
  return buffer.get();
}

} // namespace

void narrowTo(ir::DType t, const float* src, void* dst, int64_t n) {
  narrow(t, src, dst, n);
}

void roundTo(ir::DType t, float* x, int64_t n) {
  round(t, x, x, n);
}

const float* f32Run(const TensorView& v, int64_t at, int64_t n, float* tmp) {
  if (v.dtype == ir::DType::F32) return v.f32() + at;
  widenRun(v.dtype, halves(v) + at, tmp, n);
  return tmp;
}

float f32At(const TensorView& v, int64_t i) {
  if (v.dtype == ir::DType::F32) return v.f32()[i];
  float f;
  widenRun(v.dtype, halves(v) + i, &f, 1);
  return f;
}

void storeAt(const TensorView& v, int64_t i, float f) {
  if (v.dtype == ir::DType::F32)
    v.f32()[i] = f;
  else
    narrowRun(v.dtype, &f, halves(v) + i, 1);
}

GradOut outRun(const TensorView& v, bool acc, int64_t at, int64_t n, float* tmp) {
  if (v.dtype == ir::DType::F32) return {v.f32() + at, acc};
  if (acc) widenRun(v.dtype, halves(v) + at, tmp, n);
  return {tmp, acc};
}

void storeRun(const TensorView& v, int64_t at, int64_t n, const GradOut& run) {
  if (v.dtype != ir::DType::F32) narrowRun(v.dtype, run.p, halves(v) + at, n);
}

Operand roundedOperand(ir::DType t, bool asIs, float* x, int64_t n, void* half) {
  if (!asIs) {
    roundTo(t, x, n);
    return x;
  }
  narrowTo(t, x, half, n);
  return {half, t};
}

void launchStaged(const KernelCall& c, void (*run)(const KernelCall&)) {
  int64_t floats = stagingFloats(c);
  // Linear, mlp and attention take their products' half inputs as they are: gemm
  // multiplies bf16 natively where oneDNN can (KernelUtil.h, productsRead), and widens the
  // rest a piece at a time; mlp then widens its h a piece at a time too.
  uint64_t direct = directInputs(c);
  KernelCall f = stagedCall(c, plannedStaging(c, floats) ? c.workspace : stagingBuffer(floats),
                            widen, round, narrow, direct | widenedInputs(c, direct));
  run(f);
  narrowOutputs(c, f, narrow);
}

} // namespace epl::backend::cpu
