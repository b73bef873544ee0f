// The plan's memory against the machine's (MemoryFit.h).
#include "interp/MemoryFit.h"

#include "support/Text.h"

#include <algorithm>
#include <fmt/format.h>
#include <fstream>
#include <string>
#include <unistd.h>

namespace epl::interp {

namespace {

// A number from a file such as cgroup's memory.max; nullopt for "max" or no file.
std::optional<int64_t> readNumber(const char* path) {
  std::ifstream in(path);
  int64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

std::optional<int64_t> memInfoAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemAvailable:") return kb * 1024;
    in.ignore(64, '\n');
  }
  long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && size > 0) return static_cast<int64_t>(pages) * size;
  return std::nullopt;
}

// What a cgroup limit leaves (v2, then v1): a container sees the host's MemAvailable.
std::optional<int64_t> cgroupAvailable() {
  auto limit = readNumber("/sys/fs/cgroup/memory.max");
  auto used = readNumber("/sys/fs/cgroup/memory.current");
  if (!limit) {
    limit = readNumber("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    used = readNumber("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  if (!limit || !used) return std::nullopt;
  return std::max<int64_t>(*limit - *used, 0);
}

// What one rank allocates: the plan's buffers, the inputs of the step's micro-batches on
// the host among them (the largest program's, though the ranks of a data-parallel plan are
// alike).
struct RankBytes {
  const ir::Program& plan;
  int64_t total() const { return plan.peakBytes(); }
  int64_t states() const { return plan.paramBytes + plan.gradBytes + plan.optimizerBytes; }
};

RankBytes rankBytes(const ir::Module& m) {
  return RankBytes{*std::max_element(
      m.programs.begin(), m.programs.end(),
      [](const ir::Program& a, const ir::Program& b) { return a.peakBytes() < b.peakBytes(); })};
}

void memoryError(const ir::Module& m, int ranks, std::optional<int64_t> available,
                 bool allocationFailed, Diagnostics& diags) {
  RankBytes r = rankBytes(m);
  double need = static_cast<double>(r.total()) * ranks;
  std::string what = ranks == 1 ? fmt::format("the plan needs {}", formatBytes(need))
                                : fmt::format("the plan's {} ranks on this machine need {}", ranks,
                                              formatBytes(need));
  std::string has = available ? fmt::format("this machine has {} available",
                                            formatBytes(static_cast<double>(*available)))
                              : "more than this machine could allocate";
  auto batch = m.train.keyLocs.find("batch");
  bool atBatch = batch != m.train.keyLocs.end();
  auto d = diags.error(atBatch ? batch->second : m.loc,
                       fmt::format("{} of memory, {}", what, available ? "and " + has : has));
  d.length(static_cast<uint32_t>(atBatch ? 5 : m.modelName.size()))
      .note(fmt::format(
          "per rank: activations {} + params {} + grads {} + optimizer {}{}{} + "
          "the step's inputs {}",
          formatBytes(r.plan.arenaBytes), formatBytes(r.plan.paramBytes),
          formatBytes(r.plan.gradBytes), formatBytes(r.plan.optimizerBytes),
          r.plan.stagingBytes > 0 ? fmt::format(" ({}) + staging {}", m.offloadPlace(),
                                                formatBytes(r.plan.stagingBytes))
                                  : "",
          r.plan.commBytes > 0 ? fmt::format(" + comm buffers {}", formatBytes(r.plan.commBytes))
                               : "",
          formatBytes(r.plan.inputBytes)));
  if (allocationFailed) d.note("allocating it failed");
  if (available && static_cast<double>(r.states()) * ranks >= static_cast<double>(*available))
    d.help(fmt::format("the parameters, gradients and optimizer states alone take {} per rank: "
                       "make the model smaller",
                       formatBytes(r.states())));
  else
    d.help("lower `batch`, raise `micro_batches`, or spread the ranks over more machines "
           "(--hostfile): a rank holds the activations of its share of one micro-batch");
}

} // namespace

std::optional<int64_t> availableMemory() {
  auto mem = memInfoAvailable(), cgroup = cgroupAvailable();
  if (mem && cgroup) return std::min(*mem, *cgroup);
  return mem ? mem : cgroup;
}

bool checkMemoryFits(const ir::Module& m, int ranks, int64_t available, Diagnostics& diags) {
  if (m.programs.empty() ||
      static_cast<double>(rankBytes(m).total()) * ranks <= static_cast<double>(available))
    return true;
  memoryError(m, ranks, available, false, diags);
  return false;
}

OutOfMemory::OutOfMemory(int64_t planned)
    : message_(fmt::format("out of memory allocating the plan's {}",
                           formatBytes(static_cast<double>(planned)))) {}

void reportOutOfMemory(const ir::Module& m, int ranks, Diagnostics& diags) {
  memoryError(m, ranks, availableMemory(), true, diags);
}

} // namespace epl::interp
