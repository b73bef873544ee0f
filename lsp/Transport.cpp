// Content-Length framing for the language server (lsp/Transport.h).
#include "lsp/Transport.h"

#include <cctype>
#include <charconv>

namespace epl::lsp {

namespace {

// Bodies larger than this are refused: no editor sends a 64 MiB .epl file.
constexpr size_t kMaxBody = size_t{64} << 20;

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

} // namespace

std::optional<std::string> readMessage(std::istream& in) {
  std::optional<size_t> length;
  std::string line;
  // Header lines end with \r\n; an empty line ends the header.
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) {
      if (length) break;
      continue; // stray blank line between messages
    }
    size_t colon = line.find(':');
    if (colon == std::string::npos) return std::nullopt;
    if (lower(line.substr(0, colon)) != "content-length") continue;
    size_t start = line.find_first_not_of(' ', colon + 1);
    if (start == std::string::npos) return std::nullopt;
    size_t n = 0;
    auto [end, ec] = std::from_chars(line.data() + start, line.data() + line.size(), n);
    if (ec != std::errc() || end != line.data() + line.size() || n > kMaxBody) return std::nullopt;
    length = n;
  }
  if (!length || !in) return std::nullopt;
  std::string body(*length, '\0');
  in.read(body.data(), static_cast<std::streamsize>(*length));
  if (static_cast<size_t>(in.gcount()) != *length) return std::nullopt;
  return body;
}

void writeMessage(std::ostream& out, const std::string& body) {
  out << "Content-Length: " << body.size() << "\r\n\r\n" << body;
  out.flush();
}

} // namespace epl::lsp
