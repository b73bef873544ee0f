// UTF-8 validation by the table of well-formed byte sequences (Unicode, table 3-7).
#include "support/Utf8.h"

#include <fmt/format.h>

namespace epl {

namespace {

bool isContinuation(unsigned char c) {
  return (c & 0xc0) == 0x80;
}

// The range the second byte must lie in after lead byte `c`: narrower than 80..BF where
// a wider one would allow an overlong form, a surrogate, or a code point past U+10FFFF.
void secondByteRange(unsigned char c, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xbf;
  if (c == 0xe0) lo = 0xa0; // below: overlong
  if (c == 0xed) hi = 0x9f; // above: surrogates U+D800..U+DFFF
  if (c == 0xf0) lo = 0x90; // below: overlong
  if (c == 0xf4) hi = 0x8f; // above: past U+10FFFF
}

// Bytes a lead byte announces; 0 for bytes that never lead a well-formed sequence.
size_t announcedLength(unsigned char c) {
  if (c < 0x80) return 1;
  if (c < 0xc2) return 0; // continuation bytes, and C0/C1 (always overlong)
  if (c < 0xe0) return 2;
  if (c < 0xf0) return 3;
  if (c < 0xf5) return 4;
  return 0;
}

std::string hexBytes(std::string_view s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n && i < s.size(); ++i)
    out += fmt::format("{}{:02X}", i ? " " : "", static_cast<unsigned char>(s[i]));
  return out;
}

// What is wrong with the malformed sequence that starts `s`.
std::string describe(std::string_view s) {
  auto c = static_cast<unsigned char>(s[0]);
  if (isContinuation(c))
    return fmt::format("byte 0x{:02X} continues a sequence that was never started", c);
  if (c == 0xc0 || c == 0xc1)
    return fmt::format("the bytes `{}` are an overlong encoding", hexBytes(s, 2));
  if (c >= 0xf5) return fmt::format("byte 0x{:02X} never appears in UTF-8", c);
  size_t n = announcedLength(c);
  unsigned char lo = 0, hi = 0;
  secondByteRange(c, lo, hi);
  auto second = s.size() > 1 ? static_cast<unsigned char>(s[1]) : 0;
  if (s.size() > 1 && isContinuation(second) && (second < lo || second > hi)) {
    if (c == 0xed)
      return fmt::format("the bytes `{}` encode a UTF-16 surrogate, which UTF-8 does not allow",
                         hexBytes(s, 3));
    if (c == 0xf4)
      return fmt::format("the bytes `{}` encode a code point past U+10FFFF", hexBytes(s, 4));
    return fmt::format("the bytes `{}` are an overlong encoding", hexBytes(s, n));
  }
  size_t have = 1;
  while (have < n && have < s.size() && isContinuation(static_cast<unsigned char>(s[have])))
    ++have;
  return fmt::format("the sequence `{}` stops after {} of its {} bytes", hexBytes(s, have), have,
                     n);
}

} // namespace

size_t utf8SequenceLength(std::string_view s) {
  if (s.empty()) return 0;
  auto c = static_cast<unsigned char>(s[0]);
  size_t n = announcedLength(c);
  if (n == 0 || s.size() < n) return 0;
  if (n == 1) return 1;
  unsigned char lo = 0, hi = 0;
  secondByteRange(c, lo, hi);
  auto second = static_cast<unsigned char>(s[1]);
  if (second < lo || second > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (!isContinuation(static_cast<unsigned char>(s[k]))) return 0;
  return n;
}

std::optional<Utf8Error> findInvalidUtf8(std::string_view text) {
  uint32_t line = 1, col = 1;
  for (size_t i = 0; i < text.size();) {
    size_t n = utf8SequenceLength(text.substr(i));
    if (n == 0) return Utf8Error{i, line, col, describe(text.substr(i))};
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
    i += n;
  }
  return std::nullopt;
}

std::string replaceInvalidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8SequenceLength(s.substr(i));
    if (n == 0) {
      out += "\xef\xbf\xbd";
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

} // namespace epl
