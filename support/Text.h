// Small text helpers shared by the layers: suggestions, byte and count formatting.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace epl {

// Edit distance between two words (insertions, deletions, substitutions).
size_t editDistance(const std::string& a, const std::string& b);
// The closest candidate within a small edit distance, or "" when none is close.
std::string closestMatch(const std::string& word, const std::vector<std::string>& candidates);
// 1234567 -> "1,234,567".
std::string withCommas(int64_t n);
// The same for counts that may pass 2^63 - 1 (sizes read from a file).
std::string unsignedWithCommas(uint64_t n);
// Bytes in decimal units with three significant digits: "9.60 MB", "2.80 TB".
std::string formatBytes(double bytes);
// Floating-point operations alike: "31.4 GFLOP", "7.70 TFLOP".
std::string formatFlops(double flops);

// A time to three significant digits in s, ms or us: "3.31 ms".
std::string formatSeconds(double seconds);

// `s` with its first letter lower case, as diagnostics quote a library's message.
std::string lowerFirst(std::string s);

// The lines of `text`, without their line ends (a last line without one counts).
std::vector<std::string> splitLines(const std::string& text);

} // namespace epl
