// Symbolic dims and the text helpers behind every message and plan.
#include "ir/Types.h"
#include "support/Text.h"

#include <catch2/catch.hpp>

using epl::ir::Dim;

TEST_CASE("dims multiply, divide exactly and evaluate") {
  Dim b = Dim::symbol("B"), t = Dim::symbol("T");
  CHECK(b.times(Dim::constant(4))->str() == "4*B");
  CHECK(t.times(b)->str() == "B*T"); // symbols sorted: B*T == T*B
  CHECK(*t.times(b) == *b.times(t));
  CHECK(Dim::constant(12).times(b)->divide(4)->str() == "3*B");
  CHECK_FALSE(Dim::constant(6).times(b)->divide(4).has_value());
  CHECK(Dim::constant(2).times(b)->eval({{"B", 8}}) == 16);
  CHECK_FALSE(b.eval({}).has_value());
  CHECK(epl::ir::shapeStr({b, Dim::constant(128)}) == "[B, 128]");
}

TEST_CASE("size arithmetic past 2^63 - 1 gives no value instead of wrapping") {
  Dim big = Dim::constant(int64_t{1} << 62), b = Dim::symbol("B");
  CHECK_FALSE(big.times(Dim::constant(2)).has_value());
  CHECK(big.times(b)->str() == "4611686018427387904*B");
  CHECK_FALSE(big.times(b)->eval({{"B", 2}}).has_value());
  CHECK_FALSE(Dim::constant(INT64_MIN).divide(-1).has_value());
  CHECK_FALSE(epl::ir::numElements({big, Dim::constant(2)}, {}).has_value());
  CHECK(epl::ir::numElements({big, Dim::constant(1)}, {}) == int64_t{1} << 62);
  using epl::ir::TensorType, epl::ir::DType;
  // f32 of 2^61 elements is 2^63 bytes, one past the last that fits; f16 of them fits.
  CHECK_FALSE(epl::ir::checkedBytes(TensorType{DType::F32, {Dim::constant(int64_t{1} << 61)}}, {})
                  .has_value());
  CHECK(epl::ir::checkedBytes(TensorType{DType::F16, {Dim::constant(int64_t{1} << 61)}}, {}) ==
        int64_t{1} << 62);
  // A symbol without a binding counts as 1; with one, it multiplies.
  TensorType x{DType::F32, {b, Dim::constant(int64_t{1} << 59)}};
  CHECK(epl::ir::checkedBytes(x, {}) == int64_t{1} << 61);
  CHECK_FALSE(epl::ir::checkedBytes(x, {{"B", 4}}).has_value());
}

TEST_CASE("numbers print for people") {
  CHECK(epl::withCommas(175222972416) == "175,222,972,416");
  CHECK(epl::withCommas(-1234) == "-1,234");
  CHECK(epl::withCommas(0) == "0");
  CHECK(epl::withCommas(INT64_MIN) == "-9,223,372,036,854,775,808");
  CHECK(epl::formatBytes(512) == "512 B");
  CHECK(epl::formatBytes(262144) == "262 KB");
  CHECK(epl::formatBytes(9.87e6) == "9.87 MB");
  CHECK(epl::formatBytes(100.7e6) == "101 MB");
  CHECK(epl::formatBytes(999.9e6) == "1.00 GB");
}

TEST_CASE("suggestions pick close names only") {
  CHECK(epl::closestMatch("shedule", {"schedule", "zero", "amp"}) == "schedule");
  CHECK(epl::closestMatch("adamww", {"sgd", "adam", "adamw"}) == "adamw");
  CHECK(epl::closestMatch("xyz", {"schedule", "zero"}).empty());
  CHECK(epl::editDistance("kitten", "sitting") == 3);
}
