// The 16-bit wire formats: every value converts back exactly, and f32 values round to the
// nearest 16-bit value, ties to even, as the halfway points between neighbours show.
#include "backend/comm/Wire.h"
#include "Reference.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

using namespace epl::backend;
using epl::commtest::bitsOf;

namespace {

// Checks conversion `to` against the neighbours of every positive finite 16-bit value:
// the midpoint of two neighbours (exact in f32) rounds to the even one, and the f32 values
// just below and above it round down and up.
template <class To, class From>
void checkRoundingBetweenNeighbours(To to, From from, uint16_t largestFinite) {
  int64_t wrong = 0;
  for (uint32_t h = 0; h < largestFinite; ++h) {
    float a = from(static_cast<uint16_t>(h)), b = from(static_cast<uint16_t>(h + 1));
    float mid = a + (b - a) / 2; // exact; a + b could overflow
    uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    wrong += to(mid) != even;
    wrong += to(std::nextafter(mid, 0.f)) != h;
    wrong += to(std::nextafter(mid, std::numeric_limits<float>::infinity())) != h + 1;
    wrong += to(-mid) != (even | 0x8000u); // the sign is copied
  }
  CHECK(wrong == 0);
}

} // namespace

TEST_CASE("every bf16 and f16 value converts to f32 and back unchanged") {
  int64_t bf16Wrong = 0, f16Wrong = 0;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    auto v = static_cast<uint16_t>(h);
    float b = wire::fromBf16(v), f = wire::fromF16(v);
    if (std::isnan(b))
      bf16Wrong += !std::isnan(wire::fromBf16(wire::toBf16(b)));
    else
      bf16Wrong += wire::toBf16(b) != v;
    if (std::isnan(f))
      f16Wrong += !std::isnan(wire::fromF16(wire::toF16(f)));
    else
      f16Wrong += wire::toF16(f) != v;
  }
  CHECK(bf16Wrong == 0);
  CHECK(f16Wrong == 0);
}

TEST_CASE("bf16 rounds to nearest, ties to even") {
  checkRoundingBetweenNeighbours(wire::toBf16, wire::fromBf16, 0x7f7f);
  CHECK(wire::toBf16(1.f) == 0x3f80);
  CHECK(bitsOf(wire::fromBf16(0x3f80)) == bitsOf(1.f));
  // Above the largest finite bf16 by half its spacing or more: infinity.
  CHECK(wire::toBf16(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(wire::toBf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(std::isnan(wire::fromBf16(wire::toBf16(std::nanf("")))));
}

TEST_CASE("f16 rounds to nearest, ties to even, through subnormals and overflow") {
  checkRoundingBetweenNeighbours(wire::toF16, wire::fromF16, 0x7bff);
  CHECK(wire::fromF16(0x7bff) == 65504.f);
  CHECK(wire::toF16(65519.f) == 0x7bff);
  CHECK(wire::toF16(65520.f) == 0x7c00); // the tie goes to the even neighbour: infinity
  CHECK(wire::fromF16(0x0001) == 0x1p-24f);
  CHECK(wire::toF16(0x1p-25f) == 0x0000);                      // tie: to even zero
  CHECK(wire::toF16(std::nextafter(0x1p-25f, 1.f)) == 0x0001); // above the tie
  CHECK(wire::toF16(3 * 0x1p-25f) == 0x0002);                  // tie 1.5 -> 2
  CHECK(wire::toF16(-0.f) == 0x8000);
  CHECK(std::isnan(wire::fromF16(wire::toF16(std::nanf("")))));
}

#ifdef __FLT16_MANT_DIG__
TEST_CASE("f16 agrees with the compiler's _Float16 conversion") {
  int64_t wrong = 0;
  for (int64_t i = 0; i < 1 << 20; ++i) {
    // Random f32 bit patterns over the whole range, finite ones only.
    auto u = static_cast<uint32_t>(epl::splitmix64(static_cast<uint64_t>(i)));
    float x;
    std::memcpy(&x, &u, 4);
    if (!std::isfinite(x)) continue;
    _Float16 h = static_cast<_Float16>(x);
    uint16_t expected;
    std::memcpy(&expected, &h, 2);
    wrong += wire::toF16(x) != expected;
    wrong += bitsOf(wire::fromF16(expected)) != bitsOf(static_cast<float>(h));
  }
  CHECK(wrong == 0);
}
#endif

TEST_CASE("wire loops: encode scales f16, add rounds each sum, decode divides") {
  float in[3] = {1.f / 3, -2.5f, 1e-6f};
  uint16_t a[3], b[3], sum[3];
  wire::encode(WireType::F16, in, a, 3, 1024.f);
  CHECK(a[2] == wire::toF16(1e-6f * 1024.f)); // scaled before converting: no underflow
  wire::encode(WireType::F16, in, b, 3, 1024.f);
  wire::add(WireType::F16, sum, a, b, 3);
  for (int i = 0; i < 3; ++i)
    CHECK(sum[i] == wire::toF16(wire::fromF16(a[i]) + wire::fromF16(b[i])));
  float out[3];
  wire::decode(WireType::F16, sum, out, 3, 1024.f);
  for (int i = 0; i < 3; ++i)
    CHECK(out[i] == wire::fromF16(sum[i]) / 1024.f);
  CHECK(std::fabs(out[2] - 2e-6f) < 2e-6f * 0x1p-10f);
  wire::encode(WireType::BF16, in, a, 3, 1024.f); // bf16 ignores the scale
  CHECK(a[0] == wire::toBf16(1.f / 3));
  CHECK(std::string(wireTypeName(WireType::BF16)) == "bf16");
}
