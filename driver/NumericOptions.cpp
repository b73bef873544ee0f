// The CLI's numeric option checks (NumericOptions.h).
#include "driver/NumericOptions.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>

namespace epl::driver {

CLI::Validator wholeNumber(const std::string& name, int64_t lo, int64_t hi) {
  auto check = [=](std::string& text) -> std::string {
    int64_t v = 0;
    const char* end = text.data() + text.size();
    auto [stop, ec] = std::from_chars(text.data(), end, v);
    bool digits = !text.empty() && stop == end;
    if (ec == std::errc::result_out_of_range && digits)
      v = text[0] == '-' ? INT64_MIN : INT64_MAX;
    else if (ec != std::errc() || !digits)
      throw UsageError(fmt::format("{} must be a whole number, got `{}`", name, text));
    if (v < lo) throw UsageError(fmt::format("{} must be at least {}, got `{}`", name, lo, text));
    if (v > hi) throw UsageError(fmt::format("{} must be at most {}, got `{}`", name, hi, text));
    return "";
  };
  return CLI::Validator(check, fmt::format("INT in [{}, {}]", lo, hi), "");
}

CLI::Validator positiveNumber(const std::string& name) {
  auto check = [=](std::string& text) -> std::string {
    char* end = nullptr;
    double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(v) || v <= 0)
      throw UsageError(fmt::format("{} must be a positive, finite number, got `{}`", name, text));
    return "";
  };
  return CLI::Validator(check, "POSITIVE", "");
}

} // namespace epl::driver
