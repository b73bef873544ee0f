// The language server's message loop and its handlers (lsp/Server.h).
#include "lsp/Server.h"

#include "ir/PlanJson.h"
#include "ir/Printer.h"
#include "lsp/Completion.h"
#include "lsp/Diagnostics.h"
#include "lsp/Hover.h"
#include "lsp/Navigation.h"
#include "lsp/Params.h"
#include "lsp/Transport.h"

#include <fmt/format.h>
#include <sstream>

#ifndef EPL_VERSION
#define EPL_VERSION "0.0.0"
#endif

namespace epl::lsp {

using nlohmann::json;

namespace {

Position positionOf(const json& params) {
  return Position{uintegerParam(params, "position.line"),
                  uintegerParam(params, "position.character")};
}

// JSON-RPC ids are strings or numbers (null only when the sender could not tell its id).
bool validId(const json& id) {
  return id.is_string() || id.is_number() || id.is_null();
}

} // namespace

Server::Server(std::istream& in, std::ostream& out, std::ostream& log, ServerOptions options)
    : in_(in), out_(out), log_(log), options_(std::move(options)) {}

int Server::run() {
  MessageReader reader(in_);
  while (!exited_) {
    Frame frame = reader.next();
    if (frame.kind == Frame::Kind::BadFraming) {
      replyError(nullptr, ParseError, frame.text);
    } else if (frame.kind == Frame::Kind::Message) {
      handle(frame.text);
    } else {
      if (!frame.text.empty())
        log_ << "error: " << frame.text << "\n";
      else if (!shutdown_)
        log_ << "error: the input ended without `shutdown` and `exit`\n";
      break;
    }
  }
  return shutdown_ ? 0 : 1;
}

void Server::send(const json& message) {
  writeMessage(out_, message.dump(-1, ' ', false, json::error_handler_t::replace));
}

void Server::reply(const json& id, const json& result) {
  send({{"jsonrpc", "2.0"}, {"id", id}, {"result", result}});
}

void Server::replyError(const json& id, int code, const std::string& message) {
  send({{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}});
}

void Server::handle(const std::string& body) {
  json message = json::parse(body, nullptr, false);
  if (message.is_discarded()) return replyError(nullptr, ParseError, "the message is not JSON");
  if (!message.is_object())
    return replyError(nullptr, InvalidRequest, "the message is not a JSON object");
  dispatch(message);
}

// Checks the envelope, then runs the request or notification. Params are read by
// reference: copying deeply nested JSON would recurse as deep as it goes.
void Server::dispatch(const json& message) {
  auto id = message.find("id"), method = message.find("method"), params = message.find("params");
  bool isRequest = id != message.end();
  if (isRequest && !validId(*id))
    return replyError(nullptr, InvalidRequest, "`id` must be a string or a number");
  json replyId = isRequest ? *id : json(nullptr); // a scalar: cheap to copy
  if (method == message.end()) {
    if (message.contains("result") || message.contains("error"))
      return; // a response: the server sends no requests, so there is nothing to match
    return replyError(replyId, InvalidRequest, "the message has no `method`");
  }
  if (!method->is_string()) return replyError(replyId, InvalidRequest, "`method` must be a string");
  static const json noParams = json::object();
  const json& args = params == message.end() || params->is_null() ? noParams : *params;
  try {
    if (!args.is_object()) throw RpcError(InvalidParams, "`params` must be an object");
    if (isRequest)
      reply(replyId, request(method->get<std::string>(), args));
    else
      notification(method->get<std::string>(), args);
  } catch (const RpcError& e) {
    // A notification gets no answer, but a malformed one is reported with id null, so
    // that the client's log shows it.
    replyError(replyId, e.code, e.what());
  } catch (const std::exception& e) {
    replyError(replyId, InternalError, e.what());
  }
}

json Server::request(const std::string& method, const json& params) {
  if (method == "initialize") return initialize(params);
  if (!initialized_) throw RpcError(ServerNotInitialized, "`initialize` must come first");
  if (shutdown_) throw RpcError(InvalidRequest, "the server is shutting down");
  if (method == "shutdown") {
    shutdown_ = true;
    return nullptr;
  }
  if (method == "textDocument/hover") {
    Document& d = document(params);
    return hover(*d.analysis, *d.text, positionOf(params));
  }
  if (method == "textDocument/definition") {
    Document& d = document(params);
    Position at = positionOf(params);
    if (d.analysis->mainSyntax()) return definition(*d.analysis, *d.text, d.uri, at);
    if (d.parsed) return definition(*d.parsed, *d.parsedText, d.uri, at);
    return nullptr;
  }
  if (method == "textDocument/completion") {
    Document& d = document(params);
    return completion(*d.text, positionOf(params));
  }
  // EPL's own: the plan of a document, as `epl plan` prints it and as `epl plan --json`
  // gives it (null, with the reason, while the script has errors).
  if (method == "epl/plan") {
    Document& d = document(params);
    if (!d.analysis->module)
      return {{"text", nullptr},
              {"json", nullptr},
              {"reason", "the script has errors: fix them first (the Problems panel)"}};
    std::ostringstream text;
    ir::printPlan(*d.analysis->module, text);
    return {{"text", text.str()}, {"json", ir::planJson(*d.analysis->module)}};
  }
  if (method == "textDocument/documentSymbol") {
    Document& d = document(params);
    if (d.analysis->mainSyntax()) return documentSymbols(*d.analysis, *d.text);
    if (d.parsed) return documentSymbols(*d.parsed, *d.parsedText);
    return json::array();
  }
  throw RpcError(MethodNotFound, fmt::format("`{}` is not supported", method));
}

json Server::initialize(const json& params) {
  if (initialized_) throw RpcError(InvalidRequest, "`initialize` was already sent");
  if (const json* settings = optionalParam(params, "initializationOptions"))
    readSettings(*settings, "initializationOptions");
  initialized_ = true;
  return {{"capabilities",
           {{"positionEncoding", "utf-16"},
            {"textDocumentSync", {{"openClose", true}, {"change", 1}}},
            {"hoverProvider", true},
            {"definitionProvider", true},
            {"documentSymbolProvider", true},
            {"completionProvider", {{"triggerCharacters", json::array()}}}}},
          {"serverInfo", {{"name", "epl"}, {"version", EPL_VERSION}}}};
}

// { "np": 8, "importPath": ["lib"] }, from initializationOptions or the `epl` settings
// (at `path`; null is none). Checked whole before any of it applies.
void Server::readSettings(const json& settings, const std::string& path) {
  if (settings.is_null()) return;
  if (!settings.is_object())
    throw RpcError(InvalidParams, fmt::format("`{}` must be an object", path));
  ServerOptions next = options_;
  if (const json* np = optionalParam(settings, "np"))
    next.np = static_cast<int>(integerIn(*np, path + ".np", 0, 1 << 24));
  if (const json* dirs = optionalParam(settings, "importPath")) {
    if (!dirs->is_array())
      throw RpcError(InvalidParams, fmt::format("`{}.importPath` must be an array", path));
    next.importPath.clear();
    for (const auto& dir : *dirs) {
      if (!dir.is_string())
        throw RpcError(InvalidParams,
                       fmt::format("`{}.importPath` must hold strings (folders)", path));
      next.importPath.push_back(dir.get<std::string>());
    }
  }
  options_ = std::move(next);
}

void Server::notification(const std::string& method, const json& params) {
  if (method == "exit") {
    exited_ = true;
    return;
  }
  if (!initialized_ || shutdown_) return;
  if (method == "textDocument/didOpen") {
    open(stringParam(params, "textDocument.uri"), stringParam(params, "textDocument.text"));
  } else if (method == "textDocument/didChange") {
    changed(params);
  } else if (method == "textDocument/didClose") {
    std::string uri = stringParam(params, "textDocument.uri");
    documents_.erase(uri);
    send({{"jsonrpc", "2.0"},
          {"method", "textDocument/publishDiagnostics"},
          {"params", {{"uri", uri}, {"diagnostics", json::array()}}}});
  } else if (method == "workspace/didChangeConfiguration") {
    if (const json* settings = optionalParam(params, "settings"))
      if (settings->is_object() && settings->contains("epl"))
        readSettings(settings->at("epl"), "settings.epl");
    for (auto& [uri, doc] : documents_)
      analyze(doc);
  }
}

// Full synchronisation: the last change holds the whole text. A change to a document that
// is not open is dropped: the editor may send it before it sees its own didClose handled.
void Server::changed(const json& params) {
  std::string uri = stringParam(params, "textDocument.uri");
  const json& changes = arrayParam(params, "contentChanges");
  if (changes.empty() || !documents_.count(uri)) return;
  if (!changes.back().is_object())
    throw RpcError(InvalidParams, "`contentChanges` must hold objects");
  open(uri, stringParam(changes.back(), "text"));
}

void Server::open(const std::string& uri, std::string text) {
  Document& d = documents_[uri];
  d.uri = uri;
  d.path = uriToPath(uri);
  d.text = std::make_unique<LineIndex>(std::move(text));
  analyze(d);
}

Server::Document& Server::document(const json& params) {
  std::string uri = stringParam(params, "textDocument.uri");
  auto it = documents_.find(uri);
  if (it == documents_.end()) throw RpcError(InvalidParams, fmt::format("`{}` is not open", uri));
  return it->second;
}

// Runs the front end and planner on the document and publishes its diagnostics.
void Server::analyze(Document& d) {
  AnalysisOptions options{options_.np, options_.importPath};
  d.analysis = lsp::analyze(d.path, d.text->text(), options);
  if (d.analysis->mainSyntax()) {
    d.parsed = d.analysis;
    d.parsedText = d.text;
  }
  send({{"jsonrpc", "2.0"},
        {"method", "textDocument/publishDiagnostics"},
        {"params",
         {{"uri", d.uri}, {"diagnostics", toLspDiagnostics(*d.analysis, *d.text, d.uri)}}}});
}

} // namespace epl::lsp
