// Inputs and oracles shared by the communicator tests: each rank's data, and what a
// collective must produce, computed directly from every rank's inputs (no Comm involved).
#pragma once
#include "backend/comm/Comm.h"
#include "support/Random.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace epl::commtest {

using backend::WireType;

// Multiples of 1/4 in [-12, 12]: every sum of a few of them is exact in f32 in any order, so
// an f32 reduction must match the reference bit for bit.
inline float exactValue(int rank, int64_t i) {
  return static_cast<float>(((rank + 1) * 37 + i * 11) % 97 - 48) * 0.25f;
}

// Values in [-1, 1) with full 24-bit mantissas, for the 16-bit wire types.
inline float roughValue(int rank, int64_t i) {
  uint64_t bits =
      splitmix64(mixSeeds({0x5eedull, static_cast<uint64_t>(rank), static_cast<uint64_t>(i)}));
  return static_cast<float>(bits >> 40) * 0x1p-23f - 1.f;
}

inline unsigned char byteValue(int rank, int64_t i) {
  return static_cast<unsigned char>((rank * 131 + i * 7 + (i >> 8)) & 0xff);
}

inline std::vector<float> floats(int rank, int64_t count, bool exact) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    v[i] = exact ? exactValue(rank, i) : roughValue(rank, i);
  return v;
}

inline std::vector<unsigned char> bytes(int rank, int64_t count) {
  std::vector<unsigned char> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    v[i] = byteValue(rank, i);
  return v;
}

// Element i summed over n ranks in double, and the sum of magnitudes (for tolerances).
inline double exactSum(int n, int64_t i, bool exact) {
  double s = 0;
  for (int r = 0; r < n; ++r)
    s += exact ? exactValue(r, i) : roughValue(r, i);
  return s;
}

inline double magnitudeSum(int n, int64_t i) {
  double s = 0;
  for (int r = 0; r < n; ++r)
    s += std::fabs(roughValue(r, i));
  return s;
}

// How far a reduction over n ranks may be from the exact sum: each of the n conversions
// and n-1 partial sums rounds with relative error at most u (2^-24 for f32, 2^-8 for bf16,
// 2^-11 for f16) of at most the sum of magnitudes; f16 adds the absolute spacing of its
// subnormals, divided by the scale.
inline double wireTolerance(WireType w, int n, double sumOfMagnitudes, float scale) {
  double u = w == WireType::F32 ? 0x1p-24 : w == WireType::BF16 ? 0x1p-8 : 0x1p-11;
  double floor = w == WireType::F16 ? n * 0x1p-24 / scale : 0;
  return 2.0 * n * u * sumOfMagnitudes + floor;
}

inline uint32_t bitsOf(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

} // namespace epl::commtest
