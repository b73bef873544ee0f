// Runs one test script: its `# RUN:` line says what to run (`check` or `plan`, with
// options); `# CHECK:` lines must appear in the output in order, and
// `# expected-error@…` comments must match the errors reported, one to one.
//
//   # RUN: plan -np 8 --print-after split-layout
//   # RUN: plan -np 1 --rank 0        (also prints rank 0's instruction stream)
//   # CHECK: mesh: 2 data-parallel x 2 stages x split 2
//   # CHECK-NEXT: batch: 64 = …
//   # CHECK-NOT: all-reduce
//   # expected-error@+1:9 {{unknown name `y`}}      (next line, column 9)
//   # expected-error@12 {{…}}                        (line 12, any column)
//   # expected-error@other.epl:3:5 {{…}}             (an error in an imported file)
//   # expected-help {{did you mean `schedule`?}}     (a help line of the error above)
//   # expected-note {{…}}                            (a note of the error above)
#include "ir/Printer.h"
#include "lib/Epl.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

namespace {

struct Expected {
  std::string file; // empty: the test file itself
  uint32_t line = 0, col = 0;
  std::string message;
  std::vector<std::string> helps, notes;
  int atLine = 0; // where the comment is, for messages
};

std::string collapse(const std::string& s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\t') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string l;
  while (std::getline(ss, l))
    out.push_back(l);
  return out;
}

// FileCheck-style matching of CHECK, CHECK-NEXT and CHECK-NOT lines (whitespace runs fold).
bool matchChecks(const std::vector<std::pair<std::string, std::string>>& checks,
                 const std::string& output) {
  auto out = lines(output);
  size_t pos = 0;  // next output line to search from
  size_t last = 0; // line of the last match + 1
  std::vector<std::string> nots;
  for (const auto& [kind, pattern] : checks) {
    std::string p = collapse(pattern);
    if (kind == "CHECK-NOT") {
      nots.push_back(p);
      continue;
    }
    size_t found = out.size();
    if (kind == "CHECK-NEXT") {
      if (pos < out.size() && collapse(out[pos]).find(p) != std::string::npos) found = pos;
    } else {
      for (size_t i = pos; i < out.size(); ++i)
        if (collapse(out[i]).find(p) != std::string::npos) {
          found = i;
          break;
        }
    }
    if (found == out.size()) {
      std::cerr << "FAIL: " << kind << ": " << pattern << "\n  not found after output line "
                << pos + 1 << "\n";
      return false;
    }
    for (const auto& n : nots)
      for (size_t i = last; i < found; ++i)
        if (collapse(out[i]).find(n) != std::string::npos) {
          std::cerr << "FAIL: CHECK-NOT: " << n << "\n  found at output line " << i + 1 << ": "
                    << out[i] << "\n";
          return false;
        }
    nots.clear();
    pos = found + 1;
    last = pos;
  }
  for (const auto& n : nots)
    for (size_t i = last; i < out.size(); ++i)
      if (collapse(out[i]).find(n) != std::string::npos) {
        std::cerr << "FAIL: CHECK-NOT: " << n << "\n  found at output line " << i + 1 << ": "
                  << out[i] << "\n";
        return false;
      }
  return true;
}

bool matchDiagnostics(const std::vector<Expected>& expected, const epl::Diagnostics& diags,
                      const std::string& self) {
  std::vector<bool> used(diags.all().size(), false);
  bool ok = true;
  for (const Expected& e : expected) {
    bool hit = false;
    for (size_t i = 0; i < diags.all().size() && !hit; ++i) {
      const epl::Diagnostic& d = diags.all()[i];
      if (used[i] || d.severity != epl::Severity::Error ||
          d.message.find(e.message) == std::string::npos)
        continue;
      std::string path = d.loc.valid() ? diags.sources().path(d.loc.file) : "";
      std::string want = e.file.empty() ? self : e.file;
      bool fileOk = e.file.empty()
                        ? path == self
                        : path.size() >= want.size() &&
                              path.compare(path.size() - want.size(), want.size(), want) == 0;
      if (!fileOk || d.loc.line != e.line || (e.col && d.loc.col != e.col)) continue;
      bool extras = true;
      for (const auto& h : e.helps)
        extras = extras && std::any_of(d.helps.begin(), d.helps.end(), [&](const std::string& x) {
                   return x.find(h) != std::string::npos;
                 });
      for (const auto& n : e.notes) {
        bool any = std::any_of(d.plainNotes.begin(), d.plainNotes.end(), [&](const std::string& x) {
          return x.find(n) != std::string::npos;
        });
        for (const auto& [loc, text] : d.notes)
          any = any || text.find(n) != std::string::npos;
        extras = extras && any;
      }
      if (!extras) continue;
      used[i] = hit = true;
    }
    if (!hit) {
      std::cerr << "FAIL: expected error (comment at line " << e.atLine
                << ") not reported: " << e.line << ":" << e.col << " {{" << e.message << "}}\n";
      ok = false;
    }
  }
  for (size_t i = 0; i < diags.all().size(); ++i)
    if (!used[i] && diags.all()[i].severity == epl::Severity::Error) {
      std::cerr << "FAIL: unexpected error:\n" << diags.render(diags.all()[i]);
      ok = false;
    }
  return ok;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: epl-filetest FILE.epl\n";
    return 2;
  }
  std::string path = argv[1];
  std::ifstream in(path);
  std::stringstream buf;
  buf << in.rdbuf();
  auto src = lines(buf.str());
  std::vector<std::string> run;
  std::vector<std::pair<std::string, std::string>> checks;
  std::vector<Expected> expected;
  std::regex runRe(R"(#\s*RUN:\s*(.*)$)");
  std::regex checkRe(R"(#\s*(CHECK|CHECK-NEXT|CHECK-NOT):\s?(.*)$)");
  std::regex errRe(
      R"(#\s*expected-error@(?:([^:\s]+\.epl):)?([+-]?\d+)(?::(\d+))?\s*\{\{(.*)\}\})");
  std::regex extraRe(R"(#\s*expected-(help|note)\s*\{\{(.*)\}\})");
  for (size_t i = 0; i < src.size(); ++i) {
    std::smatch m;
    int lineNo = static_cast<int>(i) + 1;
    if (std::regex_search(src[i], m, runRe)) {
      std::stringstream words(m[1].str());
      std::string w;
      while (words >> w)
        run.push_back(w);
    } else if (std::regex_search(src[i], m, checkRe)) {
      checks.emplace_back(m[1].str(), m[2].str());
    } else if (std::regex_search(src[i], m, errRe)) {
      Expected e;
      e.file = m[1].str();
      std::string l = m[2].str();
      e.line =
          static_cast<uint32_t>(l[0] == '+' || l[0] == '-' ? lineNo + std::stoi(l) : std::stoi(l));
      e.col = m[3].matched ? static_cast<uint32_t>(std::stoi(m[3].str())) : 0;
      e.message = m[4].str();
      e.atLine = lineNo;
      expected.push_back(e);
    } else if (std::regex_search(src[i], m, extraRe)) {
      if (expected.empty()) {
        std::cerr << "expected-" << m[1].str() << " at line " << lineNo
                  << " follows no expected-error\n";
        return 2;
      }
      (m[1].str() == "help" ? expected.back().helps : expected.back().notes).push_back(m[2].str());
    }
  }
  if (run.empty() || (run[0] != "check" && run[0] != "plan")) {
    std::cerr << path << ": needs a `# RUN: check …` or `# RUN: plan …` line\n";
    return 2;
  }
  epl::PlanOptions options;
  options.verifyEach = true;
  bool printIr = false;
  int rank = -1;
  for (size_t i = 1; i < run.size(); ++i) {
    if ((run[i] == "-np" || run[i] == "--np") && i + 1 < run.size())
      options.np = std::stoi(run[++i]);
    else if (run[i] == "--print-after" && i + 1 < run.size())
      options.printAfter.insert(run[++i]);
    else if (run[i] == "--ir")
      printIr = true;
    else if (run[i] == "--rank" && i + 1 < run.size())
      rank = std::stoi(run[++i]);
    else {
      std::cerr << "unknown RUN option `" << run[i] << "`\n";
      return 2;
    }
  }
  std::stringstream output;
  options.passOutput = &output;
  epl::Session session;
  std::optional<epl::ir::Module> m = epl::planFile(path, session, options);
  if (m && run[0] == "plan") {
    epl::ir::printPlan(*m, output);
    if (printIr) epl::ir::printModule(*m, output);
    if (rank >= 0) epl::ir::printProgram(*m, rank, output);
  }
  std::stringstream diagText;
  session.diags.print(diagText);
  bool ok = matchDiagnostics(expected, session.diags, path);
  if (expected.empty() && !m) ok = false;
  ok = matchChecks(checks, output.str() + diagText.str()) && ok;
  if (!ok) {
    std::cerr << "---- output ----\n"
              << output.str() << "---- diagnostics ----\n"
              << diagText.str();
    return 1;
  }
  std::cout << "ok: " << std::filesystem::path(path).filename().string() << " (" << checks.size()
            << " checks, " << expected.size() << " expected errors)\n";
  return 0;
}
