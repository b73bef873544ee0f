// Hover: what a layer, a def call, a setting or a name is, and for a call in a script that
// plans, its shapes, parameters and the stage and split it lands in for the server's -np.
#pragma once
#include "ir/Ops.h"
#include "lsp/Analysis.h"
#include "lsp/TextPositions.h"

#include <nlohmann/json.hpp>

namespace epl::lsp {

// An LSP Hover (markdown contents and the range of the word), or null.
nlohmann::json hover(const Analysis& a, const LineIndex& text, Position p);

// A builtin's call form with its defaults: `linear(x, out, bias = true)`.
std::string opSignature(const ir::OpInfo& info);

} // namespace epl::lsp
