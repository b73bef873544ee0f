// Runs passes in order with --print-after, --time-passes and verify-after-each.
#include "passes/Pass.h"

#include "ir/Printer.h"
#include "ir/Verifier.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>

namespace epl::passes {

bool PassManager::run(ir::Module& m, PassContext& ctx) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::pair<std::string, double>>& times = times_;
  times.clear();
  bool ok = true;
  for (auto& pass : passes_) {
    auto start = Clock::now();
    pass->run(m, ctx);
    times.emplace_back(pass->name(),
                       std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    if (ctx.diags.hasErrors()) {
      ok = false;
      break;
    }
    if (options_.verifyEach) {
      auto problems = ir::verify(m);
      if (!problems.empty()) {
        std::fprintf(stderr, "internal error: IR verification failed after pass `%s`:\n",
                     pass->name());
        for (const auto& p : problems)
          std::fprintf(stderr, "  %s\n", p.c_str());
        std::abort();
      }
    }
    if (options_.out &&
        (options_.printAfter.count(pass->name()) || options_.printAfter.count("all"))) {
      *options_.out << fmt::format("// ----- IR after {} -----\n", pass->name());
      ir::printModule(m, *options_.out);
    }
  }
  if (options_.timePasses && options_.out) {
    double total = 0;
    *options_.out << "pass timing:\n";
    for (const auto& [name, ms] : times) {
      *options_.out << fmt::format("  {:<20} {:9.3f} ms\n", name, ms);
      total += ms;
    }
    *options_.out << fmt::format("  {:<20} {:9.3f} ms\n", "total", total);
  }
  return ok;
}

std::vector<std::string> PassManager::names() const {
  std::vector<std::string> out;
  for (const auto& p : passes_)
    out.push_back(p->name());
  return out;
}

} // namespace epl::passes
