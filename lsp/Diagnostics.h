// The front end's diagnostics as LSP `Diagnostic` objects for one editor document.
#pragma once
#include "lsp/Analysis.h"
#include "lsp/TextPositions.h"

#include <nlohmann/json.hpp>

namespace epl::lsp {

// The diagnostics of an analysis, placed in the main script. One in an imported file is
// shown at the main script's `import` that leads to it (or at the call that expanded it),
// with the real place in `relatedInformation`. `documentUri` names the main script.
nlohmann::json toLspDiagnostics(const Analysis& a, const LineIndex& text,
                                const std::string& documentUri);

// An LSP range for a location in any file of the analysis.
Range rangeIn(const Analysis& a, const LineIndex& mainText, SourceLoc loc, uint32_t length);
// An LSP Location object (uri + range); the main script keeps `documentUri`.
nlohmann::json locationJson(const Analysis& a, const LineIndex& mainText,
                            const std::string& documentUri, SourceLoc loc, uint32_t length);
nlohmann::json rangeJson(const Range& r);

} // namespace epl::lsp
