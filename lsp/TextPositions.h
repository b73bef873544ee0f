// Positions as the Language Server Protocol counts them (0-based line, UTF-16 code units)
// and as EPL does (SourceLoc: 1-based line, 1-based column in code points), and the few
// text scans the server needs (the word under the cursor, the brace closing a block).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace epl::lsp {

struct Position {
  int line = 0;      // 0-based
  int character = 0; // UTF-16 code units from the line start
};

struct Range {
  Position start, end;
};

// Maps between byte offsets, EPL locations and LSP positions in one text (a copy is kept).
class LineIndex {
public:
  explicit LineIndex(std::string text);
  const std::string& text() const { return text_; }
  // The text of a 1-based line without its line break; empty past the end.
  std::string_view line(uint32_t line) const;
  // Byte offset of (1-based line, 1-based code-point column), clamped to the line.
  size_t offsetOf(uint32_t line, uint32_t col) const;
  // Byte offset of an LSP position, clamped to the line.
  size_t offsetOf(Position p) const;
  Position positionOf(size_t offset) const;
  // (1-based line, 1-based code-point column) of a byte offset.
  std::pair<uint32_t, uint32_t> locOf(size_t offset) const;
  // The range of `length` bytes from an EPL location, kept on its line, at least one unit
  // wide when the line has room (how a caret run of a diagnostic reads in an editor).
  Range rangeOf(uint32_t line, uint32_t col, uint32_t length) const;

private:
  size_t lineOf(size_t offset) const;
  std::string text_;
  std::vector<size_t> starts_; // byte offset of each line
};

bool isWordChar(char c);
// The [start, end) byte span of the name under `offset` (or just before it), or an empty
// span when there is none.
std::pair<size_t, size_t> wordAt(const std::string& text, size_t offset);
// The offset of the `close` that balances the `open` at `openAt`, skipping comments and
// strings; npos when the text ends first.
size_t matchingBracket(const std::string& text, size_t openAt, char open, char close);
// The first `c` at or after `from` outside comments and strings, or npos.
size_t findCode(const std::string& text, size_t from, char c);

// file:///a%20b/x.epl <-> /a b/x.epl. Other schemes (untitled:) keep their text.
std::string uriToPath(const std::string& uri);
std::string pathToUri(const std::string& path);

} // namespace epl::lsp
