// `epl plan --cluster C --search` (docs/cluster.md, "Searching the policy"): every
// combination of the policy keys that change speed and memory but not the layout, each
// planned and predicted as `epl plan --cluster` does, ranked by step time among those
// that fit the device.
#include "driver/Search.h"

#include "ir/PipelineSchedule.h"
#include "ir/Predict.h"
#include "support/Files.h"
#include "support/Text.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <iostream>
#include <map>
#include <sstream>
#include <tuple>

namespace epl::driver {

namespace {

struct Setting {
  std::string key, value; // a policy key and its value as the script writes it
};

struct Candidate {
  std::vector<Setting> settings;
  std::string error; // the first error of a plan that failed
  ir::Prediction predicted;
  bool planned = false;
  bool fits() const {
    return planned && (predicted.deviceBytes <= 0 || predicted.peakBytes <= predicted.deviceBytes);
  }
};

std::string recomputeWord(const ir::Policy& p) {
  switch (p.recompute) {
  case ir::Recompute::None:
    return "none";
  case ir::Recompute::Auto:
    return "auto";
  case ir::Recompute::Every:
    return "every";
  case ir::Recompute::Listed:
    break;
  }
  std::string list = "[";
  for (size_t i = 0; i < p.recomputeBlocks.size(); ++i)
    list += (i ? ", " : "") + p.recomputeBlocks[i];
  return list + "]";
}

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
  add("recompute", recomputeWord(p), {"none", "auto", "every"});
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

// One hunk from the first changed line to the last, with a line of context each side.
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
  for (size_t i = head; i < tailBefore; ++i)
    out << "-" << before[i] << "\n";
  for (size_t i = head; i < tailAfter; ++i)
    out << "+" << after[i] << "\n";
  for (size_t i = tailBefore; i < toBefore; ++i)
    out << " " << before[i] << "\n";
}

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

} // namespace

int searchPolicy(const std::string& script, const PlanOptions& base, const ir::Cluster& cluster,
                 std::ostream& out) {
  auto start = std::chrono::steady_clock::now();
  Session session;
  std::optional<ir::Module> first = planFile(script, session, base);
  if (!first) {
    session.diags.print(std::cerr, false);
    return 1;
  }
  if (!first->train.present) {
    std::cerr << "error: --search needs a train block: the batch and the optimizer\n";
    return 2;
  }
  ir::Cluster machines = cluster.forRanks(first->mesh.np);
  std::vector<std::vector<Setting>> keys = choices(*first);
  std::vector<Candidate> candidates;
  for (std::vector<Setting>& settings : combinations(keys)) {
    Candidate c;
    c.settings = std::move(settings);
    PlanOptions options = base;
    options.printAfter.clear();
    options.timePasses = false;
    options.passOutput = nullptr;
    for (const Setting& s : c.settings)
      options.overrides.push_back(fmt::format("policy.{}={}", s.key, s.value));
    Session attempt;
    std::optional<ir::Module> m = planFile(script, attempt, options);
    if (m) {
      c.planned = true;
      c.predicted = ir::predict(*m, machines);
    } else if (!attempt.diags.all().empty()) {
      c.error = attempt.diags.all()[0].message;
    }
    candidates.push_back(std::move(c));
  }
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Candidate& script0 = candidates[0]; // the script's own settings come first
  std::vector<const Candidate*> ranked;
  for (const Candidate& c : candidates)
    if (c.fits()) ranked.push_back(&c);
  // Steps within 1% of each other are taken as equal (the model is not that precise), and
  // then the settings closer to the script's win, then the smaller memory.
  double fastest = 0;
  for (const Candidate* c : ranked)
    if (fastest == 0 || c->predicted.stepSeconds < fastest) fastest = c->predicted.stepSeconds;
  auto rank = [&](const Candidate* c) {
    int changes = 0;
    for (size_t k = 0; k < c->settings.size(); ++k)
      changes += c->settings[k].value != script0.settings[k].value;
    return std::make_tuple(
        std::floor(std::log(c->predicted.stepSeconds / fastest) / std::log(1.01)), changes,
        c->predicted.peakBytes);
  };
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](const Candidate* a, const Candidate* b) { return rank(a) < rank(b); });

  std::string tried;
  for (const std::vector<Setting>& values : keys)
    tried += fmt::format("{}{} ({})", tried.empty() ? "" : " x ", values[0].key, values.size());
  out << fmt::format("\nsearch on {} at -np {}: {} plans of {}, in {:.1f} s\n", cluster.name,
                     first->mesh.np, candidates.size(), tried, took);
  if (ranked.empty()) {
    double smallest = 0;
    for (const Candidate& c : candidates)
      if (c.planned && (smallest == 0 || c.predicted.peakBytes < smallest))
        smallest = c.predicted.peakBytes;
    out << "  no plan fits: "
        << (smallest > 0 ? fmt::format("the smallest needs {} on its largest rank, the device "
                                       "has {}",
                                       formatBytes(smallest),
                                       formatBytes(candidates[0].predicted.deviceBytes))
                         : "none planned (" + candidates[0].error + ")")
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
    out << fmt::format("  {}. step {}, {}, MFU {:.1f}%, largest rank {}: {}{}\n", i + 1,
                       formatSeconds(p.stepSeconds), rate, 100 * p.mfu, formatBytes(p.peakBytes),
                       describe(ranked[i]->settings),
                       ranked[i] == &script0 ? " (the script's)" : "");
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
    reason(fmt::format("{} did not fit the device's {}", memory,
                       formatBytes(best.predicted.deviceBytes)));
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
  out << "  to run the best:" << sets << "\n  or apply to the script:\n";
  FileText text = readFilePrefix(script, size_t{16} << 20);
  std::vector<std::string> lines = splitLines(text.text);
  std::vector<Setting> byHand;
  std::vector<std::string> after = edited(lines, first->policy, changes, byHand);
  printDiff(script, lines, after, out);
  if (!byHand.empty()) out << "  and set by hand: " << describe(byHand) << "\n";
  return 0;
}

} // namespace epl::driver
