// `epl plan --cluster C --search` (docs/cluster.md, "Searching the layout and the policy"):
// the layouts the script's numbers allow (ir::LayoutKnob), each with the script's policy
// and every micro-batch count, then every combination of the policy keys for the script's
// layout and the fastest others; each a cost-only plan predicted as `epl plan --cluster`
// does, ranked by step time among those that fit the device.
#include "driver/Search.h"

#include "frontend/Parser.h"
#include "ir/PipelineSchedule.h"
#include "ir/PlanJson.h"
#include "ir/Predict.h"
#include "support/Assert.h"
#include "support/Files.h"
#include "support/Text.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <fmt/format.h>
#include <functional>
#include <iostream>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

namespace epl::driver {

namespace {

struct Setting {
  std::string key, value; // a policy key and its value as the script writes it
};

struct Layout;

struct Candidate {
  std::vector<Setting> layout;   // the layout knobs' values (Module::layoutKnobs)
  std::vector<Setting> settings; // the policy keys' values
  std::string error;             // the first error of a plan that failed
  ir::Prediction predicted;
  std::vector<int64_t> stagePeaks; // each pipeline stage's largest rank, bytes
  bool planned = false;
  // Planned up to a stage that does not fit (Module::stoppedOver): the peak and stagePeaks
  // are the stages' up to it, the largest rank holding at least that.
  bool stopped = false;
  int stages = 0;          // pipeline positions (stagePeaks' size when not stopped)
  Layout* shape = nullptr; // the layout it was planned with
  bool fits() const {
    return planned && !stopped &&
           (predicted.deviceBytes <= 0 || predicted.peakBytes <= predicted.deviceBytes);
  }
};

// The values tried for each key: the script's first, then the others.
std::vector<std::vector<Setting>> choices(const ir::Module& m) {
  const ir::Policy& p = m.policy;
  std::vector<std::vector<Setting>> keys;
  auto add = [&](const char* key, std::string current, std::vector<std::string> others) {
    std::vector<Setting> values{{key, current}};
    for (std::string& v : others)
      if (v != current) values.push_back({key, std::move(v)});
    keys.push_back(std::move(values));
  };
  // Micro-batches: the powers of two that divide a replica's share of the batch, the six
  // largest (a pipeline wants many; each costs a plan).
  int64_t share = m.train.batch / std::max(m.mesh.dataParallel, 1);
  std::vector<std::string> micros;
  for (int64_t k = int64_t{1} << 20; k >= 1 && micros.size() < 6; k /= 2)
    if (k <= share && share % k == 0) micros.push_back(std::to_string(k));
  add("micro_batches", std::to_string(p.microBatches), micros);
  bool pipeline = m.mesh.depth() > 1 && p.schedule != ir::Schedule::Interleaved;
  add("schedule", ir::scheduleName(p.schedule),
      pipeline ? std::vector<std::string>{"gpipe", "1f1b", "zb"} : std::vector<std::string>{});
  bool dataParallel = false;
  for (const ir::StagePlan& s : m.mesh.stages)
    dataParallel |= s.copies() * m.mesh.dataParallel > 1;
  add("zero", std::to_string(static_cast<int>(p.zero)),
      dataParallel ? std::vector<std::string>{"0", "1", "2", "3"} : std::vector<std::string>{});
  add("recompute", ir::recomputeText(p), {"none", "auto", "every"});
  return keys;
}

// Every combination, the script's own first.
std::vector<std::vector<Setting>> combinations(const std::vector<std::vector<Setting>>& keys) {
  std::vector<std::vector<Setting>> out{{}};
  for (const std::vector<Setting>& values : keys) {
    std::vector<std::vector<Setting>> next;
    for (const std::vector<Setting>& prefix : out)
      for (const Setting& v : values) {
        next.push_back(prefix);
        next.back().push_back(v);
      }
    out = std::move(next);
  }
  return out;
}

std::string describe(const std::vector<Setting>& s) {
  std::string text;
  for (const Setting& x : s)
    text += fmt::format("{}{} = {}", text.empty() ? "" : ", ", x.key, x.value);
  return text;
}

// The part of a step where a slower plan loses most against the best one.
std::string lostOn(const ir::Prediction& p, const ir::Prediction& best) {
  const std::pair<const char*, double> parts[] = {
      {"compute", p.compute - best.compute},
      {"the bubble", p.bubble - best.bubble},
      {"gradient reduction", p.exposedReduction - best.exposedReduction},
      {"split collectives", p.splitCommunication - best.splitCommunication},
      {"stage transfers", p.stageTransfers - best.stageTransfers},
      {"the optimizer", p.optimizer - best.optimizer}};
  return std::max_element(std::begin(parts), std::end(parts),
                          [](const auto& a, const auto& b) { return a.second < b.second; })
      ->first;
}

// The script with the winner's values: a key's line rewritten where the script sets it
// alone on its line, else added to the policy block (or a new block). The keys it cannot
// place are returned in `byHand`.
std::vector<std::string> edited(const std::vector<std::string>& lines, const ir::Policy& policy,
                                const std::vector<Setting>& changes, std::vector<Setting>& byHand) {
  std::vector<std::string> out = lines;
  std::vector<std::string> added;
  for (const Setting& c : changes) {
    auto at = policy.keyLocs.find(c.key);
    if (at == policy.keyLocs.end()) {
      added.push_back(fmt::format("  {} = {}", c.key, c.value));
      continue;
    }
    size_t line = at->second.line - 1, col = at->second.col - 1;
    if (!at->second.valid() || line >= out.size() ||
        out[line].compare(col, c.key.size(), c.key) != 0) { // set elsewhere (an import, --set)
      byHand.push_back(c);
      continue;
    }
    std::string& text = out[line];
    size_t eq = text.find('=', col);
    std::string rest = eq == std::string::npos ? "" : text.substr(eq + 1);
    size_t end = rest.find('#');
    std::string value = rest.substr(0, end);
    bool alone = eq != std::string::npos && value.find_first_of(",{}") == std::string::npos &&
                 text.find_first_not_of(" \t") == col;
    if (!alone) {
      byHand.push_back(c);
      continue;
    }
    std::string comment = end == std::string::npos ? "" : "  " + rest.substr(end);
    text = text.substr(0, eq) + "= " + c.value + comment;
  }
  if (added.empty()) return out;
  for (size_t i = 0; i < out.size(); ++i) {
    std::string t = out[i];
    t.erase(0, t.find_first_not_of(" \t"));
    if (t.rfind("policy", 0) == 0 && t.find('{') != std::string::npos &&
        t.find('}') == std::string::npos) {
      out.insert(out.begin() + static_cast<ptrdiff_t>(i) + 1, added.begin(), added.end());
      return out;
    }
  }
  if (!policy.keyLocs.empty()) { // a policy block on one line: the user merges the keys
    for (const std::string& a : added) {
      size_t eq = a.find(" = ");
      byHand.push_back({a.substr(2, eq - 2), a.substr(eq + 3)});
    }
    return out;
  }
  out.push_back("");
  out.push_back("policy {");
  out.insert(out.end(), added.begin(), added.end());
  out.push_back("}");
  return out;
}

// One hunk from the first changed line to the last, with a line of context each side; the
// lines between that did not change (a longest common subsequence) are context too.
void printDiff(const std::string& path, const std::vector<std::string>& before,
               const std::vector<std::string>& after, std::ostream& out) {
  size_t head = 0;
  while (head < before.size() && head < after.size() && before[head] == after[head])
    ++head;
  size_t tailBefore = before.size(), tailAfter = after.size();
  while (tailBefore > head && tailAfter > head && before[tailBefore - 1] == after[tailAfter - 1])
    --tailBefore, --tailAfter;
  if (head == tailBefore && head == tailAfter) return;
  size_t from = head > 0 ? head - 1 : 0;
  size_t toBefore = std::min(before.size(), tailBefore + 1),
         toAfter = std::min(after.size(), tailAfter + 1);
  out << "--- " << path << "\n+++ " << path << "\n";
  out << fmt::format("@@ -{},{} +{},{} @@\n", from + 1, toBefore - from, from + 1, toAfter - from);
  for (size_t i = from; i < head; ++i)
    out << " " << before[i] << "\n";
  // common[i][j]: the longest common subsequence of before[head + i..] and after[head + j..].
  size_t n = tailBefore - head, k = tailAfter - head;
  std::vector<std::vector<int>> common(n + 1, std::vector<int>(k + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = k; j-- > 0;)
      common[i][j] = before[head + i] == after[head + j]
                         ? common[i + 1][j + 1] + 1
                         : std::max(common[i + 1][j], common[i][j + 1]);
  size_t i = 0, j = 0;
  while (i < n || j < k) {
    if (i < n && j < k && before[head + i] == after[head + j]) {
      out << " " << before[head + i] << "\n";
      ++i, ++j;
    } else if (j == k || (i < n && common[i + 1][j] >= common[i][j + 1])) {
      out << "-" << before[head + i++] << "\n";
    } else {
      out << "+" << after[head + j++] << "\n";
    }
  }
  for (size_t t = tailBefore; t < toBefore; ++t)
    out << " " << before[t] << "\n";
}

} // namespace

namespace {

// A layout (the knobs' values) and the plans tried with it.
struct Layout {
  std::vector<Setting> knobs;       // in Module::layoutKnobs order
  std::map<size_t, Setting> values; // the same while they are chosen, by knob
  std::map<std::pair<uint32_t, uint32_t>, int64_t> literals;
  double best = 0;                          // its fastest plan that fits, 0 when none
  std::vector<std::vector<Setting>> policy; // the policy's choices (its micro-batch counts)
};

// "stages", or "split width (line 14)" for a width written in its block, or
// "transformer_block repeat (line 9)" for the layers of a stage.
std::string knobName(const ir::LayoutKnob& k) {
  if (!k.let.empty()) return k.let;
  switch (k.kind) {
  case ir::LayoutKnob::Kind::Stages:
    return fmt::format("stage repeat (line {})", k.loc.line);
  case ir::LayoutKnob::Kind::SplitWidth:
    return fmt::format("split width (line {})", k.loc.line);
  case ir::LayoutKnob::Kind::Layers:
    return fmt::format("{} repeat (line {})", k.def, k.loc.line);
  case ir::LayoutKnob::Kind::Groups:
    return fmt::format("replicate width (line {})", k.loc.line);
  }
  return "";
}

// The ways to deal a chain's layers or devices (LayoutKnob::chain) over its stages, each at
// least one, the script's first: every way for two stages (up to 64 of them, around the
// script's), else the script's with 1, 2, 4… moved between two neighbouring stages.
std::vector<std::vector<int64_t>> dealings(const std::vector<int64_t>& script) {
  std::vector<std::vector<int64_t>> out{script};
  int64_t total = 0;
  for (int64_t v : script)
    total += v;
  auto add = [&](std::vector<int64_t> d) {
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(std::move(d));
  };
  if (script.size() == 2) {
    for (int64_t step = 1; step < total && out.size() < 64; ++step)
      for (int64_t first : {script[0] - step, script[0] + step})
        if (first >= 1 && first <= total - 1) add({first, total - first});
    return out;
  }
  for (size_t i = 0; i + 1 < script.size(); ++i)
    for (int64_t move = 1; move < total; move *= 2)
      for (int64_t sign : {-1, 1}) {
        std::vector<int64_t> d = script;
        d[i] += sign * move;
        d[i + 1] -= sign * move;
        if (d[i] >= 1 && d[i + 1] >= 1) add(d);
      }
  return out;
}

// The values tried for each knob, the script's first: pipeline depths of powers of two up
// to the device count, split widths of powers of two up to a node (tensor parallelism
// stays inside a node, where the links are fast). A `split(auto)` or `split` is first
// tried as the planner chooses it (0, "auto").
std::vector<Layout> layouts(const ir::Module& m, const ir::Cluster& cluster) {
  std::vector<Layout> out{{}};
  // Each knob in order; a chain (of Layers or of Groups knobs) at its first, all at once.
  std::vector<bool> done(m.layoutKnobs.size(), false);
  for (size_t i = 0; i < m.layoutKnobs.size(); ++i) {
    const ir::LayoutKnob& k = m.layoutKnobs[i];
    if (done[i]) continue;
    if (k.chain >= 0) { // Layers or Groups: dealt over the chain's stages
      std::vector<size_t> members;
      std::vector<int64_t> script;
      for (size_t j = i; j < m.layoutKnobs.size(); ++j)
        if (m.layoutKnobs[j].kind == k.kind && m.layoutKnobs[j].chain == k.chain) {
          members.push_back(j);
          script.push_back(m.layoutKnobs[j].value);
          done[j] = true;
        }
      std::vector<Layout> next;
      for (const Layout& prefix : out)
        for (const std::vector<int64_t>& d : dealings(script)) {
          Layout l = prefix;
          for (size_t x = 0; x < members.size(); ++x) {
            const ir::LayoutKnob& member = m.layoutKnobs[members[x]];
            l.literals[{member.loc.line, member.loc.col}] = d[x];
            l.values[members[x]] = {knobName(member), std::to_string(d[x])};
          }
          next.push_back(std::move(l));
        }
      out = std::move(next);
      continue;
    }
    bool stages = k.kind == ir::LayoutKnob::Kind::Stages;
    int64_t limit = stages ? std::min<int64_t>(m.mesh.np, 256) : cluster.devicesPerNode;
    std::vector<int64_t> values{k.value};
    for (int64_t v = 1; v <= limit; v *= 2)
      if (v != k.value) values.push_back(v);
    std::vector<Layout> next;
    for (const Layout& prefix : out)
      for (int64_t v : values) {
        Layout l = prefix;
        l.values[i] = {knobName(k), v > 0 ? std::to_string(v) : "auto"};
        if (v > 0) l.literals[{k.loc.line, k.loc.col}] = v; // 0: the planner's choice
        next.push_back(std::move(l));
      }
    out = std::move(next);
  }
  for (Layout& l : out)
    for (auto& [index, setting] : l.values)
      l.knobs.push_back(setting);
  return out;
}

// Jobs on the machine's cores, in the order queued (`first`: before the others); a job may
// queue more.
class WorkQueue {
public:
  void push(std::function<void()> job, bool first = false) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (first)
      jobs_.push_front(std::move(job));
    else
      jobs_.push_back(std::move(job));
    ready_.notify_one();
  }
  // Returns once every job queued, before or while it runs, has run.
  void run() {
    size_t threads = std::max(std::thread::hardware_concurrency(), 1u);
    std::vector<std::thread> pool;
    for (size_t t = 0; t < threads; ++t)
      pool.emplace_back([this] {
        std::unique_lock<std::mutex> lock(mutex_);
        while (true) {
          ready_.wait(lock, [this] { return !jobs_.empty() || running_ == 0; });
          if (jobs_.empty()) return;
          std::function<void()> job = std::move(jobs_.front());
          jobs_.pop_front();
          ++running_;
          lock.unlock();
          job();
          lock.lock();
          --running_;
          ready_.notify_all();
        }
      });
    for (std::thread& t : pool)
      t.join();
  }

private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  int running_ = 0;
};

// Each pipeline stage's largest rank, bytes.
std::vector<int64_t> stagePeaks(const ir::Module& m) {
  std::vector<int64_t> out;
  for (const ir::Program& p : m.programs) {
    if (out.size() <= static_cast<size_t>(p.stage)) out.resize(p.stage + 1, 0);
    out[p.stage] = std::max(out[p.stage], p.peakBytes());
  }
  return out;
}

// Plans and predicts the script with a layout and policy settings; the first plan of a
// layout also gives the layout's policy choices (its micro-batch counts). `twins`: for
// recompute = auto, the stage peaks of its plans with none and with every, where planned.
Candidate planCandidate(const std::string& script, const PlanOptions& base, Layout& layout,
                        std::vector<Setting> settings, const ir::Cluster& machines,
                        std::pair<std::vector<int64_t>, std::vector<int64_t>> twins = {},
                        bool whole = false) {
  Candidate c;
  c.shape = &layout;
  c.layout = layout.knobs;
  c.settings = std::move(settings);
  PlanOptions options = base;
  options.printAfter.clear();
  options.timePasses = false;
  options.passOutput = nullptr;
  options.costOnly = true;
  options.literalValues = layout.literals;
  options.peaksWithoutRecompute = std::move(twins.first);
  options.peaksRecomputingEvery = std::move(twins.second);
  // A plan that does not fit loses on its memory alone: its stages after the first that
  // does not fit are not planned (`whole`: they are).
  if (!whole)
    options.overMemory = [&machines](const ir::Module& m, const ir::Program& p) {
      return ir::overMemory(m, p, machines);
    };
  for (const Setting& s : c.settings)
    options.overrides.push_back(fmt::format("policy.{}={}", s.key, s.value));
  Session attempt;
  std::optional<ir::Module> m = planFile(script, attempt, options);
  if (m) {
    c.planned = true;
    c.stopped = m->stoppedOver;
    c.stages = m->mesh.depth();
    // A plan that does not fit loses on its memory alone: its step is not costed.
    c.predicted = ir::predictMemory(*m, machines);
    if (c.fits()) c.predicted = ir::predict(*m, machines);
    c.stagePeaks = stagePeaks(*m);
    if (layout.policy.empty()) layout.policy = choices(*m);
  } else if (!attempt.diags.all().empty()) {
    c.error = attempt.diags.all()[0].message;
  }
  return c;
}

// Each plan allocates and frees its programs (tens of MB at thousands of ranks): glibc
// would give the memory back to the system after each and fault it in again for the next,
// a tenth of the search's time. Keep it instead: no trimming, heaps grown 64 MB at a time,
// and blocks up to 32 MB (glibc's most) from the heap rather than their own mappings.
void keepFreedMemory() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
#endif
}

} // namespace

int searchPolicy(const std::string& script, const PlanOptions& scriptOptions,
                 const ir::Cluster& cluster, std::ostream& out) {
  auto start = std::chrono::steady_clock::now();
  keepFreedMemory();
  // Every plan compiles the same files: they parse once, for the first.
  frontend::ParseCache parsed;
  PlanOptions base = scriptOptions;
  base.parseCache = &parsed;
  Session session;
  PlanOptions firstOptions = base;
  firstOptions.costOnly = true;
  std::optional<ir::Module> first = planFile(script, session, firstOptions);
  session.diags.print(std::cerr, false); // its errors, or the script's own plan's warnings
  if (!first) return 1;
  if (!first->train.present) {
    std::cerr << "error: --search needs a train block: the batch and the optimizer\n";
    return 2;
  }
  if (std::string few = cluster.tooFew(first->mesh.np); !few.empty()) {
    std::cerr << "error: --cluster: " << few << "\n";
    return 2;
  }
  ir::Cluster machines = cluster.forRanks(first->mesh.np);
  std::vector<std::vector<Setting>> keys = choices(*first);
  std::vector<Setting> scriptSettings;
  for (const std::vector<Setting>& values : keys)
    scriptSettings.push_back(values[0]);
  std::vector<Layout> shapes = layouts(*first, cluster);
  std::vector<Candidate> candidates;
  // A plan's layout and policy settings, as one string.
  auto key = [](const std::vector<Setting>& knobs, const std::vector<Setting>& settings) {
    return describe(knobs) + "|" + describe(settings);
  };
  // The script's own plan is the first: its layout and settings.
  Candidate mine;
  mine.layout = shapes[0].knobs;
  mine.settings = scriptSettings;
  mine.planned = true;
  mine.predicted = ir::predict(*first, machines);
  mine.stagePeaks = stagePeaks(*first);
  mine.stages = first->mesh.depth();
  mine.shape = &shapes[0];
  shapes[0].policy = keys;
  // Then, all on the machine's cores at once:
  // 1. every other layout with the script's policy and each micro-batch count its
  //    data-parallel width allows (a deeper pipeline wants more), a layout a job;
  // 2. every policy for the script's layout;
  // 3. once 1. is done, every policy for the two fastest other layouts.
  // `recompute = auto` recomputes nothing where the plan without recomputation fits the
  // policy's device_memory: it is that plan. It chooses each stage's blocks between none
  // and all of them (passes/Recompute.cpp), so where a stage fits neither with none nor
  // with every, auto does not fit either. So an auto waits for its twins with none and
  // every, and is planned only where they leave it open (always when auto is the script's
  // own). What the jobs share is behind `state`.
  size_t recompute = keys.size() - 1;
  EPL_ASSERT(keys[recompute][0].key == "recompute", "recompute is the last key searched");
  bool scriptAuto = scriptSettings[recompute].value == "auto";
  auto isAuto = [&](const std::vector<Setting>& s) { return s[recompute].value == "auto"; };
  struct Job {
    Layout* layout;
    std::vector<Setting> settings;
    Candidate result;
    bool ran = false;
    int pending = 0;             // its twins not yet planned (an auto)
    std::vector<size_t> waiting; // the autos waiting for it
  };
  std::mutex state;
  WorkQueue queue;
  std::deque<Job> jobs;
  std::map<std::string, size_t> jobOf;
  std::vector<std::vector<Candidate>> byLayout(shapes.size());
  std::map<std::string, Candidate*> earlier{
      {key(mine.layout, mine.settings), &mine}}; // the plans made before their layout's jobs
  std::vector<Layout*> refine{&shapes[0]};
  int autoSkipped = 0, autoTooBig = 0;
  double budget = static_cast<double>(first->policy.deviceMemoryBytes);
  // Job k with recompute set to `value`: its plan, or null where it did not plan.
  auto twin = [&](size_t k, const char* value) -> Candidate* {
    std::vector<Setting> s = jobs[k].settings;
    s[recompute].value = value;
    std::string name = key(jobs[k].layout->knobs, s);
    auto job = jobOf.find(name);
    if (job != jobOf.end())
      return jobs[job->second].result.planned ? &jobs[job->second].result : nullptr;
    auto c = earlier.find(name);
    return c != earlier.end() && c->second->planned ? c->second : nullptr;
  };
  // An auto goes first: it is long (several trial plans), and was waiting.
  std::function<void(size_t)> runJob;
  // Auto k, its twins planned (with `state` held): planned unless its plan with none fits
  // (auto is that plan) or a stage fits neither with none nor with every. A twin that
  // stopped at a stage that does not fit (Candidate::stopped) tells nothing of the stages
  // after it; where one of those could decide, that twin is planned whole first.
  std::function<void(size_t)> decideAuto = [&](size_t k) {
    Candidate *none = twin(k, "none"), *every = twin(k, "every");
    // A plan with none that stopped holds more than it says: where what it says is within
    // the budget, it is planned whole to know.
    bool same = none && (budget <= 0 || (!none->stopped && none->predicted.peakBytes <= budget));
    bool sameOpen = none && none->stopped && budget > 0 && none->predicted.peakBytes <= budget;
    bool tooBig = false, open = sameOpen;
    Candidate* lacking = sameOpen ? none : nullptr;
    // A stage's peak: not known past where a plan stopped; nothing past a whole plan's
    // programs (one that makes none, Module::runRefusal).
    auto peakAt = [](const Candidate* c, int s) -> std::optional<int64_t> {
      if (s < static_cast<int>(c->stagePeaks.size())) return c->stagePeaks[s];
      if (c->stopped) return std::nullopt;
      return 0;
    };
    for (int s = 0;
         !sameOpen && budget > 0 && none && every && s < std::max(none->stages, every->stages);
         ++s) {
      std::optional<int64_t> a = peakAt(none, s), b = peakAt(every, s);
      bool overNone = !a || *a > budget, overEvery = !b || *b > budget; // or not known
      tooBig |= a && b && overNone && overEvery;
      if (overNone && overEvery && !(a && b) && !lacking) {
        open = true;
        lacking = !a ? none : every; // a twin that stopped: planned whole, it is known
      }
    }
    if (!same && !tooBig && open) {
      ++jobs[k].pending;
      queue.push(
          [&, k, lacking] {
            Candidate whole =
                planCandidate(script, base, *lacking->shape, lacking->settings, machines, {}, true);
            std::lock_guard<std::mutex> lock(state);
            *lacking = std::move(whole);
            if (--jobs[k].pending == 0) decideAuto(k);
          },
          true);
      return;
    }
    if (same || tooBig)
      ++(same ? autoSkipped : autoTooBig);
    else
      runJob(k);
  };
  runJob = [&](size_t k) {
    queue.push(
        [&, k] {
          Layout* layout;
          std::vector<Setting> settings;
          std::pair<std::vector<int64_t>, std::vector<int64_t>> twins;
          {
            std::lock_guard<std::mutex> lock(state);
            layout = jobs[k].layout;
            settings = jobs[k].settings;
            if (isAuto(settings)) { // its trials start from its twins' plans
              if (const Candidate* none = twin(k, "none")) twins.first = none->stagePeaks;
              if (const Candidate* every = twin(k, "every")) twins.second = every->stagePeaks;
            }
          }
          Candidate c = planCandidate(script, base, *layout, settings, machines, std::move(twins));
          std::lock_guard<std::mutex> lock(state);
          jobs[k].result = std::move(c);
          jobs[k].ran = true;
          for (size_t a : jobs[k].waiting)
            if (--jobs[a].pending == 0) decideAuto(a);
        },
        isAuto(jobs[k].settings));
  };
  // Every policy of a layout not planned yet, as jobs (with `state` held).
  auto addJobs = [&](Layout* layout) {
    size_t from = jobs.size();
    for (std::vector<Setting>& settings : combinations(layout->policy)) {
      std::string name = key(layout->knobs, settings);
      if (earlier.count(name) || jobOf.count(name)) continue;
      jobOf[name] = jobs.size();
      jobs.push_back({layout, std::move(settings), {}, false, 0, {}});
    }
    for (size_t k = from; k < jobs.size(); ++k) {
      if (!isAuto(jobs[k].settings) || scriptAuto) {
        runJob(k);
        continue;
      }
      for (const char* value : {"none", "every"}) {
        std::vector<Setting> s = jobs[k].settings;
        s[recompute].value = value;
        auto job = jobOf.find(key(layout->knobs, s));
        if (job == jobOf.end()) continue;
        jobs[job->second].waiting.push_back(k);
        ++jobs[k].pending;
      }
      if (jobs[k].pending == 0) decideAuto(k);
    }
  };
  size_t layoutsLeft = shapes.size() - 1;
  for (size_t i = 1; i < shapes.size(); ++i)
    queue.push([&, i] {
      Layout& layout = shapes[i];
      std::vector<Candidate> tried;
      std::vector<Setting> settings = scriptSettings;
      tried.push_back(planCandidate(script, base, layout, settings, machines));
      if (!tried.back().planned) {
        settings[0].value = "1";
        tried.push_back(planCandidate(script, base, layout, settings, machines));
      }
      if (tried.back().planned)
        for (const Setting& micro : std::vector<Setting>(layout.policy.at(0)))
          if (micro.value != settings[0].value) {
            settings[0] = micro;
            tried.push_back(planCandidate(script, base, layout, settings, machines));
          }
      std::lock_guard<std::mutex> lock(state);
      byLayout[i] = std::move(tried);
      if (--layoutsLeft > 0) return;
      // The last layout: the two fastest get every policy.
      std::vector<Layout*> others;
      for (size_t j = 1; j < shapes.size(); ++j) {
        for (Candidate& c : byLayout[j]) {
          if (c.fits() && (shapes[j].best == 0 || c.predicted.stepSeconds < shapes[j].best))
            shapes[j].best = c.predicted.stepSeconds;
          earlier[key(c.layout, c.settings)] = &c;
        }
        if (shapes[j].best > 0) others.push_back(&shapes[j]);
      }
      std::stable_sort(others.begin(), others.end(),
                       [](const Layout* a, const Layout* b) { return a->best < b->best; });
      for (size_t j = 0; j < others.size() && j < 2; ++j) {
        refine.push_back(others[j]);
        addJobs(others[j]);
      }
    });
  {
    std::lock_guard<std::mutex> lock(state);
    addJobs(&shapes[0]);
  }
  queue.run();
  for (size_t i = 1; i < shapes.size(); ++i)
    for (Candidate& c : byLayout[i])
      candidates.push_back(std::move(c));
  size_t layoutPlans = candidates.size();
  candidates.push_back(std::move(mine));
  for (Job& job : jobs)
    if (job.ran) candidates.push_back(std::move(job.result));
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Candidate& script0 = *std::find_if(candidates.begin(), candidates.end(), [&](auto& c) {
    return describe(c.layout) == describe(shapes[0].knobs) &&
           describe(c.settings) == describe(scriptSettings);
  });
  std::vector<const Candidate*> ranked;
  for (const Candidate& c : candidates)
    if (c.fits()) ranked.push_back(&c);
  // Steps within 1% of each other are taken as equal (the model is not that precise), and
  // then the settings closer to the script's win, then the smaller memory.
  double fastest = 0;
  for (const Candidate* c : ranked)
    if (fastest == 0 || c->predicted.stepSeconds < fastest) fastest = c->predicted.stepSeconds;
  auto changed = [&](const Candidate& c) {
    std::vector<Setting> out;
    for (size_t k = 0; k < c.layout.size(); ++k)
      if (c.layout[k].value != script0.layout[k].value) out.push_back(c.layout[k]);
    for (size_t k = 0; k < c.settings.size(); ++k)
      if (c.settings[k].value != script0.settings[k].value) out.push_back(c.settings[k]);
    return out;
  };
  auto rank = [&](const Candidate* c) {
    return std::make_tuple(
        std::floor(std::log(c->predicted.stepSeconds / fastest) / std::log(1.01)),
        changed(*c).size(), c->predicted.peakBytes);
  };
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](const Candidate* a, const Candidate* b) { return rank(a) < rank(b); });

  std::string what;
  for (const std::vector<Setting>& values : keys)
    what += fmt::format("{}{} ({})", what.empty() ? "" : " x ", values[0].key, values.size());
  if (shapes.size() > 1) {
    std::string knobs;
    for (const Setting& k : shapes[0].knobs)
      knobs += (knobs.empty() ? "" : " x ") + k.key;
    out << fmt::format("\nsearch on {} at -np {}: {} plans in {:.1f} s: {} layouts of {} with "
                       "the script's policy and each micro_batches ({} plans), then {} for the "
                       "script's layout{}\n",
                       cluster.name, first->mesh.np, candidates.size(), took, shapes.size(), knobs,
                       layoutPlans, what,
                       refine.size() > 1
                           ? fmt::format(" and the {} fastest others", refine.size() - 1)
                           : " (no other layout fit with the script's policy)");
  } else {
    out << fmt::format("\nsearch on {} at -np {}: {} plans of {}, in {:.1f} s\n", cluster.name,
                       first->mesh.np, candidates.size(), what, took);
  }
  if (autoSkipped > 0)
    out << fmt::format("  ({} with recompute = auto not planned: the plan with none fits the "
                       "device_memory, so auto recomputes nothing)\n",
                       autoSkipped);
  if (autoTooBig > 0)
    out << fmt::format("  ({} with recompute = auto not planned: a stage fits the device_memory "
                       "neither with none nor with every, so auto does not fit either)\n",
                       autoTooBig);
  if (ranked.empty()) {
    // The smallest plan: those that stopped at a stage that does not fit are planned whole,
    // smallest first, while what they held up to it is below the smallest whole one's peak.
    std::vector<Candidate*> partial;
    for (Candidate& c : candidates)
      if (c.planned && c.stopped) partial.push_back(&c);
    std::stable_sort(partial.begin(), partial.end(), [](const Candidate* a, const Candidate* b) {
      return a->predicted.peakBytes < b->predicted.peakBytes;
    });
    auto smallestWhole = [&] {
      double smallest = 0;
      for (const Candidate& c : candidates)
        if (c.planned && !c.stopped && (smallest == 0 || c.predicted.peakBytes < smallest))
          smallest = c.predicted.peakBytes;
      return smallest;
    };
    for (Candidate* c : partial) {
      double smallest = smallestWhole();
      if (smallest > 0 && c->predicted.peakBytes >= smallest) break;
      *c = planCandidate(script, base, *c->shape, c->settings, machines, {}, true);
    }
    double smallest = smallestWhole();
    out << "  no plan fits: "
        << (smallest > 0
                ? fmt::format("the smallest needs {} on its largest rank, the device "
                              "has {}",
                              formatBytes(smallest), formatBytes(script0.predicted.deviceBytes))
                : "none planned (" + script0.error + ")")
        << "\n";
    return 1;
  }
  const Candidate& best = *ranked[0];
  out << "  the fastest that fit:\n";
  for (size_t i = 0; i < ranked.size() && i < 5; ++i) {
    const ir::Prediction& p = ranked[i]->predicted;
    std::string rate =
        p.tokensPerSecond > 0
            ? fmt::format("{} tokens/s", withCommas(static_cast<int64_t>(p.tokensPerSecond)))
            : fmt::format("{:.4g} samples/s", p.samplesPerSecond);
    std::string settings = describe(ranked[i]->layout);
    settings += (settings.empty() ? "" : ", ") + describe(ranked[i]->settings);
    out << fmt::format("  {}. step {}, {}, MFU {:.1f}%, largest rank {}: {}{}\n", i + 1,
                       formatSeconds(p.stepSeconds), rate, 100 * p.mfu, formatBytes(p.peakBytes),
                       settings, ranked[i] == &script0 ? " (the script's)" : "");
  }
  // Why the others lost.
  int memory = 0, failed = 0;
  std::map<std::string, int> slower;
  std::string firstError;
  for (const Candidate& c : candidates) {
    if (!c.planned) {
      ++failed;
      if (firstError.empty()) firstError = c.error;
    } else if (!c.fits()) {
      ++memory;
    } else if (&c != &best) {
      ++slower[lostOn(c.predicted, best.predicted)];
    }
  }
  std::string why;
  auto reason = [&](const std::string& text) { why += (why.empty() ? "" : "; ") + text; };
  if (memory > 0)
    reason(cluster.groups.empty() ? fmt::format("{} did not fit the device's {}", memory,
                                                formatBytes(best.predicted.deviceBytes))
                                  : fmt::format("{} did not fit their devices' memory", memory));
  if (failed > 0) reason(fmt::format("{} did not plan (first: {})", failed, firstError));
  for (const auto& [part, n] : slower)
    reason(fmt::format("{} lost most on {}", n, part));
  out << "  the others: " << why << "\n";
  if (&best == &script0) {
    out << "  the script's settings are the fastest.\n";
    return 0;
  }
  if (script0.fits())
    out << fmt::format("  the script's settings: step {} ({:.2f}x the best)\n",
                       formatSeconds(script0.predicted.stepSeconds),
                       script0.predicted.stepSeconds / best.predicted.stepSeconds);
  std::vector<Setting> changes;
  std::string sets;
  for (size_t k = 0; k < best.settings.size(); ++k)
    if (best.settings[k].value != script0.settings[k].value) {
      changes.push_back(best.settings[k]);
      sets += fmt::format(" --set policy.{}={}", best.settings[k].key, best.settings[k].value);
    }
  std::vector<std::pair<ir::LayoutKnob, int64_t>> relaid;
  for (size_t k = 0; k < best.layout.size(); ++k)
    if (best.layout[k].value != script0.layout[k].value)
      relaid.push_back({first->layoutKnobs[k], std::stoll(best.layout[k].value)});
  if (relaid.empty())
    out << "  to run the best:" << sets << "\n  or apply to the script:\n";
  else
    out << "  to run the best, apply to the script (the layout is the script's text):\n";
  FileText text = readFilePrefix(script, size_t{16} << 20);
  std::vector<std::string> lines = splitLines(text.text);
  // The layout's numbers first, right to left on a line so that the columns hold, then the
  // policy's lines (which may add lines).
  std::sort(relaid.begin(), relaid.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.first.loc.line, b.first.loc.col) <
           std::make_pair(b.first.loc.line, a.first.loc.col);
  });
  std::vector<std::string> relaidLines = lines;
  for (const auto& [knob, value] : relaid)
    relaidLines.at(knob.loc.line - 1)
        .replace(knob.loc.col - 1, knob.length,
                 knob.bare ? fmt::format("split({})", value) : std::to_string(value));
  std::vector<Setting> byHand;
  std::vector<std::string> after = edited(relaidLines, first->policy, changes, byHand);
  printDiff(script, lines, after, out);
  if (!byHand.empty()) out << "  and set by hand: " << describe(byHand) << "\n";
  return 0;
}

} // namespace epl::driver
