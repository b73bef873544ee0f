// Offsets, EPL locations and LSP positions (lsp/TextPositions.h).
#include "lsp/TextPositions.h"

#include <algorithm>
#include <cctype>
#include <fmt/format.h>

namespace epl::lsp {

namespace {

// Bytes in the UTF-8 sequence led by `c` (1 for a stray continuation byte).
size_t sequenceLength(unsigned char c) {
  if (c >= 0xf0) return 4;
  if (c >= 0xe0) return 3;
  if (c >= 0xc0) return 2;
  return 1;
}

// UTF-16 code units of the code point led by `c`.
int utf16Units(unsigned char c) {
  return c >= 0xf0 ? 2 : 1;
}

} // namespace

LineIndex::LineIndex(std::string text) : text_(std::move(text)) {
  starts_.push_back(0);
  for (size_t i = 0; i < text_.size(); ++i)
    if (text_[i] == '\n') starts_.push_back(i + 1);
}

std::string_view LineIndex::line(uint32_t line) const {
  if (line == 0 || line > starts_.size()) return {};
  size_t begin = starts_[line - 1];
  size_t end = line < starts_.size() ? starts_[line] - 1 : text_.size();
  if (end > begin && text_[end - 1] == '\r') --end;
  return std::string_view(text_).substr(begin, end - begin);
}

size_t LineIndex::offsetOf(uint32_t line, uint32_t col) const {
  if (line == 0) return 0;
  if (line > starts_.size()) return text_.size();
  std::string_view l = this->line(line);
  size_t i = 0;
  for (uint32_t c = 1; c < col && i < l.size(); ++c)
    i += sequenceLength(static_cast<unsigned char>(l[i]));
  return starts_[line - 1] + std::min(i, l.size());
}

size_t LineIndex::offsetOf(Position p) const {
  if (p.line < 0) return 0;
  if (static_cast<size_t>(p.line) >= starts_.size()) return text_.size();
  std::string_view l = line(static_cast<uint32_t>(p.line + 1));
  size_t i = 0;
  for (int units = 0; units < p.character && i < l.size();) {
    auto c = static_cast<unsigned char>(l[i]);
    units += utf16Units(c);
    i += sequenceLength(c);
  }
  return starts_[p.line] + std::min(i, l.size());
}

size_t LineIndex::lineOf(size_t offset) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end(), offset);
  return static_cast<size_t>(it - starts_.begin()) - 1;
}

Position LineIndex::positionOf(size_t offset) const {
  offset = std::min(offset, text_.size());
  size_t line = lineOf(offset);
  int units = 0;
  for (size_t i = starts_[line]; i < offset;) {
    auto c = static_cast<unsigned char>(text_[i]);
    units += utf16Units(c);
    i += sequenceLength(c);
  }
  return Position{static_cast<int>(line), units};
}

std::pair<uint32_t, uint32_t> LineIndex::locOf(size_t offset) const {
  offset = std::min(offset, text_.size());
  size_t line = lineOf(offset);
  uint32_t col = 1;
  for (size_t i = starts_[line]; i < offset;
       i += sequenceLength(static_cast<unsigned char>(text_[i])))
    ++col;
  return {static_cast<uint32_t>(line + 1), col};
}

Range LineIndex::rangeOf(uint32_t line, uint32_t col, uint32_t length) const {
  if (line == 0) return Range{};
  size_t begin = offsetOf(line, col == 0 ? 1 : col);
  size_t lineStart = line <= starts_.size() ? starts_[line - 1] : text_.size();
  size_t lineEnd = lineStart + this->line(line).size();
  size_t end = std::min<size_t>(begin + std::max<uint32_t>(length, 1), lineEnd);
  return Range{positionOf(begin), positionOf(std::max(begin, end))};
}

bool isWordChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

std::pair<size_t, size_t> wordAt(const std::string& text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t start = offset;
  if ((start == text.size() || !isWordChar(text[start])) && start > 0 &&
      isWordChar(text[start - 1]))
    --start; // the cursor just after a name
  if (start == text.size() || !isWordChar(text[start])) return {offset, offset};
  while (start > 0 && isWordChar(text[start - 1]))
    --start;
  size_t end = start;
  while (end < text.size() && isWordChar(text[end]))
    ++end;
  return {start, end};
}

namespace {

// Skips a comment or string starting at `i` (returns the offset after it), or returns `i`.
size_t skipNonCode(const std::string& text, size_t i) {
  if (text[i] == '#') {
    size_t nl = text.find('\n', i);
    return nl == std::string::npos ? text.size() : nl;
  }
  if (text[i] == '"') {
    size_t j = i + 1;
    for (; j < text.size() && text[j] != '"' && text[j] != '\n'; ++j)
      if (text[j] == '\\' && j + 1 < text.size()) ++j;
    return std::min(j + 1, text.size());
  }
  return i;
}

} // namespace

size_t matchingBracket(const std::string& text, size_t openAt, char open, char close) {
  int depth = 0;
  for (size_t i = openAt; i < text.size();) {
    size_t next = skipNonCode(text, i);
    if (next != i) {
      i = next;
      continue;
    }
    if (text[i] == open) ++depth;
    if (text[i] == close && --depth == 0) return i;
    ++i;
  }
  return std::string::npos;
}

size_t findCode(const std::string& text, size_t from, char c) {
  for (size_t i = from; i < text.size();) {
    size_t next = skipNonCode(text, i);
    if (next != i) {
      i = next;
      continue;
    }
    if (text[i] == c) return i;
    ++i;
  }
  return std::string::npos;
}

namespace {

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

} // namespace

std::string uriToPath(const std::string& uri) {
  const std::string scheme = "file://";
  if (uri.rfind(scheme, 0) != 0) return uri;
  std::string path;
  for (size_t i = scheme.size(); i < uri.size(); ++i) {
    if (uri[i] == '%' && i + 2 < uri.size() && hexValue(uri[i + 1]) >= 0 &&
        hexValue(uri[i + 2]) >= 0) {
      path += static_cast<char>(hexValue(uri[i + 1]) * 16 + hexValue(uri[i + 2]));
      i += 2;
    } else {
      path += uri[i];
    }
  }
  return path;
}

std::string pathToUri(const std::string& path) {
  std::string uri = "file://";
  for (unsigned char c : path) {
    if (std::isalnum(c) ||
        std::string_view("/-._~").find(static_cast<char>(c)) != std::string_view::npos)
      uri += static_cast<char>(c);
    else
      uri += fmt::format("%{:02X}", c);
  }
  return uri;
}

} // namespace epl::lsp
