// Go to definition and the document outline, from the syntax of the script and its imports.
#pragma once
#include "lsp/Analysis.h"
#include "lsp/TextPositions.h"

#include <nlohmann/json.hpp>

namespace epl::lsp {

// The definition of the name at `p`: a parameter or the first assignment of a local in the
// enclosing def or model, else a `let`, `def` or `model` of the script or any file it
// imports; the imported file for a position on an `import` path. A Location, or null.
nlohmann::json definition(const Analysis& a, const LineIndex& text, const std::string& uri,
                          Position p);

// DocumentSymbol[] for the main script: imports, lets, defs (parameters, blocks), models
// (parameters, stages and split blocks), policy and train (their keys).
nlohmann::json documentSymbols(const Analysis& a, const LineIndex& text);

} // namespace epl::lsp
