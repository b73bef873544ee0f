// The language server's message loop and its handlers (lsp/Server.h).
#include "lsp/Server.h"

#include "lsp/Diagnostics.h"
#include "lsp/Hover.h"
#include "lsp/Navigation.h"
#include "lsp/Transport.h"

#include <fmt/format.h>

#ifndef EPL_VERSION
#define EPL_VERSION "0.0.0"
#endif

namespace epl::lsp {

using nlohmann::json;

namespace {

// JSON-RPC and LSP error codes.
enum ErrorCode {
  ParseError = -32700,
  InvalidRequest = -32600,
  MethodNotFound = -32601,
  InvalidParams = -32602,
  InternalError = -32603,
  ServerNotInitialized = -32002,
};

struct RpcError {
  int code;
  std::string message;
};

Position positionOf(const json& params) {
  const json& p = params.at("position");
  return Position{p.at("line").get<int>(), p.at("character").get<int>()};
}

} // namespace

Server::Server(std::istream& in, std::ostream& out, ServerOptions options)
    : in_(in), out_(out), options_(std::move(options)) {}

int Server::run() {
  while (!exited_) {
    std::optional<std::string> body = readMessage(in_);
    if (!body) break;
    json message = json::parse(*body, nullptr, false);
    if (message.is_discarded() || !message.is_object()) {
      send({{"jsonrpc", "2.0"},
            {"id", nullptr},
            {"error", {{"code", ParseError}, {"message", "the message is not a JSON object"}}}});
      continue;
    }
    dispatch(message);
  }
  return shutdown_ ? 0 : 1;
}

void Server::send(const json& message) {
  writeMessage(out_, message.dump(-1, ' ', false, json::error_handler_t::replace));
}

void Server::dispatch(const json& message) {
  std::string method = message.value("method", "");
  if (method.empty() && (message.contains("result") || message.contains("error")))
    return; // a response: the server sends no requests, so there is nothing to match
  json params = message.contains("params") ? message["params"] : json::object();
  if (!message.contains("id")) { // a notification: no answer, errors are dropped
    try {
      notification(method, params);
    } catch (const std::exception&) {
    }
    return;
  }
  json reply = {{"jsonrpc", "2.0"}, {"id", message["id"]}};
  try {
    if (method.empty()) throw RpcError{InvalidRequest, "a request needs a method"};
    reply["result"] = request(method, params);
  } catch (const RpcError& e) {
    reply["error"] = {{"code", e.code}, {"message", e.message}};
  } catch (const json::exception& e) {
    reply["error"] = {{"code", InvalidParams}, {"message", e.what()}};
  } catch (const std::exception& e) {
    reply["error"] = {{"code", InternalError}, {"message", e.what()}};
  }
  send(reply);
}

json Server::request(const std::string& method, const json& params) {
  if (method == "initialize") return initialize(params);
  if (!initialized_) throw RpcError{ServerNotInitialized, "`initialize` must come first"};
  if (shutdown_) throw RpcError{InvalidRequest, "the server is shutting down"};
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
    if (d.analysis->mainSyntax())
      return definition(*d.analysis, *d.text, d.uri, positionOf(params));
    if (d.parsed) return definition(*d.parsed, *d.parsedText, d.uri, positionOf(params));
    return nullptr;
  }
  if (method == "textDocument/documentSymbol") {
    Document& d = document(params);
    if (d.analysis->mainSyntax()) return documentSymbols(*d.analysis, *d.text);
    if (d.parsed) return documentSymbols(*d.parsed, *d.parsedText);
    return json::array();
  }
  throw RpcError{MethodNotFound, fmt::format("`{}` is not supported", method)};
}

json Server::initialize(const json& params) {
  if (initialized_) throw RpcError{InvalidRequest, "`initialize` was already sent"};
  initialized_ = true;
  if (params.contains("initializationOptions") && params["initializationOptions"].is_object())
    readSettings(params["initializationOptions"]);
  return {{"capabilities",
           {{"positionEncoding", "utf-16"},
            {"textDocumentSync", {{"openClose", true}, {"change", 1}}},
            {"hoverProvider", true},
            {"definitionProvider", true},
            {"documentSymbolProvider", true}}},
          {"serverInfo", {{"name", "epl"}, {"version", EPL_VERSION}}}};
}

// { "np": 8, "importPath": ["lib"] }, from initializationOptions or the `epl` settings.
void Server::readSettings(const json& settings) {
  if (settings.contains("np") && settings["np"].is_number_integer())
    options_.np = std::clamp(settings["np"].get<int>(), 0, 1 << 24);
  if (settings.contains("importPath") && settings["importPath"].is_array()) {
    options_.importPath.clear();
    for (const auto& dir : settings["importPath"])
      if (dir.is_string()) options_.importPath.push_back(dir.get<std::string>());
  }
}

void Server::notification(const std::string& method, const json& params) {
  if (method == "exit") {
    exited_ = true;
    return;
  }
  if (!initialized_ || shutdown_) return;
  if (method == "textDocument/didOpen") {
    const json& doc = params.at("textDocument");
    open(doc.at("uri").get<std::string>(), doc.at("text").get<std::string>());
  } else if (method == "textDocument/didChange") {
    Document& d = document(params);
    // Full synchronisation: the last change holds the whole text.
    const json& changes = params.at("contentChanges");
    if (changes.empty()) return;
    open(d.uri, changes.back().at("text").get<std::string>());
  } else if (method == "textDocument/didClose") {
    std::string uri = params.at("textDocument").at("uri").get<std::string>();
    documents_.erase(uri);
    send({{"jsonrpc", "2.0"},
          {"method", "textDocument/publishDiagnostics"},
          {"params", {{"uri", uri}, {"diagnostics", json::array()}}}});
  } else if (method == "workspace/didChangeConfiguration") {
    if (params.contains("settings") && params["settings"].contains("epl"))
      readSettings(params["settings"]["epl"]);
    for (auto& [uri, doc] : documents_)
      analyze(doc);
  }
}

void Server::open(const std::string& uri, std::string text) {
  Document& d = documents_[uri];
  d.uri = uri;
  d.path = uriToPath(uri);
  d.text = std::make_unique<LineIndex>(std::move(text));
  analyze(d);
}

Server::Document& Server::document(const json& params) {
  std::string uri = params.at("textDocument").at("uri").get<std::string>();
  auto it = documents_.find(uri);
  if (it == documents_.end()) throw RpcError{InvalidParams, fmt::format("`{}` is not open", uri)};
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
