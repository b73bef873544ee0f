// The `epl` command line: check, plan, run, sample, data.
#include "backend/Device.h"
#include "backend/comm/Comm.h"
#include "driver/Launch.h"
#include "driver/NumericOptions.h"
#include "driver/Repl.h"
#include "driver/Search.h"
#include "interp/Calibrate.h"
#include "interp/MemoryFit.h"
#include "interp/Trainer.h"
#include "interp/checkpoint/AtomicFile.h"
#include "interp/data/Dataset.h"
#include "ir/PlanJson.h"
#include "ir/PlanSvg.h"
#include "ir/Printer.h"
#include "lib/Epl.h"
#include "lsp/Command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <sstream>
#include <unistd.h>

#ifndef EPL_VERSION
#define EPL_VERSION "0.0.0"
#endif

namespace {

using epl::driver::positiveNumber;
using epl::driver::wholeNumber;

// Bounds of the numeric options. Steps: far beyond any run, and a round number.
constexpr int64_t kMaxSteps = 1'000'000'000'000;
constexpr int kMaxRanks = 1 << 24;
// Threads per rank: beyond the cores they only slow a run, and thousands of them may not
// start at all (limits on threads per user, or on address space for their stacks).
constexpr int kMaxThreads = 1024;

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
  std::vector<std::string> overrides; // --set KEY=VALUE
  int64_t steps = 0;                  // --steps N, short for --set train.steps=N
};

void addCommon(CLI::App* cmd, Common& c) {
  cmd->add_option("script", c.script, "the .epl script")->required()->check(CLI::ExistingFile);
  cmd->add_option("--np,-n", c.np, "number of devices (ranks); -np N works too, as in mpirun")
      ->check(wholeNumber("-np", 1, kMaxRanks));
  cmd->add_option("-I,--import-path", c.importPath,
                  "extra folder for imports (searched before stdlib/)");
  std::vector<std::string> passNames = epl::passNames();
  passNames.push_back("all");
  cmd->add_option("--print-after", c.printAfter, "print the IR after these passes (or `all`)")
      ->check(CLI::IsMember(passNames));
  cmd->add_flag("--time-passes", c.timePasses, "print the time each pass took");
  cmd->add_flag("--verify-each", c.verifyEach, "verify the IR after every pass");
  cmd->add_option("--set", c.overrides,
                  "override a setting, checked as in the script: policy.zero=1, train.batch=64");
  cmd->add_option("--steps", c.steps, "override train.steps")
      ->check(wholeNumber("--steps", 1, kMaxSteps));
}

epl::PlanOptions planOptions(const Common& c) {
  epl::PlanOptions o;
  o.np = c.np;
  o.printAfter = {c.printAfter.begin(), c.printAfter.end()};
  o.timePasses = c.timePasses;
  o.verifyEach = c.verifyEach;
  o.importPath = c.importPath;
  o.overrides = c.overrides;
  if (c.steps > 0) o.overrides.push_back("train.steps=" + std::to_string(c.steps));
  o.passOutput = &std::cout;
  return o;
}

// deviceMemoryIsHost: the plan is for devices that use the host's memory (the CPU's), or for
// devices with memory of their own (PlanOptions::deviceMemoryIsHost).
std::optional<epl::ir::Module> plan(const Common& c, epl::Session& session,
                                    bool deviceMemoryIsHost = true) {
  epl::PlanOptions options = planOptions(c);
  options.deviceMemoryIsHost = deviceMemoryIsHost;
  std::optional<epl::ir::Module> m = epl::planFile(c.script, session, options);
  session.diags.print(std::cerr, isatty(2));
  return m;
}

std::string scriptDir(const std::string& script) {
  return std::filesystem::absolute(script).parent_path().string();
}

// Whether this machine has the memory for its ranks of the plan, checked before any rank
// allocates. Every rank checks (ranks on different machines see different figures) and
// they agree; the lowest rank that does not fit says why.
bool memoryFits(const epl::ir::Module& m, epl::SourceManager& sources, epl::backend::Comm* comm) {
  epl::Diagnostics diags(sources);
  auto available = epl::interp::availableMemory();
  int local = comm ? epl::driver::ranksOnThisMachine() : 1;
  char ok = !available || epl::interp::checkMemoryFits(m, local, *available, diags);
  int ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  std::vector<char> flags(static_cast<size_t>(ranks), ok);
  if (ranks > 1) comm->allGather(&ok, flags.data(), 1, "checking memory");
  auto firstFailed = std::find(flags.begin(), flags.end(), 0);
  if (firstFailed == flags.end()) return true;
  if (firstFailed - flags.begin() == rank) {
    epl::Diagnostics shown(sources);
    shown.append(diags, ranks > 1 ? fmt::format("rank {}: ", rank) : "");
    shown.print(std::cerr, isatty(2));
  }
  return false;
}

// The plan's buffers did not fit after all (another process took the memory): said as
// memoryFits says it.
void reportOutOfMemory(const epl::ir::Module& m, epl::SourceManager& sources,
                       epl::backend::Comm* comm) {
  epl::Diagnostics diags(sources);
  epl::interp::reportOutOfMemory(m, comm ? epl::driver::ranksOnThisMachine() : 1, diags);
  epl::Diagnostics shown(sources);
  shown.append(diags, comm ? fmt::format("rank {}: ", comm->rank()) : "");
  shown.print(std::cerr, isatty(2));
}

// One rank of `epl run` (or the only one): plan, train, report. Under MPI every rank plans
// the same script; rank 0 alone prints what the plan says, and a rank that cannot go on
// ends the whole job.
int runRank(Common args, epl::interp::RunOptions o, epl::backend::Comm* comm) {
  int rank = comm ? comm->rank() : 0;
  epl::Session session;
  std::optional<epl::ir::Module> m;
  {
    std::ostringstream quiet;
    epl::PlanOptions po = planOptions(args);
    po.deviceMemoryIsHost = epl::backend::deviceMemoryIsHost(o.device);
    if (rank != 0) po.passOutput = &quiet;
    m = epl::planFile(args.script, session, po);
  }
  if (rank == 0 && (!m || !comm || !epl::driver::planShownByLauncher()))
    session.diags.print(std::cerr, isatty(2));
  if (!m || !memoryFits(*m, session.sources, comm)) return 1;
  o.script = args.script;
  o.version = EPL_VERSION;
  o.baseDir = scriptDir(args.script);
  if (o.metricsPath.empty())
    o.metricsPath = std::filesystem::path(args.script).stem().string() + ".metrics.jsonl";
  o.out = &std::cout;
  // mpirun gives ranks a pseudo-terminal even when its own output is a file: under MPI
  // only the launcher knows.
  o.terminal = comm ? epl::driver::terminalForwarded() : isatty(1);
  o.comm = comm;
  if (o.threads == 0 && comm) {
    o.threads = epl::driver::threadsPerRank();
    if (std::string note = epl::driver::bindingNote(); rank == 0 && !note.empty())
      std::cerr << note << "\n";
  }
  if (rank == 0) {
    epl::Diagnostics warnings(session.sources);
    epl::interp::warnUnappliedPolicies(*m, warnings);
    warnings.print(std::cerr, isatty(2));
  }
  // What train() reports, this rank prints: it leaves to rank 0 what every rank found.
  epl::Diagnostics runDiags(session.sources);
  int rc = 1;
  try {
    rc = epl::interp::train(*m, o, runDiags);
  } catch (const std::bad_alloc&) { // OutOfMemory, or a smaller buffer beside the plan's
    std::cout.flush();
    reportOutOfMemory(*m, session.sources, comm);
    if (comm && comm->size() > 1) comm->abort(1);
    return 1;
  } catch (const std::exception& e) {
    // A collective that timed out or failed, or a bug: the other ranks would wait for this
    // one forever, so the whole job ends here.
    std::cout.flush();
    std::string what = e.what();
    if (comm && what.rfind("rank ", 0) != 0) what = fmt::format("rank {}: {}", rank, what);
    std::cerr << "error: " << what << "\n";
    if (comm && comm->size() > 1) comm->abort(1);
    return 1;
  }
  runDiags.print(std::cerr, isatty(2));
  return rc;
}

int runScript(Common args, epl::interp::RunOptions o, const epl::driver::LaunchOptions& launch,
              bool npGiven, int argc, char** argv) {
  // A cluster that does not load is an error before anything runs (every rank finds it;
  // rank 0 says so).
  auto clusterLoads = [&](bool say) {
    std::string error;
    if (o.cluster.empty() || epl::ir::loadCluster(o.cluster, error)) return true;
    if (say) std::cerr << "error: --cluster: " << error << "\n";
    return false;
  };
  if (epl::backend::insideMpiJob()) {
    auto comm = epl::backend::makeMpiComm();
    if (!clusterLoads(comm->rank() == 0)) return 2;
    if (npGiven && args.np != comm->size()) {
      if (comm->rank() == 0)
        std::cerr << fmt::format("error: -np {} was given, but this MPI job has {} ranks\n",
                                 args.np, comm->size());
      return 2;
    }
    args.np = comm->size();
    return runRank(args, o, comm.get());
  }
  if (!clusterLoads(true)) return 2;
  if (args.np == 1) return runRank(args, o, nullptr);
  // Plan here first: a script's errors are reported once, before any rank starts.
  {
    epl::Session session;
    auto m = plan(args, session, epl::backend::deviceMemoryIsHost(o.device));
    if (!m) return 1;
    if (!epl::interp::checkRunnable(*m, session.diags)) {
      session.diags.print(std::cerr, isatty(2));
      return 1;
    }
    // Without a hostfile every rank runs on this machine.
    auto available = epl::interp::availableMemory();
    if (launch.hostfile.empty() && available &&
        !epl::interp::checkMemoryFits(*m, args.np, *available, session.diags)) {
      session.diags.print(std::cerr, isatty(2));
      return 1;
    }
  }
  return epl::driver::launchRanks(args.np, launch, argc, argv);
}

// `epl calibrate`: this process measures the compute and writes the cluster file, then
// starts two ranks of itself under mpirun, whose rank 0 adds the link they measured, then
// 2, 4, … and as many ranks as cores (`--side-by-side`), whose rank 0 adds their GEMM rate
// side by side.
int calibrate(const std::string& out, int rounds, bool sideBySide, int argc, char** argv) {
  namespace fs = std::filesystem;
  auto write = [&](const nlohmann::json& j) {
    std::error_code ec;
    if (fs::path(out).has_parent_path()) fs::create_directories(fs::path(out).parent_path(), ec);
    try {
      epl::checkpoint::writeFileAtomic(out, j.dump(2) + "\n");
      return true;
    } catch (const epl::checkpoint::CheckpointError& e) {
      std::cerr << "error: " << e.what() << "\n";
      return false;
    }
  };
  auto read = [&](nlohmann::json& j) {
    std::ifstream in(out, std::ios::binary);
    j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_discarded()) return true;
    std::cerr << "error: " << out << " is not the file `epl calibrate` wrote\n";
    return false;
  };
  if (sideBySide && !epl::backend::insideMpiJob()) {
    std::cerr << "error: --side-by-side is for the ranks `epl calibrate` starts itself\n";
    return 2;
  }
  if (sideBySide) {
    auto comm = epl::backend::makeMpiComm();
    double total = epl::interp::measureSideBySide(*comm, rounds);
    nlohmann::json j;
    if (comm->rank() != 0) return 0;
    if (!read(j)) return 1;
    int ranks = comm->size(), cores = j["calibration"].value("cores", ranks);
    int threads = std::max(1, cores / ranks);
    double alone = j["calibration"]["gemm_flops"].value(std::to_string(threads), 0.0);
    j["calibration"]["gemm_side_by_side"][std::to_string(ranks)] = total;
    std::cerr << fmt::format(
        "  {} ranks side by side, {} thread{} each: GEMM {:.1f} GFLOP/s in all{}\n", ranks, threads,
        threads == 1 ? "" : "s", total / 1e9,
        alone > 0 ? fmt::format(" ({:.2f} of each alone)", total / ranks / alone) : "");
    return write(j) ? 0 : 1;
  }
  if (epl::backend::insideMpiJob()) {
    auto comm = epl::backend::makeMpiComm();
    if (comm->size() < 2) {
      std::cerr << "error: `epl calibrate` measures the link between two ranks: run it alone "
                   "(it starts them), not under mpirun -np 1\n";
      return 2;
    }
    epl::ir::Link link = epl::interp::measureLink(*comm);
    epl::interp::measureSends(*comm, link);
    if (comm->rank() != 0) return 0;
    nlohmann::json j;
    if (!read(j)) return 1;
    j["intra_node"] = {{"bandwidth", link.bandwidth},
                       {"latency", link.latency},
                       {"send_bandwidth", link.sendBandwidth},
                       {"send_latency", link.sendLatency}};
    std::cerr << fmt::format("  all-reduce between {} ranks: {:.2f} GB/s, {:.1f} us a hop\n",
                             comm->size(), link.bandwidth / 1e9, link.latency * 1e6);
    std::cerr << fmt::format("  one rank sending to another: {:.2f} GB/s, {:.1f} us\n",
                             link.sendBandwidth / 1e9, link.sendLatency * 1e6);
    return write(j) ? 0 : 1;
  }
  std::cerr << "measuring this machine for `--cluster here`:\n";
  nlohmann::json j = epl::interp::measureCompute(std::cerr, rounds);
  // Until the ranks measure it: a link as fast as the memory, so the file is whole.
  j["intra_node"] = {{"bandwidth", j["device"]["memory_bandwidth"]}, {"latency", 1e-6}};
  if (!write(j)) return 1;
  int rc = epl::driver::launchRanks(2, {}, argc, argv);
  if (rc != 0) {
    std::cerr << "error: the all-reduce between two ranks could not be measured (mpirun exited "
              << rc << "); " << out << " has the compute only\n";
    return 1;
  }
  // Ranks side by side, as a run of that many ranks shares the cores (ir::Cluster::forRanks).
  std::vector<char*> again(argv, argv + argc);
  std::string flag = "--side-by-side";
  again.push_back(flag.data());
  int cores = j["calibration"].value("cores", 1);
  for (int ranks : epl::interp::calibratedCounts(cores)) {
    if (ranks < 2) continue;
    rc = epl::driver::launchRanks(ranks, {}, static_cast<int>(again.size()), again.data());
    if (rc != 0) {
      std::cerr << "error: the GEMM of " << ranks << " ranks side by side could not be measured "
                << "(mpirun exited " << rc << "); " << out << " has the rest\n";
      return 1;
    }
  }
  std::cerr << "wrote " << out << "\n";
  return 0;
}

// Sampling runs one sequence at a time: the model is planned with batch 1.
int sampleScript(Common args, epl::interp::SampleOptions o) {
  args.overrides.push_back("train.batch=1");
  args.overrides.push_back("policy.micro_batches=1");
  epl::Session session;
  auto m = plan(args, session);
  if (!m || !memoryFits(*m, session.sources, nullptr)) return 1;
  o.baseDir = scriptDir(args.script);
  o.out = &std::cout;
  int rc = 1;
  try {
    rc = epl::interp::sample(*m, o, session.diags);
  } catch (const std::bad_alloc&) {
    reportOutOfMemory(*m, session.sources, nullptr);
  }
  session.diags.print(std::cerr, isatty(2));
  return rc;
}

int convertText(const std::string& in, const std::string& out) {
  try {
    int64_t tokens = epl::data::textToTokens(in, out);
    std::cout << "wrote " << out << " (" << tokens << " tokens)\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

// `epl plan --svg DIR`: the pictures of the plan, each file named on standard error.
bool writeSvgs(const epl::ir::Module& m, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (const auto& [name, svg] : epl::ir::planSvgs(m)) {
    std::string path = (std::filesystem::path(dir) / name).string();
    std::ofstream out(path, std::ios::binary);
    out << svg;
    out.close();
    if (!out) {
      std::cerr << fmt::format("error: cannot write `{}`{}\n", path,
                               ec ? ": " + ec.message() : std::string());
      return false;
    }
    std::cerr << "wrote " << path << "\n";
  }
  return true;
}

int printRank(const epl::ir::Module& m, int rank) {
  if (rank >= m.mesh.np) {
    std::cerr << "error: rank " << rank << " is not in this plan of " << m.mesh.np
              << " device(s)\n";
    return 2;
  }
  if (rank >= static_cast<int>(m.programs.size())) {
    std::cerr << "error: no instruction stream for rank " << rank
              << (m.train.present
                      ? ": streams are not built yet for a plan with " + m.runRefusal() + "\n"
                      : std::string(": the script has no `train` block\n"));
    return 1;
  }
  epl::ir::printProgram(m, rank, std::cout);
  return 0;
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
  int rank = -1;
  CLI::Option* rankOption =
      planCmd->add_option("--rank", rank, "print this rank's instruction stream and memory plan")
          ->check(wholeNumber("--rank", 0, kMaxRanks - 1));
  bool printJson = false;
  planCmd
      ->add_flag("--json", printJson,
                 "print the plan as JSON: mesh, stages, layers, bridges, gradient buckets, "
                 "schedule, each rank's memory (docs/plan-json.md)")
      ->excludes(rankOption)
      ->excludes("--ir");
  std::string svgDir;
  planCmd->add_option("--svg", svgDir,
                      "also write pictures of the plan into this folder: mesh.svg, memory.svg "
                      "(each rank's ledger), schedule.svg (a pipeline's schedule)");
  std::string cluster;
  planCmd->add_option(
      "--cluster", cluster,
      "also predict the step on this cluster: dgx-a100, dgx-h100, dgx-h200, here (this "
      "machine, after `epl calibrate`) or a JSON file (docs/cluster.md)");
  bool search = false;
  planCmd
      ->add_flag("--search", search,
                 "with --cluster: try other stage counts and split widths, micro_batches, "
                 "schedule, zero and recompute, and print the fastest that fit and the "
                 "script's diff")
      ->needs("--cluster")
      ->excludes("--json")
      ->excludes("--rank")
      ->excludes("--ir");

  Common runArgs;
  runArgs.np = 1;
  epl::interp::RunOptions runOptions;
  CLI::App* runCmd = app.add_subcommand("run", "train: the script's model, data and optimizer");
  addCommon(runCmd, runArgs);
  runCmd->add_flag("--resume", runOptions.resume,
                   "continue from the newest checkpoint in the train block's `checkpoint` dir");
  runCmd->add_option("--metrics", runOptions.metricsPath,
                     "JSON lines of every step (default: SCRIPT.metrics.jsonl here)");
  runCmd->add_option("--tensorboard", runOptions.tensorboardDir,
                     "also write the metrics as TensorBoard event files into this folder "
                     "(created if missing)");
  runCmd->add_option("--trace", runOptions.tracePath,
                     "every rank's timeline of the first 20 steps, as a Chrome trace (Perfetto)");
  runCmd
      ->add_option("--threads", runOptions.threads,
                   "CPU threads per rank (default: the cores, shared by the ranks on a machine)")
      ->check(wholeNumber("--threads", 1, kMaxThreads));
  runCmd
      ->add_option("--device", runOptions.device,
                   "auto (a GPU when there is one that runs the plan), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  runCmd->add_option("--cluster", runOptions.cluster,
                     "compare the step time with this cluster's prediction after the fourth "
                     "step (default: `here` on a calibrated CPU, the GPU's own kind on a GPU)");
  runCmd->add_option("--offload-dir", runOptions.offloadDir,
                     "where `offload_to = disk` keeps the optimizer states: one file per rank, "
                     "removed from the folder once open (default: the temporary folder, "
                     "TMPDIR)");
  runCmd->add_flag("--log-all", runOptions.logAll,
                   "every rank prints its log, each line after its rank (default: rank 0 alone)");
  epl::driver::LaunchOptions launch;
  runCmd->add_option("--hostfile", launch.hostfile, "mpirun's hostfile, for several machines")
      ->check(CLI::ExistingFile);
  runCmd->add_option("--mca", launch.mca, "an MCA parameter for mpirun: --mca KEY VALUE")
      ->type_size(2)
      ->allow_extra_args(false);
  runCmd->add_flag("--save-initial", runOptions.saveInitial,
                   "also checkpoint the initial weights, as step 0");
  runCmd
      ->add_option("--stop-after", runOptions.stopAfter,
                   "stop (with a checkpoint) after this step, as if interrupted")
      ->check(wholeNumber("--stop-after", 1, kMaxSteps));

  Common sampleArgs;
  sampleArgs.np = 1;
  epl::interp::SampleOptions sampleOptions;
  CLI::App* sampleCmd =
      app.add_subcommand("sample", "generate text from a trained byte-level model");
  addCommon(sampleCmd, sampleArgs);
  sampleCmd->add_option("--checkpoint", sampleOptions.checkpoint,
                        "checkpoint folder or dir (default: the train block's)");
  sampleCmd->add_option("--prompt", sampleOptions.prompt, "text to continue");
  sampleCmd->add_option("--length", sampleOptions.length, "bytes to generate")
      ->check(wholeNumber("--length", 1, int64_t{1} << 20));
  sampleCmd->add_option("--temperature", sampleOptions.temperature, "softmax temperature")
      ->check(positiveNumber("--temperature"));
  sampleCmd->add_option("--seed", sampleOptions.seed, "sampling seed")
      ->check(wholeNumber("--seed", 0, INT64_MAX));
  sampleCmd
      ->add_option("--device", sampleOptions.device,
                   "auto (a GPU when there is one that runs the model), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));

  std::string textIn, tokensOut;
  CLI::App* dataCmd =
      app.add_subcommand("data", "convert a text file to a uint16 token file (one token a byte)");
  dataCmd->add_option("text", textIn, "the text file")->required()->check(CLI::ExistingFile);
  dataCmd->add_option("tokens", tokensOut, "the token file to write")->required();
  Common replArgs;
  std::string replCommands;
  CLI::App* replCmd = app.add_subcommand(
      "repl", "inspect the plan at a prompt, and plan again with other settings (`help` there)");
  addCommon(replCmd, replArgs);
  replCmd->add_option("-c,--commands", replCommands,
                      "run these `;`-separated commands instead of a prompt: \"mesh; mem\"");
  std::string calibrateOut = epl::ir::hereClusterPath();
  CLI::App* calibrateCmd = app.add_subcommand(
      "calibrate", "measure this machine (GEMM, memory, MPI all-reduce) for `--cluster here`");
  calibrateCmd->add_option("--out", calibrateOut,
                           "the cluster file to write (default: $EPL_CLUSTER_HERE, else "
                           "~/.config/epl/here.json)");
  int calibrateRounds = 3;
  calibrateCmd
      ->add_option("--rounds", calibrateRounds,
                   "measure everything this many times and keep the medians (steadier on a "
                   "shared machine)")
      ->check(CLI::Range(1, 100));
  bool calibrateSideBySide = false; // the ranks `calibrate` starts for it; not for users
  calibrateCmd->add_flag("--side-by-side", calibrateSideBySide)->group("");
  epl::lsp::Command lsp(app); // `epl lsp`: the language server (lsp/)

  // An unknown command is named as such (CLI11 would only say one is required).
  if (argc > 1 && argv[1][0] != '-') {
    try {
      app.get_subcommand(argv[1]);
    } catch (const CLI::OptionNotFound&) {
      std::cerr << "error: unknown command `" << argv[1]
                << "`\n  = help: the commands are `check`, `plan`, `repl`, `run`, `sample`, "
                   "`data`, `calibrate` and `lsp`; see `epl --help`\n";
      return 2;
    }
  }
  try {
    app.parse(normaliseArgs(argc, argv));
  } catch (const CLI::ParseError& e) {
    // Help and version exit 0; usage mistakes exit 2, as most command-line tools do.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const epl::driver::UsageError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  if (lsp.chosen()) return lsp.run();
  if (*check) return plan(checkArgs, *std::make_unique<epl::Session>()) ? 0 : 1;
  if (*runCmd)
    return runScript(runArgs, runOptions, launch, runCmd->get_option("--np")->count() > 0, argc,
                     argv);
  if (*sampleCmd) return sampleScript(sampleArgs, sampleOptions);
  if (*replCmd)
    return epl::driver::runRepl({replArgs.script, planOptions(replArgs), replCommands}, std::cin,
                                std::cout, std::cerr);
  if (*dataCmd) return convertText(textIn, tokensOut);
  if (*calibrateCmd)
    return calibrate(calibrateOut, calibrateRounds, calibrateSideBySide, argc, argv);
  epl::Session session;
  std::optional<epl::ir::Cluster> machines;
  if (!cluster.empty()) {
    std::string error;
    machines = epl::ir::loadCluster(cluster, error);
    if (!machines) {
      std::cerr << "error: --cluster: " << error << "\n";
      return 2;
    }
    // Before planning where -np is given (a plan may fail for other reasons at that width).
    if (std::string few = machines->tooFew(planArgs.np); !few.empty()) {
      std::cerr << "error: --cluster: " << few << "\n";
      return 2;
    }
  }
  // A cluster's devices have memory of their own, unless it is a calibrated CPU (`here`).
  bool hostMemory = !machines || machines->calibration.has_value();
  if (search) {
    epl::PlanOptions options = planOptions(planArgs);
    options.deviceMemoryIsHost = hostMemory;
    return epl::driver::searchPolicy(planArgs.script, options, *machines, std::cout);
  }
  auto m = plan(planArgs, session, hostMemory);
  if (!m) return 1;
  if (!svgDir.empty() && !writeSvgs(*m, svgDir)) return 1;
  if (rank >= 0) return printRank(*m, rank);
  std::optional<epl::ir::Prediction> predicted;
  if (machines && !machines->tooFew(m->mesh.np).empty()) { // -np left out: one replica's
    std::cerr << "error: --cluster: " << machines->tooFew(m->mesh.np) << "\n";
    return 2;
  }
  if (machines) predicted = epl::ir::predict(*m, machines->forRanks(m->mesh.np), printJson);
  if (printJson) {
    epl::ir::printPlanJson(*m, std::cout, predicted ? &*predicted : nullptr);
    return 0;
  }
  epl::ir::printPlan(*m, std::cout);
  if (predicted) epl::ir::printPrediction(*m, *predicted, std::cout);
  if (printIr) {
    std::cout << "\n";
    epl::ir::printModule(*m, std::cout);
  }
  return 0;
}
