// JSON-RPC messages framed as the Language Server Protocol frames them on stdio:
// `Content-Length: N\r\n\r\n` and then N bytes of JSON.
#pragma once
#include <istream>
#include <ostream>
#include <string>

namespace epl::lsp {

// What one read of the input gives: a message body, a framing error the reader has
// stepped past (the next read goes on with the message after it), or the end of input.
struct Frame {
  enum class Kind { Message, BadFraming, End };
  Kind kind = Kind::End;
  // Message: the body. BadFraming: what was wrong. End: empty when the input ended between
  // messages, else how it ended inside one.
  std::string text;
};

// Reads framed messages, and recovers from broken ones: after a header it cannot read, it
// skips to the next `Content-Length:`; a body over the size limit is skipped by its length,
// never held. Memory stays bounded by the limit whatever the input.
class MessageReader {
public:
  // Bodies larger than this are refused: no editor sends a 64 MiB .epl file.
  static constexpr size_t kMaxBody = size_t{64} << 20;
  static constexpr size_t kMaxHeaderLine = 4096;

  explicit MessageReader(std::istream& in) : in_(in) {}
  Frame next();

private:
  enum class Line { Read, TooLong, End };
  Line readLine(std::string& line);
  Frame header();
  Frame body(uint64_t length);
  Frame lose(std::string what);
  bool skipToHeader();

  std::istream& in_;
  bool lost_ = false;   // a broken header was seen: skip to the next one
  std::string pending_; // the start of a header line already read while skipping
};

// Writes one message with its header and flushes, so the client sees it at once.
void writeMessage(std::ostream& out, const std::string& body);

} // namespace epl::lsp
