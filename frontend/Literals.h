// The values of number literals, exact or refused: integers (INT), numbers (FLOAT) and
// sizes (SIZE) as the lexer delimits them. Nothing is rounded away silently: a literal
// out of range, or a size that is not a whole number of bytes, is a problem to report.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace epl::frontend {

// Why a literal has no value: the error's message and its `= note:` line.
struct LiteralProblem {
  std::string message, note;
};

// INT: [0-9]+, at most 2^63 - 1.
std::optional<LiteralProblem> parseIntLiteral(std::string_view text, int64_t& out);
// FLOAT: 0 or a normal 64-bit float; subnormals (below 2.2250738585072014e-308) are
// refused because they hold fewer significant digits than were written.
std::optional<LiteralProblem> parseFloatLiteral(std::string_view text, double& out);
// SIZE: a decimal number and a unit, an exact whole number of bytes up to 2^63 - 1.
std::optional<LiteralProblem> parseSizeLiteral(std::string_view text, int64_t& out);

} // namespace epl::frontend
