// The 16-bit wire formats of reductions (WireType): exact conversions from and to f32, and
// the three loops a reduction runs on wire data (encode, add, decode). The conversions are
// also the CPU device's for tensors amp stores in half precision (cpu/HalfStorage.cpp).
#pragma once
#include "backend/comm/Comm.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace epl::backend::wire {

// f32 -> bf16 and f32 -> IEEE half, rounding to nearest, ties to even. NaN stays NaN (quiet);
// a half overflows to infinity, and values below its range go subnormal, then to zero.
// bf16's pair is inline and branch-free, so the loops over it vectorise (amp converts every
// half tensor a CPU kernel touches).
inline uint16_t toBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  // bf16 is the top half of f32: the low 16 bits carry into it above halfway, and at
  // halfway when the kept half is odd (a carry may reach infinity, which is the correctly
  // rounded result). A NaN keeps its top bits and becomes quiet.
  uint32_t rounded = (u + 0x7fffu + (u >> 16 & 1u)) >> 16;
  uint32_t nan = u >> 16 | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
uint16_t toF16(float x);
// Exact: every bf16 and half value is an f32 value.
inline float fromBf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
float fromF16(uint16_t h);

// Bytes of one element on the wire.
size_t elementBytes(WireType w);

// dst = wire(src * scale); scale applies to F16 only. dst may not overlap src unless w is F32
// and they are the same buffer.
void encode(WireType w, const float* src, void* dst, int64_t n, float scale);
// dst = float(src) / scale (F16), float(src) otherwise.
void decode(WireType w, const void* src, float* dst, int64_t n, float scale);
// dst = wire(a + b), element by element in f32, rounded to the wire type: one hop of a
// reduction. dst may be a or b.
void add(WireType w, void* dst, const void* a, const void* b, int64_t n);

} // namespace epl::backend::wire
