// JSON-RPC errors, and the typed reading of a message's params: a field that is missing or
// of the wrong type is an InvalidParams error naming it, never an exception escaping the
// server or a value cast out of range.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace epl::lsp {

// JSON-RPC and LSP error codes.
enum ErrorCode {
  ParseError = -32700,
  InvalidRequest = -32600,
  MethodNotFound = -32601,
  InvalidParams = -32602,
  InternalError = -32603,
  ServerNotInitialized = -32002,
};

// An error the server answers with: its code and message go into the response.
struct RpcError : std::runtime_error {
  RpcError(ErrorCode code, const std::string& message) : std::runtime_error(message), code(code) {}
  ErrorCode code;
};

// The value at a dotted `path` of objects below `params` ("textDocument.uri"); throws
// RpcError(InvalidParams) when a step is missing or not an object.
const nlohmann::json& paramAt(const nlohmann::json& params, const std::string& path);
// The value at `path`, or null when its last step is absent (its parents must exist).
const nlohmann::json* optionalParam(const nlohmann::json& params, const std::string& path);

std::string stringParam(const nlohmann::json& params, const std::string& path);
// An LSP `uinteger` (0 to 2^31 - 1), as positions use.
int uintegerParam(const nlohmann::json& params, const std::string& path);
// An integer from lo to hi.
int64_t integerIn(const nlohmann::json& value, const std::string& path, int64_t lo, int64_t hi);
const nlohmann::json& arrayParam(const nlohmann::json& params, const std::string& path);

} // namespace epl::lsp
