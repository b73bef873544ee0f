// The `epl` command line: check, plan (run, repl and the rest arrive with the runtime).
#include "driver/Epl.h"
#include "ir/Printer.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <iostream>
#include <unistd.h>

#ifndef EPL_VERSION
#define EPL_VERSION "0.0.0"
#endif

namespace {

// mpirun spells the rank count `-np N`; CLI11 wants long options with two dashes.
std::vector<std::string> normaliseArgs(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-np")
      a = "--np";
    else if (a.rfind("-np=", 0) == 0)
      a = "--np=" + a.substr(4);
    args.push_back(a);
  }
  std::reverse(args.begin(), args.end()); // CLI11 takes a reversed vector
  return args;
}

struct Common {
  std::string script;
  int np = 0;
  std::vector<std::string> printAfter;
  bool timePasses = false;
  bool verifyEach = false;
  std::vector<std::string> importPath;
};

void addCommon(CLI::App* cmd, Common& c) {
  cmd->add_option("script", c.script, "the .epl script")->required()->check(CLI::ExistingFile);
  cmd->add_option("--np,-n", c.np, "number of devices (ranks); -np N works too, as in mpirun")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("-I,--import-path", c.importPath,
                  "extra folder for imports (searched before stdlib/)");
  std::vector<std::string> passNames = epl::passNames();
  passNames.push_back("all");
  cmd->add_option("--print-after", c.printAfter, "print the IR after these passes (or `all`)")
      ->check(CLI::IsMember(passNames));
  cmd->add_flag("--time-passes", c.timePasses, "print the time each pass took");
  cmd->add_flag("--verify-each", c.verifyEach, "verify the IR after every pass");
}

std::optional<epl::ir::Module> plan(const Common& c, epl::Session& session) {
  epl::PlanOptions o;
  o.np = c.np;
  o.printAfter = {c.printAfter.begin(), c.printAfter.end()};
  o.timePasses = c.timePasses;
  o.verifyEach = c.verifyEach;
  o.importPath = c.importPath;
  o.passOutput = &std::cout;
  std::optional<epl::ir::Module> m = epl::planFile(c.script, session, o);
  session.diags.print(std::cerr, isatty(2));
  return m;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"EPL: declare a parallel training job in one script, check it, plan it", "epl"};
  app.set_version_flag("--version", std::string("epl ") + EPL_VERSION);
  app.require_subcommand(1);

  Common checkArgs, planArgs;
  CLI::App* check =
      app.add_subcommand("check", "report errors in a script (no output when it is fine)");
  addCommon(check, checkArgs);
  CLI::App* planCmd =
      app.add_subcommand("plan", "print the parallel plan: mesh, stages, bridges, bytes per rank");
  addCommon(planCmd, planArgs);
  bool printIr = false;
  planCmd->add_flag("--ir", printIr, "print the final IR after the plan");

  // An unknown command is named as such (CLI11 would only say one is required).
  if (argc > 1 && argv[1][0] != '-') {
    try {
      app.get_subcommand(argv[1]);
    } catch (const CLI::OptionNotFound&) {
      std::cerr << "error: unknown command `" << argv[1]
                << "`\n  = help: the commands are `check` and `plan`; see `epl --help`\n";
      return 2;
    }
  }
  try {
    app.parse(normaliseArgs(argc, argv));
  } catch (const CLI::ParseError& e) {
    // Help and version exit 0; usage mistakes exit 2, as most command-line tools do.
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (*check) return plan(checkArgs, *std::make_unique<epl::Session>()) ? 0 : 1;
  epl::Session session;
  auto m = plan(planArgs, session);
  if (!m) return 1;
  epl::ir::printPlan(*m, std::cout);
  if (printIr) {
    std::cout << "\n";
    epl::ir::printModule(*m, std::cout);
  }
  return 0;
}
