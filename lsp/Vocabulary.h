// What the language knows, as JSON, for the editor tests that keep the highlighting in step
// with the grammar and the front end (hidden options of `epl lsp`).
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace epl::lsp {

// { "builtins": [...], "policyKeys": [...], "trainKeys": [...], "settingCalls": [...],
//   "scalarTypes": [...], "optionWords": [...] }, from the op table and the setting tables.
void printVocabulary(std::ostream& out);

// { "FILE": [[kind, line, col, text], ...], ... }: the real lexer's tokens of each file.
// Returns false (after printing what it could) when a file cannot be read or lexed.
bool printTokens(const std::vector<std::string>& files, std::ostream& out);

} // namespace epl::lsp
