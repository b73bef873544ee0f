// The language server on any bytes as its input. An input that starts with `{` is a list of
// message bodies, one a line, each framed here, so that mutations reach the handlers
// rather than only the framing; any other input is the raw stream, framing included. The
// server must answer or skip whatever comes; a crash, a hang, an escaping exception or a
// sanitizer report is a finding.
#include "lsp/Server.h"

#include <sstream>

namespace {

std::string framedLines(const std::string& text) {
  std::string out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    out += "Content-Length: " + std::to_string(line.size()) + "\r\n\r\n" + line;
  return out;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::istringstream in(size > 0 && data[0] == '{' ? framedLines(text) : text);
  std::ostringstream out, log;
  epl::lsp::Server server(in, out, log, epl::lsp::ServerOptions{});
  server.run();
  return 0;
}
