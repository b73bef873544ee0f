// The one channel for user mistakes: errors, warnings, notes and help in the rustc style.
//
//   error: unknown policy key `shedule`
//    --> train.epl:12:3
//      |
//   12 |   shedule = 1f1b
//      |   ^^^^^^^
//      = help: did you mean `schedule`?
//
// Compiler bugs are not diagnostics: they are EPL_ASSERT failures (support/Assert.h).
#pragma once
#include "support/SourceManager.h"

#include <ostream>
#include <string>
#include <vector>

namespace epl {

enum class Severity { Error, Warning };

struct Diagnostic {
  Severity severity = Severity::Error;
  std::string message;
  SourceLoc loc;
  uint32_t length = 1;                                  // carets under the location
  std::vector<std::pair<SourceLoc, std::string>> notes; // `note:` with their own location
  std::vector<std::string> helps;                       // `= help:` lines
  std::vector<std::string> plainNotes;                  // `= note:` lines
};

// Thrown to abandon a compilation after an error has been reported (stops cascades).
struct CompileAborted {};

class Diagnostics {
public:
  explicit Diagnostics(SourceManager& sources) : sources_(sources) {}

  // Builder returned by error()/warning(); the diagnostic is recorded when it is destroyed.
  class Builder {
  public:
    Builder(Diagnostics& d, Diagnostic diag) : owner_(&d), diag_(std::move(diag)) {}
    Builder(Builder&& o) noexcept : owner_(o.owner_), diag_(std::move(o.diag_)) {
      o.owner_ = nullptr;
    }
    Builder(const Builder&) = delete;
    ~Builder();
    Builder& help(std::string text);
    Builder& note(std::string text);
    Builder& noteAt(SourceLoc loc, std::string text);
    Builder& length(uint32_t n);

  private:
    Diagnostics* owner_;
    Diagnostic diag_;
  };

  Builder report(Severity severity, SourceLoc loc, std::string message);
  Builder error(SourceLoc loc, std::string message);
  Builder warning(SourceLoc loc, std::string message);

  size_t errorCount() const { return errors_; }
  bool hasErrors() const { return errors_ > 0; }
  const std::vector<Diagnostic>& all() const { return diags_; }
  SourceManager& sources() { return sources_; }
  const SourceManager& sources() const { return sources_; }

  // Records every diagnostic of `other`, each message after `prefix` ("rank 2: ").
  void append(const Diagnostics& other, const std::string& prefix = "");

  // Renders every diagnostic recorded so far, in order.
  void print(std::ostream& out, bool color = false) const;
  std::string render(const Diagnostic& d, bool color = false) const;

private:
  void record(Diagnostic d);
  SourceManager& sources_;
  std::vector<Diagnostic> diags_;
  size_t errors_ = 0;
};

} // namespace epl
