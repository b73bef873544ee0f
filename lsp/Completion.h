// Completion: what may be written where the cursor is. Inside `policy { … }` its keys;
// inside a train block its keys, and after `key =` the calls that setting takes; inside a
// model, a def or a block of either, the builtin layers, the script's own defs and the
// block keywords; at the top level the declarations.
#pragma once
#include "lsp/Analysis.h"
#include "lsp/TextPositions.h"

#include <nlohmann/json.hpp>

namespace epl::lsp {

// An LSP CompletionList for position `p` of `text` (complete: the client filters by the
// word typed so far).
nlohmann::json completion(const LineIndex& text, Position p);

} // namespace epl::lsp
