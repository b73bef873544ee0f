// bf16 and IEEE half conversions with round-to-nearest-even, and the reduction loops over
// wire data. Written with integer bit operations so that every rank, whatever its compiler
// flags or vector unit, produces the same bits.
#include "backend/comm/Wire.h"

#include <cstring>

namespace epl::backend::wire {

namespace {

uint32_t bitsOf(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float floatOf(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Adds one to `r` when the dropped bits `rest` (of which `half` is the halfway value) round
// it up: above halfway, or exactly halfway with r odd.
uint32_t roundNearestEven(uint32_t r, uint32_t rest, uint32_t half) {
  return r + (rest > half || (rest == half && (r & 1u)));
}

} // namespace

// Steps, on |x| (the sign is copied):
//   1. NaN and infinity map to themselves; values at or above 65520 (halfway between the
//      largest half, 65504, and 2^16, rounding to even) overflow to infinity;
//   2. below 2^-14 (the smallest normal half) the result is a subnormal: |x| / 2^-24
//      rounded to an integer, which may carry into the smallest normal;
//   3. otherwise rebias the exponent (127 -> 15) and round the mantissa from 23 to 10 bits;
//      a carry out of the mantissa correctly increments the exponent.
uint16_t toF16(float x) {
  uint32_t u = bitsOf(x);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t ax = u & 0x7fffffffu;
  if (ax >= 0x7f800000u)
    return static_cast<uint16_t>(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (ax < 0x38800000u) {
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign); // below 2^-25: rounds to zero
    uint32_t exponent = ax >> 23;                             // 102 ..= 112
    uint32_t mantissa = (ax & 0x7fffffu) | 0x800000u;         // |x| = mantissa * 2^(exponent-150)
    uint32_t shift = 126 - exponent;                          // |x| / 2^-24 = mantissa >> shift
    uint32_t r =
        roundNearestEven(mantissa >> shift, mantissa & ((1u << shift) - 1), 1u << (shift - 1));
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = roundNearestEven((ax - 0x38000000u) >> 13, ax & 0x1fffu, 0x1000u);
  return static_cast<uint16_t>(sign | r);
}

float fromF16(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return floatOf(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) { // zero or subnormal: mantissa * 2^-24, exact in f32
    float v = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -v : v;
  }
  return floatOf(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

size_t elementBytes(WireType w) {
  return w == WireType::F32 ? 4 : 2;
}

void encode(WireType w, const float* src, void* dst, int64_t n, float scale) {
  if (n == 0) return; // the buffers may be null
  switch (w) {
  case WireType::F32:
    if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  case WireType::BF16: {
    auto* out = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i)
      out[i] = toBf16(src[i]);
    return;
  }
  case WireType::F16: {
    auto* out = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i)
      out[i] = toF16(src[i] * scale);
    return;
  }
  }
}

void decode(WireType w, const void* src, float* dst, int64_t n, float scale) {
  if (n == 0) return; // the buffers may be null
  switch (w) {
  case WireType::F32:
    if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  case WireType::BF16: {
    const auto* in = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i)
      dst[i] = fromBf16(in[i]);
    return;
  }
  case WireType::F16: {
    const auto* in = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i)
      dst[i] = fromF16(in[i]) / scale;
    return;
  }
  }
}

namespace {

// out = to(from(x) + from(y)) over 16-bit values: one hop of a 16-bit reduction.
template <uint16_t (*to)(float), float (*from)(uint16_t)>
void add16(void* dst, const void* a, const void* b, int64_t n) {
  auto* out = static_cast<uint16_t*>(dst);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (int64_t i = 0; i < n; ++i)
    out[i] = to(from(x[i]) + from(y[i]));
}

} // namespace

void add(WireType w, void* dst, const void* a, const void* b, int64_t n) {
  switch (w) {
  case WireType::F32: {
    auto* out = static_cast<float*>(dst);
    const auto* x = static_cast<const float*>(a);
    const auto* y = static_cast<const float*>(b);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      out[i] = x[i] + y[i];
    return;
  }
  case WireType::BF16:
    return add16<toBf16, fromBf16>(dst, a, b, n);
  case WireType::F16:
    return add16<toF16, fromF16>(dst, a, b, n);
  }
}

} // namespace epl::backend::wire
