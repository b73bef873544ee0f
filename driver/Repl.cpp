// `epl repl` (see Repl.h). Every command reads the current plan; `set` plans the script
// again from its text with one more setting (a fresh module: no pass runs twice on one),
// keeps the new plan only when it plans without errors, and shows what changed in the
// plan's text. Errors print as `epl check` prints them and never end the session.
#include "driver/Repl.h"

#include "frontend/Settings.h"
#include "ir/PlanJson.h"
#include "ir/PlanSvg.h"
#include "ir/Printer.h"
#include "support/Text.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <editline/readline.h>
#include <fmt/format.h>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <unistd.h>
#include <vector>

namespace epl::driver {

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;)
    out.push_back(w);
  return out;
}

const char* kHelp = R"(commands:
  plan               the whole plan, as `epl plan` prints it
  mesh               the mesh and one line a stage
  stage N            stage N: its layers, split blocks and model states
  rank R             rank R: where it sits, its stream counted by kind, its memory plan
  rank R stream      every instruction of rank R's step, as `epl plan --rank R` prints it
  explain LAYER      where a layer lives, its parameters, how it is split, what it sends
  mem                the memory ledger of every rank
  comm               the bridges, each link's bytes a step, the gradient reduction
  schedule           a pipeline's schedule: bubble, micro-batches in flight, a timeline
  set KEY = VALUE    plan again with a setting: np = 16, policy.zero = 3,
                     micro_batches = 16 (a bare key is the policy's or the train block's)
  settings           the settings given so far
  diff               what the last `set` or `reset` changed
  reset              back to the settings the session started with
  check              plan again and report any error, as `epl check` does
  help, quit
)";

class Repl {
public:
  Repl(const ReplOptions& o, std::ostream& out, std::ostream& err)
      : o_(o), out_(out), err_(err), np_(o.plan.np), overrides_(o.plan.overrides) {}

  // Plans the script as given; the session goes on without a plan when it does not plan.
  void start() {
    if (auto m = planNow(np_, overrides_, true)) {
      m_ = std::move(m);
      text_ = planText(*m_);
    }
  }

  // The mesh at a glance, as the prompt opens.
  void greet() {
    if (m_) out_ << summary();
    out_ << "`help` lists the commands\n";
  }

  // Runs one command line; false when it failed.
  bool run(const std::string& line) {
    std::vector<std::string> w = words(line);
    if (w.empty()) return true;
    const std::string& cmd = w[0];
    if (cmd == "quit" || cmd == "exit") {
      quit_ = true;
      return true;
    }
    if (cmd == "help") {
      out_ << kHelp;
      return true;
    }
    if (cmd == "set") return set(trim(line.substr(line.find("set") + 3)));
    if (cmd == "settings") return showSettings();
    if (cmd == "reset") return reset();
    if (cmd == "check") return check();
    if (cmd == "diff") {
      out_ << (diff_.empty() ? "no `set` or `reset` yet\n" : diff_);
      return true;
    }
    static const std::set<std::string> planned = {"plan",    "mesh", "stage", "rank",
                                                  "explain", "mem",  "comm",  "schedule"};
    if (!planned.count(cmd)) {
      err_ << fmt::format("error: unknown command `{}`\n  = help: `help` lists the commands\n",
                          cmd);
      return false;
    }
    if (!m_) {
      err_ << "error: there is no plan: the script did not plan with these settings\n"
              "  = help: `check` shows why; `set` or `reset` changes the settings\n";
      return false;
    }
    if (cmd == "plan") {
      ir::printPlan(*m_, out_);
      return true;
    }
    if (cmd == "mesh") {
      out_ << summary();
      return true;
    }
    if (cmd == "mem") return memory();
    if (cmd == "comm") return comm();
    if (cmd == "schedule") return schedule();
    bool stream = cmd == "rank" && w.size() == 3 && w[2] == "stream";
    if (w.size() != 2 && !stream) {
      err_ << fmt::format("error: `{}` takes one argument\n  = help: {}\n", cmd,
                          cmd == "stage"  ? "stage N, from 0"
                          : cmd == "rank" ? "rank R, from 0 (`rank R stream`: every instruction)"
                                          : "explain LAYER, e.g. a name `mesh` or `stage` lists");
      return false;
    }
    if (cmd == "explain") return explain(w[1]);
    std::optional<int> n = number(w[1]);
    int count = cmd == "stage" ? static_cast<int>(m_->mesh.stages.size()) : m_->mesh.np;
    if (!n || *n < 0 || *n >= count) {
      err_ << fmt::format("error: no {} `{}`: this plan has {} {} (0 to {})\n", cmd, w[1], count,
                          cmd == "stage" ? "stages" : "ranks", count - 1);
      return false;
    }
    if (cmd == "stage") {
      ir::printStageSection(*m_, *n, out_);
      return true;
    }
    if (m_->programs.empty()) {
      err_ << "error: this plan does not run yet, so it has no rank programs\n";
      return false;
    }
    if (stream) {
      ir::printProgram(*m_, *n, out_);
      return true;
    }
    return rankSummary(*n);
  }

  bool quit() const { return quit_; }

  // What tab completes after `before` (the line up to the word being completed).
  std::vector<std::string> candidates(const std::string& before) const {
    std::vector<std::string> w = words(before);
    if (w.empty())
      return {"check", "comm", "diff", "exit",  "explain",  "help", "mem",      "mesh",
              "plan",  "quit", "rank", "reset", "schedule", "set",  "settings", "stage"};
    std::vector<std::string> out;
    if (w.size() > 1) return out; // every command takes one word after its name
    if (w[0] == "stage" && m_)
      for (size_t s = 0; s < m_->mesh.stages.size(); ++s)
        out.push_back(std::to_string(s));
    if (w[0] == "rank" && m_)
      for (int r = 0; r < m_->mesh.np; ++r)
        out.push_back(std::to_string(r));
    if (w[0] == "explain" && m_) out = layerNames();
    if (w[0] == "set") {
      out.push_back("np");
      for (const frontend::KeyDoc& k : frontend::policyKeys())
        out.push_back("policy." + k.name);
      for (const frontend::KeyDoc& k : frontend::trainKeys())
        out.push_back("train." + k.name);
    }
    return out;
  }

private:
  std::optional<ir::Module> planNow(int np, const std::vector<std::string>& overrides,
                                    bool report) {
    Session session;
    PlanOptions options = o_.plan;
    options.np = np;
    options.overrides = overrides;
    options.printAfter.clear();
    options.timePasses = false;
    auto m = planFile(o_.script, session, options);
    if (report || !m) session.diags.print(err_, false);
    return m;
  }

  static std::string planText(const ir::Module& m) {
    std::ostringstream text;
    ir::printPlan(m, text);
    return text.str();
  }

  // The plan's first lines (model, mesh, batch, parameters, model states), then one line a
  // stage.
  std::string summary() const {
    std::string out;
    for (const std::string& l : splitLines(text_)) {
      if (l.empty()) break;
      out += l + "\n";
    }
    for (size_t s = 0; s < m_->mesh.stages.size(); ++s) {
      std::ostringstream stage;
      ir::printStageSection(*m_, static_cast<int>(s), stage);
      out += splitLines(stage.str()).at(0) + "\n";
    }
    return out;
  }

  static std::optional<int> number(const std::string& s) {
    if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c));
        }))
      return {};
    return std::stoi(s);
  }

  // "np = 16", "policy.zero=3", "micro_batches = 16".
  bool set(const std::string& assignment) {
    size_t eq = assignment.find('=');
    std::string key = trim(assignment.substr(0, eq)),
                value = eq == std::string::npos ? "" : trim(assignment.substr(eq + 1));
    if (eq == std::string::npos || key.empty() || value.empty()) {
      err_ << "error: `set` takes KEY = VALUE\n  = help: set policy.zero = 3, set np = 16\n";
      return false;
    }
    int np = np_;
    std::vector<std::string> overrides = overrides_;
    if (key == "np") {
      std::optional<int> n = number(value);
      if (!n || *n < 1) {
        err_ << fmt::format("error: np must be a whole number of devices, at least 1, got `{}`\n",
                            value);
        return false;
      }
      np = *n;
    } else {
      if (key.find('.') == std::string::npos) key = qualified(key);
      overrides.push_back(key + "=" + value);
    }
    return replanWith(np, std::move(overrides));
  }

  // A bare key: the policy's when it has one of that name, else the train block's.
  static std::string qualified(const std::string& key) {
    for (const frontend::KeyDoc& k : frontend::trainKeys())
      if (k.name == key) {
        for (const frontend::KeyDoc& p : frontend::policyKeys())
          if (p.name == key) return "policy." + key;
        return "train." + key;
      }
    return "policy." + key;
  }

  bool replanWith(int np, std::vector<std::string> overrides) {
    std::optional<ir::Module> m = planNow(np, overrides, false);
    if (!m) {
      err_ << "the plan is unchanged\n";
      return false;
    }
    np_ = np;
    overrides_ = std::move(overrides);
    std::string text = planText(*m);
    diff_ = difference(text_, text);
    m_ = std::move(m);
    text_ = std::move(text);
    out_ << diff_;
    return true;
  }

  // The lines of the old plan's text that the new one lacks, and the new lines, each in
  // the order of its text.
  static std::string difference(const std::string& before, const std::string& after) {
    std::vector<std::string> a = splitLines(before), b = splitLines(after);
    std::multiset<std::string> inA(a.begin(), a.end()), inB(b.begin(), b.end());
    std::string out;
    for (const std::string& l : a)
      if (!l.empty() && !inB.count(l)) out += "- " + l + "\n";
    for (const std::string& l : b)
      if (!l.empty() && !inA.count(l)) out += "+ " + l + "\n";
    return out.empty() ? "no change to the plan\n" : out;
  }

  bool showSettings() {
    out_ << fmt::format("np = {}\n", np_ > 0 ? std::to_string(np_) : "one replica (not given)");
    for (const std::string& o : overrides_)
      out_ << o << "\n";
    return true;
  }

  bool reset() { return replanWith(o_.plan.np, o_.plan.overrides); }

  bool check() {
    std::optional<ir::Module> m = planNow(np_, overrides_, true);
    if (!m) return false;
    out_ << fmt::format("no errors: `{}` plans on {} device{}\n", m->modelName, m->mesh.np,
                        m->mesh.np == 1 ? "" : "s");
    return true;
  }

  bool memory() {
    if (m_->programs.empty()) {
      err_ << "error: this plan does not run yet, so it has no memory ledger per rank\n";
      return false;
    }
    ir::printRankMemory(*m_, out_);
    return true;
  }

  // Rank r: the first line of `epl plan --rank R` (its stage, split rank and samples), its
  // step's instructions counted by kind, and its memory plan.
  bool rankSummary(int r) {
    std::ostringstream text;
    ir::printProgram(*m_, r, text);
    std::vector<std::string> all = splitLines(text.str());
    const ir::Program& p = m_->programs.at(static_cast<size_t>(r));
    std::map<std::string, int> counts;
    for (const ir::Instr& in : p.step) {
      switch (in.kind) {
      case ir::InstrKind::Run: {
        ir::Phase phase = m_->ops[in.op].phase;
        ++counts[phase == ir::Phase::Forward    ? "forward ops"
                 : phase == ir::Phase::Backward ? "backward ops"
                                                : "optimizer ops"];
        break;
      }
      case ir::InstrKind::Send:
        ++counts["sends"];
        break;
      case ir::InstrKind::Recv:
        ++counts["receives"];
        break;
      case ir::InstrKind::ReduceStart:
        ++counts["gradient reductions"];
        break;
      case ir::InstrKind::GatherStart:
        ++counts["parameter gathers"];
        break;
      default:
        break;
      }
    }
    std::vector<std::string> parts;
    for (const char* k : {"forward ops", "backward ops", "optimizer ops", "sends", "receives",
                          "gradient reductions", "parameter gathers"})
      if (counts.count(k)) parts.push_back(fmt::format("{} {}", counts[k], k));
    out_ << all.at(0) << "\n";
    out_ << fmt::format("  {} instructions a step: {}\n", p.step.size(), fmt::join(parts, ", "));
    for (const std::string& l : all)
      if (l.rfind("memory plan:", 0) == 0) out_ << "  " << l << "\n";
    out_ << fmt::format("  (`rank {} stream` lists them)\n", r);
    return true;
  }

  bool comm() {
    ir::printBridgeSection(*m_, out_);
    // Each link's bytes a step: every bridge's per micro-batch, times the micro-batches.
    std::map<std::pair<int, int>, int64_t> links;
    for (const ir::Bridge& b : m_->bridges)
      if (b.bytes > 0) links[{b.fromStage, b.toStage}] += b.bytes * m_->policy.microBatches;
    if (!links.empty())
      out_ << fmt::format("a step ({} micro-batches), each receiving device:\n",
                          m_->policy.microBatches);
    for (const auto& [link, bytes] : links)
      out_ << fmt::format("  {}: {}\n",
                          link.first == link.second
                              ? fmt::format("inside stage {} (its split groups)", link.first)
                              : fmt::format("stage {} -> {}", link.first, link.second),
                          formatBytes(static_cast<double>(bytes)));
    bool reduction = false;
    for (const std::string& l : splitLines(text_)) {
      if (l.rfind("gradient reduction:", 0) == 0) reduction = true;
      if (reduction && l.empty()) break;
      if (reduction) out_ << l << "\n";
    }
    if (!reduction) out_ << "gradient reduction: none (one data-parallel rank a stage)\n";
    return true;
  }

  bool schedule() {
    std::ostringstream text;
    ir::printScheduleSection(*m_, text);
    out_ << (text.str().empty() ? "one stage: no pipeline schedule\n" : trim(text.str()) + "\n");
    out_ << ir::scheduleTimeline(*m_);
    return true;
  }

  std::vector<std::string> layerNames() const {
    std::vector<std::string> out;
    for (const auto& stage : ir::planJson(*m_)["stages"])
      for (const auto& layer : stage["layers"])
        out.push_back(layer["name"].get<std::string>());
    return out;
  }

  // A layer by its name (`transformer_block.3`), or every layer of one call
  // (`transformer_block`): where it lives, its parameters, its split ops, what it sends.
  bool explain(const std::string& name) {
    nlohmann::ordered_json j = ir::planJson(*m_);
    auto matches = [&](const std::string& layer) {
      return layer == name ||
             (layer.rfind(name + ".", 0) == 0 &&
              layer.find_first_not_of("0123456789", name.size() + 1) == std::string::npos);
    };
    auto within = [&](const std::string& op) {
      std::string layer = op.substr(0, op.find('/'));
      return matches(layer);
    };
    bool found = false;
    for (const auto& stage : j["stages"]) {
      int64_t params = 0;
      std::vector<std::string> names;
      for (const auto& layer : stage["layers"])
        if (matches(layer["name"].get<std::string>())) {
          names.push_back(layer["name"].get<std::string>());
          params += layer["params"].get<int64_t>();
        }
      if (names.empty()) continue;
      found = true;
      int stageIndex = stage["index"].get<int>();
      out_ << fmt::format("{}: stage {} ({}, line {}), on ranks {}\n",
                          names.size() == 1 ? names[0]
                                            : fmt::format("{} ({} layers)", name, names.size()),
                          stageIndex, stage["kind"].get<std::string>(), stage["line"].get<int>(),
                          ir::stageRankRanges(m_->mesh, stageIndex));
      out_ << fmt::format("  parameters: {} ({}), of the stage's {}\n", withCommas(params),
                          formatBytes(4.0 * static_cast<double>(params)),
                          withCommas(stage["params"]["count"].get<int64_t>()));
      std::vector<std::string> forms;
      for (const auto& op : stage["split_ops"])
        if (within(op["op"].get<std::string>()))
          forms.push_back(fmt::format("{} {} over {} (line {})", op["op"].get<std::string>(),
                                      op["form"].get<std::string>(), op["width"].get<int>(),
                                      op["line"].get<int>()));
      if (names.size() == 1) { // its forward ops and what each makes
        std::vector<std::string> ops;
        size_t backward = 0;
        for (const ir::Op& op : m_->ops) {
          if (!within(op.name) || op.stage != stageIndex) continue;
          if (op.phase == ir::Phase::Backward) ++backward;
          if (op.phase != ir::Phase::Forward || op.outputs.empty()) continue;
          ops.push_back(fmt::format("{} -> {}", ir::opInfo(op.kind).name,
                                    m_->tensors[op.outputs[0]].type.str()));
        }
        out_ << fmt::format("  forward: {}\n  backward: {} op{}\n", fmt::join(ops, "; "), backward,
                            backward == 1 ? "" : "s");
        explainCost(stageIndex, within);
      }
      if (forms.empty())
        out_ << fmt::format("  not split: whole on each of the stage's {} device{}\n",
                            stage["devices"].get<int>(), stage["devices"] == 1 ? "" : "s");
      for (const std::string& f : forms)
        out_ << "  split: " << f << "\n";
      for (const auto& b : j["bridges"])
        if (within(b["tensor"].get<std::string>()) && b["to_stage"] == stageIndex)
          out_ << fmt::format(
              "  {}: {} {}, {} a micro-batch (line {})\n", b["what"].get<std::string>(),
              b["tensor"].get<std::string>(), b["type"].get<std::string>(),
              b["bytes"].is_null() ? std::string("?")
                                   : formatBytes(static_cast<double>(b["bytes"].get<int64_t>())),
              b["line"].get<int>());
    }
    if (!found) {
      std::vector<std::string> names = layerNames();
      err_ << fmt::format("error: no layer `{}` in this plan\n  = help: the layers: {}\n", name,
                          fmt::join(names, ", "));
    }
    return found;
  }

  // On one device of the stage, a micro-batch: the matrix-product FLOPs of the layer's
  // forward ops and the bytes of what they make (outputs and the tensors saved for the
  // backward). Plans that do not run have no rank programs, and no such lines.
  template <class Within> void explainCost(int stage, const Within& within) {
    const ir::Program* p = m_->firstProgramOf(stage);
    if (!p) return;
    double flops = 0;
    int64_t bytes = 0;
    for (size_t i = 0; i < m_->ops.size(); ++i) {
      const ir::Op& op = m_->ops[i];
      if (op.phase != ir::Phase::Forward || op.stage != stage || !within(op.name)) continue;
      flops += m_->runFlops(*p, static_cast<int>(i)).forward;
      for (int t : op.outputs)
        bytes += m_->bytesOn(*p, t);
    }
    out_ << fmt::format(
        "  on rank {}, a micro-batch: {}; its forward makes {} of tensors\n", p->rank,
        flops > 0
            ? fmt::format("forward {} in matrix products, backward twice that", formatFlops(flops))
            : std::string("no matrix products"),
        formatBytes(static_cast<double>(bytes)));
  }

  const ReplOptions& o_;
  std::ostream &out_, &err_;
  int np_;
  std::vector<std::string> overrides_;
  std::optional<ir::Module> m_;
  std::string text_, diff_;
  bool quit_ = false;
};

// Tab completion at the prompt: the session the completer asks, and the candidates that
// start with the word being completed.
Repl* completing = nullptr;
std::vector<std::string> matches;

char* nextMatch(const char* text, int state) {
  static size_t at = 0;
  if (state == 0) at = 0;
  std::string prefix = text;
  while (at < matches.size()) {
    const std::string& m = matches[at++];
    if (m.rfind(prefix, 0) == 0) return strdup(m.c_str());
  }
  return nullptr;
}

char** complete(const char* text, int start, int) {
  rl_attempted_completion_over = 1; // never file names
  matches = completing->candidates(std::string(rl_line_buffer, static_cast<size_t>(start)));
  return rl_completion_matches(text, nextMatch);
}

std::string historyFile() {
  if (const char* f = std::getenv("EPL_HISTORY")) return f;
  const char* home = std::getenv("HOME");
  return home ? std::string(home) + "/.epl_history" : "";
}

} // namespace

int runRepl(const ReplOptions& options, std::istream& in, std::ostream& out, std::ostream& err) {
  Repl repl(options, out, err);
  repl.start();
  bool ok = true;
  if (!options.commands.empty()) {
    std::istringstream commands(options.commands);
    for (std::string c; std::getline(commands, c, ';') && !repl.quit();)
      ok = repl.run(c) && ok;
    return ok ? 0 : 1;
  }
  if (&in != &std::cin || !isatty(0) || !isatty(1)) {
    for (std::string line; !repl.quit() && std::getline(in, line);)
      ok = repl.run(line) && ok;
    return ok ? 0 : 1;
  }
  // A terminal: line editing, completion, and the history of earlier sessions.
  repl.greet();
  std::string history = historyFile();
  using_history();
  if (!history.empty()) read_history(history.c_str());
  completing = &repl;
  rl_attempted_completion_function = complete;
  while (!repl.quit()) {
    char* line = readline("epl> ");
    if (!line) break; // end of input (ctrl-d)
    std::string text = line;
    std::free(line);
    if (!trim(text).empty()) add_history(text.c_str());
    repl.run(text);
    out.flush();
  }
  if (!history.empty()) {
    write_history(history.c_str());
    history_truncate_file(history.c_str(), 1000);
  }
  return 0;
}

} // namespace epl::driver
