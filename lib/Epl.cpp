// libepl: the front end followed by the pass pipeline.
#include "lib/Epl.h"

#include "frontend/Frontend.h"
#include "passes/Pipeline.h"

#include <cstdlib>
#include <filesystem>
#include <pthread.h>

#ifndef EPL_STDLIB_DIR
#define EPL_STDLIB_DIR "stdlib"
#endif

namespace epl {

std::vector<std::string> passNames() {
  passes::PassManager pm(passes::PassManagerOptions{});
  passes::buildPipeline(pm);
  return pm.names();
}

std::string stdlibDir() {
  if (const char* env = std::getenv("EPL_STDLIB")) return env;
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto installed = exe.parent_path().parent_path() / "share" / "epl" / "stdlib";
    if (std::filesystem::is_directory(installed, ec)) return installed.string();
  }
  return EPL_STDLIB_DIR;
}

namespace {

std::optional<ir::Module> runPasses(std::optional<ir::Module> m, Session& session,
                                    const PlanOptions& options) {
  if (!m) return std::nullopt;
  m->deviceMemoryIsHost = options.deviceMemoryIsHost;
  passes::PassManagerOptions pmOptions;
  pmOptions.printAfter = options.printAfter;
  pmOptions.timePasses = options.timePasses;
  pmOptions.verifyEach = options.verifyEach;
  pmOptions.out = options.passOutput;
  passes::PassManager pm(pmOptions);
  passes::buildPipeline(pm);
  passes::PassContext ctx{session.diags,
                          options.np,
                          options.costOnly,
                          options.peaksWithoutRecompute,
                          options.peaksRecomputingEvery,
                          options.overMemory};
  if (!pm.run(*m, ctx)) return std::nullopt;
  return m;
}

frontend::FrontendOptions frontendOptions(const PlanOptions& options) {
  frontend::FrontendOptions f;
  f.importPath = options.importPath;
  f.overrides = options.overrides;
  f.syntax = options.syntax;
  f.parseCache = options.parseCache;
  f.literalValues = options.literalValues;
  f.importPath.push_back(stdlibDir());
  return f;
}

} // namespace

std::optional<ir::Module> planFile(const std::string& path, Session& session,
                                   const PlanOptions& options) {
  std::optional<ir::Module> m;
  runWithLargeStack([&] {
    // The front end and the passes run on any number of threads at once (the search plans
    // in parallel); only ANTLR's lexing and parsing take turns (frontend::antlrMutex).
    std::optional<ir::Module> checked =
        frontend::compileFile(path, session.diags, frontendOptions(options));
    m = runPasses(std::move(checked), session, options);
  });
  return m;
}

std::optional<ir::Module> planText(const std::string& name, const std::string& text,
                                   Session& session, const PlanOptions& options) {
  std::optional<ir::Module> m;
  runWithLargeStack([&] {
    std::optional<ir::Module> checked =
        frontend::compileText(name, text, session.diags, frontendOptions(options));
    m = runPasses(std::move(checked), session, options);
  });
  return m;
}

void runWithLargeStack(const std::function<void()>& fn) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, size_t{512} << 20);
  pthread_t thread;
  auto trampoline = [](void* arg) -> void* {
    (*static_cast<const std::function<void()>*>(arg))();
    return nullptr;
  };
  if (pthread_create(&thread, &attr, trampoline, const_cast<std::function<void()>*>(&fn)) != 0) {
    fn(); // no thread: run here with the default stack
  } else {
    pthread_join(thread, nullptr);
  }
  pthread_attr_destroy(&attr);
}

} // namespace epl
