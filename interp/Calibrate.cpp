// `epl calibrate`'s measurements (interp/Calibrate.h).
#include "interp/Calibrate.h"

#include "backend/cpu/ConvDirect.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"
#include "backend/cpu/Parallel.h"
#include "interp/MemoryFit.h"
#include "interp/OffloadedStates.h"
#include "ir/Cluster.h"
#include "support/Text.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace epl::interp {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Repeats `run` (after one warm-up) until it has taken `seconds`, at least `minReps` times;
// the seconds a run.
template <class F> double timed(F run, double seconds = 0.25, int minReps = 3) {
  run();
  int reps = 0;
  double start = now(), end = start;
  while (end - start < seconds || reps < minReps) {
    run();
    ++reps;
    end = now();
  }
  return (end - start) / reps;
}

// The seconds a run of `reps` runs of `run`, after one to warm up: a fixed count, where ranks
// time their messages (a time limit would let them disagree on the count, and their
// collectives and sends with it).
template <class F> double timedCount(F run, int reps) {
  run();
  double start = now();
  for (int i = 0; i < reps; ++i)
    run();
  return (now() - start) / reps;
}

// FLOP/s of one GEMM shape on the pool's threads: [m, k] by [k, n] with the operands laid
// out as `layout` says (A B^T by default: the second stored [n, k], as a linear's weights),
// in f32 or (`type` bf16: amp's products where the CPU reads it as it is) bf16, timed for
// at least `seconds`.
double gemmShapeRate(int64_t m, int64_t n, int64_t k, double seconds,
                     ir::GemmLayout layout = ir::GemmLayout::ABt, int minReps = 3,
                     ir::DType type = ir::DType::F32) {
  std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(k * n), 0.25f),
      c(static_cast<size_t>(m * n));
  // 0.5 and 0.25 in bf16.
  std::vector<uint16_t> ah(type == ir::DType::BF16 ? a.size() : 0, 0x3f00),
      bh(type == ir::DType::BF16 ? b.size() : 0, 0x3e80);
  using backend::Operand;
  Operand oa = ah.empty() ? Operand(a.data()) : Operand(ah.data(), type);
  Operand ob = bh.empty() ? Operand(b.data()) : Operand(bh.data(), type);
  bool transA = layout == ir::GemmLayout::AtB, transB = layout == ir::GemmLayout::ABt;
  double t = timed(
      [&] {
        backend::cpu::gemm(transA, transB, m, n, k, 1.f, oa, transA ? m : k, ob, transB ? k : n,
                           0.f, c.data(), n);
      },
      seconds, minReps);
  return 2.0 * static_cast<double>(m * n * k) / t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// The GEMM rate of large products: the median over a transformer's (rows x width by width
// x 3 width, rows x 4 width by 4 width x width) and a cube's.
double gemmRate() {
  return median({gemmShapeRate(4096, 768, 256, 0.25), gemmShapeRate(4096, 256, 1024, 0.25),
                 gemmShapeRate(1024, 1024, 1024, 0.25)});
}

// The last-level cache's bytes, from sysfs (the highest level cpu0 reports); 0 unknown.
double lastLevelCacheBytes() {
  double bytes = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream f(fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/size", index));
    std::string size;
    if (!(f >> size) || size.empty()) continue;
    double scale = size.back() == 'K' ? 1024.0 : size.back() == 'M' ? 1024.0 * 1024 : 1.0;
    bytes = std::max(bytes, std::atof(size.c_str()) * scale);
  }
  return bytes;
}

// Bytes a second of y = a + b over arrays of n floats each, by the CPU's `add` kernel on the
// pool's threads (its vector code and its split of the work, as a script's elementwise ops
// run): larger than any cache by default.
double memoryRate(int64_t n = int64_t{1} << 24, double seconds = 0.25) { // 64 MiB an array
  std::vector<float> a(static_cast<size_t>(n), 1.f), b(static_cast<size_t>(n), 2.f),
      y(static_cast<size_t>(n));
  backend::KernelCall add;
  add.kind = ir::OpKind::Add;
  add.in = {{a.data(), ir::DType::F32, {n}}, {b.data(), ir::DType::F32, {n}}};
  add.out = {{y.data(), ir::DType::F32, {n}}};
  double t = timed([&] { backend::cpu::add(add); }, seconds);
  return 12.0 * static_cast<double>(n) / t;
}

// The working sets of the bandwidth curve, as floats an array: 24 KiB to 96 MiB over the
// three arrays, by fours; memoryRate()'s 192 MiB ends the curve.
std::vector<int64_t> curveFloats() {
  std::vector<int64_t> n;
  for (int64_t f = int64_t{1} << 11; f <= int64_t{1} << 23; f *= 4)
    n.push_back(f);
  return n;
}

// The shapes of the GEMM grid in each layout: rows [m, n, k, FLOP/s, layout] for
// ClusterDevice::matmulRate, and the same in bf16 (a sixth field) where the CPU multiplies
// it as it is. m and k reach 4096, the rows of a batch and a weight
// gradient's sum over them; the largest products (over 2^32 multiply-adds) are left out,
// their neighbours standing in.
struct GridShape {
  int64_t m, n, k;
  ir::GemmLayout layout;
  ir::DType type;
};
std::vector<GridShape> gemmGridShapes() {
  std::vector<GridShape> shapes;
  std::vector<ir::DType> types{ir::DType::F32};
  if (backend::cpu::productsRead(ir::DType::BF16)) types.push_back(ir::DType::BF16);
  for (ir::DType type : types)
    for (ir::GemmLayout layout : {ir::GemmLayout::ABt, ir::GemmLayout::AB, ir::GemmLayout::AtB})
      for (int64_t m : {32, 256, 1024, 4096})
        for (int64_t n : {32, 256, 1024})
          for (int64_t k : {32, 256, 1024, 4096})
            if (m * n * k <= int64_t{1} << 32) shapes.push_back({m, n, k, layout, type});
  return shapes;
}

// The shapes of conv2d's grid (ClusterDevice::convGrids), where the CPU's convolution is
// oneDNN's direct one: batches of kConvImages images (as many groups as the kernel cuts a
// batch into), a 3 x 3 kernel, stride 1 and padding 1; channels 1, 16, 64 and 256 in, 16,
// 64 and 256 out, on sides 7, 14, 28 and 56: the shapes the kernel runs directly, forward and
// backward, of at most 2^28 multiply-adds (their neighbours stand in for the larger ones:
// the grid adds about 12 s to a calibration on 2 cores).
constexpr int64_t kConvImages = ir::kConvGroups;
struct ConvShape {
  int64_t c, co, side;
};
std::vector<ConvShape> convGridShapes() {
  std::vector<ConvShape> shapes;
  if (!backend::cpu::convDirectInUse()) return shapes;
  for (int64_t c : {1, 16, 64, 256})
    for (int64_t co : {16, 64, 256})
      for (int64_t side : {7, 14, 28, 56}) {
        int64_t plane = side * side;
        auto taken = [&](bool backward) {
          return ir::convDirectPlan(kConvImages, c, side, side, co, 3, plane, backward).taken;
        };
        if (kConvImages * plane * co * c * 9 <= int64_t{1} << 28 && taken(false) && taken(true))
          shapes.push_back({c, co, side});
      }
  return shapes;
}

// conv2d's FLOP/s of one shape through the CPU's own kernel on the pool's threads, each
// timed for at least `seconds`: its forward, its backward to the input's and the weights'
// gradients, and its backward to the weights' alone (as the first layer's, whose input is
// the data); over the FLOPs the model counts (the forward's product once, twice, once).
struct ConvRates {
  double forward, backward, weights;
};
ConvRates convShapeRates(const ConvShape& s, double seconds) {
  const int64_t b = kConvImages, k = 3, plane = s.side * s.side;
  auto floats = [](int64_t n, float v) { return std::vector<float>(static_cast<size_t>(n), v); };
  std::vector<float> x = floats(b * s.c * plane, 0.5f), w = floats(s.co * s.c * k * k, 0.25f),
                     bias = floats(s.co, 0.125f), y = floats(b * s.co * plane, 0.f),
                     dy = floats(b * s.co * plane, 0.0625f), dx = floats(b * s.c * plane, 0.f),
                     dw = floats(s.co * s.c * k * k, 0.f), db = floats(s.co, 0.f);
  ir::Attrs attrs{{"channels", s.co},
                  {"kernel", k},
                  {"stride", int64_t{1}},
                  {"padding", int64_t{1}},
                  {"bias", true}};
  using ir::DType;
  backend::TensorView xv{x.data(), DType::F32, {b, s.c, s.side, s.side}},
      wv{w.data(), DType::F32, {s.co, s.c, k, k}}, bv{bias.data(), DType::F32, {s.co}},
      yv{y.data(), DType::F32, {b, s.co, s.side, s.side}};
  backend::KernelCall forward;
  forward.kind = ir::OpKind::Conv2d;
  forward.attrs = &attrs;
  forward.in = {xv, wv, bv};
  forward.out = {yv};
  backend::KernelCall backward = forward;
  backward.backward = true;
  backward.in = {{dy.data(), DType::F32, yv.shape}, xv, wv, bv, yv};
  backward.out = {{dx.data(), DType::F32, xv.shape},
                  {dw.data(), DType::F32, wv.shape},
                  {db.data(), DType::F32, bv.shape}};
  backend::KernelCall weights = backward;
  weights.out[0].data = nullptr;
  double flops = 2.0 * static_cast<double>(b * plane * s.co * s.c * k * k);
  auto rate = [&](const backend::KernelCall& c, double count) {
    return count * flops / timed([&] { backend::cpu::conv2d(c); }, seconds, 1);
  };
  return {rate(forward, 1), rate(backward, 2), rate(weights, 1)};
}

// One thread count's figures: each the median of its rounds, the rounds taking turns so that
// a slow moment of a shared machine moves one round of each, not all of one.
struct ThreadRates {
  double gemm = 0, memory = 0;
  nlohmann::json grid = nlohmann::json::array();
  std::vector<std::pair<double, double>> curve; // [bytes, bytes/s] by working set
  // conv2d's grid; empty where the CPU's convolution is im2col's
  nlohmann::json conv = nlohmann::json::array();
};
ThreadRates measureAt(int rounds) {
  std::vector<GridShape> shapes = gemmGridShapes();
  std::vector<double> gemm, memory;
  std::vector<std::vector<double>> grid(shapes.size());
  std::vector<int64_t> sizes = curveFloats();
  std::vector<std::vector<double>> curve(sizes.size());
  std::vector<ConvShape> convs = convGridShapes();
  std::vector<std::array<std::vector<double>, 3>> conv(convs.size());
  for (int r = 0; r < rounds; ++r) {
    gemm.push_back(gemmRate());
    memory.push_back(memoryRate());
    for (size_t i = 0; i < sizes.size(); ++i)
      curve[i].push_back(memoryRate(sizes[i], 0.05));
    for (size_t i = 0; i < shapes.size(); ++i) {
      const GridShape& g = shapes[i];
      grid[i].push_back(gemmShapeRate(g.m, g.n, g.k, 0.02, g.layout, 1, g.type));
    }
    for (size_t i = 0; i < convs.size(); ++i) {
      ConvRates c = convShapeRates(convs[i], 0.01);
      conv[i][0].push_back(c.forward);
      conv[i][1].push_back(c.backward);
      conv[i][2].push_back(c.weights);
    }
  }
  ThreadRates t{median(gemm), median(memory), {}, {}};
  for (size_t i = 0; i < sizes.size(); ++i)
    t.curve.emplace_back(12.0 * static_cast<double>(sizes[i]), median(curve[i]));
  t.curve.emplace_back(12.0 * static_cast<double>(int64_t{1} << 24), t.memory);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const GridShape& g = shapes[i];
    nlohmann::json row = {g.m, g.n, g.k, median(grid[i]), ir::gemmLayoutName(g.layout)};
    if (g.type != ir::DType::F32) row.push_back(ir::dtypeName(g.type));
    t.grid.push_back(std::move(row));
  }
  for (size_t i = 0; i < convs.size(); ++i)
    t.conv.push_back({convs[i].c, convs[i].co, convs[i].side, 3, median(conv[i][0]),
                      median(conv[i][1]), median(conv[i][2])});
  return t;
}

// Bytes a second each way through the file that states offloaded to disk live in
// (OffloadedStates, in the folder runs use by default): 64 MiB written and read back in
// chunks of 1 MiB, as the update streams them, each the median of `rounds`. Through the
// page cache, as the runs' reads and writes go: states that fit in memory move at its pace.
double diskRate(int rounds) {
  constexpr int64_t kChunk = int64_t{1} << 20, kBytes = int64_t{64} << 20;
  std::vector<unsigned char> chunk(static_cast<size_t>(kChunk), 1), staging(3 * 4096);
  OffloadedStates file(std::filesystem::temp_directory_path().string(), 1, kBytes,
                       {staging.data(), staging.data() + 4096, staging.data() + 8192}, 4096);
  auto pass = [&](bool write) {
    double start = now();
    for (int64_t at = 0; at < kBytes; at += kChunk)
      write ? file.write(0, at, kChunk, chunk.data()) : file.read(0, at, kChunk, chunk.data());
    return static_cast<double>(kBytes) / (now() - start);
  };
  pass(true); // the file's blocks exist from here on, as a run's do after its first step
  std::vector<double> rates;
  for (int r = 0; r < std::max(rounds, 1); ++r)
    rates.push_back(2 / (1 / pass(true) + 1 / pass(false)));
  return median(rates);
}

} // namespace

double cacheFromCurve(const std::vector<std::pair<double, double>>& curve, double memory,
                      double sysfs) {
  // From the fastest point on: the smallest sets may be slower than the cache they sit in,
  // where starting the threads costs more than moving the bytes.
  auto fastest = std::max_element(curve.begin(), curve.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; });
  double bytes = 0;
  for (auto at = fastest; at != curve.end() && at->second >= 1.5 * memory; ++at)
    bytes = at->first;
  return sysfs > 0 ? std::min(bytes, sysfs) : bytes;
}

std::vector<int> calibratedCounts(int cores) {
  std::vector<int> counts;
  for (int n = 1; n < cores; n *= 2)
    counts.push_back(n);
  counts.push_back(std::max(cores, 1));
  return counts;
}

nlohmann::json measureCompute(std::ostream& log, int rounds) {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> counts = calibratedCounts(cores);
  nlohmann::json gemm = nlohmann::json::object(), memory = nlohmann::json::object(),
                 shapes = nlohmann::json::object(), cache = nlohmann::json::object(),
                 curves = nlohmann::json::object(), convs = nlohmann::json::object();
  std::map<int, std::vector<std::pair<double, double>>> points; // the curves, by threads
  double lastGemm = 0, lastMemory = 0;
  for (int t : counts) {
    backend::cpu::initThreads(t);
    ThreadRates rates = measureAt(rounds);
    lastGemm = rates.gemm;
    lastMemory = rates.memory;
    gemm[std::to_string(t)] = lastGemm;
    memory[std::to_string(t)] = lastMemory;
    shapes[std::to_string(t)] = std::move(rates.grid);
    std::string conv;
    if (!rates.conv.empty()) {
      // The forward's rate at 64 channels in and out on 14 x 14, for the log.
      for (const nlohmann::json& row : rates.conv)
        if (row[0] == 64 && row[1] == 64 && row[2] == 14)
          conv = fmt::format("; conv2d 64 -> 64 channels on 14 x 14: {:.1f} GFLOP/s forward, "
                             "{:.1f} backward",
                             row[4].get<double>() / 1e9, row[5].get<double>() / 1e9);
      convs[std::to_string(t)] = std::move(rates.conv);
    }
    std::vector<std::string> bySize; // every other point of the curve, for the log
    for (size_t i = 0; i < rates.curve.size(); i += 2)
      bySize.push_back(fmt::format("{:.1f} at {}", rates.curve[i].second / 1e9,
                                   formatBytes(rates.curve[i].first)));
    curves[std::to_string(t)] = rates.curve;
    points[t] = std::move(rates.curve);
    log << fmt::format("  {} thread{}: GEMM {:.1f} GFLOP/s, memory {:.1f} GB/s; GB/s by "
                       "working set: {}{}\n",
                       t, t == 1 ? "" : "s", lastGemm / 1e9, lastMemory / 1e9,
                       fmt::join(bySize, ", "), conv);
  }
  // The cache as the curve shows it, and its rate over three arrays that fill a quarter of
  // it, read off each thread count's curve.
  double sysfs = lastLevelCacheBytes();
  double cacheBytes = cacheFromCurve(points[counts.back()], lastMemory, sysfs);
  if (cacheBytes > 0) {
    for (int t : counts)
      cache[std::to_string(t)] = ir::curveAt(points[t], cacheBytes / 4);
    log << fmt::format(
        "  the last-level cache: {} as the curve shows it{}\n", formatBytes(cacheBytes),
        sysfs > cacheBytes ? fmt::format(" (the system says {})", formatBytes(sysfs)) : "");
  }
  nlohmann::json calibration = {{"cores", cores},
                                {"gemm_flops", gemm},
                                {"memory_bandwidth", memory},
                                {"gemm_by_shape", shapes},
                                {"bandwidth_by_size", curves}};
  if (!convs.empty()) calibration["conv_by_shape"] = convs;
  if (!cache.empty()) {
    calibration["cache_bytes"] = cacheBytes;
    calibration["cache_bandwidth"] = cache;
  }
  double disk = 0;
  try {
    disk = diskRate(rounds);
    log << fmt::format("  the offloaded states' file in {}: {:.2f} GB/s each way\n",
                       std::filesystem::temp_directory_path().string(), disk / 1e9);
  } catch (const OffloadError& e) {
    log << fmt::format("  the offloaded states' file: not measured ({})\n", e.what());
  }
  std::optional<int64_t> bytes = availableMemory();
  nlohmann::json cluster = {{"name", "here"},
                            {"devices_per_node", cores},
                            {"device",
                             {{"name", fmt::format("cpu ({} cores)", cores)},
                              {"memory_bytes", bytes ? static_cast<double>(*bytes) : 1e9},
                              {"memory_bandwidth", lastMemory},
                              {"peak_flops", {{"f32", lastGemm}}},
                              {"matmul_efficiency", 1},
                              {"memory_efficiency", 1}}},
                            {"calibration", calibration}};
  if (disk > 0) cluster["disk_bandwidth"] = disk;
  return cluster;
}

ir::Link measureLink(backend::Comm& comm) {
  int n = comm.size();
  auto sum = [&](std::vector<float>& data) {
    backend::Request r = comm.iallReduce(data.data(), static_cast<int64_t>(data.size()));
    comm.wait(r, "calibrate all-reduce");
  };
  auto average = [&](std::vector<float>& data, int reps) {
    return timedCount([&] { sum(data); }, reps);
  };
  std::vector<float> one(1, 1.f), big(size_t{1} << 22, 1.f); // 4 bytes, 16 MiB
  double small = average(one, 200);
  double large = average(big, 10);
  ir::Link link;
  link.latency = small / (2.0 * (n - 1));
  double moved = 2.0 * (n - 1) / n * 4.0 * static_cast<double>(big.size());
  link.bandwidth = moved / std::max(large - 2.0 * (n - 1) * link.latency, large / 2);
  return link;
}

double measureSideBySide(backend::Comm& comm, int rounds) {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  backend::cpu::initThreads(std::max(1, cores / comm.size()));
  std::vector<double> sums;
  for (int r = 0; r < std::max(rounds, 1); ++r) {
    backend::Request barrier = comm.ibarrier();
    comm.wait(barrier, "calibrate barrier");
    std::vector<float> rate{static_cast<float>(gemmRate() / 1e9)}; // GFLOP/s: a float holds it
    backend::Request sum = comm.iallReduce(rate.data(), 1);
    comm.wait(sum, "calibrate all-reduce");
    sums.push_back(static_cast<double>(rate[0]) * 1e9);
  }
  return median(sums);
}

void measureSends(backend::Comm& comm, ir::Link& link) {
  int me = comm.rank();
  std::vector<char> small(4), big(size_t{16} << 20);
  // Half a round trip: rank 0 sends and waits for the reply, rank 1 replies.
  auto trip = [&](std::vector<char>& data) {
    auto bytes = static_cast<int64_t>(data.size());
    for (int step = 0; step < 2; ++step) {
      backend::Request r = (step == 0) == (me == 0) ? comm.isend(data.data(), bytes, 1 - me, 7)
                                                    : comm.irecv(data.data(), bytes, 1 - me, 7);
      comm.wait(r, "calibrate send");
    }
  };
  auto average = [&](std::vector<char>& data, int reps) {
    return timedCount([&] { trip(data); }, reps) / 2;
  };
  if (me < 2) {
    double latency = average(small, 200), large = average(big, 10);
    link.sendLatency = latency;
    link.sendBandwidth = static_cast<double>(big.size()) / std::max(large - latency, large / 2);
  }
  backend::Request r = comm.ibarrier();
  comm.wait(r, "calibrate barrier");
}

} // namespace epl::interp
