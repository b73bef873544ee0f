// Number literals: std::from_chars for integers and floats (no exceptions, no locale),
// exact decimal arithmetic for sizes.
#include "frontend/Literals.h"

#include "support/Assert.h"

#include <cfloat>
#include <charconv>
#include <cmath>
#include <fmt/format.h>

namespace epl::frontend {

namespace {

// Whether a float literal that does not fit a double lies above its range rather than
// below: the decimal exponent of its leading digit, plus its exponent, is positive.
bool beyondLargest(std::string_view text) {
  size_t e = text.find_first_of("eE");
  std::string_view mantissa = text.substr(0, e);
  long exponent = 0;
  if (e != std::string_view::npos) {
    std::string_view digits = text.substr(e + 1);
    bool negative = !digits.empty() && digits[0] == '-';
    if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) digits.remove_prefix(1);
    for (char c : digits) // saturates: only the sign of the sum below matters
      exponent = std::min(exponent * 10 + (c - '0'), 1'000'000'000L);
    if (negative) exponent = -exponent;
  }
  size_t dot = std::min(mantissa.find('.'), mantissa.size());
  size_t lead = mantissa.find_first_not_of("0.");
  if (lead == std::string_view::npos) return false; // zero: never out of range
  long leadExponent =
      lead < dot ? static_cast<long>(dot - lead - 1) : -static_cast<long>(lead - dot);
  return leadExponent + exponent > 0;
}

// `digits` times `factor`, as decimal digits, most significant first.
void multiplyDigits(std::string& digits, int factor) {
  int carry = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
    int v = (*it - '0') * factor + carry;
    *it = static_cast<char>('0' + v % 10);
    carry = v / 10;
  }
  for (; carry > 0; carry /= 10)
    digits.insert(digits.begin(), static_cast<char>('0' + carry % 10));
}

// A unit as a base (1000 or 1024) raised to a power; false for an unknown unit.
bool unitScale(std::string_view unit, int& base, int& power) {
  static const char* const decimal[] = {"KB", "MB", "GB", "TB"};
  static const char* const binary[] = {"KiB", "MiB", "GiB", "TiB"};
  for (int k = 0; k < 4; ++k) {
    if (unit == decimal[k] || unit == binary[k]) {
      base = unit == decimal[k] ? 1000 : 1024;
      power = k + 1;
      return true;
    }
  }
  return false;
}

} // namespace

std::optional<LiteralProblem> parseIntLiteral(std::string_view text, int64_t& out) {
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec == std::errc() && p == text.data() + text.size()) return std::nullopt;
  return LiteralProblem{fmt::format("integer `{}` is too large", text),
                        "integers must be at most 2^63 - 1 (9223372036854775807)"};
}

std::optional<LiteralProblem> parseFloatLiteral(std::string_view text, double& out) {
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  bool parsed = ec == std::errc();
  EPL_ASSERT(parsed ? p == text.data() + text.size() : ec == std::errc::result_out_of_range,
             "the lexer passed a malformed number");
  if (parsed && (out == 0 || std::isnormal(out))) return std::nullopt;
  if (!parsed && beyondLargest(text))
    return LiteralProblem{fmt::format("number `{}` is too large", text),
                          fmt::format("numbers are 64-bit floats, at most {}", DBL_MAX)};
  return LiteralProblem{
      fmt::format("number `{}` is too small", text),
      fmt::format("numbers are 64-bit floats: other than 0, at least {} in size (below it "
                  "they lose precision)",
                  DBL_MIN)};
}

// Exact: the digits are scaled by the unit in decimal, then the integer part must fit
// and the fraction must be zero (`1.5KB` is 1500 bytes; `0.0001KB` is refused).
std::optional<LiteralProblem> parseSizeLiteral(std::string_view text, int64_t& out) {
  size_t unitAt = text.find_first_not_of("0123456789.");
  int base = 0, power = 0;
  bool known = unitAt != std::string_view::npos && unitScale(text.substr(unitAt), base, power);
  EPL_ASSERT(known, "the lexer passed a size without a known unit");
  std::string_view number = text.substr(0, unitAt);
  size_t dot = std::min(number.find('.'), number.size());
  std::string_view whole = number.substr(0, dot);
  std::string_view fraction = dot < number.size() ? number.substr(dot + 1) : "";
  fraction = fraction.substr(0, fraction.find_last_not_of('0') + 1);
  whole.remove_prefix(std::min(whole.find_first_not_of('0'), whole.size()));
  std::string digits = std::string(whole) + std::string(fraction);
  for (int k = 0; k < power; ++k)
    multiplyDigits(digits, base);
  std::string_view bytes(digits.data(), digits.size() - fraction.size());
  std::string_view rest(digits.data() + bytes.size(), fraction.size());
  bytes.remove_prefix(std::min(bytes.find_first_not_of('0'), bytes.size()));
  if (bytes.empty()) bytes = "0";
  auto [p, ec] = std::from_chars(bytes.data(), bytes.data() + bytes.size(), out);
  if (ec != std::errc() || p != bytes.data() + bytes.size())
    return LiteralProblem{fmt::format("size `{}` is too large", text),
                          "a size is a count of bytes, at most 2^63 - 1 (about 9.22 EB)"};
  if (rest.find_first_not_of('0') != std::string_view::npos)
    return LiteralProblem{fmt::format("size `{}` is not a whole number of bytes", text),
                          "a size is a count of bytes: `1.5KB` is 1500 and `0.5KiB` is 512"};
  return std::nullopt;
}

} // namespace epl::frontend
