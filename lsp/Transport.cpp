// Content-Length framing for the language server (lsp/Transport.h).
#include "lsp/Transport.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fmt/format.h>

namespace epl::lsp {

namespace {

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t") + 1 - begin);
}

// A header line as an error message shows it: printable, and short.
std::string shown(const std::string& line) {
  std::string out;
  for (char c : line.substr(0, 40))
    out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return line.size() > 40 ? out + "…" : out;
}

const std::string kLengthField = "content-length:";

} // namespace

Frame MessageReader::next() {
  if (lost_ && !skipToHeader())
    return Frame{Frame::Kind::End, "the input ended while skipping to the next message"};
  return header();
}

// Reads up to '\n' (dropped, with a '\r' before it), never more than kMaxHeaderLine bytes.
MessageReader::Line MessageReader::readLine(std::string& line) {
  line = std::move(pending_);
  pending_.clear();
  for (int c; (c = in_.get()) != std::char_traits<char>::eof();) {
    if (c == '\n') {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return Line::Read;
    }
    if (line.size() == kMaxHeaderLine) return Line::TooLong;
    line += static_cast<char>(c);
  }
  return Line::End;
}

// header : (field ':' value '\r\n')+ '\r\n'; only Content-Length matters. Blank lines
// between messages are skipped.
Frame MessageReader::header() {
  bool started = !pending_.empty();
  std::string line;
  for (;;) {
    Line got = readLine(line);
    if (got == Line::End)
      return started || !line.empty()
                 ? Frame{Frame::Kind::End, "the input ended inside a message header"}
                 : Frame{};
    if (got == Line::TooLong)
      return lose(fmt::format("a header line is longer than {} bytes", kMaxHeaderLine));
    if (line.empty() && !started) continue;
    if (line.empty()) return lose("a message header without `Content-Length`");
    started = true;
    size_t colon = line.find(':');
    if (colon == std::string::npos)
      return lose(fmt::format("`{}` is not a header field (`Content-Length: N`)", shown(line)));
    if (lower(line.substr(0, colon + 1)) != kLengthField) continue;
    std::string value = trim(line.substr(colon + 1));
    uint64_t length = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), length);
    if (ec != std::errc() || end != value.data() + value.size() || value.empty())
      return lose(fmt::format("`Content-Length: {}` is not a byte count", shown(value)));
    // The rest of the header, up to its blank line.
    while ((got = readLine(line)) == Line::Read && !line.empty()) {
    }
    if (got == Line::End) return Frame{Frame::Kind::End, "the input ended inside a message header"};
    if (got == Line::TooLong)
      return lose(fmt::format("a header line is longer than {} bytes", kMaxHeaderLine));
    return body(length);
  }
}

// Reads `length` bytes as they come (a lying length costs no memory it does not fill), or
// skips them when over the limit.
Frame MessageReader::body(uint64_t length) {
  std::string text;
  char chunk[1 << 16];
  for (uint64_t left = length; left > 0;) {
    in_.read(chunk, static_cast<std::streamsize>(std::min<uint64_t>(left, sizeof chunk)));
    auto got = static_cast<uint64_t>(in_.gcount());
    if (got == 0)
      return Frame{Frame::Kind::End,
                   fmt::format("the input ended inside a message: {} of its {} bytes came",
                               length - left, length)};
    if (length <= kMaxBody) text.append(chunk, got);
    left -= got;
  }
  if (length > kMaxBody)
    return Frame{Frame::Kind::BadFraming,
                 fmt::format("a message of {} bytes is over the limit of {} MiB; it was skipped",
                             length, kMaxBody >> 20)};
  return Frame{Frame::Kind::Message, std::move(text)};
}

Frame MessageReader::lose(std::string what) {
  lost_ = true;
  return Frame{Frame::Kind::BadFraming, std::move(what)};
}

// Skips input up to the next `Content-Length:` (any case), which starts the next header.
bool MessageReader::skipToHeader() {
  size_t matched = 0;
  for (int c; (c = in_.get()) != std::char_traits<char>::eof();) {
    char l = static_cast<char>(std::tolower(c));
    // No prefix of the field name recurs inside it, so a mismatch restarts at 0 (or 1).
    matched = l == kLengthField[matched] ? matched + 1 : l == kLengthField[0] ? 1 : 0;
    if (matched == kLengthField.size()) {
      lost_ = false;
      pending_ = "Content-Length:";
      return true;
    }
  }
  return false;
}

void writeMessage(std::ostream& out, const std::string& body) {
  out << "Content-Length: " << body.size() << "\r\n\r\n" << body;
  out.flush();
}

} // namespace epl::lsp
