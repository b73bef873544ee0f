// The language server's parts: message framing, positions in UTF-16, and a whole session
// in-process (so the sanitizer build checks the server's memory use too).
#define CATCH_CONFIG_MAIN
#include "lsp/Server.h"
#include "lsp/TextPositions.h"
#include "lsp/Transport.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sstream>

using namespace epl::lsp;
using nlohmann::json;

namespace {

std::string frame(const json& message) {
  std::string body = message.dump();
  return "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Every message the server wrote, in order.
std::vector<json> messages(const std::string& out) {
  std::istringstream in(out);
  std::vector<json> all;
  while (auto body = readMessage(in))
    all.push_back(json::parse(*body));
  return all;
}

} // namespace

TEST_CASE("messages are framed by Content-Length", "[lsp]") {
  std::istringstream in("Content-Length: 2\r\nContent-Type: application/vscode-jsonrpc; "
                        "charset=utf-8\r\n\r\n{}\r\ncontent-length:  7\r\n\r\n[1,2,3]");
  CHECK(readMessage(in) == std::optional<std::string>("{}"));
  CHECK(readMessage(in) == std::optional<std::string>("[1,2,3]"));
  CHECK_FALSE(readMessage(in)); // end of input

  std::istringstream truncated("Content-Length: 10\r\n\r\n{}");
  CHECK_FALSE(readMessage(truncated));
  std::istringstream garbage("hello\r\n\r\n{}");
  CHECK_FALSE(readMessage(garbage));
  std::istringstream huge("Content-Length: 99999999999\r\n\r\n{}");
  CHECK_FALSE(readMessage(huge));

  std::ostringstream out;
  writeMessage(out, "{\"a\":1}");
  CHECK(out.str() == "Content-Length: 7\r\n\r\n{\"a\":1}");
}

TEST_CASE("positions count UTF-16 code units, locations code points", "[lsp]") {
  // é is 2 bytes and 1 UTF-16 unit; 𝛼 is 4 bytes and 2 units.
  LineIndex text("ab\r\n\"é𝛼\" x = 1\nlast");
  CHECK(text.line(1) == "ab");
  CHECK(text.line(2) == "\"é𝛼\" x = 1");
  CHECK(text.line(3) == "last");
  CHECK(text.line(4).empty());
  // `x` is code point 6 of line 2 (1-based), byte 8 of the line, UTF-16 column 6.
  size_t x = text.offsetOf(2, 6);
  CHECK(text.text()[x] == 'x');
  Position p = text.positionOf(x);
  CHECK(p.line == 1);
  CHECK(p.character == 6);
  CHECK(text.offsetOf(p) == x);
  CHECK(text.locOf(x) == std::pair<uint32_t, uint32_t>{2, 6});
  Range r = text.rangeOf(2, 6, 1);
  CHECK(r.start.character == 6);
  CHECK(r.end.character == 7);
  // A caret run past the end of its line stops there; a position past it is clamped.
  Range clamped = text.rangeOf(3, 2, 50);
  CHECK(clamped.end.line == 2);
  CHECK(clamped.end.character == 4);
  CHECK(text.offsetOf(Position{0, 99}) == 2);
  CHECK(text.offsetOf(Position{99, 0}) == text.text().size());
}

TEST_CASE("words, brackets and URIs", "[lsp]") {
  std::string s = "h = linear(x, 8) # (comment\nk = \"{\" {a}";
  CHECK(wordAt(s, 6) == std::pair<size_t, size_t>{4, 10});
  CHECK(wordAt(s, 10) == std::pair<size_t, size_t>{4, 10}); // just after the name
  CHECK(wordAt(s, 2).first == wordAt(s, 2).second);         // on `=`
  CHECK(matchingBracket(s, s.find('('), '(', ')') == s.find(')'));
  CHECK(findCode(s, 0, '{') == s.rfind('{')); // not the one in the string
  CHECK(matchingBracket("{ \"}\" # }\n }", 0, '{', '}') == 11);
  CHECK(matchingBracket("{ {", 0, '{', '}') == std::string::npos);

  CHECK(uriToPath("file:///a%20b/c%23d.epl") == "/a b/c#d.epl");
  CHECK(pathToUri("/a b/c#d.epl") == "file:///a%20b/c%23d.epl");
  CHECK(uriToPath(pathToUri("/tmp/é x.epl")) == "/tmp/é x.epl");
  CHECK(uriToPath("untitled:Untitled-1") == "untitled:Untitled-1");
}

TEST_CASE("a session in-process: diagnostics, hover, definition, symbols", "[lsp]") {
  const std::string uri = "file://" + std::string(EPL_SOURCE_DIR) + "/examples/scratch.epl";
  const std::string broken = "let d = 64, ks = [1, 2], s = \"a,b\"\nmodel m(x: f32[B, 8, d]) {\n  "
                             "return mse(attention(x, 5), x)\n}\n";
  const std::string fixed = "let d = 64, ks = [1, 2], s = \"a,b\"\nmodel m(x: f32[B, 8, d]) {\n  "
                            "return mse(attention(x, 4), x)\n}\n";
  std::string input =
      frame({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "initialize"}, {"params", json::object()}});
  input +=
      frame({{"jsonrpc", "2.0"},
             {"method", "textDocument/didOpen"},
             {"params", {{"textDocument", {{"uri", uri}, {"version", 1}, {"text", broken}}}}}});
  input += frame({{"jsonrpc", "2.0"},
                  {"method", "textDocument/didChange"},
                  {"params",
                   {{"textDocument", {{"uri", uri}, {"version", 2}}},
                    {"contentChanges", {{{"text", fixed}}}}}}});
  auto at = [&](int id, const char* method, int line, int character) {
    return frame({{"jsonrpc", "2.0"},
                  {"id", id},
                  {"method", method},
                  {"params",
                   {{"textDocument", {{"uri", uri}}},
                    {"position", {{"line", line}, {"character", character}}}}}});
  };
  input += at(2, "textDocument/hover", 2, 15);
  input += at(3, "textDocument/definition", 2, 23);
  input += at(4, "textDocument/documentSymbol", 0, 0);
  input += frame({{"jsonrpc", "2.0"}, {"id", 5}, {"method", "shutdown"}});
  input += frame({{"jsonrpc", "2.0"}, {"method", "exit"}});
  std::istringstream in(input);
  std::ostringstream out;
  Server server(in, out, ServerOptions{2, {}});
  CHECK(server.run() == 0);

  std::vector<json> all = messages(out.str());
  REQUIRE(all.size() == 7);
  CHECK(all[0]["result"]["capabilities"]["hoverProvider"] == true);
  const json& first = all[1]["params"]["diagnostics"];
  REQUIRE(first.size() == 1);
  CHECK(first[0]["message"] == "attention width (64) must be divisible by heads (5)");
  CHECK(first[0]["range"]["start"] == json({{"line", 2}, {"character", 13}}));
  CHECK(first[0]["range"]["end"] == json({{"line", 2}, {"character", 22}}));
  CHECK(all[2]["params"]["diagnostics"].empty());
  const std::string hover = all[3]["result"]["contents"]["value"];
  CHECK_THAT(hover, Catch::Contains("attention(x, heads, causal = true)"));
  CHECK_THAT(hover, Catch::Contains("plan for -np 2: 2 data-parallel"));
  CHECK_THAT(hover, Catch::Contains("parameters: 16,640"));
  CHECK(all[4]["result"]["range"]["start"] == json({{"line", 1}, {"character", 8}}));
  const json& symbols = all[5]["result"];
  REQUIRE(symbols.size() == 4);
  CHECK(symbols[0]["detail"] == "64");
  CHECK(symbols[1]["detail"] == "[1, 2]");
  CHECK(symbols[2]["detail"] == "\"a,b\"");
  CHECK(symbols[3]["name"] == "m");
  CHECK(all[6]["result"].is_null());
}

TEST_CASE("a literal out of range is a diagnostic at the literal, not the server's end", "[lsp]") {
  const std::string uri = "file://" + std::string(EPL_SOURCE_DIR) + "/examples/scratch.epl";
  const std::string text = "let v = 1e309\nmodel m(x: f32[B, 8]) {\n  return mse(x, x)\n}\n";
  std::string input =
      frame({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "initialize"}, {"params", json::object()}});
  input += frame({{"jsonrpc", "2.0"},
                  {"method", "textDocument/didOpen"},
                  {"params", {{"textDocument", {{"uri", uri}, {"version", 1}, {"text", text}}}}}});
  input += frame({{"jsonrpc", "2.0"}, {"id", 2}, {"method", "shutdown"}});
  input += frame({{"jsonrpc", "2.0"}, {"method", "exit"}});
  std::istringstream in(input);
  std::ostringstream out;
  Server server(in, out, ServerOptions{});
  CHECK(server.run() == 0);
  std::vector<json> all = messages(out.str());
  REQUIRE(all.size() == 3);
  const json& diagnostics = all[1]["params"]["diagnostics"];
  REQUIRE(diagnostics.size() == 1);
  CHECK_THAT(diagnostics[0]["message"].get<std::string>(),
             Catch::StartsWith("number `1e309` is too large"));
  CHECK(diagnostics[0]["range"]["start"] == json({{"line", 0}, {"character", 8}}));
  CHECK(diagnostics[0]["range"]["end"] == json({{"line", 0}, {"character", 13}}));
}

TEST_CASE("requests before initialize and unknown methods are errors", "[lsp]") {
  std::string input = frame({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "shutdown"}});
  input +=
      frame({{"jsonrpc", "2.0"}, {"id", 2}, {"method", "initialize"}, {"params", json::object()}});
  input += frame({{"jsonrpc", "2.0"}, {"id", 99}, {"result", nullptr}}); // a response: ignored
  input += frame({{"jsonrpc", "2.0"}, {"id", 3}, {"method", "workspace/symbol"}});
  input += frame({{"jsonrpc", "2.0"},
                  {"id", 4},
                  {"method", "textDocument/hover"},
                  {"params", {{"textDocument", {{"uri", "file:///nope.epl"}}}}}});
  std::istringstream in(input);
  std::ostringstream out;
  Server server(in, out, ServerOptions{});
  CHECK(server.run() == 1); // the input ended without shutdown and exit
  std::vector<json> all = messages(out.str());
  REQUIRE(all.size() == 4);
  CHECK(all[0]["error"]["code"] == -32002);
  CHECK(all[2]["error"]["code"] == -32601);
  CHECK(all[3]["error"]["code"] == -32602);
}
