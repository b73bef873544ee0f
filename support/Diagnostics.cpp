// Recording and rendering of diagnostics in the rustc style.
#include "support/Diagnostics.h"

#include "support/Utf8.h"

#include <fmt/format.h>

namespace epl {

Diagnostics::Builder::~Builder() {
  if (owner_) owner_->record(std::move(diag_));
}
Diagnostics::Builder& Diagnostics::Builder::help(std::string text) {
  diag_.helps.push_back(std::move(text));
  return *this;
}
Diagnostics::Builder& Diagnostics::Builder::note(std::string text) {
  diag_.plainNotes.push_back(std::move(text));
  return *this;
}
Diagnostics::Builder& Diagnostics::Builder::noteAt(SourceLoc loc, std::string text) {
  diag_.notes.emplace_back(loc, std::move(text));
  return *this;
}
Diagnostics::Builder& Diagnostics::Builder::length(uint32_t n) {
  diag_.length = n == 0 ? 1 : n;
  return *this;
}

Diagnostics::Builder Diagnostics::report(Severity severity, SourceLoc loc, std::string message) {
  Diagnostic d;
  d.severity = severity;
  d.loc = loc;
  d.message = std::move(message);
  return Builder(*this, std::move(d));
}

Diagnostics::Builder Diagnostics::error(SourceLoc loc, std::string message) {
  return report(Severity::Error, loc, std::move(message));
}

Diagnostics::Builder Diagnostics::warning(SourceLoc loc, std::string message) {
  return report(Severity::Warning, loc, std::move(message));
}

void Diagnostics::append(const Diagnostics& other, const std::string& prefix) {
  for (Diagnostic d : other.all()) {
    d.message = prefix + d.message;
    record(std::move(d));
  }
}

void Diagnostics::record(Diagnostic d) {
  if (d.severity == Severity::Error) ++errors_;
  diags_.push_back(std::move(d));
}

namespace {

// A source line as shown: malformed UTF-8 replaced (the terminal and the language
// server's JSON need valid text), tabs as one space so the caret lines up, other control
// characters as their pictures (NUL as U+2400 ␀, as rustc does), and cut after 200 code
// points. Each character stays one column.
std::string shownLine(std::string_view text) {
  std::string shown;
  for (char c : replaceInvalidUtf8(text)) {
    auto u = static_cast<unsigned char>(c);
    if (c == '\t')
      shown += ' ';
    else if (u < 0x20 || u == 0x7f) // U+2400 + c, or U+2421 for DEL, in UTF-8
      shown += {'\xe2', '\x90', static_cast<char>(u == 0x7f ? 0xa1 : 0x80 + u)};
    else
      shown += c;
  }
  size_t end = 0;
  for (int n = 0; end < shown.size() && n < 200; ++n)
    end += utf8SequenceLength(std::string_view(shown).substr(end));
  return end < shown.size() ? shown.substr(0, end) + "…" : shown;
}

// Appends ` --> file:line:col`, the source line and a caret run under the column.
void renderSnippet(std::string& out, const SourceManager& sm, SourceLoc loc, uint32_t length,
                   const char* label = nullptr) {
  if (!loc.valid()) return;
  std::string lineNo = std::to_string(loc.line);
  std::string pad(lineNo.size(), ' ');
  out += fmt::format("{} --> {}:{}:{}\n", pad, sm.path(loc.file), loc.line, loc.col);
  std::string_view text = sm.line(loc.file, loc.line);
  if (text.empty() && loc.col > 1) return;
  std::string shown = shownLine(text);
  uint32_t col = loc.col == 0 ? 1 : loc.col;
  uint32_t width = std::max<uint32_t>(1, length);
  if (col - 1 < shown.size())
    width = std::min<uint32_t>(width, shown.size() - (col - 1));
  else
    width = 1;
  out += fmt::format("{} |\n{} | {}\n{} | {}{}{}\n", pad, lineNo, shown, pad,
                     std::string(std::min<uint32_t>(col - 1, 201), ' '), std::string(width, '^'),
                     label ? std::string(" ") + label : "");
}

} // namespace

std::string Diagnostics::render(const Diagnostic& d, bool color) const {
  std::string out;
  const char* kind = d.severity == Severity::Error ? "error" : "warning";
  if (color)
    out += fmt::format("\x1b[1;{}m{}\x1b[0m\x1b[1m: {}\x1b[0m\n",
                       d.severity == Severity::Error ? 31 : 33, kind, d.message);
  else
    out += fmt::format("{}: {}\n", kind, d.message);
  renderSnippet(out, sources_, d.loc, d.length);
  for (const auto& [loc, text] : d.notes) {
    out += fmt::format("note: {}\n", text);
    renderSnippet(out, sources_, loc, 1);
  }
  std::string pad = d.loc.valid() ? std::string(std::to_string(d.loc.line).size(), ' ') : "";
  for (const auto& n : d.plainNotes)
    out += fmt::format("{} = note: {}\n", pad, n);
  for (const auto& h : d.helps)
    out += fmt::format("{} = help: {}\n", pad, h);
  return out;
}

void Diagnostics::print(std::ostream& out, bool color) const {
  for (const auto& d : diags_)
    out << render(d, color) << "\n";
}

} // namespace epl
