// Typed access to a message's params (lsp/Params.h).
#include "lsp/Params.h"

#include <fmt/format.h>

namespace epl::lsp {

using nlohmann::json;

namespace {

[[noreturn]] void invalid(const std::string& path, const std::string& what) {
  throw RpcError(InvalidParams, fmt::format("`{}` {}", path, what));
}

// The object `path` names, created from its steps before `end`.
const json& parentOf(const json& params, const std::string& path, size_t end) {
  const json* at = &params;
  size_t start = 0;
  while (start < end) {
    size_t dot = path.find('.', start);
    std::string step = path.substr(start, dot - start);
    auto it = at->find(step);
    if (it == at->end()) invalid(path.substr(0, dot), "is missing");
    if (!it->is_object()) invalid(path.substr(0, dot), "must be an object");
    at = &*it;
    start = dot + 1;
  }
  return *at;
}

} // namespace

const json* optionalParam(const json& params, const std::string& path) {
  if (!params.is_object()) throw RpcError(InvalidParams, "`params` must be an object");
  size_t dot = path.rfind('.');
  size_t last = dot == std::string::npos ? 0 : dot + 1;
  const json& parent = parentOf(params, path, last);
  auto it = parent.find(path.substr(last));
  return it == parent.end() ? nullptr : &*it;
}

const json& paramAt(const json& params, const std::string& path) {
  const json* value = optionalParam(params, path);
  if (!value) invalid(path, "is missing");
  return *value;
}

std::string stringParam(const json& params, const std::string& path) {
  const json& value = paramAt(params, path);
  if (!value.is_string()) invalid(path, "must be a string");
  return value.get<std::string>();
}

int uintegerParam(const json& params, const std::string& path) {
  return static_cast<int>(integerIn(paramAt(params, path), path, 0, INT32_MAX));
}

int64_t integerIn(const json& value, const std::string& path, int64_t lo, int64_t hi) {
  // nlohmann-json keeps non-negative integers as unsigned ones; neither kind is cast before
  // its range is known.
  bool inRange = false;
  if (value.is_number_unsigned()) {
    uint64_t v = value.get<uint64_t>();
    inRange =
        hi >= 0 && v <= static_cast<uint64_t>(hi) && (lo <= 0 || v >= static_cast<uint64_t>(lo));
  } else if (value.is_number_integer()) {
    inRange = value.get<int64_t>() >= lo && value.get<int64_t>() <= hi;
  }
  if (!inRange) invalid(path, fmt::format("must be an integer from {} to {}", lo, hi));
  return value.get<int64_t>();
}

const json& arrayParam(const json& params, const std::string& path) {
  const json& value = paramAt(params, path);
  if (!value.is_array()) invalid(path, "must be an array");
  return value;
}

} // namespace epl::lsp
