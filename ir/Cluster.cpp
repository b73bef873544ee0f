// Built-in clusters and the cluster file (ir/Cluster.h, docs/cluster.md).
#include "ir/Cluster.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace epl::ir {

namespace {

// NVIDIA's data sheets: dense peaks (no sparsity), NVLink bandwidth each way per GPU (600
// and 900 GB/s both ways), one InfiniBand NIC per GPU (200 and 400 Gb/s).
Cluster dgxA100() {
  Cluster c;
  c.name = "dgx-a100";
  c.devicesPerNode = 8;
  c.device = {"A100-SXM4-80GB", 80e9, 2.039e12, 19.5e12, 312e12, 312e12, 0.75, 0.8, {}, {}};
  c.device.peakTf32 = 156e12;
  c.intraNode = {300e9, 5e-6};
  c.interNode = {25e9, 10e-6};
  c.hostLink = {32e9, 10e-6}; // PCIe 4.0 x16
  return c;
}

Cluster dgxH100() {
  Cluster c;
  c.name = "dgx-h100";
  c.devicesPerNode = 8;
  c.device = {"H100-SXM5-80GB", 80e9, 3.35e12, 67e12, 989e12, 989e12, 0.75, 0.8, {}, {}};
  c.device.peakTf32 = 494.7e12;
  c.intraNode = {450e9, 5e-6};
  c.interNode = {50e9, 10e-6};
  c.hostLink = {64e9, 10e-6}; // PCIe 5.0 x16
  return c;
}

// The H100's compute with HBM3e: 141 GB at 4.8 TB/s.
Cluster dgxH200() {
  Cluster c = dgxH100();
  c.name = "dgx-h200";
  c.device.name = "H200-SXM5-141GB";
  c.device.memoryBytes = 141e9;
  c.device.memoryBandwidth = 4.8e12;
  return c;
}

using json = nlohmann::json;

// A positive number at `key` of `obj`, or the error naming where it is missing.
bool number(const json& obj, const std::string& where, const char* key, bool required, double& out,
            std::string& error) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) error = fmt::format("{}: `{}` is missing", where, key);
    return !required;
  }
  if (!it->is_number() || it->get<double>() <= 0) {
    error = fmt::format("{}: `{}` must be a positive number, got {}", where, key, it->dump());
    return false;
  }
  out = it->get<double>();
  return true;
}

bool checkKeys(const json& obj, const std::string& where, std::initializer_list<const char*> keys,
               std::string& error) {
  if (!obj.is_object()) {
    error = fmt::format("{}: must be an object", where);
    return false;
  }
  for (const auto& [key, value] : obj.items()) {
    bool known = false;
    for (const char* k : keys)
      known = known || key == k;
    if (!known) {
      error = fmt::format("{}: unknown field `{}`", where, key);
      return false;
    }
  }
  return true;
}

bool link(const json& obj, const std::string& where, Link& out, std::string& error) {
  return checkKeys(obj, where, {"bandwidth", "latency", "send_bandwidth", "send_latency"}, error) &&
         number(obj, where, "bandwidth", true, out.bandwidth, error) &&
         number(obj, where, "latency", true, out.latency, error) &&
         number(obj, where, "send_bandwidth", false, out.sendBandwidth, error) &&
         number(obj, where, "send_latency", false, out.sendLatency, error);
}

// A device object (docs/cluster.md's `device` fields); `attention` is its default kernel.
bool device(const json& d, const std::string& where, ClusterDevice::Attention attention,
            ClusterDevice& out, std::string& error) {
  if (!checkKeys(d, where,
                 {"name", "memory_bytes", "memory_bandwidth", "peak_flops", "matmul_efficiency",
                  "memory_efficiency", "attention", "tiles_up_to"},
                 error))
    return false;
  out.name = d.value("name", "device");
  if (!number(d, where, "memory_bytes", true, out.memoryBytes, error) ||
      !number(d, where, "memory_bandwidth", true, out.memoryBandwidth, error) ||
      !number(d, where, "matmul_efficiency", false, out.matmulEfficiency, error) ||
      !number(d, where, "memory_efficiency", false, out.memoryEfficiency, error))
    return false;
  if (out.matmulEfficiency > 1 || out.memoryEfficiency > 1) {
    error = fmt::format("{}: an efficiency is a share of the peak, at most 1", where);
    return false;
  }
  out.attention = attention;
  if (d.contains("attention")) {
    const json& a = d["attention"];
    if (a != "scores" && a != "tiles") {
      error = fmt::format("{}: `attention` is \"scores\" or \"tiles\", got {}", where, a.dump());
      return false;
    }
    out.attention =
        a == "tiles" ? ClusterDevice::Attention::Tiles : ClusterDevice::Attention::Scores;
  }
  if (d.contains("tiles_up_to")) {
    double width = 0;
    if (!number(d, where, "tiles_up_to", true, width, error)) return false;
    if (width != static_cast<double>(static_cast<int64_t>(width)) ||
        out.attention != ClusterDevice::Attention::Tiles) {
      error = fmt::format("{}: `tiles_up_to` is the widest head a tiling attention kernel "
                          "(`\"attention\": \"tiles\"`) tiles, a whole number",
                          where);
      return false;
    }
    out.tilesUpTo = static_cast<int64_t>(width);
  }
  if (!d.contains("peak_flops")) {
    error = fmt::format("{}: `peak_flops` is missing", where);
    return false;
  }
  const json& p = d["peak_flops"];
  std::string peaks = where + ".peak_flops";
  if (!checkKeys(p, peaks, {"f32", "tf32", "bf16", "fp16"}, error) ||
      !number(p, peaks, "f32", true, out.peakF32, error))
    return false;
  out.peakBf16 = out.peakF16 = out.peakF32;
  return number(p, peaks, "tf32", false, out.peakTf32, error) &&
         number(p, peaks, "bf16", false, out.peakBf16, error) &&
         number(p, peaks, "fp16", false, out.peakF16, error);
}

// `device_groups`: a list of {"devices": n, "device": {...}}, ranks filling them in order.
bool deviceGroups(const json& list, const std::string& where, ClusterDevice::Attention attention,
                  std::vector<Cluster::DeviceGroup>& out, std::string& error) {
  if (!list.is_array() || list.empty()) {
    error =
        fmt::format("{}: must be a list of groups, {{\"devices\": n, \"device\": {{…}}}}", where);
    return false;
  }
  for (size_t i = 0; i < list.size(); ++i) {
    std::string at = fmt::format("{}[{}]", where, i);
    const json& g = list[i];
    double n = 0;
    if (!checkKeys(g, at, {"devices", "device"}, error) ||
        !number(g, at, "devices", true, n, error))
      return false;
    if (n != static_cast<int>(n)) {
      error = fmt::format("{}: `devices` is a whole number, got {}", at, g["devices"].dump());
      return false;
    }
    if (!g.contains("device")) {
      error = fmt::format("{}: `device` is missing", at);
      return false;
    }
    Cluster::DeviceGroup group;
    group.count = static_cast<int>(n);
    if (!device(g["device"], at + ".device", attention, group.device, error)) return false;
    out.push_back(group);
  }
  return true;
}

// The entry of a non-empty by-threads map for `threads`: the most threads measured up to
// it, else the fewest measured.
template <class T> const T& atThreads(const std::map<int, T>& byThreads, int threads) {
  const T* found = &byThreads.begin()->second;
  for (const auto& [t, value] : byThreads)
    if (t <= threads) found = &value;
  return *found;
}

// The measured rate at the most threads measured up to `threads` (0 when none was).
double rateAt(const std::map<int, double>& rates, int threads) {
  return rates.empty() ? 0 : atThreads(rates, threads);
}

// `count`: what the keys count (threads; ranks for gemm_side_by_side).
bool rates(const json& obj, const std::string& where, std::map<int, double>& out,
           std::string& error, const std::string& count = "thread") {
  if (!obj.is_object() || obj.empty()) {
    error = fmt::format("{}: must map {} counts to rates", where, count);
    return false;
  }
  for (const auto& [key, value] : obj.items()) {
    int n = std::atoi(key.c_str());
    if (n <= 0 || std::to_string(n) != key || !value.is_number() || value.get<double>() <= 0) {
      error = fmt::format("{}: `{}`: {} is not a {} count and a positive rate", where, key,
                          value.dump(), count);
      return false;
    }
    out[n] = value.get<double>();
  }
  return true;
}

std::optional<GemmLayout> parseGemmLayout(const std::string& name) {
  for (GemmLayout l : {GemmLayout::ABt, GemmLayout::AB, GemmLayout::AtB})
    if (name == gemmLayoutName(l)) return l;
  return std::nullopt;
}

// The grid `epl calibrate` measured at each thread count:
// {"1": [[m, n, k, FLOP/s, layout], …]}.
bool shapeRates(const json& obj, const std::string& where,
                std::map<int, std::vector<ClusterDevice::ShapeRate>>& out, std::string& error) {
  if (!obj.is_object()) {
    error =
        fmt::format("{}: must map thread counts to [m, n, k, FLOP/s, layout, type] rows", where);
    return false;
  }
  for (const auto& [key, rows] : obj.items()) {
    int threads = std::atoi(key.c_str());
    bool ok = threads > 0 && std::to_string(threads) == key && rows.is_array();
    for (const json& r : ok ? rows : json::array()) {
      // The layout is optional (files of earlier versions timed A B^T alone), and so is the
      // type (f32; "bf16" where the CPU multiplies bf16 as it is).
      ok = ok && r.is_array() && r.size() >= 4 && r.size() <= 6;
      for (size_t i = 0; ok && i < 4; ++i)
        ok = r[i].is_number() && r[i].get<double>() > 0;
      std::optional<GemmLayout> layout = GemmLayout::ABt;
      if (ok && r.size() >= 5)
        layout = r[4].is_string() ? parseGemmLayout(r[4].get<std::string>()) : std::nullopt;
      std::optional<DType> type = DType::F32;
      if (ok && r.size() == 6)
        type = r[5].is_string() ? parseDType(r[5].get<std::string>()) : std::nullopt;
      ok = ok && layout && (type == DType::F32 || type == DType::BF16);
      if (ok)
        out[threads].push_back({r[0].get<double>(), r[1].get<double>(), r[2].get<double>(),
                                r[3].get<double>(), *layout, *type});
    }
    if (!ok) {
      error = fmt::format("{}: `{}`: not a thread count and [m, n, k, FLOP/s, layout, type] "
                          "rows of positive numbers, \"ABt\", \"AB\" or \"AtB\", and "
                          "\"f32\" or \"bf16\"",
                          where, key);
      return false;
    }
  }
  return true;
}

// conv2d's rates `epl calibrate` measured: {"1": [[C, Co, side, K, forward, backward,
// weights FLOP/s], …]}.
bool convRates(const json& obj, const std::string& where,
               std::map<int, std::vector<ClusterDevice::ConvRate>>& out, std::string& error) {
  bool ok = obj.is_object();
  std::string key;
  static const json none = json::object();
  for (const auto& item : (ok ? obj : none).items()) {
    key = item.key();
    int threads = std::atoi(key.c_str());
    ok = threads > 0 && std::to_string(threads) == key && item.value().is_array();
    for (const json& r : ok ? item.value() : json::array()) {
      ok = ok && r.is_array() && r.size() == 7;
      for (size_t i = 0; ok && i < 7; ++i)
        ok = r[i].is_number() && r[i].get<double>() > 0;
      if (ok)
        out[threads].push_back({r[0].get<double>(), r[1].get<double>(), r[2].get<double>(),
                                r[3].get<double>(), r[4].get<double>(), r[5].get<double>(),
                                r[6].get<double>()});
    }
    if (!ok) break;
  }
  if (!ok)
    error = fmt::format("{}: {}must map thread counts to [channels, out_channels, side, kernel, "
                        "forward, backward, weights FLOP/s] rows of positive numbers",
                        where, key.empty() ? "" : fmt::format("`{}`: ", key));
  return ok;
}

// Where v falls between the grid's values along one axis, in logarithms: the two values'
// indices and v's weight on the second (clamped to the grid's ends).
struct Bracket {
  size_t lo = 0, hi = 0;
  double w = 0;
};
Bracket bracket(const std::vector<double>& axis, double v) {
  Bracket b;
  if (v <= axis.front()) return b;
  if (v >= axis.back()) return {axis.size() - 1, axis.size() - 1, 0};
  while (b.hi + 1 < axis.size() && axis[b.hi] < v)
    ++b.hi;
  b.lo = b.hi - 1;
  b.w = std::log(v / axis[b.lo]) / std::log(axis[b.hi] / axis[b.lo]);
  return b;
}

} // namespace

double curveAt(const std::vector<std::pair<double, double>>& curve, double bytes) {
  if (bytes <= curve.front().first) return curve.front().second;
  if (bytes >= curve.back().first) return curve.back().second;
  size_t hi = 1;
  while (curve[hi].first < bytes)
    ++hi;
  const auto& [x0, y0] = curve[hi - 1];
  const auto& [x1, y1] = curve[hi];
  double w = std::log(bytes / x0) / std::log(x1 / x0);
  return std::exp((1 - w) * std::log(y0) + w * std::log(y1));
}

namespace {

// The curves `epl calibrate` measured: {"1": [[bytes, bytes/s], …]}, ascending in bytes.
bool sizeRates(const json& obj, const std::string& where,
               std::map<int, std::vector<std::pair<double, double>>>& out, std::string& error) {
  bool ok = obj.is_object() && !obj.empty();
  for (const auto& [key, rows] : obj.items()) {
    if (!ok) break;
    int threads = std::atoi(key.c_str());
    ok = threads > 0 && std::to_string(threads) == key && rows.is_array() && !rows.empty();
    for (const json& r : ok ? rows : json::array()) {
      ok = ok && r.is_array() && r.size() == 2 && r[0].is_number() && r[1].is_number() &&
           r[0].get<double>() > 0 && r[1].get<double>() > 0 &&
           (out[threads].empty() || out[threads].back().first < r[0].get<double>());
      if (ok) out[threads].push_back({r[0].get<double>(), r[1].get<double>()});
    }
  }
  if (!ok)
    error = fmt::format("{}: must map thread counts to [bytes, bytes/s] rows of positive "
                        "numbers, ascending in bytes",
                        where);
  return ok;
}

} // namespace

double ClusterDevice::bandwidthFor(double bytes) const {
  return bandwidthBySize.empty() ? memoryBandwidth : curveAt(bandwidthBySize, bytes);
}

void ClusterDevice::GemmGrid::add(double mv, double nv, double kv, double r) {
  m.push_back(mv), n.push_back(nv), k.push_back(kv);
  rate[{mv, nv, kv}] = r;
}

void ClusterDevice::GemmGrid::sortAxes() {
  for (std::vector<double>* axis : {&m, &n, &k}) {
    std::sort(axis->begin(), axis->end());
    axis->erase(std::unique(axis->begin(), axis->end()), axis->end());
  }
}

double ClusterDevice::GemmGrid::at(double mv, double nv, double kv) const {
  if (empty()) return 0;
  Bracket bm = bracket(m, mv), bn = bracket(n, nv), bk = bracket(k, kv);
  double sum = 0, weights = 0;
  for (int c = 0; c < 8; ++c) {
    double w = (c & 1 ? bm.w : 1 - bm.w) * (c & 2 ? bn.w : 1 - bn.w) * (c & 4 ? bk.w : 1 - bk.w);
    auto it =
        rate.find({m[c & 1 ? bm.hi : bm.lo], n[c & 2 ? bn.hi : bn.lo], k[c & 4 ? bk.hi : bk.lo]});
    if (w <= 0 || it == rate.end()) continue;
    sum += w * std::log(it->second);
    weights += w;
  }
  return weights > 0 ? std::exp(sum / weights) : 0;
}

void ClusterDevice::setGemmRates(const std::vector<ShapeRate>& rows) {
  std::array<GemmGrid, 3> grids, bf16;
  for (const ShapeRate& s : rows)
    (s.type == DType::BF16 ? bf16 : grids)[static_cast<size_t>(s.layout)].add(s.m, s.n, s.k,
                                                                              s.rate);
  for (auto* set : {&grids, &bf16})
    for (GemmGrid& g : *set)
      g.sortAxes();
  gemmGrids = std::move(grids);
  bf16Grids = std::move(bf16);
}

double ClusterDevice::matmulRate(const Product& p, DType compute, bool tf32) const {
  const std::array<GemmGrid, 3>& grids =
      compute == DType::BF16 && !bf16Grids[static_cast<size_t>(GemmLayout::ABt)].empty()
          ? bf16Grids
          : gemmGrids;
  const GemmGrid* grid = &grids[static_cast<size_t>(p.layout)];
  if (grid->empty()) grid = &grids[static_cast<size_t>(GemmLayout::ABt)];
  double rate = grid->at(p.m, p.n, p.k);
  return rate > 0 ? rate : peak(compute, tf32) * matmulEfficiency;
}

void ClusterDevice::setConvRates(const std::vector<ConvRate>& rows) {
  std::array<GemmGrid, 3> grids;
  for (const ConvRate& r : rows) {
    double plane = r.side * r.side, ckk = r.c * r.k * r.k;
    grids[static_cast<size_t>(ConvPass::Forward)].add(r.co, plane, ckk, r.forward);
    grids[static_cast<size_t>(ConvPass::Backward)].add(r.co, plane, ckk, r.backward);
    grids[static_cast<size_t>(ConvPass::Weights)].add(r.co, plane, ckk, r.weights);
  }
  for (GemmGrid& g : grids)
    g.sortAxes();
  convGrids = std::move(grids);
}

double ClusterDevice::convRate(ConvPass pass, double co, double plane, double ckk) const {
  return convGrids[static_cast<size_t>(pass)].at(co, plane, ckk);
}

Cluster Cluster::forRanks(int np, int requested) const {
  if (!calibration || calibration->cores <= 0 || np <= 0) return *this;
  const Calibration& k = *calibration;
  Cluster c = *this;
  int threads = requested > 0 ? std::min(requested, k.cores) : std::max(1, k.cores / np);
  // More threads than cores (more ranks than cores, or more threads asked for): each rank
  // gets its share of the cores.
  double share = std::min(1.0, static_cast<double>(k.cores) / (static_cast<double>(np) * threads));
  // The ranks running at once do not each reach a rank's rate alone: a machine whose cores
  // share their vector units, caches or power runs n ranks of t threads below n times t
  // threads' rate. Where `epl calibrate` ran ranks side by side, each gets the share of
  // their rate that a rank of theirs lost (of the fewest measured at least as many as run
  // here, else the most); otherwise no more than what their threads reach together in one
  // process (past the most threads measured, taken to grow with the threads).
  int running = std::min(np, k.cores), used = std::min(k.cores, running * threads);
  double alone = rateAt(k.gemmFlops, threads), together = 1;
  auto side = k.gemmSideBySide.lower_bound(running);
  if (side == k.gemmSideBySide.end() && !k.gemmSideBySide.empty()) side = std::prev(side);
  auto past = k.gemmFlops.upper_bound(used);
  if (running > 1 && side != k.gemmSideBySide.end()) {
    const auto& [ranks, rate] = *side;
    double each = rateAt(k.gemmFlops, std::max(1, k.cores / ranks));
    if (each > 0) together = std::min(1.0, rate / ranks / each);
  } else if (alone > 0 && past != k.gemmFlops.begin()) {
    const auto& [most, rate] = *std::prev(past);
    together = std::min(1.0, rate * used / most / running / alone);
  }
  double gemm = alone * together * share;
  // The ranks running at once (as many as the cores) cannot pass what all the cores reach;
  // each runs its share of the time.
  double memory = std::min(rateAt(k.memoryBandwidth, threads),
                           rateAt(k.memoryBandwidth, k.cores) / std::min(np, k.cores)) *
                  share;
  c.device.peakF32 = c.device.peakBf16 = c.device.peakF16 = gemm;
  std::vector<ClusterDevice::ShapeRate> rows;
  if (!k.gemmByShape.empty()) rows = atThreads(k.gemmByShape, threads);
  for (ClusterDevice::ShapeRate& s : rows)
    s.rate *= together * share;
  c.device.setGemmRates(rows);
  std::vector<ClusterDevice::ConvRate> convs;
  if (!k.convByShape.empty()) convs = atThreads(k.convByShape, threads);
  for (ClusterDevice::ConvRate& r : convs)
    for (double* rate : {&r.forward, &r.backward, &r.weights})
      *rate *= together * share;
  c.device.setConvRates(convs);
  c.device.memoryBandwidth = memory;
  // The ranks share the cache as they share the cores.
  if (k.cacheBytes > 0 && !k.cacheBandwidth.empty()) {
    c.device.cacheBytes = k.cacheBytes / std::min(np, k.cores);
    c.device.cacheBandwidth = rateAt(k.cacheBandwidth, threads) * share;
  }
  // The ranks running at once move n sets together: each at most 1/n of the rate all the
  // cores reach over n times its set, its share of the time.
  if (!k.bandwidthBySize.empty()) {
    int n = std::min(np, k.cores);
    const auto& all = atThreads(k.bandwidthBySize, k.cores);
    for (const auto& [bytes, rate] : atThreads(k.bandwidthBySize, threads))
      c.device.bandwidthBySize.push_back(
          {bytes, std::min(rate, curveAt(all, bytes * n) / n) * share});
  }
  c.device.matmulEfficiency = c.device.memoryEfficiency = 1;
  c.overlapsCompute = false;
  c.coreShare = share;
  c.device.name =
      fmt::format("{} ({} thread{} a rank)", device.name, threads, threads == 1 ? "" : "s");
  c.devicesPerNode = std::max(np, c.devicesPerNode); // every rank on this machine
  return c;
}

int Cluster::deviceCount() const {
  int n = 0;
  for (const DeviceGroup& g : groups)
    n += g.count;
  return n;
}

int Cluster::groupOf(int rank) const {
  for (size_t g = 0; g < groups.size(); ++g) {
    if (rank < groups[g].count) return static_cast<int>(g);
    rank -= groups[g].count;
  }
  return groups.empty() ? 0 : static_cast<int>(groups.size()) - 1;
}

std::string Cluster::devicesName() const {
  if (groups.empty()) return device.name;
  std::vector<std::string> parts;
  for (const DeviceGroup& g : groups)
    parts.push_back(fmt::format("{} x {}", g.count, g.device.name));
  return fmt::format("{}", fmt::join(parts, " + "));
}

std::string Cluster::tooFew(int np) const {
  int n = deviceCount();
  if (n == 0 || np <= n) return "";
  return fmt::format("the plan needs {} devices and cluster `{}` has {} ({})", np, name, n,
                     devicesName());
}

std::string hereClusterPath() {
  if (const char* p = std::getenv("EPL_CLUSTER_HERE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x)
    return std::string(x) + "/epl/here.json";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.config/epl/here.json";
}

std::vector<std::string> builtinClusterNames() {
  return {"dgx-a100", "dgx-h100", "dgx-h200"};
}

std::optional<std::string> builtinClusterForGpu(const std::string& gpu) {
  auto has = [&](const char* text) { return gpu.find(text) != std::string::npos; };
  // CUDA's names: "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3" (the SXM part; the PCIe
  // and NVL ones say so, and have other peaks and bandwidths), "NVIDIA H200".
  if (has("A100-SXM4-80GB")) return "dgx-a100";
  if (has("H100 80GB HBM3")) return "dgx-h100";
  if (has("H200") && !has("NVL")) return "dgx-h200";
  return std::nullopt;
}

std::optional<Cluster> parseCluster(const std::string& text, const std::string& source,
                                    std::string& error) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    error = fmt::format("{}: not valid JSON", source);
    return std::nullopt;
  }
  Cluster c;
  if (!checkKeys(j, source,
                 {"name", "devices_per_node", "nodes", "device", "device_groups", "intra_node",
                  "inter_node", "host_link", "disk_bandwidth", "calibration"},
                 error))
    return std::nullopt;
  c.name = j.value("name", source);
  double perNode = 1, nodes = 0;
  if (!number(j, source, "devices_per_node", true, perNode, error) ||
      !number(j, source, "nodes", false, nodes, error))
    return std::nullopt;
  if (perNode != static_cast<int>(perNode) || nodes != static_cast<int>(nodes)) {
    error = fmt::format("{}: `devices_per_node` and `nodes` are whole numbers", source);
    return std::nullopt;
  }
  c.devicesPerNode = static_cast<int>(perNode);
  c.nodes = static_cast<int>(nodes);
  bool groups = j.contains("device_groups");
  if (groups && j.contains("device")) {
    error = fmt::format("{}: `device` and `device_groups` are two ways to say the same: give one",
                        source);
    return std::nullopt;
  }
  if (!(j.contains("device") || groups) || !j.contains("intra_node")) {
    error = fmt::format("{}: `{}` is missing", source,
                        j.contains("device") || groups ? "intra_node" : "device");
    return std::nullopt;
  }
  // A calibrated machine is this one: the CPU kernel's tiles; a described device a GPU's.
  ClusterDevice::Attention attention = j.contains("calibration") ? ClusterDevice::Attention::Tiles
                                                                 : ClusterDevice::Attention::Scores;
  if (groups && j.contains("calibration")) {
    error = fmt::format("{}: a calibrated machine (`calibration`) is one kind of device: "
                        "`device`, not `device_groups`",
                        source);
    return std::nullopt;
  }
  if (groups) {
    if (!deviceGroups(j["device_groups"], source + ": device_groups", attention, c.groups, error))
      return std::nullopt;
    c.device = c.groups[0].device;
  } else if (!device(j["device"], source + ": device", attention, c.device, error)) {
    return std::nullopt;
  }
  if (!link(j["intra_node"], source + ": intra_node", c.intraNode, error)) return std::nullopt;
  c.interNode = c.intraNode;
  if (j.contains("inter_node") &&
      !link(j["inter_node"], source + ": inter_node", c.interNode, error))
    return std::nullopt;
  if ((j.contains("host_link") &&
       !link(j["host_link"], source + ": host_link", c.hostLink, error)) ||
      !number(j, source, "disk_bandwidth", false, c.diskBandwidth, error))
    return std::nullopt;
  if (j.contains("host_link") && j.contains("calibration")) {
    error = fmt::format("{}: a calibrated machine's device is its CPU, whose memory is the "
                        "host's: it has no `host_link`",
                        source);
    return std::nullopt;
  }
  if (j.contains("calibration")) {
    const json& k = j["calibration"];
    std::string at = source + ": calibration";
    Calibration cal;
    double cores = 0;
    if (!checkKeys(k, at,
                   {"cores", "gemm_flops", "memory_bandwidth", "gemm_by_shape", "conv_by_shape",
                    "cache_bytes", "cache_bandwidth", "bandwidth_by_size", "gemm_side_by_side"},
                   error) ||
        !number(k, at, "cores", true, cores, error) ||
        !number(k, at, "cache_bytes", false, cal.cacheBytes, error) ||
        !rates(k.value("gemm_flops", json::object()), at + ".gemm_flops", cal.gemmFlops, error) ||
        !rates(k.value("memory_bandwidth", json::object()), at + ".memory_bandwidth",
               cal.memoryBandwidth, error))
      return std::nullopt;
    if (k.contains("gemm_by_shape") &&
        !shapeRates(k["gemm_by_shape"], at + ".gemm_by_shape", cal.gemmByShape, error))
      return std::nullopt;
    if (k.contains("conv_by_shape") &&
        !convRates(k["conv_by_shape"], at + ".conv_by_shape", cal.convByShape, error))
      return std::nullopt;
    if (k.contains("gemm_side_by_side") && !rates(k["gemm_side_by_side"], at + ".gemm_side_by_side",
                                                  cal.gemmSideBySide, error, "rank"))
      return std::nullopt;
    if (k.contains("cache_bandwidth") &&
        !rates(k["cache_bandwidth"], at + ".cache_bandwidth", cal.cacheBandwidth, error))
      return std::nullopt;
    if (k.contains("bandwidth_by_size") &&
        !sizeRates(k["bandwidth_by_size"], at + ".bandwidth_by_size", cal.bandwidthBySize, error))
      return std::nullopt;
    cal.cores = static_cast<int>(cores);
    c.calibration = cal;
    c.device.headProductsF32 = true; // EPL's CPU kernel: its tiles' products in sgemm
  }
  return c;
}

std::optional<Cluster> loadCluster(const std::string& nameOrPath, std::string& error) {
  if (nameOrPath == "dgx-a100") return dgxA100();
  if (nameOrPath == "dgx-h100") return dgxH100();
  if (nameOrPath == "dgx-h200") return dgxH200();
  std::string path = nameOrPath == "here" ? hereClusterPath() : nameOrPath;
  std::ifstream in(path, std::ios::binary);
  if (!in && nameOrPath == "here") {
    error = fmt::format("this machine is not calibrated: `epl calibrate` measures it and writes {}",
                        path);
    return std::nullopt;
  }
  if (!in) {
    error = fmt::format("no cluster `{}`: not a built-in one ({}) and no such file", nameOrPath,
                        fmt::join(builtinClusterNames(), ", "));
    return std::nullopt;
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parseCluster(text.str(), path, error);
}

} // namespace epl::ir
