// The EPL language server: JSON-RPC over stdio, the documents an editor has open, and the
// requests it answers (diagnostics as you type, hover, definition, document symbols).
#pragma once
#include "lsp/Analysis.h"
#include "lsp/TextPositions.h"

#include <istream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>

namespace epl::lsp {

struct ServerOptions {
  int np = 0; // devices the hover's plan is for; 0 means one model replica
  std::vector<std::string> importPath;
};

class Server {
public:
  // Messages come from `in` and go to `out`; why the input ended, when it ended before
  // `shutdown` or inside a message, goes to `log` (stderr).
  Server(std::istream& in, std::ostream& out, std::ostream& log, ServerOptions options);
  // Serves until `exit` or the end of the input; returns the process exit status (0 after
  // `shutdown` then `exit`, 1 otherwise, as the protocol asks). A malformed message is
  // answered with a JSON-RPC error (id null when it has none) and the server goes on.
  int run();

private:
  struct Document {
    std::string uri, path;
    std::shared_ptr<LineIndex> text;
    std::shared_ptr<Analysis> analysis;
    // The last analysis whose main script parsed, and its text, for navigation while the
    // script has a syntax error.
    std::shared_ptr<Analysis> parsed;
    std::shared_ptr<LineIndex> parsedText;
  };

  void handle(const std::string& body);
  void dispatch(const nlohmann::json& message);
  void reply(const nlohmann::json& id, const nlohmann::json& result);
  void replyError(const nlohmann::json& id, int code, const std::string& message);
  nlohmann::json request(const std::string& method, const nlohmann::json& params);
  void notification(const std::string& method, const nlohmann::json& params);
  nlohmann::json initialize(const nlohmann::json& params);
  void readSettings(const nlohmann::json& settings, const std::string& path);
  void changed(const nlohmann::json& params);
  void open(const std::string& uri, std::string text);
  void analyze(Document& doc);
  Document& document(const nlohmann::json& params);
  void send(const nlohmann::json& message);

  std::istream& in_;
  std::ostream& out_;
  std::ostream& log_;
  ServerOptions options_;
  bool initialized_ = false, shutdown_ = false, exited_ = false;
  std::map<std::string, Document> documents_;
};

} // namespace epl::lsp
