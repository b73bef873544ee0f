// The language server's parts: message framing, positions in UTF-16, and a whole session
// in-process (so the sanitizer build checks the server's memory use too).
#include "lsp/Server.h"
#include "lsp/TextPositions.h"
#include "lsp/Transport.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>
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
  MessageReader reader(in);
  std::vector<json> all;
  for (Frame f = reader.next(); f.kind == Frame::Kind::Message; f = reader.next())
    all.push_back(json::parse(f.text));
  return all;
}

// What the server wrote and logged for `input`, and its exit status.
struct Session {
  std::vector<json> messages;
  std::string log;
  int status = 0;
};
Session serve(const std::string& input) {
  std::istringstream in(input);
  std::ostringstream out, log;
  Server server(in, out, log, ServerOptions{});
  Session s;
  s.status = server.run();
  s.messages = messages(out.str());
  s.log = log.str();
  return s;
}

std::string framed(const std::string& body) {
  return "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

const std::string kInitialize =
    framed(R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}})");
const std::string kShutdownExit = framed(R"({"jsonrpc":"2.0","id":99,"method":"shutdown"})") +
                                  framed(R"({"jsonrpc":"2.0","method":"exit"})");

} // namespace

TEST_CASE("messages are framed by Content-Length", "[lsp]") {
  std::istringstream in("Content-Length: 2\r\nContent-Type: application/vscode-jsonrpc; "
                        "charset=utf-8\r\n\r\n{}\r\ncontent-length:  7 \r\n\r\n[1,2,3]");
  MessageReader reader(in);
  CHECK(reader.next().text == "{}");
  CHECK(reader.next().text == "[1,2,3]");
  Frame end = reader.next();
  CHECK(end.kind == Frame::Kind::End);
  CHECK(end.text.empty()); // between messages: a clean end

  std::ostringstream out;
  writeMessage(out, "{\"a\":1}");
  CHECK(out.str() == "Content-Length: 7\r\n\r\n{\"a\":1}");
}

TEST_CASE("broken framing is reported and skipped to the next message", "[lsp]") {
  auto reads = [](const std::string& input) {
    std::istringstream in(input);
    MessageReader reader(in);
    std::vector<Frame> frames;
    do
      frames.push_back(reader.next());
    while (frames.back().kind != Frame::Kind::End);
    return frames;
  };
  auto check = [&](const std::string& broken, const std::string& error) {
    INFO(broken);
    std::vector<Frame> f = reads(broken + framed("{}"));
    REQUIRE(f.size() == 3);
    CHECK(f[0].kind == Frame::Kind::BadFraming);
    CHECK_THAT(f[0].text, Catch::Contains(error));
    CHECK(f[1].kind == Frame::Kind::Message);
    CHECK(f[1].text == "{}");
  };
  check("hello\r\n\r\n{}", "`hello` is not a header field");
  check("Content-Type: x\r\n\r\n{}", "a message header without `Content-Length`");
  check("Content-Length: -5\r\n\r\n{}", "`Content-Length: -5` is not a byte count");
  check("Content-Length: 99999999999999999999999\r\n\r\n", "is not a byte count");
  check(std::string(5000, 'x'), "a header line is longer than 4096 bytes");
  // Over the limit: skipped by its length, never held.
  std::string huge(MessageReader::kMaxBody + 1, ' ');
  check(framed(huge), "a message of 67108865 bytes is over the limit of 64 MiB");

  std::vector<Frame> cut = reads("Content-Length: 10\r\n\r\n{}");
  CHECK(cut.back().text == "the input ended inside a message: 2 of its 10 bytes came");
  CHECK(reads("Content-Length: 10\r\n").back().text == "the input ended inside a message header");
  CHECK(reads("garbage").back().text == "the input ended inside a message header");
  CHECK(reads("x\ny").back().text == "the input ended while skipping to the next message");
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
  std::ostringstream log;
  Server server(in, out, log, ServerOptions{2, {}});
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
  CHECK_THAT(hover,
             Catch::Contains("attention(x, heads, causal = true, bias = true, kv_heads = heads, "
                             "rotary = false, rotary_base = 10000, mask = none)"));
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
  std::ostringstream log;
  Server server(in, out, log, ServerOptions{});
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
  Session s = serve(input);
  CHECK(s.status == 1); // the input ended without shutdown and exit
  CHECK(s.log == "error: the input ended without `shutdown` and `exit`\n");
  const std::vector<json>& all = s.messages;
  REQUIRE(all.size() == 4);
  CHECK(all[0]["error"]["code"] == -32002);
  CHECK(all[2]["error"]["code"] == -32601);
  CHECK(all[3]["error"]["code"] == -32602);
}

TEST_CASE("malformed messages are answered with errors, and the server goes on", "[lsp]") {
  const std::string uri = R"("file:///tmp/epl-lsp-test.epl")";
  auto hover = [&](int id, const std::string& position) {
    return framed(R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
                  R"(,"method":"textDocument/hover","params":{"textDocument":{"uri":)" + uri +
                  R"(},"position":)" + position + "}}");
  };
  std::string input = kInitialize;
  input += framed(R"({"jsonrpc":"2.0","id":2,"method":7})");
  input += framed(R"({"jsonrpc":"2.0","method":"textDocument/didOpen","params":{"textDocument":)"
                  R"({"uri":)" +
                  uri + R"(,"text":"let a = 1\n"}}})"); // diagnostics
  input += hover(3, R"("x")");
  input += hover(4, R"({"line":-1,"character":0})");
  input += hover(5, R"({"line":1e30,"character":0})");
  input += hover(6, R"({"line":4294967296,"character":0})");
  input += hover(7, R"({"line":0,"character":99999999999999999999999})");
  input += framed(R"({"jsonrpc":"2.0","id":8,"method":"textDocument/hover","params":)"
                  R"({"textDocument":{"uri":5},"position":{"line":0,"character":0}}})");
  input += framed(R"({"jsonrpc":"2.0","id":{"a":1},"method":"shutdown"})");
  input += framed(R"({"jsonrpc":"2.0","id":9,"method":"shutdown","params":[1]})");
  input += framed(R"({"jsonrpc":"2.0","method":"textDocument/didOpen","params":)"
                  R"({"textDocument":{"uri":5,"text":""}}})");
  input += framed("not json") + framed("[1, 2]") + "hello\r\n\r\n";
  input += framed(R"({"jsonrpc":"2.0","id":10})");
  input += kShutdownExit;
  Session s = serve(input);
  CHECK(s.status == 0);
  CHECK(s.log.empty());
  std::vector<std::pair<json, int>> errors;
  for (const json& m : s.messages)
    if (m.contains("error")) errors.push_back({m["id"], m["error"]["code"].get<int>()});
  std::vector<std::pair<json, int>> expected = {
      {2, -32600},       {3, -32602},       {4, -32602},       {5, -32602}, {6, -32602},
      {7, -32602},       {8, -32602},       {nullptr, -32600}, {9, -32602}, {nullptr, -32602},
      {nullptr, -32700}, {nullptr, -32600}, {nullptr, -32700}, {10, -32600}};
  CHECK(errors == expected);
  CHECK(s.messages.back()["id"] == 99); // the shutdown after them all was answered
}

TEST_CASE("a change after the document closed is dropped (an editor race)", "[lsp]") {
  const std::string doc = R"({"uri":"file:///tmp/epl-lsp-test.epl"})";
  std::string input = kInitialize;
  input += framed(R"({"jsonrpc":"2.0","method":"textDocument/didClose","params":{"textDocument":)" +
                  doc + "}}");
  input +=
      framed(R"({"jsonrpc":"2.0","method":"textDocument/didChange","params":{"textDocument":)" +
             doc + R"(,"contentChanges":[{"text":"let a = 2\n"}]}})");
  input += kShutdownExit;
  Session s = serve(input);
  CHECK(s.status == 0);
  REQUIRE(s.messages.size() == 3); // initialize, the cleared diagnostics, shutdown
  CHECK(s.messages[1]["method"] == "textDocument/publishDiagnostics");
  CHECK(s.messages[2]["id"] == 99);
}

TEST_CASE("an input that ends inside a message says so on the log", "[lsp]") {
  Session s = serve(kInitialize + "Content-Length: 10\r\n\r\n{}");
  CHECK(s.status == 1);
  CHECK(s.log == "error: the input ended inside a message: 2 of its 10 bytes came\n");
}

TEST_CASE("completion offers what may be written where the cursor is", "[lsp]") {
  const std::string uri = "file://" + std::string(EPL_SOURCE_DIR) + "/examples/scratch.epl";
  const std::string text = "policy {\n  zero = 1\n  \n}\ntrain m {\n  optimizer = \n"
                           "  eval = { every = 1 }\n}\ndef block(x: f32[B, 8]) -> f32[B, 8] {\n"
                           "  return x\n}\nmodel m(x: f32[B, 8]) {\n  \n}\n\n";
  std::string input = kInitialize;
  input += frame({{"jsonrpc", "2.0"},
                  {"method", "textDocument/didOpen"},
                  {"params", {{"textDocument", {{"uri", uri}, {"version", 1}, {"text", text}}}}}});
  int id = 10;
  auto at = [&](int line, int character) {
    return frame({{"jsonrpc", "2.0"},
                  {"id", id++},
                  {"method", "textDocument/completion"},
                  {"params",
                   {{"textDocument", {{"uri", uri}}},
                    {"position", {{"line", line}, {"character", character}}}}}});
  };
  input += at(2, 2);  // 10: inside policy
  input += at(5, 14); // 11: after `optimizer = `
  input += at(12, 2); // 12: inside the model
  input += at(14, 0); // 13: at the top level
  input += at(6, 2);  // 14: a train key
  input += kShutdownExit;
  Session s = serve(input);
  auto labels = [&](int reply) {
    std::set<std::string> out;
    for (const json& m : s.messages)
      if (m.contains("id") && m["id"] == reply)
        for (const json& i : m["result"]["items"])
          out.insert(i["label"].get<std::string>());
    return out;
  };
  std::set<std::string> policy = labels(10), optimizer = labels(11), model = labels(12),
                        top = labels(13), train = labels(14);
  CHECK(policy.count("zero"));
  CHECK(policy.count("micro_batches"));
  CHECK_FALSE(policy.count("linear"));
  CHECK(optimizer.count("adamw"));
  CHECK(optimizer.count("sgd"));
  CHECK_FALSE(optimizer.count("text")); // a data source, not an optimizer
  CHECK(model.count("linear"));
  CHECK(model.count("attention"));
  CHECK(model.count("block")); // the script's def
  CHECK(model.count("replicate"));
  CHECK_FALSE(model.count("zero"));
  CHECK(top.count("model"));
  CHECK(top.count("policy"));
  CHECK_FALSE(top.count("linear"));
  CHECK(train.count("optimizer"));
  CHECK(train.count("batch"));
}

TEST_CASE("epl/plan gives a document's plan as text and JSON", "[lsp]") {
  const std::string uri = "file://" + std::string(EPL_SOURCE_DIR) + "/examples/scratch.epl";
  const std::string good = "model m(x: f32[B, 8]) {\n  return mse(linear(x, 8), x)\n}\n";
  const std::string bad = "model m(x: f32[B, 8]) {\n  return mse(linear(x, 8), y)\n}\n";
  std::string input = kInitialize;
  auto open = [&](const std::string& u, const std::string& text) {
    return frame({{"jsonrpc", "2.0"},
                  {"method", "textDocument/didOpen"},
                  {"params", {{"textDocument", {{"uri", u}, {"version", 1}, {"text", text}}}}}});
  };
  auto plan = [&](int id, const std::string& u) {
    return frame({{"jsonrpc", "2.0"},
                  {"id", id},
                  {"method", "epl/plan"},
                  {"params", {{"textDocument", {{"uri", u}}}}}});
  };
  std::string badUri = uri + ".bad.epl";
  input += open(uri, good) + open(badUri, bad) + plan(20, uri) + plan(21, badUri);
  input += kShutdownExit;
  Session s = serve(input);
  json goodPlan, badPlan;
  for (const json& m : s.messages) {
    if (m.contains("id") && m["id"] == 20) goodPlan = m["result"];
    if (m.contains("id") && m["id"] == 21) badPlan = m["result"];
  }
  CHECK_THAT(goodPlan["text"].get<std::string>(),
             Catch::Contains("plan for model `m` on 1 device"));
  CHECK(goodPlan["json"]["model"] == "m");
  CHECK(goodPlan["json"]["params"]["count"] == 72);
  CHECK(badPlan["text"].is_null());
  CHECK_THAT(badPlan["reason"].get<std::string>(), Catch::Contains("errors"));
}
