// Suggestions for misspelt names and human-readable figures.
#include "support/Text.h"

#include <algorithm>
#include <fmt/format.h>
#include <sstream>

namespace epl {

size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closestMatch(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t bestDist = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = editDistance(word, c);
    if (d < bestDist) {
      bestDist = d;
      best = c;
    }
  }
  return best;
}

std::string unsignedWithCommas(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string withCommas(int64_t n) {
  // The magnitude as unsigned: -n overflows for the most negative value.
  uint64_t magnitude = n < 0 ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
  return n < 0 ? "-" + unsignedWithCommas(magnitude) : unsignedWithCommas(magnitude);
}

static std::string threeDigits(double v, const char* const* units, size_t count, double step) {
  size_t u = 0;
  while (v >= step * 0.9995 && u + 1 < count) {
    v /= step;
    ++u;
  }
  if (u == 0) return fmt::format("{:.0f}{}", v, units[0]);
  int decimals = v >= 99.95 ? 0 : v >= 9.995 ? 1 : 2;
  return fmt::format("{:.{}f}{}", v, decimals, units[u]);
}

std::string formatBytes(double bytes) {
  static const char* const units[] = {" B", " KB", " MB", " GB", " TB", " PB"};
  return threeDigits(bytes, units, 6, 1000.0);
}

std::string formatFlops(double flops) {
  static const char* const units[] = {" FLOP",  " kFLOP", " MFLOP", " GFLOP",
                                      " TFLOP", " PFLOP", " EFLOP"};
  return threeDigits(flops, units, 7, 1000.0);
}

std::string lowerFirst(std::string s) {
  if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z') s[0] = static_cast<char>(s[0] - 'A' + 'a');
  return s;
}

std::string formatSeconds(double s) {
  if (s >= 1) return fmt::format("{:.3g} s", s);
  if (s >= 1e-3) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} us", s * 1e6);
}

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

} // namespace epl
