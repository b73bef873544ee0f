// JSON-RPC messages framed as the Language Server Protocol frames them on stdio:
// `Content-Length: N\r\n\r\n` and then N bytes of JSON.
#pragma once
#include <istream>
#include <optional>
#include <ostream>
#include <string>

namespace epl::lsp {

// Reads the next message body. nullopt at the end of the input or on a broken header
// (a stream that cannot be re-synchronised); other header fields are ignored.
std::optional<std::string> readMessage(std::istream& in);

// Writes one message with its header and flushes, so the client sees it at once.
void writeMessage(std::ostream& out, const std::string& body);

} // namespace epl::lsp
