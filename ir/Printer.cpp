// Deterministic text for modules and plans: same module in, same bytes out.
#include "ir/Printer.h"

#include "support/Text.h"

#include <algorithm>
#include <fmt/format.h>
#include <functional>
#include <map>

namespace epl::ir {

namespace {

const char* scopeKind(const Scope& s) {
  switch (s.kind) {
  case ScopeKind::Model:
    return "model";
  case ScopeKind::Stage:
    return s.isSplitStage ? "stage split" : "stage replicate";
  case ScopeKind::Split:
    return "split";
  }
  return "?";
}

std::string widthStr(const Scope& s) {
  if (s.isAuto && s.width == 0) return "(auto)";
  if (s.width == 0) return "";
  return fmt::format("({}{})", s.width, s.isAuto ? ", auto" : "");
}

std::string attrList(const Attrs& attrs) {
  if (attrs.empty()) return "";
  std::vector<std::string> parts;
  for (const auto& [k, v] : attrs)
    parts.push_back(k + " = " + attrStr(v));
  return " {" + fmt::format("{}", fmt::join(parts, ", ")) + "}";
}

} // namespace

void printModule(const Module& m, std::ostream& out) {
  out << fmt::format("module @{}", m.modelName);
  for (const auto& [sym, v] : m.bindings)
    out << fmt::format(" [{} = {}]", sym, v);
  out << "\n";
  for (size_t s = 1; s < m.scopes.size(); ++s) {
    const Scope& sc = m.scopes[s];
    out << fmt::format("  scope #{} {}{}", s, scopeKind(sc), widthStr(sc));
    if (sc.parent > 0) out << fmt::format(" in #{}", sc.parent);
    out << fmt::format(" at {}:{}\n", sc.loc.line, sc.loc.col);
  }
  for (int t : m.inputs)
    out << fmt::format("  input %{} : {}\n", m.tensors[t].name, m.tensors[t].type.str());
  auto ref = [&](int t) { return t < 0 ? std::string("_") : "%" + m.tensors[t].name; };
  for (const Op& op : m.ops) {
    std::vector<std::string> ins, outs;
    for (int t : op.inputs)
      ins.push_back(ref(t));
    for (size_t k = 0; k < op.outputs.size(); ++k)
      outs.push_back((k < op.accumulate.size() && op.accumulate[k] ? "+" : "") +
                     ref(op.outputs[k]));
    out << "  ";
    if (!outs.empty()) out << fmt::format("{} = ", fmt::join(outs, ", "));
    out << fmt::format("{}{}({}){}", opInfo(op.kind).name,
                       op.phase == Phase::Backward    ? ".backward"
                       : op.phase == Phase::Recompute ? ".recompute"
                                                      : "",
                       fmt::join(ins, ", "), attrList(op.attrs));
    if (op.phase == Phase::Forward) out << " : " << m.tensors[op.outputs[0]].type.str();
    if (op.phase != Phase::Forward) {
      for (int p : op.params)
        out << fmt::format(" @{}", m.params[p].name);
      out << "\n";
      continue;
    }
    if (op.scope > 0) out << fmt::format(" in #{}", op.scope);
    if (op.stage >= 0) out << fmt::format(" stage {}", op.stage);
    if (op.splitForm != SplitForm::None)
      out << fmt::format(" split {}", splitFormName(op.splitForm));
    if (op.stage >= 0 && m.tensors[op.outputs[0]].layout.kind != LayoutKind::DataParallel)
      out << fmt::format(" -> {}", m.tensors[op.outputs[0]].layout.str());
    out << "\n";
    for (int p : op.params) {
      const Param& prm = m.params[p];
      out << fmt::format("      param @{} : {}", prm.name, prm.type.str());
      if (prm.shardDim >= 0) out << fmt::format(" cut dim {}", prm.shardDim);
      out << "\n";
    }
  }
  for (int t : m.outputs)
    out << fmt::format("  return %{}\n", m.tensors[t].name);
}

// "0-1, 4-5": the global ranks of a stage group across all replicas; past four replicas
// "0-7, 64-71, …, 960-967 (16 replicas, every 64)".
std::string stageRankRanges(const Mesh& mesh, int s) {
  auto range = [&](int r) {
    int a = mesh.rank(r, s, 0), b = mesh.rank(r, s, mesh.stages[s].group - 1);
    return a == b ? std::to_string(a) : fmt::format("{}-{}", a, b);
  };
  if (mesh.dataParallel > 4)
    return fmt::format("{}, {}, …, {} ({} replicas, every {})", range(0), range(1),
                       range(mesh.dataParallel - 1), mesh.dataParallel, mesh.replicaSize);
  std::vector<std::string> parts;
  for (int r = 0; r < mesh.dataParallel; ++r)
    parts.push_back(range(r));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::vector<std::pair<std::string, int64_t>> stageLayerParams(const Module& m, int s) {
  std::vector<std::pair<std::string, int64_t>> layers;
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < m.ops.size(); ++i) {
    const Op& op = m.ops[i];
    if (op.stage != s || op.phase != Phase::Forward ||
        opInfo(op.kind).split == SplitRule::Communication)
      continue;
    std::string layer = op.name.substr(0, op.name.find('/'));
    auto [it, fresh] = at.emplace(layer, layers.size());
    if (fresh) layers.push_back({layer, 0});
    for (int p : op.params) // a tied weight counts once, at the layer that made it
      if (m.params[p].op == static_cast<int>(i))
        layers[it->second].second += *numElements(m.params[p].type.shape, {});
  }
  return layers;
}

namespace {

// Groups equal strings that repeat, keeping first-seen order: "attention heads x12".
std::string countedList(const std::vector<std::string>& items) {
  std::vector<std::pair<std::string, int>> counts;
  for (const auto& i : items) {
    auto it =
        std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == i; });
    if (it == counts.end())
      counts.emplace_back(i, 1);
    else
      ++it->second;
  }
  std::vector<std::string> parts;
  for (const auto& [item, n] : counts)
    parts.push_back(n == 1 ? item : fmt::format("{} x{}", item, n));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// The first path component of an op name, the layer a user wrote: "transformer_block.3".
std::string layerOf(const std::string& opName) {
  return opName.substr(0, opName.find('/'));
}

// Splits "transformer_block.3" into ("transformer_block", 3); index -1 when there is none.
std::pair<std::string, int> splitIndex(const std::string& layer) {
  size_t dot = layer.rfind('.');
  if (dot == std::string::npos || dot + 1 == layer.size()) return {layer, -1};
  for (size_t i = dot + 1; i < layer.size(); ++i)
    if (!isdigit(static_cast<unsigned char>(layer[i]))) return {layer, -1};
  return {layer.substr(0, dot), std::stoi(layer.substr(dot + 1))};
}

struct LayerRow {
  std::string name;
  int first = -1, last = -1; // index range of collapsed repeats
  int64_t params = 0;        // each
  int count = 1;
};

// The layers of one stage in order, with consecutive repeats of one block collapsed.
std::vector<LayerRow> stageLayers(const Module& m, int s) {
  std::vector<LayerRow> rows;
  for (const auto& [layer, params] : stageLayerParams(m, s)) {
    auto [base, idx] = splitIndex(layer);
    if (!rows.empty() && idx >= 0 && rows.back().first >= 0 && rows.back().name == base &&
        rows.back().last + 1 == idx && rows.back().params == params) {
      rows.back().last = idx;
      ++rows.back().count;
      continue;
    }
    rows.push_back(LayerRow{idx >= 0 ? base : layer, idx, idx, params, 1});
  }
  return rows;
}

std::string rowName(const LayerRow& r) {
  if (r.first < 0) return r.name;
  if (r.first == r.last) return fmt::format("{}.{}", r.name, r.first);
  return fmt::format("{}.{}-{}", r.name, r.first, r.last);
}

void printStage(const Module& m, int s, std::ostream& out) {
  const StagePlan& st = m.mesh.stages[s];
  std::string kind = st.scope < 0                      ? "whole model"
                     : m.scopes[st.scope].isSplitStage ? "split"
                                                       : "replicate";
  out << fmt::format("stage {} ({}, line {}): {} device{}, split width {}, {} cop{}; ranks {}\n", s,
                     kind, st.loc.line, st.group, st.group == 1 ? "" : "s", st.splitWidth,
                     st.copies(), st.copies() == 1 ? "y" : "ies", stageRankRanges(m.mesh, s));
  out << fmt::format("  {:<34} {:>16} {:>10}\n", "layer", "params", "bytes");
  for (const LayerRow& r : stageLayers(m, s)) {
    std::string count =
        r.count > 1 ? fmt::format("{} x {}", r.count, withCommas(r.params)) : withCommas(r.params);
    out << fmt::format("  {:<34} {:>16} {:>10}\n", rowName(r), count,
                       formatBytes(4.0 * r.params * r.count));
  }
  // One line a split block; the blocks of a def repeated in a loop fold into one, `x4`.
  std::vector<std::pair<std::string, int>> lines;
  for (size_t sc = 1; sc < m.scopes.size(); ++sc) {
    if (m.scopes[sc].kind != ScopeKind::Split &&
        !(m.scopes[sc].kind == ScopeKind::Stage && m.scopes[sc].isSplitStage))
      continue;
    std::vector<std::string> forms;
    for (const Op& op : m.ops)
      if (op.stage == s && op.phase == Phase::Forward &&
          m.splitScopeOf(op.scope) == static_cast<int>(sc) && op.splitForm != SplitForm::None)
        forms.push_back(fmt::format("{} {}", op.name.substr(op.name.rfind('/') + 1),
                                    splitFormName(op.splitForm)));
    if (forms.empty()) continue;
    std::string line = fmt::format("  split({}) at line {}: {}", m.scopes[sc].width,
                                   m.scopes[sc].loc.line, countedList(forms));
    if (!lines.empty() && lines.back().first == line)
      ++lines.back().second;
    else
      lines.push_back({line, 1});
  }
  for (const auto& [line, times] : lines)
    out << line << (times > 1 ? fmt::format(" (x{})", times) : "") << "\n";
  out << fmt::format("  {:<34} {:>16} {:>10}\n", "stage total", withCommas(st.paramCount),
                     formatBytes(st.paramBytes));
  out << fmt::format("  {:<34} {:>16} {:>10}\n", "held by each device",
                     withCommas(st.rankParamCount), formatBytes(st.rankParamBytes));
  out << fmt::format("  model states per device: {} params + {} grads + {} optimizer = {}",
                     formatBytes(st.stateParamBytes), formatBytes(st.stateGradBytes),
                     formatBytes(st.stateOptimizerBytes), formatBytes(st.modelStateBytes()));
  if (st.offloadedBytes > 0) out << fmt::format("; {} offloaded", formatBytes(st.offloadedBytes));
  out << "\n";
}

struct BridgeRow {
  std::string where, what, tensor, type, bytes;
  uint32_t line = 0;
  int first = -1;         // layer index of the block the tensor belongs to, -1 when none
  std::string base, rest; // "transformer_block", "/attention"
};

BridgeRow bridgeRow(const Module& m, const Bridge& b) {
  const Op& op = m.ops[b.op];
  int t = op.inputs.empty() ? op.outputs[0] : op.inputs[0];
  if (op.kind == OpKind::CrossEntropy) t = op.inputs[1];
  BridgeRow r;
  r.where = b.fromStage == b.toStage ? fmt::format("stage {}", b.toStage)
                                     : fmt::format("stage {} -> {}", b.fromStage, b.toStage);
  r.what = b.what;
  r.tensor = m.tensors[t].name;
  r.type = m.tensors[t].type.str();
  r.bytes = b.bytes < 0 ? "?" : formatBytes(static_cast<double>(b.bytes));
  r.line = op.site.line;
  std::string layer = layerOf(r.tensor);
  auto [base, idx] = splitIndex(layer);
  if (idx >= 0) {
    r.first = idx;
    r.base = base;
    r.rest = r.tensor.substr(layer.size());
  }
  return r;
}

// A run of bridge rows from one block instance (same base and index), or one row.
struct BridgeUnit {
  std::vector<BridgeRow> rows;
  int first = -1, last = -1;
  // Whether the first `n` rows of `o` repeat this unit's rows, but for the index.
  bool repeatedBy(const BridgeUnit& o, size_t n) const {
    if (first < 0 || o.first < 0 || rows.size() != n || o.rows.size() < n) return false;
    for (size_t i = 0; i < n; ++i) {
      const BridgeRow &a = rows[i], &b = o.rows[i];
      if (a.base != b.base || a.rest != b.rest || a.where != b.where || a.what != b.what ||
          a.type != b.type || a.bytes != b.bytes)
        return false;
    }
    return true;
  }
};

// One line a bridge; the bridges of consecutive repeats of one block fold into one
// group of lines, `x12`.
void printBridges(const Module& m, std::ostream& out) {
  out << "bridges (per micro-batch, bytes each receiving device gets):\n";
  if (m.bridges.empty()) {
    out << "  none\n";
    return;
  }
  std::vector<BridgeUnit> units;
  for (const Bridge& b : m.bridges) {
    BridgeRow r = bridgeRow(m, b);
    if (!units.empty() && r.first >= 0 && units.back().first == r.first &&
        units.back().rows[0].base == r.base)
      units.back().rows.push_back(r);
    else
      units.push_back(BridgeUnit{{r}, r.first, r.first});
  }
  std::vector<BridgeUnit> folded;
  for (BridgeUnit& u : units) {
    // The last block of a stage adds the boundary's rows after the repeated ones.
    size_t n = folded.empty() ? 0 : folded.back().rows.size();
    if (!folded.empty() && folded.back().last + 1 == u.first && folded.back().repeatedBy(u, n)) {
      folded.back().last = u.first;
      if (u.rows.size() == n) continue;
      u.rows.erase(u.rows.begin(), u.rows.begin() + static_cast<std::ptrdiff_t>(n));
    }
    folded.push_back(u);
  }
  size_t whatWidth = 36; // wider where a row's summary is longer
  for (const BridgeUnit& u : folded)
    for (const BridgeRow& r : u.rows)
      whatWidth = std::max(whatWidth, r.what.size());
  for (const BridgeUnit& u : folded)
    for (const BridgeRow& r : u.rows) {
      bool many = u.first != u.last;
      std::string name =
          many ? fmt::format("{}.{}-{}{}", r.base, u.first, u.last, r.rest) : r.tensor;
      std::string times = many ? fmt::format(" x{}", u.last - u.first + 1) : "";
      out << fmt::format("  {:<12} {:<{}} {:<40} {:>10}{}  line {}\n", r.where, r.what, whatWidth,
                         name + " " + r.type, r.bytes, times, r.line);
    }
}

// A split stage's collectives of one micro-batch by the statement they serve (the line of
// the model, or of the repeated call, whose ops they feed or drain): forward and backward,
// each as counts and bytes by kind, with the split ops of that line as its label.
void printSplitTrafficByLine(const Module& m, const Program& p, std::ostream& out) {
  struct Side {
    std::map<std::string, std::pair<int, int64_t>> kinds; // "all-reduce" -> (count, bytes)
  };
  std::map<uint32_t, Side[2]> lines;
  std::map<uint32_t, std::vector<std::string>> labels;
  for (const Instr& in : p.step) {
    if (in.kind != InstrKind::Run || in.micro != 0) continue;
    auto c = m.splitCollective(p, in.op);
    if (!c) continue;
    const Op& op = m.ops[in.op];
    auto& [n, bytes] =
        lines[op.site.line][op.phase == Phase::Forward ? 0 : 1].kinds[collectiveName(c->kind)];
    ++n;
    bytes += c->kind == CollectiveKind::AllGather ? c->bytes * p.splitWidth : c->bytes;
  }
  if (lines.empty()) return;
  for (const Op& op : m.ops)
    if (op.phase == Phase::Forward && op.stage == p.stage && op.splitForm != SplitForm::None &&
        lines.count(op.site.line)) {
      std::vector<std::string>& l = labels[op.site.line];
      std::string kind = opInfo(builtinOf(op.kind)).name;
      if (std::find(l.begin(), l.end(), kind) == l.end()) l.push_back(kind);
    }
  out << "  by line (all-gathers: the gathered bytes):\n";
  for (const auto& [line, sides] : lines) {
    auto side = [&](const Side& s) {
      if (s.kinds.empty()) return std::string("-");
      std::vector<std::string> parts;
      for (const auto& [kind, v] : s.kinds)
        parts.push_back(fmt::format("{} {}{} ({})", v.first, kind, v.first == 1 ? "" : "s",
                                    formatBytes(static_cast<double>(v.second))));
      return fmt::format("{}", fmt::join(parts, ", "));
    };
    std::string label = labels.count(line) ? fmt::format(" {}", fmt::join(labels[line], ", ")) : "";
    out << fmt::format("    line {}{}: forward {}; backward {}\n", line, label, side(sides[0]),
                       side(sides[1]));
  }
}

// Each split stage's collectives per micro-batch and per step, from its first rank's
// program (every rank of a split group runs the same ones).
void printSplitTraffic(const Module& m, std::ostream& out) {
  std::vector<int> shown(m.mesh.stages.size(), 0);
  for (const Program& p : m.programs) {
    if (p.splitWidth == 1 || shown[p.stage]++) continue;
    Module::SplitTraffic t = m.splitTraffic(p);
    auto side = [&](int k) {
      std::string s = fmt::format("{} all-reduce{} ({}), {} all-gather{} ({})", t.allReduces[k],
                                  t.allReduces[k] == 1 ? "" : "s",
                                  formatBytes(static_cast<double>(t.allReduceBytes[k])),
                                  t.allGathers[k], t.allGathers[k] == 1 ? "" : "s",
                                  formatBytes(static_cast<double>(t.allGatherBytes[k])));
      if (t.allToAlls[k] > 0)
        s += fmt::format(", {} all-to-all{} (up to {})", t.allToAlls[k],
                         t.allToAlls[k] == 1 ? "" : "s",
                         formatBytes(static_cast<double>(t.allToAllBytes[k])));
      if (t.reduceScatters[k] > 0)
        s += fmt::format(", {} reduce-scatter{} ({})", t.reduceScatters[k],
                         t.reduceScatters[k] == 1 ? "" : "s",
                         formatBytes(static_cast<double>(t.reduceScatterBytes[k])));
      return s;
    };
    out << fmt::format("\nsplit communication of stage {} (groups of {} ranks), per micro-batch:\n",
                       p.stage, p.splitWidth);
    out << fmt::format("  forward: {}\n  backward: {}\n", side(0), side(1));
    out << fmt::format("  a ring sends {} from each rank a micro-batch, {} a step\n",
                       formatBytes(static_cast<double>(t.ringSendBytes)),
                       formatBytes(static_cast<double>(t.ringSendBytes * p.microBatches)));
    printSplitTrafficByLine(m, p, out);
  }
}

// The policy's `comm_dtype` word.
const char* wireName(DType d) {
  return d == DType::F32 ? "fp32" : d == DType::BF16 ? "bf16" : "fp16";
}

} // namespace

void printStageSection(const Module& m, int stage, std::ostream& out) {
  printStage(m, stage, out);
}

void printBridgeSection(const Module& m, std::ostream& out) {
  printBridges(m, out);
}

// What runs again in the backward (passes/Recompute.cpp): the recomputed blocks (each a
// run of Recompute ops before its backward), and sequence parallelism's gathers alone.
void printRecompute(const Module& m, std::ostream& out) {
  int blocks = 0, blockOps = 0, gathers = 0;
  for (size_t i = 0; i < m.ops.size();) {
    if (m.ops[i].phase != Phase::Recompute) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < m.ops.size() && m.ops[end].phase == Phase::Recompute)
      ++end;
    if (end - i == 1 && reduceScattersBackward(m.ops[i])) {
      ++gathers;
    } else {
      ++blocks;
      blockOps += static_cast<int>(end - i);
    }
    i = end;
  }
  // What the recomputations cost: their FLOPs over every rank's step.
  double again = 0, all = 0;
  for (const Program& p : m.programs) {
    Module::StepFlops f = m.stepFlops(p);
    again += f.recompute;
    all += f.total();
  }
  std::string cost = again > 0
                         ? fmt::format("; they cost {} a step over all ranks, {:.1f}% more compute",
                                       formatFlops(again), 100 * again / std::max(all - again, 1.0))
                         : "";
  const Module::AutoRecompute& a = m.autoRecompute;
  if (a.ran) {
    out << "\nrecompute = auto: ";
    if (a.budget <= 0)
      out << "nothing recomputed (set `device_memory` for a budget to fit)\n";
    else if (a.chosen == 0)
      out << fmt::format("nothing recomputed: the largest rank's memory plan ({}) fits "
                         "`device_memory` ({})\n",
                         formatBytes(a.peakWithout), formatBytes(a.budget));
    else
      out << fmt::format(
          "{} of {} blocks ({}{}) run their forward again before their backward: the largest "
          "rank's memory plan {}, {} `device_memory` ({})\n",
          a.chosen, a.blocks,
          fmt::join(a.names.begin(), a.names.begin() + std::min<long>(4, a.chosen), ", "),
          a.chosen > 4 ? ", …" : "",
          a.peakWith == a.peakWithout ? fmt::format("stays {}", formatBytes(a.peakWith))
                                      : fmt::format("is {} instead of {}", formatBytes(a.peakWith),
                                                    formatBytes(a.peakWithout)),
          a.peakWith <= a.budget ? "within" : "more than", formatBytes(a.budget));
    if (a.ran && a.chosen > 0 && !cost.empty()) out << "  " << cost.substr(2) << "\n";
  }
  std::string how = m.policy.recompute == Recompute::Listed
                        ? fmt::format("[{}]", fmt::join(m.policy.recomputeBlocks, ", "))
                        : "every";
  if (blocks > 0 && !a.ran)
    out << fmt::format("\nrecompute = {}: {} block{} run {} forward op{} again just before "
                       "their backward; each keeps only what it reads from outside{}\n",
                       how, blocks, blocks == 1 ? "" : "s", blockOps, blockOps == 1 ? "" : "s",
                       cost);
  if (gathers > 0)
    out << fmt::format("{}sequence parallelism: {} all-gather{} of sequence slices run{} again "
                       "in the backward; only the slices are kept\n",
                       blocks > 0 || a.ran ? "" : "\n", gathers, gathers == 1 ? "" : "s",
                       gathers == 1 ? "s" : "");
}

void printPlan(const Module& m, std::ostream& out) {
  const Mesh& mesh = m.mesh;
  int64_t total = 0;
  for (const auto& st : mesh.stages)
    total += st.paramCount;
  out << fmt::format("plan for model `{}` on {} device{}\n", m.modelName, mesh.np,
                     mesh.np == 1 ? "" : "s");
  int g = 1;
  for (const auto& st : mesh.stages)
    g = std::max(g, st.splitWidth);
  out << fmt::format(
      "mesh: {} data-parallel x {} stage{} x split {}{}; one replica = {} device{}{}\n",
      mesh.dataParallel, mesh.stages.size(), mesh.stages.size() == 1 ? "" : "s", g,
      g > 1 && m.policy.sequenceParallel ? " (sequence-parallel)" : "", mesh.replicaSize,
      mesh.replicaSize == 1 ? "" : "s",
      mesh.chunks == 1
          ? ""
          : fmt::format(" ({} chunks on each of {} pipeline ranks)", mesh.chunks, mesh.depth()));
  if (mesh.microBatch > 0)
    out << fmt::format("batch: {} = {} micro-batch{} x {} data-parallel x {} samples ({} = {})\n",
                       m.train.batch, m.policy.microBatches, m.policy.microBatches == 1 ? "" : "es",
                       mesh.dataParallel, mesh.microBatch, m.batchSymbol, mesh.microBatch);
  else
    out << fmt::format("batch: no `train` block; `{}` stays symbolic\n", m.batchSymbol);
  out << fmt::format("params: {} ({}, f32)\n", withCommas(total), formatBytes(4.0 * total));
  if (double sample = m.forwardFlopsPerSample(); sample > 0 && m.train.batch > 0)
    out << fmt::format("compute: {} a step in matrix products (forward {}, backward twice that; "
                       "{} a sample)\n",
                       formatFlops(3 * sample * static_cast<double>(m.train.batch)),
                       formatFlops(sample * static_cast<double>(m.train.batch)),
                       formatFlops(3 * sample));
  static const char* amp[] = {"fp32", "fp16", "bf16"};
  static const char* zero[] = {"none", "1 (optimizer states)", "2 (+ gradients)",
                               "3 (+ parameters)"};
  out << fmt::format("model states: {} with {}, ZeRO {}{}\n\n", amp[static_cast<int>(m.policy.amp)],
                     m.train.optimizer.kind, zero[static_cast<int>(m.policy.zero)],
                     m.policy.matmul == Matmul::Tf32 ? "; GPU matrix products in tf32" : "");
  for (size_t s = 0; s < mesh.stages.size(); ++s) {
    printStage(m, static_cast<int>(s), out);
    out << "\n";
  }
  printBridges(m, out);
  printSplitTraffic(m, out);
  printScheduleSection(m, out);
  printRecompute(m, out);
  std::vector<GradBucket> plain;        // the data-parallel buckets
  std::map<int, std::vector<int>> tied; // a weight tied across stages -> its stages
  std::map<int, int64_t> tiedBytes;     // ... -> what one copy's all-reduce carries
  for (const GradBucket& b : m.buckets) {
    if (!b.tied) {
      plain.push_back(b);
      continue;
    }
    tied[b.firstParam].push_back(b.stage);
    tiedBytes[b.firstParam] = m.wireBytes(b);
  }
  if (!plain.empty()) {
    int64_t bytes = 0;
    for (const GradBucket& b : plain)
      bytes += m.wireBytes(b);
    bool alike = std::all_of(plain.begin(), plain.end(),
                             [&](const GradBucket& b) { return b.ranks == plain[0].ranks; });
    bool scatter = m.zeroShardsGradients();
    out << fmt::format(
        "\ngradient reduction: {} in {} bucket{}, {} over {} in {}, {}\n",
        formatBytes(static_cast<double>(bytes)), plain.size(), plain.size() == 1 ? "" : "s",
        scatter ? "reduce-scattered to each rank's ZeRO slice in every micro-batch" : "summed",
        alike ? fmt::format("{} ranks", plain[0].ranks) : "each stage's ranks",
        wireName(m.policy.commDtype),
        m.policy.overlapComm ? "each started as soon as its gradients are final"
                             : "after the whole backward");
    // A pipeline: every stage's data-parallel group, and what it sums.
    for (size_t s = 0; mesh.stages.size() > 1 && s < mesh.stages.size(); ++s) {
      int64_t stageBytes = 0, count = 0;
      for (const GradBucket& b : plain)
        if (b.stage == static_cast<int>(s)) stageBytes += m.wireBytes(b), ++count;
      if (count == 0) continue;
      out << fmt::format("  stage {}: {} in {} bucket{} over ranks {}\n", s,
                         formatBytes(static_cast<double>(stageBytes)), count, count == 1 ? "" : "s",
                         stageRankRanges(mesh, static_cast<int>(s)));
    }
  }
  for (const auto& [q, stages] : tied) {
    std::vector<std::string> ranks;
    for (int s : stages)
      ranks.push_back(stageRankRanges(mesh, s));
    bool pieces = m.reducedOverPieces(q), scatter = m.zeroShardsGradients();
    out << fmt::format("{}tied weight @{}: one copy in each of stages {}, its gradients ({}{} in "
                       "{}) {}summed over {} ranks {} {}\n",
                       plain.empty() ? "\n" : "  ", m.params[q].name, fmt::join(stages, " and "),
                       formatBytes(static_cast<double>(tiedBytes.at(q))), pieces ? " a piece" : "",
                       wireName(m.policy.commDtype),
                       scatter ? "reduce-scattered over each stage's ranks in every micro-batch, "
                                 "then the slices (fp32) "
                               : "",
                       pieces ? "the ones holding the same piece among their" : "their",
                       fmt::join(ranks, "; "),
                       scatter ? "once a step" : "after each stage's backward");
  }
  out << "\nparameters per rank:\n";
  for (size_t s = 0; s < mesh.stages.size(); ++s) {
    const StagePlan& st = mesh.stages[s];
    out << fmt::format("  ranks {}: {} params, {} each; model states {} (stage {})\n",
                       stageRankRanges(mesh, static_cast<int>(s)), withCommas(st.rankParamCount),
                       formatBytes(st.rankParamBytes), formatBytes(st.modelStateBytes()), s);
  }
  printRankCompute(m, out);
  printRankMemory(m, out);
}

namespace {

// One line per run of consecutive ranks whose figures read the same.
void printByRanks(const Module& m, const std::function<std::string(const Program&)>& figures,
                  std::ostream& out) {
  size_t n = m.programs.size();
  for (size_t first = 0; first < n;) {
    std::string text = figures(m.programs[first]);
    size_t end = first + 1;
    while (end < n && figures(m.programs[end]) == text)
      ++end;
    out << (end - first == 1 ? fmt::format("  rank {}: {}\n", first, text)
                             : fmt::format("  ranks {}-{}: {}\n", first, end - 1, text));
    first = end;
  }
}

} // namespace

// The matrix-product FLOPs of each rank's step, and of the model's.
void printRankCompute(const Module& m, std::ostream& out) {
  if (m.programs.empty()) return;
  double model = 3 * m.forwardFlopsPerSample() * static_cast<double>(m.train.batch);
  out << fmt::format(
      "\ncompute per rank (matrix-product FLOPs a step{}):\n",
      model > 0 ? fmt::format("; the model's, all ranks together: {}", formatFlops(model)) : "");
  printByRanks(
      m,
      [&](const Program& p) {
        Module::StepFlops f = m.stepFlops(p);
        std::string text = fmt::format("{} = forward {} + backward {}", formatFlops(f.total()),
                                       formatFlops(f.forward), formatFlops(f.backward));
        if (f.recompute > 0) text += fmt::format(" + recomputed {}", formatFlops(f.recompute));
        return text;
      },
      out);
}

// What each rank's program allocates (the figures `epl run` checks against the machine and
// compares with what it measures), runs of consecutive ranks with the same figures on one
// line. Plans that do not run have no programs, and no such section.
void printRankMemory(const Module& m, std::ostream& out) {
  if (m.programs.empty()) return;
  out << "\nmemory per rank (what `epl run` allocates; `epl plan --rank R` places it):\n";
  auto figures = [&](const Program& p) {
    std::string text = fmt::format(
        "{} = activations {}{} + params {} + grads {} + optimizer {}", formatBytes(p.peakBytes()),
        formatBytes((p.slots == 1 ? p.arenaBytes : p.activationBytes()) + p.recvBytes),
        p.largestWorkspace() > 0
            ? fmt::format(" (kernel workspaces up to {})", formatBytes(p.largestWorkspace()))
            : "",
        formatBytes(p.paramBytes), formatBytes(p.gradBytes), formatBytes(p.optimizerBytes));
    if (p.stagingBytes > 0)
      text += fmt::format(" + staging {} ({} {})", formatBytes(p.stagingBytes),
                          formatBytes(p.offloadedBytes), m.offloadPlace());
    if (p.commBytes > 0) text += fmt::format(" + comm buffers {}", formatBytes(p.commBytes));
    if (p.inputBytes > 0) text += fmt::format(" + host inputs {}", formatBytes(p.inputBytes));
    return text;
  };
  printByRanks(m, figures, out);
  // Where the runtime holds more model states than the policy accounts above (beyond each
  // parameter's 64-byte alignment), say why.
  auto slack = static_cast<double>(3 * 64 * m.params.size());
  bool more = std::any_of(m.programs.begin(), m.programs.end(), [&](const Program& p) {
    int64_t held = p.paramBytes + p.gradBytes + p.optimizerBytes; // in memory
    return p.stage < static_cast<int>(m.mesh.stages.size()) &&
           static_cast<double>(held) > 1.01 * m.mesh.stages[p.stage].modelStateBytes() + slack;
  });
  if (more)
    out << "  (more model states than the stages above account: this runtime partitions them "
           "with ZeRO only where `epl run` says it applies)\n";
}

namespace {

// An op in the memory plan's rows: `block.0/mlp`, `block.0/mlp backward`.
std::string opLabel(const Module& m, int op) {
  const Op& o = m.ops[op];
  if (o.phase == Phase::Backward) return m.ops[o.forward].name + " backward";
  if (o.phase == Phase::Recompute) return o.name + " (recomputed)";
  return o.name;
}

std::string instrText(const Module& m, const Program& p, const Instr& in) {
  switch (in.kind) {
  case InstrKind::ZeroGrads:
    return "zero-grads";
  case InstrKind::Load:
    return fmt::format("load micro-batch {}", in.micro);
  case InstrKind::SeedGrad: {
    // An ignored class: times the micro-batch's weight by kept targets (Executor).
    const Op& loss = m.ops[m.tensors[m.outputs[0]].producer];
    std::string kept = loss.kind == OpKind::CrossEntropy && ignoredClass(&loss.attrs) >= 0
                           ? ", weighed by its kept targets"
                           : "";
    return p.dataRanks == 1
               ? fmt::format("seed-grad %{} = 1/micro_batches{}", m.tensors[m.lossGrad].name, kept)
               : fmt::format("seed-grad %{} = 1/(micro_batches x {} ranks){}",
                             m.tensors[m.lossGrad].name, p.dataRanks, kept);
  }
  case InstrKind::ReduceStart:
  case InstrKind::ReduceWait: {
    const GradBucket& b = m.buckets.at(in.bucket);
    if (in.kind == InstrKind::ReduceWait)
      return fmt::format("reduce-wait bucket {}{}", in.bucket, in.tie ? " (tied)" : "");
    std::string params =
        b.endParam - b.firstParam == 1
            ? "@" + m.params[b.firstParam].name
            : fmt::format("@{} … @{}", m.params[b.firstParam].name, m.params[b.endParam - 1].name);
    if (in.tie)
      return fmt::format("reduce-start bucket {} (tied): the gradient slices of {} ({} f32), "
                         "summed over the {} ranks of the stages holding it",
                         in.bucket, params, formatBytes(static_cast<double>(b.bytes)), b.ranks);
    int ranks = m.reductionRanks(p, b, false);
    return fmt::format(
        "reduce-start bucket {}: {} gradient{}, {} ({} {}), {} over {} ranks", in.bucket,
        b.endParam - b.firstParam, b.endParam - b.firstParam == 1 ? "" : "s", params,
        formatBytes(static_cast<double>(m.wireBytes(b))), wireName(m.policy.commDtype),
        m.zeroShardsGradients() ? "reduce-scattered" : "summed", ranks);
  }
  case InstrKind::GatherStart:
  case InstrKind::GatherWait: {
    const GradBucket& b = m.buckets.at(in.bucket);
    const char* use = in.use == 0 ? "forward" : "backward";
    if (in.kind == InstrKind::GatherWait)
      return fmt::format("gather-wait bucket {} ({})", in.bucket, use);
    size_t owners = m.bucketPieces(p).at(in.bucket).size();
    return fmt::format("gather-start bucket {} ({} of micro-batch {}): {} parameter{} from @{}, "
                       "{} from {} rank{}",
                       in.bucket, use, in.micro, b.endParam - b.firstParam,
                       b.endParam - b.firstParam == 1 ? "" : "s", m.params[b.firstParam].name,
                       formatBytes(static_cast<double>(b.bytes)), owners, owners == 1 ? "" : "s");
  }
  case InstrKind::Send:
  case InstrKind::Recv: {
    bool send = in.kind == InstrKind::Send;
    const char* what = m.ops.at(in.op).phase == Phase::Backward ? "gradient" : "activation";
    std::string rows =
        in.rows < 0 ? "" : fmt::format(" rows {}..{}", in.firstRow, in.firstRow + in.rows);
    return fmt::format("{} {} {}%{}{} of micro-batch {} {} rank {} (tag {})",
                       send ? "send" : "recv", what, in.accumulate ? "+" : "",
                       m.tensors[in.tensor].name, rows, in.micro, send ? "to" : "from", in.peer,
                       in.tag);
  }
  case InstrKind::Run:
    break;
  }
  const Op& op = m.ops[in.op];
  std::vector<std::string> outs;
  size_t inputs = op.phase == Phase::Backward ? m.ops[op.forward].inputs.size() : 0;
  for (size_t k = 0; k < op.outputs.size(); ++k)
    if (op.outputs[k] >= 0 && writesOutput(in.part, k, inputs))
      outs.push_back((k < op.accumulate.size() && op.accumulate[k] ? "+%" : "%") +
                     m.tensors[op.outputs[k]].name);
  static const char* part[] = {".backward", ".backward-inputs", ".backward-params"};
  std::string name =
      opInfo(op.kind).name + (op.phase == Phase::Backward    ? part[static_cast<int>(in.part)]
                              : op.phase == Phase::Recompute ? ".recompute"
                                                             : "");
  if (op.phase == Phase::Optimizer && op.kind == OpKind::OptimizerStep)
    name = fmt::format("{} @{}", op.name, m.params[op.params.at(0)].name);
  return fmt::format("{}{}", outs.empty() ? "" : fmt::format("{} = ", fmt::join(outs, ", ")), name);
}

} // namespace

void printProgram(const Module& m, int rank, std::ostream& out) {
  const Program& p = m.programs.at(rank);
  out << fmt::format("rank {}: one step, {} micro-batch{}", rank, m.policy.microBatches,
                     m.policy.microBatches == 1 ? "" : "es");
  if (p.stages > 1) out << fmt::format(", pipeline stage {} of {}", p.stage, p.stages);
  if (p.stages > 1 && p.dataRanks > 1)
    out << fmt::format(" (one of its {} ranks, {}{} samples a micro-batch)", p.dataRanks,
                       p.readsWhole ? "each reading its copy's " : "", p.localBatch);
  if (p.splitWidth > 1)
    out << fmt::format(", split rank {} of {} (ranks {}-{})", p.splitRank, p.splitWidth,
                       rank - p.splitRank, rank - p.splitRank + p.splitWidth - 1);
  out << "\n";
  for (size_t i = 0; i < p.step.size(); ++i)
    out << fmt::format("  {:4}  {}\n", i, instrText(m, p, p.step[i]));
  out << fmt::format("evaluation: {} instructions (load, then the forward ops)\n", p.eval.size());
  std::string activations =
      p.slots == 1 ? formatBytes(p.arenaBytes)
                   : fmt::format("{} slots x {}", p.slots, formatBytes(p.slotStride()));
  if (p.sharedBytes > 0) activations += fmt::format(" + shared {}", formatBytes(p.sharedBytes));
  if (p.recvBytes > 0)
    activations += fmt::format(" + receive buffers {}", formatBytes(p.recvBytes));
  std::string offload =
      p.stagingBytes > 0
          ? fmt::format(" + staging {} (optimizer states {}: {})", formatBytes(p.stagingBytes),
                        m.offloadPlace(), formatBytes(p.offloadedBytes))
          : "";
  auto buckets = std::count_if(p.bucketOffset.begin(), p.bucketOffset.end(),
                               [](int64_t at) { return at >= 0; });
  std::vector<std::string> within;
  if (buckets > 0)
    within.push_back(fmt::format("with {} gradient bucket{}", buckets, buckets == 1 ? "" : "s"));
  if (p.largestWorkspace() > 0)
    within.push_back(fmt::format("kernel workspaces up to {}", formatBytes(p.largestWorkspace())));
  if (!within.empty()) activations += fmt::format(" ({})", fmt::join(within, "; "));
  std::string comm =
      p.commBytes > 0 ? fmt::format(" + comm buffers {}", formatBytes(p.commBytes)) : "";
  if (p.inputBytes > 0) comm += fmt::format(" + host inputs {}", formatBytes(p.inputBytes));
  out << fmt::format(
      "memory plan: {} = activations {} + params {} + grads {}{} + optimizer {}{}{}\n",
      formatBytes(p.peakBytes()), activations, formatBytes(p.paramBytes), formatBytes(p.gradBytes),
      p.bucketOffset.empty() ? "" : " (ZeRO slice)", formatBytes(p.optimizerBytes), offload, comm);
  // What sits in the arena: tensors (by id), with ZeRO stage 2 gradient buckets (by id past
  // the tensors'), stage 3's gathered parameters (past those), and kernels' workspaces
  // (past those): the memory plan's ids.
  // (p.offset holds the buckets' and gathered blocks' offsets too, past the tensors'.)
  size_t tensors = std::min(p.offset.size(), m.tensors.size()),
         gathers = tensors + p.bucketOffset.size(), works = gathers + p.gatherOffset.size();
  auto offset = [&](size_t i) {
    return i < tensors   ? p.offset[i]
           : i < gathers ? p.bucketOffset[i - tensors]
           : i < works   ? p.gatherOffset[i - gathers]
                         : p.workspaces[i - works].offset;
  };
  auto shared = [&](size_t i) {
    return i < works ? p.isShared(static_cast<int>(i)) : p.workspaces[i - works].shared;
  };
  std::vector<size_t> placed;
  for (size_t i = 0; i < works + p.workspaces.size(); ++i)
    if (offset(i) >= 0) placed.push_back(i);
  // A slot's tensors, then the shared region's (offsets from its start).
  std::sort(placed.begin(), placed.end(), [&](size_t a, size_t b) {
    if (shared(a) != shared(b)) return shared(b);
    return offset(a) != offset(b) ? offset(a) < offset(b) : a < b;
  });
  out << "  offset      bytes  tensor\n";
  for (size_t i : placed)
    if (i < tensors)
      out << fmt::format("  {:>9}  {:>9}  %{}{}\n", offset(i), m.bytesOn(p, static_cast<int>(i)),
                         m.tensors[i].name, shared(i) ? "  (shared)" : "");
    else if (i < gathers)
      out << fmt::format("  {:>9}  {:>9}  gradient bucket {}{}\n", offset(i),
                         p.bucketBytes[i - tensors], i - tensors, shared(i) ? "  (shared)" : "");
    else if (i < works)
      out << fmt::format("  {:>9}  {:>9}  parameters of bucket {}, gathered for the {}{}\n",
                         offset(i), p.bucketBytes[(i - gathers) / 2], (i - gathers) / 2,
                         (i - gathers) % 2 == 0 ? "forward" : "backward",
                         shared(i) ? "  (shared)" : "");
    else
      out << fmt::format("  {:>9}  {:>9}  workspace of {}{}{}\n", offset(i),
                         p.workspaces[i - works].bytes, opLabel(m, p.workspaces[i - works].op),
                         p.workspaces[i - works].part == BackwardPart::Inputs   ? " (B)"
                         : p.workspaces[i - works].part == BackwardPart::Params ? " (W)"
                                                                                : "",
                         shared(i) ? "  (shared)" : "");
}

} // namespace epl::ir
