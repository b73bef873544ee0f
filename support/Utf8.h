// The one UTF-8 validator: every text the compiler reads (scripts, imports, an editor's
// buffer) passes it before anything else looks at the text.
//
// Strict, as RFC 3629 and Unicode's table of well-formed byte sequences: no overlong
// encodings (C0 80, E0 80 80), no encoded surrogates (ED A0 80 is U+D800), nothing past
// U+10FFFF (F4 90 80 80), no truncated sequences, no stray continuation bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace epl {

// The first malformed byte of a text: its offset, its 1-based line and column (columns
// count code points, as SourceLoc does), and what is wrong, for a `= note:` line.
struct Utf8Error {
  size_t offset = 0;
  uint32_t line = 1, col = 1;
  std::string reason;
};

std::optional<Utf8Error> findInvalidUtf8(std::string_view text);

// Bytes in the well-formed sequence that starts `s`, or 0 when it is malformed (or empty).
size_t utf8SequenceLength(std::string_view s);

// `s` with each byte that is not part of a well-formed sequence replaced by U+FFFD, so
// that it can be shown on a terminal or sent as JSON; one column per replaced byte.
std::string replaceInvalidUtf8(std::string_view s);

} // namespace epl
