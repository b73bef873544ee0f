// Number literals are exact or refused: the boundaries of integers, 64-bit floats
// (subnormals refused) and sizes (whole bytes up to 2^63 - 1).
#include "frontend/Literals.h"

#include <catch2/catch.hpp>
#include <cfloat>
#include <string>

using namespace epl::frontend;

namespace {

std::string literalProblem(const std::optional<LiteralProblem>& p) {
  return p ? p->message : "";
}

int64_t size(const std::string& text) {
  int64_t v = -1;
  auto p = parseSizeLiteral(text, v);
  INFO(text << ": " << literalProblem(p));
  REQUIRE_FALSE(p.has_value());
  return v;
}

std::string sizeProblem(const std::string& text) {
  int64_t v = 0;
  return literalProblem(parseSizeLiteral(text, v));
}

std::string floatProblem(const std::string& text) {
  double v = 0;
  return literalProblem(parseFloatLiteral(text, v));
}

} // namespace

TEST_CASE("integer literals stop at 2^63 - 1") {
  int64_t v = 0;
  CHECK_FALSE(parseIntLiteral("9223372036854775807", v).has_value());
  CHECK(v == INT64_MAX);
  CHECK_FALSE(parseIntLiteral("000000000000000000000000000042", v).has_value());
  CHECK(v == 42);
  CHECK(literalProblem(parseIntLiteral("9223372036854775808", v)) ==
        "integer `9223372036854775808` is too large");
  CHECK(literalProblem(parseIntLiteral(std::string(400, '9'), v)).find("is too large") !=
        std::string::npos);
}

TEST_CASE("float literals are 0 or normal 64-bit floats") {
  double v = 0;
  CHECK_FALSE(parseFloatLiteral("1.7976931348623157e308", v).has_value());
  CHECK(v == DBL_MAX);
  CHECK_FALSE(parseFloatLiteral("2.2250738585072014e-308", v).has_value());
  CHECK(v == DBL_MIN);
  CHECK_FALSE(parseFloatLiteral("0e99999999999999999999", v).has_value());
  CHECK(v == 0);
  CHECK_FALSE(parseFloatLiteral("0.000e-400", v).has_value());
  CHECK_FALSE(parseFloatLiteral("3e-4", v).has_value());
  CHECK(v == 3e-4);
  CHECK(floatProblem("1e309") == "number `1e309` is too large");
  CHECK(floatProblem("1.7976931348623159e308") == "number `1.7976931348623159e308` is too large");
  CHECK(floatProblem("1e99999999999999999999") == "number `1e99999999999999999999` is too large");
  CHECK(floatProblem("0.0001e309") == "");
  CHECK(floatProblem("1e-400") == "number `1e-400` is too small");
  CHECK(floatProblem("4e-320") == "number `4e-320` is too small");
  CHECK(floatProblem("2.2250738585072011e-308") == "number `2.2250738585072011e-308` is too small");
  CHECK(floatProblem("1000e-330") == "number `1000e-330` is too small");
  CHECK(floatProblem("1e-99999999999999999999") == "number `1e-99999999999999999999` is too small");
}

TEST_CASE("sizes are exact whole numbers of bytes") {
  CHECK(size("25MB") == 25'000'000);
  CHECK(size("1.5KB") == 1500);
  CHECK(size("0.5KiB") == 512);
  CHECK(size("1.25GiB") == 1'342'177'280);
  CHECK(size("0.001KB") == 1);
  CHECK(size("007.500KB") == 7500);
  CHECK(size("0KB") == 0);
  CHECK(size("8388607TiB") == INT64_MAX - (int64_t{1} << 40) + 1);
  CHECK(size("9223372.036854775807TB") == INT64_MAX);
  // 2^-40 TiB, written out in full, is one byte.
  CHECK(size("0.0000000000009094947017729282379150390625TiB") == 1);
  CHECK(sizeProblem("8388608TiB") == "size `8388608TiB` is too large");
  CHECK(sizeProblem("9223372.036854775808TB") == "size `9223372.036854775808TB` is too large");
  std::string huge = "25" + std::string(398, '0') + "MB";
  CHECK(sizeProblem(huge) == "size `" + huge + "` is too large");
  CHECK(sizeProblem("0.0001KB") == "size `0.0001KB` is not a whole number of bytes");
  CHECK(sizeProblem("1.1KiB") == "size `1.1KiB` is not a whole number of bytes");
  CHECK(sizeProblem("0." + std::string(5000, '0') + "1GB") ==
        "size `0." + std::string(5000, '0') + "1GB` is not a whole number of bytes");
}
