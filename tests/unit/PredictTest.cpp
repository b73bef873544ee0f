// The cluster file and the cost model (ir/Cluster.h, ir/Predict.h) against hand-computed
// steps.
#include "Planned.h"

#include "interp/Calibrate.h"
#include "ir/Cluster.h"
#include "ir/PipelineSchedule.h"
#include "ir/Predict.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <fmt/format.h>
#include <fstream>
#include <iterator>
#include <map>

using epl::ir::Cluster;
using epl::ir::Link;

namespace {

// The cluster file `text` says (the test stops with the parser's error when it is none).
Cluster parsed(const std::string& text) {
  std::string error;
  auto c = epl::ir::parseCluster(text, "c.json", error);
  INFO(error);
  REQUIRE(c);
  return *c;
}

// A device whose memory is so fast that every op costs its products alone, and whose links
// are as given.
Cluster computeBound(double peak, Link link) {
  return parsed(
      R"({"name": "test", "devices_per_node": 8, "device": {"memory_bytes": 1e12,
          "memory_bandwidth": 1e30, "peak_flops": {"f32": )" +
      fmt::format("{}", peak) + R"(}, "matmul_efficiency": 0.5},
          "intra_node": {"bandwidth": )" +
      fmt::format("{}", link.bandwidth) + R"(, "latency": )" + fmt::format("{}", link.latency) +
      "}}");
}

// The seconds of a prediction's ops (predict's `ops`) but the batch's read, which moves its
// bytes at the memory's rate whatever the cache.
double opsButRead(const epl::ir::Prediction& p) {
  double s = 0;
  for (const auto& op : p.ops)
    if (op.name != "read") s += op.seconds;
  return s;
}

} // namespace

TEST_CASE("a ring all-reduce sends 2 (n - 1) / n of the buffer in 2 (n - 1) hops") {
  Link link{100e9, 5e-6};
  CHECK(epl::ir::ringAllReduceSeconds(1e9, 4, link) == Approx(1.5e9 / 100e9 + 6 * 5e-6));
  CHECK(epl::ir::ringHalfSeconds(1e9, 4, link) == Approx(0.75e9 / 100e9 + 3 * 5e-6));
  CHECK(epl::ir::ringAllReduceSeconds(1e9, 1, link) == 0);
}

TEST_CASE("clusters: the built-in ones, and a file's mistakes named with their field") {
  std::string error;
  for (const std::string& name : epl::ir::builtinClusterNames()) {
    auto c = epl::ir::loadCluster(name, error);
    REQUIRE(c);
    CHECK(c->devicesPerNode == 8);
    CHECK(c->device.peakBf16 > c->device.peakF32);
    CHECK(c->interNode.bandwidth < c->intraNode.bandwidth);
  }
  CHECK_FALSE(epl::ir::loadCluster("dgx-a1000", error));
  CHECK(error == "no cluster `dgx-a1000`: not a built-in one (dgx-a100, dgx-h100, dgx-h200) "
                 "and no such file");
  auto bad = [&](const std::string& text) {
    CHECK_FALSE(epl::ir::parseCluster(text, "c.json", error));
    return error;
  };
  CHECK(bad("{") == "c.json: not valid JSON");
  CHECK(bad(R"({"devices_per_node": 8, "gpus": 1})") == "c.json: unknown field `gpus`");
  CHECK(bad(R"({"devices_per_node": 8, "intra_node": {"bandwidth": 1, "latency": 1}})") ==
        "c.json: `device` is missing");
  CHECK(bad(R"({"devices_per_node": 8, "device": {"memory_bytes": 1, "memory_bandwidth": 1,
        "peak_flops": {"f32": -1}}, "intra_node": {"bandwidth": 1, "latency": 1}})") ==
        "c.json: device.peak_flops: `f32` must be a positive number, got -1");
  CHECK(bad(R"({"devices_per_node": 8, "device": {"memory_bytes": 1, "memory_bandwidth": 1,
        "peak_flops": {"f32": 1, "tf32": 0}}, "intra_node": {"bandwidth": 1, "latency": 1}})") ==
        "c.json: device.peak_flops: `tf32` must be a positive number, got 0");
  CHECK(bad(R"({"devices_per_node": 8, "device": {"memory_bytes": 1, "memory_bandwidth": 1,
        "peak_flops": {"f32": 1}}, "intra_node": {"bandwidth": 1}})") ==
        "c.json: intra_node: `latency` is missing");
}

TEST_CASE("a GPU's built-in cluster, from the name CUDA gives it") {
  using epl::ir::builtinClusterForGpu;
  CHECK(builtinClusterForGpu("cuda:0 (NVIDIA A100-SXM4-80GB, 79 GiB; driver 12.4)") == "dgx-a100");
  CHECK(builtinClusterForGpu("NVIDIA H100 80GB HBM3") == "dgx-h100");
  CHECK(builtinClusterForGpu("cuda:0 (NVIDIA H200, 140 GiB; driver 13.0)") == "dgx-h200");
  // Other parts of the same names have other peaks and bandwidths.
  CHECK_FALSE(builtinClusterForGpu("NVIDIA H100 PCIe"));
  CHECK_FALSE(builtinClusterForGpu("NVIDIA H200 NVL"));
  CHECK_FALSE(builtinClusterForGpu("NVIDIA A100-SXM4-40GB"));
  CHECK_FALSE(builtinClusterForGpu("NVIDIA L4"));
  std::string error;
  auto h200 = epl::ir::loadCluster("dgx-h200", error);
  REQUIRE(h200);
  CHECK(h200->device.memoryBytes == 141e9);
  CHECK(h200->device.memoryBandwidth == 4.8e12);
  CHECK(h200->device.peakBf16 == epl::ir::loadCluster("dgx-h100", error)->device.peakBf16);
}

TEST_CASE("a data-parallel step: each rank's products at its rate, the all-reduce past the "
          "backward") {
  Link link{1e6, 1e-3}; // slow enough that the reduction outlasts the backward
  Cluster c = computeBound(1e9, link);
  auto m = epl::testing::planned("one.epl", epl::testing::kOneStage, 2);
  REQUIRE(m);
  REQUIRE(m->programs.size() == 2);
  epl::ir::Prediction p = epl::ir::predict(*m, c);
  epl::ir::Module::StepFlops f = m->stepFlops(m->programs[0]);
  double rate = 1e9 * 0.5;
  CHECK(p.compute == Approx(f.total() / rate));
  // linear(x, 4) on 8 inputs: 36 parameters, 144 bytes summed over 2 ranks.
  double reduce = epl::ir::ringAllReduceSeconds(144, 2, link);
  CHECK(p.gradientReduction == Approx(reduce));
  CHECK(p.exposedReduction == Approx(reduce - f.backward / rate));
  CHECK(p.stepSeconds == Approx(p.compute + p.exposedReduction + p.optimizer));
  CHECK(p.samplesPerSecond == Approx(8 / p.stepSeconds));
  CHECK(p.mfu == Approx(3 * m->forwardFlopsPerSample() * 8 / p.stepSeconds / (2 * 1e9)));
}

TEST_CASE("the predicted ops: the busiest rank's compute, op by op, named as the trace names "
          "them") {
  // Two stages of 4 micro-batches on 2 ranks: the second stage (linear 128 -> 10 and the
  // loss) does less than the first (64 -> 128 and relu), so the first is the busiest.
  Cluster c = computeBound(1e9, {1e9, 1e-6});
  auto m = epl::testing::planned("two.epl", epl::testing::kTwoStages, 2);
  REQUIRE(m);
  CHECK(epl::ir::predict(*m, c).ops.empty()); // only when asked for
  epl::ir::Prediction p = epl::ir::predict(*m, c, true);
  CHECK(p.opsRank == 0);
  std::vector<std::string> names;
  double seconds = 0;
  for (const auto& o : p.ops) {
    names.push_back(o.name);
    seconds += o.seconds;
    CHECK(o.runs == (o.name == "zero-grads" ? 1 : 4)); // once a step, else a micro-batch
  }
  // The gradients' clearing and the micro-batches' loads are the step's work too.
  CHECK(names == std::vector<std::string>{"zero-grads", "load", "fwd linear", "fwd relu",
                                          "bwd relu", "bwd linear"});
  CHECK(seconds == Approx(p.compute));
  CHECK(p.ops[2].flops == Approx(2.0 * 64 * 128 * 16)); // 4 runs of 4 rows each
}

TEST_CASE("matmul = tf32: f32 products at the device's TF32 peak where it has one, else at "
          "its f32 peak") {
  auto m = epl::testing::planned("one.epl", epl::testing::kOneStage, 1);
  REQUIRE(m);
  std::string error;
  auto withTf32 = epl::ir::parseCluster(
      R"({"name": "t", "devices_per_node": 8, "device": {"memory_bytes": 1e12, "memory_bandwidth": 1e30,
          "peak_flops": {"f32": 1e9, "tf32": 8e9}, "matmul_efficiency": 0.5},
          "intra_node": {"bandwidth": 1e9, "latency": 1e-6}})",
      "t.json", error);
  INFO(error);
  REQUIRE(withTf32);
  Cluster without = computeBound(1e9, {1e9, 1e-6});
  epl::ir::Module::StepFlops f = m->stepFlops(m->programs[0]);
  CHECK(epl::ir::predict(*m, *withTf32).compute == Approx(f.total() / (1e9 * 0.5)));
  m->policy.matmul = epl::ir::Matmul::Tf32;
  epl::ir::Prediction fast = epl::ir::predict(*m, *withTf32);
  CHECK(fast.compute == Approx(f.total() / (8e9 * 0.5)));
  CHECK(fast.mfu == Approx(3 * m->forwardFlopsPerSample() * 8 / fast.stepSeconds / 8e9));
  CHECK(epl::ir::predict(*m, without).compute == Approx(f.total() / (1e9 * 0.5)));
  // The built-in GPUs have TF32 tensor cores: 156 and 494.7 TFLOP/s dense.
  CHECK(epl::ir::loadCluster("dgx-a100", error)->device.peakTf32 == 156e12);
  CHECK(epl::ir::loadCluster("dgx-h100", error)->device.peakTf32 == 494.7e12);
}

TEST_CASE("ZeRO stages 1 and 2 gather the updated parameters after the optimizer, 3 does not") {
  Link link{1e6, 1e-3};
  Cluster c = computeBound(1e9, link); // memory so fast that only the gather takes time
  auto optimizer = [&](const char* zero) {
    std::string text = std::string(epl::testing::kOneStage) + "policy { zero = " + zero + " }\n";
    auto m = epl::testing::planned("zero.epl", text, 2);
    REQUIRE(m);
    return epl::ir::predict(*m, c).optimizer;
  };
  CHECK(optimizer("0") == Approx(0).margin(1e-12));
  // linear(x, 4) on 8 inputs: 36 f32 parameters, 144 bytes, in two slices of 72 that are
  // 64-byte aligned: 128 each, and the gather sends them whole.
  double gather = epl::ir::ringHalfSeconds(2 * 128, 2, link);
  CHECK(optimizer("1") == Approx(gather));
  CHECK(optimizer("2") == Approx(gather));
  CHECK(optimizer("3") == Approx(0).margin(1e-12));
}

TEST_CASE("a pipeline's step is its slowest stage's micro-batches over the schedule's busy share") {
  Cluster c = computeBound(1e9, Link{1e12, 1e-12});
  auto m = epl::testing::planned("two.epl", epl::testing::kTwoStages, 2);
  REQUIRE(m);
  epl::ir::Prediction p = epl::ir::predict(*m, c);
  REQUIRE(p.stageCompute.size() == 2);
  double rate = 1e9 * 0.5;
  for (int s = 0; s < 2; ++s) {
    const epl::ir::Program& prog = m->programs[s];
    double transfers = p.stageCompute[s] - m->stepFlops(prog).total() / rate / 4;
    CHECK(transfers >= 0);
    CHECK(transfers < 1e-6); // the link is all but free
  }
  double slowest = std::max(p.stageCompute[0], p.stageCompute[1]);
  double busy = 1 - epl::ir::simulateSchedule(m->policy.schedule, {2, 4, 1}).bubble;
  CHECK(p.bubble == Approx(4 * slowest / busy - 4 * slowest));
  CHECK(p.stepSeconds == Approx(4 * slowest / busy + p.exposedReduction + p.optimizer));
}

TEST_CASE("a pipeline's transfers cost the link's send figures where it has them, else the "
          "ring's") {
  auto m = epl::testing::planned("two.epl", epl::testing::kTwoStages, 2);
  REQUIRE(m);
  // Every Send of stage 0's program: its bytes and count.
  const epl::ir::Program& first = m->programs[0];
  double bytes = 0, sends = 0;
  for (const epl::ir::Instr& in : first.step)
    if (in.kind == epl::ir::InstrKind::Send)
      bytes += static_cast<double>(m->transferBytes(first, in)), ++sends;
  REQUIRE(sends > 0);
  auto withLink = [&](const std::string& link) {
    return parsed(R"({"name": "test", "devices_per_node": 8, "device": {"memory_bytes": 1e12,
        "memory_bandwidth": 1e30, "peak_flops": {"f32": 1e30}}, "intra_node": )" +
                  link + "}");
  };
  Cluster ring = withLink(R"({"bandwidth": 1e6, "latency": 1e-3})");
  CHECK(epl::ir::predict(*m, ring).stageTransfers == Approx(bytes / 1e6 + sends * 1e-3));
  Cluster sending = withLink(
      R"({"bandwidth": 1e6, "latency": 1e-3, "send_bandwidth": 4e6, "send_latency": 2e-3})");
  CHECK(epl::ir::predict(*m, sending).stageTransfers == Approx(bytes / 4e6 + sends * 2e-3));
  // One of the two: the other is the ring's.
  Cluster half = withLink(R"({"bandwidth": 1e6, "latency": 1e-3, "send_bandwidth": 4e6})");
  CHECK(epl::ir::predict(*m, half).stageTransfers == Approx(bytes / 4e6 + sends * 1e-3));
  std::string error;
  CHECK_FALSE(epl::ir::parseCluster(
      R"({"devices_per_node": 1, "device": {"memory_bytes": 1, "memory_bandwidth": 1,
          "peak_flops": {"f32": 1}}, "intra_node": {"bandwidth": 1, "latency": 1,
          "send_bandwidth": 0}})",
      "c.json", error));
  CHECK(error == "c.json: intra_node: `send_bandwidth` must be a positive number, got 0");
}

TEST_CASE("a pipeline whose ranks share a calibrated machine's cores: its bubble shrinks by "
          "the share") {
  // Products at 1 GFLOP/s a core, memory all but free. One core: at -np 2 each rank runs
  // at half its rates, and the ranks running in the warm-up and cool-down at a whole core.
  auto cluster = [](int cores) {
    return parsed(fmt::format(R"({{"devices_per_node": 1, "device": {{"memory_bytes": 1e12,
            "memory_bandwidth": 1e9, "peak_flops": {{"f32": 1e9}}}},
            "intra_node": {{"bandwidth": 1e12, "latency": 1e-12}},
            "calibration": {{"cores": {}, "gemm_flops": {{"1": 1e9}},
              "memory_bandwidth": {{"1": 1e30}}}}}})",
                              cores))
        .forRanks(2);
  };
  auto m = epl::testing::planned("two.epl", epl::testing::kTwoStages, 2);
  REQUIRE(m);
  Cluster own = cluster(2), shared = cluster(1);
  CHECK(own.coreShare == 1);
  CHECK(shared.coreShare == Approx(0.5));
  epl::ir::Prediction a = epl::ir::predict(*m, own), b = epl::ir::predict(*m, shared);
  CHECK_FALSE(a.sharedCores);
  CHECK(b.sharedCores);
  // Half the rates: twice the stages' time; the bubble at a whole core, as long as with a
  // core each.
  REQUIRE(b.stageCompute.size() == 2);
  for (int s = 0; s < 2; ++s) // (its transfers, which no core runs, all but free)
    CHECK(b.stageCompute[s] == Approx(2 * a.stageCompute[s]).epsilon(1e-3));
  CHECK(b.bubble == Approx(a.bubble).epsilon(1e-3));
  // A pipeline of one rank a stage on a core each, or data parallelism, shrinks nothing.
  auto one = epl::testing::planned("one.epl", epl::testing::kOneStage, 2);
  REQUIRE(one);
  CHECK_FALSE(epl::ir::predict(*one, shared).sharedCores);
}

TEST_CASE("attention's scores cost their memory traffic on a device whose kernel keeps them "
          "there") {
  // Products all but free; memory at 1 GB/s x 0.8, so the bytes decide.
  auto cluster = [](const char* attention, const char* more = "") {
    return parsed(fmt::format(R"({{"devices_per_node": 1, "device": {{"memory_bytes": 1e12,
            "memory_bandwidth": 1e9, "peak_flops": {{"f32": 1e30}}, "attention": "{}"{}}},
            "intra_node": {{"bandwidth": 1e9, "latency": 1e-6}}}})",
                              attention, more));
  };
  const char* script = R"(
model net(x: f32[B, 16, 8], y: f32[B, 16, 8]) {
  return mse(attention(x, 2), y)
}
train net {
  data = synthetic(samples = 4)
  batch = 4
}
)";
  auto m = epl::testing::planned("attn.epl", script, 1);
  REQUIRE(m);
  double scores = epl::ir::predict(*m, cluster("scores")).compute;
  double tiles = epl::ir::predict(*m, cluster("tiles")).compute;
  // 4 samples x 2 heads x 16 x 16 f32 scores: 4 passes in the forward, 10 in the backward.
  double elements = 4 * 2 * 16 * 16;
  CHECK(scores - tiles == Approx((4 + 10) * elements * 4 / (1e9 * 0.8)));
  // Under amp the scores are held in the half type, in f32 by EPL's kernels
  // (headProductsF32): twice the bytes.
  std::string amp = script;
  amp.replace(amp.find("train net"), 0, "policy { amp = bf16 }\n");
  auto half = epl::testing::planned("attn_amp.epl", amp, 1);
  REQUIRE(half);
  Cluster inF32 = cluster("scores");
  inF32.device.headProductsF32 = true;
  CHECK(epl::ir::predict(*half, inF32).compute -
            epl::ir::predict(*half, cluster("scores")).compute ==
        Approx((4 + 10) * elements * 2 / (1e9 * 0.8)));
  // Heads 4 wide: a kernel tiling heads up to 4 wide tiles them, one up to 2 wide does not.
  CHECK(epl::ir::predict(*m, cluster("tiles", R"(, "tiles_up_to": 4)")).compute == tiles);
  CHECK(epl::ir::predict(*m, cluster("tiles", R"(, "tiles_up_to": 2)")).compute == scores);
  std::string error;
  CHECK_FALSE(epl::ir::parseCluster(
      R"({"devices_per_node": 1, "device": {"memory_bytes": 1, "memory_bandwidth": 1,
          "peak_flops": {"f32": 1}, "attention": "scores", "tiles_up_to": 128},
          "intra_node": {"bandwidth": 1, "latency": 1}})",
      "a.json", error));
  CHECK(error == "a.json: device: `tiles_up_to` is the widest head a tiling attention kernel "
                 "(`\"attention\": \"tiles\"`) tiles, a whole number");
  CHECK(epl::ir::loadCluster("dgx-a100", error)->device.attention ==
        epl::ir::ClusterDevice::Attention::Scores);
  CHECK_FALSE(epl::ir::parseCluster(
      R"({"devices_per_node": 1, "device": {"memory_bytes": 1, "memory_bandwidth": 1,
          "peak_flops": {"f32": 1}, "attention": "flash"},
          "intra_node": {"bandwidth": 1, "latency": 1}})",
      "a.json", error));
  CHECK(error == R"(a.json: device: `attention` is "scores" or "tiles", got "flash")");
}

TEST_CASE("on a calibrated machine no gradient reduction hides behind the backward") {
  // Its ranks' threads take every core, and over shared memory the copies are CPU work.
  std::string error;
  auto c = epl::ir::parseCluster(
      R"({"devices_per_node": 2, "device": {"memory_bytes": 1e12, "memory_bandwidth": 1e9,
          "peak_flops": {"f32": 1e9}}, "intra_node": {"bandwidth": 1e6, "latency": 1e-3},
          "calibration": {"cores": 2, "gemm_flops": {"1": 1e9}, "memory_bandwidth": {"1": 1e9}}})",
      "here.json", error);
  INFO(error);
  REQUIRE(c);
  auto m = epl::testing::planned("one.epl", epl::testing::kOneStage, 2);
  REQUIRE(m);
  CHECK(c->overlapsCompute);
  Cluster two = c->forRanks(2);
  CHECK_FALSE(two.overlapsCompute);
  epl::ir::Prediction p = epl::ir::predict(*m, two);
  CHECK(p.gradientReduction > 0);
  CHECK(p.exposedReduction == Approx(p.gradientReduction));
  CHECK(p.stepSeconds == Approx(p.compute + p.gradientReduction + p.optimizer));
  // The same devices with collectives beside the compute hide some of it.
  two.overlapsCompute = true;
  CHECK(epl::ir::predict(*m, two).exposedReduction < p.gradientReduction);
}

TEST_CASE("ranks running at once on a calibrated machine get their share of what their "
          "threads reach together") {
  // Products at 1 GFLOP/s on one thread; on both threads at 2 GFLOP/s (cores of their own),
  // or still 1 (cores that share a vector unit), or not measured (taken to grow with them).
  auto cluster = [](const std::string& gemm, const std::string& side = "") {
    return parsed(fmt::format(R"({{"devices_per_node": 2, "device": {{"memory_bytes": 1e12,
            "memory_bandwidth": 1e9, "peak_flops": {{"f32": 1e9}}}},
            "intra_node": {{"bandwidth": 1e12, "latency": 1e-12}},
            "calibration": {{"cores": 2, "gemm_flops": {},
              "memory_bandwidth": {{"1": 1e30, "2": 1e30}}{}}}}})",
                              gemm, side.empty() ? "" : ", \"gemm_side_by_side\": " + side));
  };
  Cluster own = cluster(R"({"1": 1e9, "2": 2e9})"), sharing = cluster(R"({"1": 1e9, "2": 1e9})"),
          unmeasured = cluster(R"({"1": 1e9})");
  CHECK(own.forRanks(2).device.peakF32 == Approx(1e9));
  CHECK(sharing.forRanks(2).device.peakF32 == Approx(0.5e9));
  CHECK(unmeasured.forRanks(2).device.peakF32 == Approx(1e9));
  // One rank of both threads runs at their rate, whichever machine.
  CHECK(own.forRanks(1).device.peakF32 == Approx(2e9));
  CHECK(sharing.forRanks(1).device.peakF32 == Approx(1e9));
  // A plan's products at -np 2 take twice as long where the cores share their units.
  auto m = epl::testing::planned("one.epl", epl::testing::kOneStage, 2);
  REQUIRE(m);
  double a = epl::ir::predict(*m, own.forRanks(2)).compute;
  double b = epl::ir::predict(*m, sharing.forRanks(2)).compute;
  CHECK(b == Approx(2 * a).epsilon(0.05));
  // Where `epl calibrate` ran two ranks side by side, their rate decides, not one
  // process's at both threads: 1.5 GFLOP/s in all, 0.75 each.
  Cluster measured = cluster(R"({"1": 1e9, "2": 1e9})", R"({"2": 1.5e9})");
  CHECK(measured.forRanks(2).device.peakF32 == Approx(0.75e9));
  CHECK(measured.forRanks(1).device.peakF32 == Approx(1e9));
  // More ranks than cores: those running at once (2) lose that share, each half the time.
  CHECK(measured.forRanks(4).device.peakF32 == Approx(0.375e9));
  std::string error;
  CHECK_FALSE(epl::ir::parseCluster(R"({"devices_per_node": 2, "device": {"memory_bytes": 1e12,
      "memory_bandwidth": 1e9, "peak_flops": {"f32": 1e9}}, "intra_node": {"bandwidth": 1e9,
      "latency": 1e-6}, "calibration": {"cores": 2, "gemm_flops": {"1": 1e9},
      "memory_bandwidth": {"1": 1e9}, "gemm_side_by_side": {"two": 1e9}}})",
                                    "here.json", error));
  CHECK(error ==
        "here.json: calibration.gemm_side_by_side: `two`: 1000000000.0 is not a rank count "
        "and a positive rate");
}

TEST_CASE("a rank whose memory plan fits its share of the cache moves its bytes at the "
          "cache's rate, or the curve's for the plan where there is one") {
  // Products all but free; memory at 1 GB/s, the cache at 4 GB/s (a core; twice that on
  // both); with a curve, y = a + b at 8 GB/s over any set (16 on both cores).
  auto cluster = [](double cacheBytes, bool curve = false) {
    return parsed(fmt::format(R"({{"devices_per_node": 1, "device": {{"memory_bytes": 1e12,
            "memory_bandwidth": 1e9, "peak_flops": {{"f32": 1e30}}}},
            "intra_node": {{"bandwidth": 1e9, "latency": 1e-6}},
            "calibration": {{"cores": 2, "gemm_flops": {{"1": 1e30}},
              "memory_bandwidth": {{"1": 1e9, "2": 2e9}}, "cache_bytes": {},
              "cache_bandwidth": {{"1": 4e9, "2": 8e9}}{}}}}})",
                              cacheBytes,
                              curve ? R"(, "bandwidth_by_size": {"1": [[1e3, 8e9], [1e9, 8e9]],
                                         "2": [[1e3, 1.6e10], [1e9, 1.6e10]]})"
                                    : ""));
  };
  auto m = epl::testing::planned("one.epl", epl::testing::kOneStage, 1);
  REQUIRE(m);
  double plan = static_cast<double>(m->programs[0].peakBytes());
  // One rank gets both cores: 2 GB/s, 8 GB/s inside a cache it has to itself.
  epl::ir::Prediction out = epl::ir::predict(*m, cluster(plan / 2).forRanks(1), true);
  epl::ir::Prediction in = epl::ir::predict(*m, cluster(plan).forRanks(1), true);
  CHECK(opsButRead(in) == Approx(opsButRead(out) / 4));
  CHECK(in.optimizer == Approx(out.optimizer / 4));
  // With a curve: the ops' bytes at its rate for the plan's bytes, 16 GB/s; outside the
  // cache, the memory's.
  epl::ir::Prediction onCurve = epl::ir::predict(*m, cluster(plan, true).forRanks(1), true);
  CHECK(opsButRead(onCurve) == Approx(opsButRead(out) / 8));
  epl::ir::Prediction offCurve = epl::ir::predict(*m, cluster(plan / 2, true).forRanks(1), true);
  CHECK(opsButRead(offCurve) == Approx(opsButRead(out)));
  // Two ranks share the cache: each has half of it, and a core's rates.
  Cluster two = cluster(plan).forRanks(2);
  CHECK(two.device.cacheBytes == Approx(plan / 2));
  CHECK(two.device.cacheBandwidth == Approx(4e9));
  std::string error;
  CHECK_FALSE(epl::ir::parseCluster(
      R"({"devices_per_node": 1, "device": {"memory_bytes": 1, "memory_bandwidth": 1,
          "peak_flops": {"f32": 1}}, "intra_node": {"bandwidth": 1, "latency": 1},
          "calibration": {"cores": 1, "cache_bytes": -1}})",
      "c.json", error));
  CHECK(error == "c.json: calibration: `cache_bytes` must be a positive number, got -1");
}

TEST_CASE("the calibrated cache ends where the curve falls to the memory's rate, and no later "
          "than the system says") {
  // 40 GB/s in L1, 50 in L2, 25 in L3 up to 10 MB, then 11.5 (past the cache, a little above
  // the memory's 10) and 10.
  std::vector<std::pair<double, double>> curve{
      {1e4, 4e10}, {1e6, 5e10}, {1e7, 2.5e10}, {1e8, 1.15e10}, {2e8, 1e10}};
  CHECK(epl::interp::cacheFromCurve(curve, 1e10, 0) == 1e7);
  CHECK(epl::interp::cacheFromCurve(curve, 1e10, 5e8) == 1e7); // a VM's host cache
  CHECK(epl::interp::cacheFromCurve(curve, 1e10, 5e6) == 5e6);
  // No point at 1.5 times the memory's rate: no cache.
  CHECK(epl::interp::cacheFromCurve({{1e4, 1.2e10}, {1e6, 1.4e10}, {1e8, 1e10}}, 1e10, 3e7) == 0);
  // Two threads over the smallest sets spend more on starting than on moving bytes: the
  // cache counts from the fastest point (a 2-core EPYC VM: 46 GB/s at 24 KB, 85 at 6.3 MB,
  // 77 at 25 MB, 52 at 101 MB, the memory 49).
  CHECK(epl::interp::cacheFromCurve(
            {{24576, 4.59e10}, {6.29e6, 8.49e10}, {2.52e7, 7.73e10}, {1.01e8, 5.15e10}}, 4.86e10,
            3.36e7) == 2.52e7);
}

TEST_CASE("a calibrated machine's step reads its batch from the data first, at the memory's "
          "rate") {
  auto m = epl::testing::planned("one.epl", epl::testing::kOneStage, 1);
  REQUIRE(m);
  double input = static_cast<double>(m->programs[0].inputBytes);
  REQUIRE(input > 0);
  // The batch's staging written and as many bytes read, at 1 GB/s: whole, the first op.
  Cluster calibrated = parsed(R"({"devices_per_node": 1, "device": {"memory_bytes": 1e12,
          "memory_bandwidth": 1e9, "peak_flops": {"f32": 1e30}},
          "intra_node": {"bandwidth": 1e9, "latency": 1e-6},
          "calibration": {"cores": 1, "gemm_flops": {"1": 1e30},
            "memory_bandwidth": {"1": 1e9}, "cache_bytes": 1e12,
            "cache_bandwidth": {"1": 4e9}}})");
  epl::ir::Prediction p = epl::ir::predict(*m, calibrated.forRanks(1), true);
  REQUIRE_FALSE(p.ops.empty());
  CHECK(p.ops[0].name == "read");
  CHECK(p.ops[0].seconds == Approx(2 * input / 1e9));
  CHECK(p.ops[0].runs == 1);
  CHECK(p.compute == Approx(opsButRead(p) + 2 * input / 1e9));
  // A cluster file of devices (a GPU's host work is not modelled): no read.
  Cluster devices = parsed(R"({"devices_per_node": 1, "device": {"memory_bytes": 1e12,
          "memory_bandwidth": 1e9, "peak_flops": {"f32": 1e30}},
          "intra_node": {"bandwidth": 1e9, "latency": 1e-6}})");
  epl::ir::Prediction q = epl::ir::predict(*m, devices, true);
  for (const auto& op : q.ops)
    CHECK(op.name != "read");
}

TEST_CASE("a calibrated optimizer moves its bytes at the rate of a working set their size, "
          "the ranks sharing what all cores reach") {
  // y = a + b at 1 thread: 40 GB/s over 1 MB, 10 GB/s from 100 MB; at 2 threads twice that
  // up to 1 MB, 30 GB/s from 100 MB.
  auto cluster = [](const char* curve) {
    return parsed(fmt::format(R"({{"devices_per_node": 1, "device": {{"memory_bytes": 1e12,
            "memory_bandwidth": 1e9, "peak_flops": {{"f32": 1e30}}}},
            "intra_node": {{"bandwidth": 1e9, "latency": 1e-6}},
            "calibration": {{"cores": 2, "gemm_flops": {{"1": 1e30}},
              "memory_bandwidth": {{"1": 1e10, "2": 3e10}}, "bandwidth_by_size": {}}}}})",
                              curve));
  };
  Cluster c = cluster(R"({"1": [[1e6, 4e10], [1e8, 1e10]], "2": [[1e6, 8e10], [1e8, 3e10]]})");
  const epl::ir::ClusterDevice& one = c.forRanks(1).device;
  CHECK(one.bandwidthFor(1e3) == Approx(8e10)); // clamped at the ends
  CHECK(one.bandwidthFor(1e9) == Approx(3e10));
  CHECK(one.bandwidthFor(1e7) == Approx(std::sqrt(8e10 * 3e10))); // halfway in logarithms
  // Two ranks: a core's curve, but no more than half of what both cores reach over twice
  // the set: at 1 MB half the 2-thread rate at 2 MB (below a core's 40 GB/s), at 100 MB a
  // core's 10 GB/s (both cores' 30 over 200 MB, halved, is 15).
  const epl::ir::ClusterDevice& two = c.forRanks(2).device;
  REQUIRE(two.bandwidthBySize.size() == 2);
  double w = std::log(2.0) / std::log(100.0);
  CHECK(two.bandwidthFor(1e6) == Approx(std::pow(8e10, 1 - w) * std::pow(3e10, w) / 2));
  CHECK(two.bandwidthFor(1e8) == Approx(1e10));
  Cluster slow = cluster(R"({"1": [[1e6, 1e10]], "2": [[1e6, 3e10]]})");
  CHECK(slow.forRanks(2).device.bandwidthFor(1e6) == Approx(1e10));
  // Four ranks on the two cores: two run at once, each as two ranks do, half the time. The
  // memory: a core's 10 GB/s (both cores' 30, halved, is more), halved; at 1 MB as `two`,
  // halved.
  const epl::ir::ClusterDevice& four = c.forRanks(4).device;
  CHECK(four.memoryBandwidth == Approx(1e10 / 2));
  CHECK(four.bandwidthFor(1e6) == Approx(two.bandwidthFor(1e6) / 2));
  CHECK(four.bandwidthFor(1e8) == Approx(1e10 / 2));
  CHECK(c.forRanks(2).device.memoryBandwidth == Approx(1e10));
  // The optimizer's bytes at their set's rate; the ops' bytes keep the memory's.
  auto m = epl::testing::planned("one.epl", epl::testing::kOneStage, 1);
  REQUIRE(m);
  const epl::ir::Program& p = m->programs[0];
  // It reads them all and writes the parameters and states back over the lines it read,
  // where y = a + b moves 16 bytes for the 12 the curve counts.
  double updated = static_cast<double>(p.paramBytes + p.gradBytes + p.optimizerBytes);
  double moved = updated + static_cast<double>(p.paramBytes + p.optimizerBytes);
  epl::ir::Prediction fast = epl::ir::predict(*m, c.forRanks(1));
  CHECK(fast.optimizer == Approx(moved * 0.75 / one.bandwidthFor(updated)));
  epl::ir::Prediction flat = epl::ir::predict(*m, slow.forRanks(1));
  CHECK(flat.compute == Approx(fast.compute));
  CHECK(flat.optimizer == Approx(moved * 0.75 / 3e10));
  std::string error;
  for (const char* bad : {R"({"1": [[2e6, 1e9], [1e6, 2e9]]})", R"({"1": [[1e6]]})",
                          R"({"x": [[1e6, 1e9]]})", R"({"1": []})", "[]"}) {
    INFO(bad);
    CHECK_FALSE(
        epl::ir::parseCluster(fmt::format(R"({{"devices_per_node": 1, "device": {{"memory_bytes": 1,
            "memory_bandwidth": 1, "peak_flops": {{"f32": 1}}}}, "intra_node": {{"bandwidth": 1,
            "latency": 1}}, "calibration": {{"cores": 1, "gemm_flops": {{"1": 1}},
            "memory_bandwidth": {{"1": 1}}, "bandwidth_by_size": {}}}}})",
                                          bad),
                              "c.json", error));
    CHECK(error == "c.json: calibration.bandwidth_by_size: must map thread counts to [bytes, "
                   "bytes/s] rows of positive numbers, ascending in bytes");
  }
}

TEST_CASE("a calibrated GEMM rate: the grid's at its points, between them in logarithms") {
  std::string error;
  auto c = epl::ir::parseCluster(
      R"({"devices_per_node": 2, "device": {"memory_bytes": 1e9, "memory_bandwidth": 1e10,
          "peak_flops": {"f32": 1e11}}, "intra_node": {"bandwidth": 1e9, "latency": 1e-6},
          "calibration": {"cores": 2, "gemm_flops": {"1": 5e10, "2": 1e11},
            "memory_bandwidth": {"1": 1e10, "2": 2e10},
            "gemm_by_shape": {"1": [[16, 16, 16, 1e9], [16, 16, 64, 4e9], [16, 64, 16, 4e9],
                                    [16, 64, 64, 16e9], [64, 16, 16, 4e9], [64, 16, 64, 16e9],
                                    [64, 64, 16, 16e9], [64, 64, 64, 64e9]]}}})",
      "here.json", error);
  INFO(error);
  REQUIRE(c);
  // Two ranks on two cores: a thread each, the grid of one thread.
  epl::ir::Cluster two = c->forRanks(2);
  const epl::ir::ClusterDevice& d = two.device;
  REQUIRE(d.gemmGrids[0].rate.size() == 8); // rows without a layout are A B^T's
  auto rate = [&](double m, double n, double k) {
    return d.matmulRate({m, n, k, 1}, epl::ir::DType::F32);
  };
  CHECK(rate(16, 16, 16) == Approx(1e9));
  CHECK(rate(64, 64, 64) == Approx(64e9));
  CHECK(rate(32, 16, 16) == Approx(2e9));    // halfway in logarithms: the geometric mean
  CHECK(rate(32, 32, 32) == Approx(8e9));    // halfway on every axis
  CHECK(rate(4096, 64, 64) == Approx(64e9)); // past the grid: its edge
  CHECK(rate(1, 1, 1) == Approx(1e9));
  // Four ranks share the two cores: each half as fast.
  CHECK(c->forRanks(4).device.matmulRate({64, 64, 64, 1}, epl::ir::DType::F32) == Approx(32e9));
  // Without a grid, the peak's share.
  CHECK(c->device.matmulRate({64, 64, 64, 1}, epl::ir::DType::F32) == Approx(1e11 * 0.75));
  CHECK_FALSE(epl::ir::parseCluster(
      R"({"devices_per_node": 2, "device": {"memory_bytes": 1, "memory_bandwidth": 1,
          "peak_flops": {"f32": 1}}, "intra_node": {"bandwidth": 1, "latency": 1},
          "calibration": {"cores": 2, "gemm_flops": {"1": 1}, "memory_bandwidth": {"1": 1},
            "gemm_by_shape": {"1": [[16, 16, 16]]}}})",
      "here.json", error));
  CHECK(error == "here.json: calibration.gemm_by_shape: `1`: not a thread count and [m, n, k, "
                 "FLOP/s, layout, type] rows of positive numbers, \"ABt\", \"AB\" or "
                 "\"AtB\", and \"f32\" or \"bf16\"");
}

TEST_CASE("a calibrated GEMM rate comes from its layout's grid, else from A B^T's") {
  std::string error;
  auto c = epl::ir::parseCluster(
      R"({"devices_per_node": 1, "device": {"memory_bytes": 1e9, "memory_bandwidth": 1e10,
          "peak_flops": {"f32": 1e11}}, "intra_node": {"bandwidth": 1e9, "latency": 1e-6},
          "calibration": {"cores": 1, "gemm_flops": {"1": 5e10}, "memory_bandwidth": {"1": 1e10},
            "gemm_by_shape": {"1": [[16, 16, 16, 1e9], [64, 64, 64, 4e9, "ABt"],
                                    [16, 16, 16, 2e9, "AtB"], [64, 64, 64, 8e9, "AtB"]]}}})",
      "here.json", error);
  INFO(error);
  REQUIRE(c);
  Cluster one = c->forRanks(1);
  const epl::ir::ClusterDevice& d = one.device;
  using epl::ir::GemmLayout;
  auto rate = [&](double x, GemmLayout l) {
    return d.matmulRate({x, x, x, 1, l}, epl::ir::DType::F32);
  };
  CHECK(rate(16, GemmLayout::ABt) == Approx(1e9));
  CHECK(rate(64, GemmLayout::ABt) == Approx(4e9));
  CHECK(rate(16, GemmLayout::AtB) == Approx(2e9));
  CHECK(rate(32, GemmLayout::AtB) == Approx(4e9)); // between its own grid's points
  CHECK(rate(64, GemmLayout::AB) == Approx(4e9));  // no grid of its own
  CHECK_FALSE(epl::ir::parseCluster(
      R"({"devices_per_node": 1, "device": {"memory_bytes": 1, "memory_bandwidth": 1,
          "peak_flops": {"f32": 1}}, "intra_node": {"bandwidth": 1, "latency": 1},
          "calibration": {"cores": 1, "gemm_flops": {"1": 1}, "memory_bandwidth": {"1": 1},
            "gemm_by_shape": {"1": [[16, 16, 16, 1e9, "BtA"]]}}})",
      "here.json", error));
  CHECK(error == "here.json: calibration.gemm_by_shape: `1`: not a thread count and [m, n, k, "
                 "FLOP/s, layout, type] rows of positive numbers, \"ABt\", \"AB\" or "
                 "\"AtB\", and \"f32\" or \"bf16\"");
}

TEST_CASE("bf16 products take the calibration's bf16 grid, else the f32 one") {
  // A CPU that multiplies bf16 as it is (AMX) has bf16 rows; one that widens it runs amp's
  // products in f32, at the f32 grid's rates.
  std::string error;
  const char* withBf16 =
      R"({"devices_per_node": 1, "device": {"memory_bytes": 1e9, "memory_bandwidth": 1e10,
          "peak_flops": {"f32": 1e11}}, "intra_node": {"bandwidth": 1e9, "latency": 1e-6},
          "calibration": {"cores": 1, "gemm_flops": {"1": 5e10}, "memory_bandwidth": {"1": 1e10},
            "gemm_by_shape": {"1": [[16, 16, 16, 1e9, "ABt"], [64, 64, 64, 4e9, "ABt"],
                                    [16, 16, 16, 5e9, "ABt", "bf16"],
                                    [64, 64, 64, 2e10, "ABt", "bf16"]]}}})";
  auto c = epl::ir::parseCluster(withBf16, "here.json", error);
  INFO(error);
  REQUIRE(c);
  Cluster one = c->forRanks(1);
  using epl::ir::DType;
  using epl::ir::GemmLayout;
  CHECK(one.device.matmulRate({64, 64, 64, 1}, DType::F32) == Approx(4e9));
  CHECK(one.device.matmulRate({64, 64, 64, 1}, DType::BF16) == Approx(2e10));
  CHECK(one.device.matmulRate({16, 16, 16, 1, GemmLayout::AtB}, DType::BF16) == Approx(5e9));
  CHECK(one.device.matmulRate({64, 64, 64, 1}, DType::F16) == Approx(4e9));
  std::string f32Only = withBf16;
  size_t bf16Rows = f32Only.rfind(',', f32Only.find("[16, 16, 16, 5e9"));
  f32Only.replace(bf16Rows, std::string::npos, "]}}}");
  auto widened = epl::ir::parseCluster(f32Only, "here.json", error);
  REQUIRE(widened);
  CHECK(widened->forRanks(1).device.matmulRate({64, 64, 64, 1}, DType::BF16) == Approx(4e9));
  CHECK_FALSE(epl::ir::parseCluster(
      R"({"devices_per_node": 1, "device": {"memory_bytes": 1, "memory_bandwidth": 1,
          "peak_flops": {"f32": 1}}, "intra_node": {"bandwidth": 1, "latency": 1},
          "calibration": {"cores": 1, "gemm_flops": {"1": 1}, "memory_bandwidth": {"1": 1},
            "gemm_by_shape": {"1": [[16, 16, 16, 1e9, "ABt", "i32"]]}}})",
      "here.json", error));
}

TEST_CASE("attention's per-head products under amp: in f32 on a calibrated machine, in the "
          "half type on the built-in clusters") {
  // EPL's CPU kernel multiplies attention's tiles with sgemm whatever amp's type, so a
  // calibrated machine costs them on its f32 grid; Megatron-LM's runs, which the built-in
  // clusters model, multiply them in fp16.
  std::string error;
  auto c = epl::ir::parseCluster(
      R"({"devices_per_node": 1, "device": {"memory_bytes": 1e9, "memory_bandwidth": 1e30,
          "peak_flops": {"f32": 1e11}}, "intra_node": {"bandwidth": 1e9, "latency": 1e-6},
          "calibration": {"cores": 1, "gemm_flops": {"1": 5e10}, "memory_bandwidth": {"1": 1e30},
            "gemm_by_shape": {"1": [[16, 16, 16, 1e9, "ABt"], [16, 16, 16, 5e9, "ABt", "bf16"]]}}})",
      "here.json", error);
  INFO(error);
  REQUIRE(c);
  CHECK(c->device.headProductsF32);
  CHECK_FALSE(epl::ir::loadCluster("dgx-a100", error)->device.headProductsF32);
  auto m = epl::testing::planned("attn.epl", R"(
model net(x: f32[B, 16, 8], y: f32[B, 16, 8]) {
  return mse(attention(x, 2), y)
}
policy { amp = bf16 }
train net {
  data = synthetic(samples = 4)
  batch = 4
}
)",
                                 1);
  REQUIRE(m);
  Cluster one = c->forRanks(1), halves = one;
  halves.device.headProductsF32 = false;
  // 4 samples x 2 heads of [16, 4] (a 1-point grid: every shape at its rates): Q K^T and
  // P V are 2 x 16 x 16 x 4 FLOPs each a head, the backward twice the forward.
  double perHead = 3 * 2 * (2.0 * 16 * 16 * 4) * 4 * 2;
  CHECK(epl::ir::predict(*m, one).compute - epl::ir::predict(*m, halves).compute ==
        Approx(perHead * (1 / 1e9 - 1 / 5e9)));
  // The flag follows a product into its backward's two.
  auto attention = std::find_if(m->ops.begin(), m->ops.end(), [](const epl::ir::Op& o) {
    return o.kind == epl::ir::OpKind::Attention;
  });
  REQUIRE(attention != m->ops.end());
  auto products = epl::ir::opProducts(epl::ir::OpKind::Attention, {{4, 16, 8}}, {{24, 8}},
                                      {4, 16, 8}, attention->attrs, true);
  REQUIRE(products.size() == 8);
  for (size_t i = 0; i < products.size(); ++i)
    CHECK(products[i].perHead == (i >= 4));
}

TEST_CASE("a cost-only plan predicts what the plan of every rank predicts") {
  // One program per stage stands for its stage's ranks in every replica: the step, its
  // parts, the FLOPs and the largest rank's memory come out as from every rank's program.
  std::ifstream in(std::string(EPL_SOURCE_DIR) + "/examples/gpt_char.epl");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(!text.empty());
  std::string error;
  Cluster c = *epl::ir::loadCluster("dgx-a100", error);
  struct Case {
    const char* name;
    std::string text;
    int np;
    std::vector<std::string> sets;
  };
  std::vector<Case> cases = {
      {"one stage, data parallel, ZeRO-1", epl::testing::kOneStage, 4, {"policy.zero=1"}},
      {"two stages", epl::testing::kTwoStages, 4, {}},
      {"pipeline of split stages", text, 8, {}},
      {"pipeline of split stages, ZeRO-2", text, 8, {"policy.zero=2"}},
      {"pipeline of split stages, ZeRO-3, gpipe",
       text,
       16,
       {"policy.zero=3", "policy.schedule=gpipe"}},
  };
  for (const Case& k : cases) {
    INFO(k.name);
    auto plan = [&](bool costOnly) {
      epl::PlanOptions options;
      options.np = k.np;
      options.overrides = k.sets;
      options.costOnly = costOnly;
      return epl::testing::planned("case.epl", k.text, options);
    };
    auto whole = plan(false), cheap = plan(true);
    REQUIRE(whole);
    REQUIRE(cheap);
    CHECK(cheap->programs.size() == cheap->mesh.stages.size());
    CHECK(whole->programs.size() == static_cast<size_t>(k.np));
    epl::ir::Prediction a = epl::ir::predict(*whole, c), b = epl::ir::predict(*cheap, c);
    CHECK(b.stepSeconds == Approx(a.stepSeconds).epsilon(1e-12));
    CHECK(b.compute == Approx(a.compute).epsilon(1e-12));
    CHECK(b.bubble == Approx(a.bubble).epsilon(1e-12));
    CHECK(b.exposedReduction == Approx(a.exposedReduction).epsilon(1e-12));
    CHECK(b.optimizer == Approx(a.optimizer).epsilon(1e-12));
    CHECK(b.tflopsPerDevice == Approx(a.tflopsPerDevice).epsilon(1e-12));
    CHECK(b.peakBytes == a.peakBytes);
  }
}

TEST_CASE("a cost-only plan stops at the first stage that does not fit, its stages before "
          "as planned whole") {
  // What the search does with a plan that does not fit (PlanOptions::overMemory): each
  // stage's memory planned as it is made, the later stages left out. The memory plan reads
  // ZeRO's domains off the other stages' programs (Module::zeroApplies), made or not yet.
  std::ifstream in(std::string(EPL_SOURCE_DIR) + "/examples/gpt_char.epl");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(!text.empty());
  for (std::string zero : {"0", "1", "2", "3"})
    for (int over : {-1, 0, 1}) { // the stage over the limit, -1 none
      INFO("zero " << zero << ", stage " << over << " does not fit");
      auto plan = [&](bool stop) {
        epl::PlanOptions options;
        options.np = 8;
        options.overrides = {"policy.zero=" + zero};
        options.costOnly = true;
        if (stop)
          options.overMemory = [&](const epl::ir::Module&, const epl::ir::Program& p) {
            return p.stage == over;
          };
        return epl::testing::planned("case.epl", text, options);
      };
      auto whole = plan(false), cut = plan(true);
      REQUIRE(whole);
      REQUIRE(cut);
      REQUIRE(whole->programs.size() == 2);
      CHECK(!whole->stoppedOver);
      CHECK(cut->stoppedOver == (over >= 0));
      REQUIRE(cut->programs.size() == (over == 0 ? 1u : 2u));
      for (size_t s = 0; s < cut->programs.size(); ++s) {
        const epl::ir::Program &a = whole->programs[s], &b = cut->programs[s];
        CHECK(b.stage == a.stage);
        CHECK(b.peakBytes() == a.peakBytes());
        CHECK(b.optimizerBytes == a.optimizerBytes);
        CHECK(b.arenaBytes == a.arenaBytes);
        CHECK(b.offset == a.offset);
      }
    }
}

namespace {

// Two kinds of device, `first` and `second` of each, memory all but free to move: each
// op costs its products at peak x 0.5.
Cluster mixed(int first, double peak0, int second, double peak1, double memory1 = 1e12) {
  std::string error;
  auto group = [](int n, const char* name, double peak, double memory) {
    return fmt::format(R"({{"devices": {}, "device": {{"name": "{}", "memory_bytes": {},
        "memory_bandwidth": 1e30, "peak_flops": {{"f32": {}}}, "matmul_efficiency": 0.5}}}})",
                       n, name, memory, peak);
  };
  auto c = epl::ir::parseCluster(
      fmt::format(R"({{"name": "mixed", "devices_per_node": 8, "device_groups": [{}, {}],
          "intra_node": {{"bandwidth": 1e12, "latency": 1e-12}}}})",
                  group(first, "fast", peak0, 1e12), group(second, "slow", peak1, memory1)),
      "mixed.json", error);
  INFO(error);
  REQUIRE(c);
  return *c;
}

} // namespace

TEST_CASE("a mixed cluster: ranks fill its device groups in order, and its file's mistakes") {
  Cluster c = mixed(8, 1e9, 8, 5e8);
  CHECK(c.deviceCount() == 16);
  CHECK(c.groupOf(0) == 0);
  CHECK(c.groupOf(7) == 0);
  CHECK(c.groupOf(8) == 1);
  CHECK(c.deviceOf(15).name == "slow");
  CHECK(c.device.name == "fast");
  CHECK(c.devicesName() == "8 x fast + 8 x slow");
  CHECK(c.tooFew(16).empty());
  CHECK(c.tooFew(32) ==
        "the plan needs 32 devices and cluster `mixed` has 16 (8 x fast + 8 x slow)");
  std::string error;
  CHECK(epl::ir::loadCluster("dgx-a100", error)->tooFew(4096).empty()); // as many as needed

  auto bad = [&](const std::string& groups, const std::string& more = "") {
    CHECK_FALSE(epl::ir::parseCluster(R"({"devices_per_node": 8, "device_groups": )" + groups +
                                          more +
                                          R"(, "intra_node": {"bandwidth": 1, "latency": 1}})",
                                      "c.json", error));
    return error;
  };
  const std::string dev = R"({"memory_bytes": 1, "memory_bandwidth": 1, "peak_flops": {"f32": 1}})";
  CHECK(bad("[]") ==
        R"(c.json: device_groups: must be a list of groups, {"devices": n, "device": {…}})");
  CHECK(bad(R"([{"devices": 2.5, "device": )" + dev + "}]") ==
        "c.json: device_groups[0]: `devices` is a whole number, got 2.5");
  CHECK(bad(R"([{"devices": 8, "device": )" + dev + R"(}, {"devices": 8}])") ==
        "c.json: device_groups[1]: `device` is missing");
  CHECK(bad(R"([{"devices": 8, "device": {"memory_bytes": 1, "memory_bandwidth": 1}}])") ==
        "c.json: device_groups[0].device: `peak_flops` is missing");
  CHECK(bad(R"([{"devices": 8, "gpu": 1}])") == "c.json: device_groups[0]: unknown field `gpu`");
  CHECK(bad(R"([{"devices": 8, "device": )" + dev + "}]", R"(, "device": )" + dev) ==
        "c.json: `device` and `device_groups` are two ways to say the same: give one");
  CHECK(bad(R"([{"devices": 8, "device": )" + dev + "}]", R"(, "calibration": {"cores": 2})") ==
        "c.json: a calibrated machine (`calibration`) is one kind of device: `device`, not "
        "`device_groups`");
}

TEST_CASE("a mixed cluster: each stage at its devices' rate, the slowest kind pacing a group, "
          "the MFU over every device's peak, the tightest memory") {
  auto m = epl::testing::planned("two.epl", epl::testing::kTwoStages, 2);
  REQUIRE(m);
  // Stage 0 on rank 0 (fast), stage 1 on rank 1: as fast, then half as fast.
  epl::ir::Prediction same = epl::ir::predict(*m, mixed(1, 1e9, 1, 1e9));
  epl::ir::Prediction slow = epl::ir::predict(*m, mixed(1, 1e9, 1, 5e8));
  REQUIRE(slow.stageCompute.size() == 2);
  CHECK(slow.device == "1 x fast + 1 x slow");
  CHECK(slow.stageCompute[0] == Approx(same.stageCompute[0]));
  // A micro-batch's products, and its gradient's send back (2 KB over 1 TB/s: 2 ns).
  double products1 = m->stepFlops(m->programs[1]).total() / (1e9 * 0.5) / 4;
  CHECK(same.stageCompute[1] == Approx(products1).margin(1e-8));
  CHECK(slow.stageCompute[1] == Approx(2 * products1).margin(1e-8));
  double model = 3 * m->forwardFlopsPerSample() * 16;
  CHECK(slow.mfu == Approx(model / slow.stepSeconds / (1e9 + 5e8)));
  // The second device's memory is the one too small: its rank's plan is named against it.
  epl::ir::Prediction tight = epl::ir::predict(*m, mixed(1, 1e9, 1, 1e9, 1000));
  CHECK(tight.peakBytes == static_cast<double>(m->programs[1].peakBytes()));
  CHECK(tight.deviceBytes == 1000);
  CHECK(tight.memoryDevice == "slow");
  // The memory part alone (the search's plans that do not fit): the same rank and device,
  // nothing costed.
  epl::ir::Prediction memory = epl::ir::predictMemory(*m, mixed(1, 1e9, 1, 1e9, 1000));
  CHECK(memory.peakBytes == static_cast<double>(m->programs[1].peakBytes()));
  CHECK(memory.deviceBytes == 1000);
  CHECK(memory.memoryDevice == "slow");
  CHECK(memory.device == "1 x fast + 1 x slow");
  CHECK(memory.stepSeconds == 0);
  CHECK(memory.compute == 0);

  // Data parallel over a fast and a slow device: the slow one paces the step.
  auto dp = epl::testing::planned("one.epl", epl::testing::kOneStage, 2);
  REQUIRE(dp);
  epl::ir::Prediction fast = epl::ir::predict(*dp, mixed(2, 1e9, 2, 1e9));
  epl::ir::Prediction paced = epl::ir::predict(*dp, mixed(1, 1e9, 1, 2.5e8));
  CHECK(paced.compute == Approx(4 * fast.compute));
}

TEST_CASE("a mixed cluster: a cost-only plan predicts what the plan of every rank predicts") {
  std::ifstream in(std::string(EPL_SOURCE_DIR) + "/examples/gpt_char.epl");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(!text.empty());
  // -np 8: 2 stages x split 2 x 2 copies (ranks 0-1, 2-3; 4-5, 6-7), the first ranks fast
  // and the rest slow: 3 mixes both stages, 4 puts a copy on each kind, 6 mixes stage 1.
  for (int fastRanks : {3, 4, 6}) {
    INFO(fastRanks);
    Cluster c = mixed(fastRanks, 2e14, 8 - fastRanks, 5e13, 1e8);
    auto plan = [&](bool costOnly) {
      epl::PlanOptions options;
      options.np = 8;
      options.costOnly = costOnly;
      return epl::testing::planned("case.epl", text, options);
    };
    auto whole = plan(false), cheap = plan(true);
    REQUIRE(whole);
    REQUIRE(cheap);
    epl::ir::Prediction a = epl::ir::predict(*whole, c), b = epl::ir::predict(*cheap, c);
    CHECK(b.stepSeconds == Approx(a.stepSeconds).epsilon(1e-12));
    CHECK(b.compute == Approx(a.compute).epsilon(1e-12));
    CHECK(b.bubble == Approx(a.bubble).epsilon(1e-12));
    CHECK(b.tflopsPerDevice == Approx(a.tflopsPerDevice).epsilon(1e-12));
    CHECK(b.peakBytes == a.peakBytes);
    CHECK(b.memoryDevice == a.memoryDevice);
  }
}

TEST_CASE("states offloaded to disk: their traffic over the node's disks or the host link, what "
          "the update does not hide") {
  const char* text = R"(
model net(x: f32[B, 64], y: i32[B]) {
  return cross_entropy(linear(relu(linear(x, 256)), 10), y)
}
policy { offload = optimizer offload_to = disk }
train net {
  data = synthetic(samples = 16)
  batch = 16
  optimizer = adam(lr = 1e-3)
}
)";
  auto m = epl::testing::planned("offload.epl", text, 1);
  REQUIRE(m);
  const epl::ir::Program& p = m->programs[0];
  REQUIRE(p.offloadedBytes > 0);
  double bytes = 2.0 * static_cast<double>(p.offloadedBytes); // read and written once a step
  auto cluster = [](const std::string& extra) {
    return parsed(R"({"devices_per_node": 8, "device": {"memory_bytes": 1e12,
        "memory_bandwidth": 1e9, "peak_flops": {"f32": 1e12}},
        "intra_node": {"bandwidth": 1e9, "latency": 1e-6})" +
                  extra + "}");
  };
  SECTION("a slow disk: all but the update's time exposed") {
    epl::ir::Prediction out = epl::ir::predict(*m, cluster(R"(, "disk_bandwidth": 1e6)"));
    CHECK(out.offloadBytes == bytes);
    CHECK(out.diskCosted);
    CHECK(out.offload == Approx(bytes / 1e6));
    CHECK(out.exposedOffload == Approx(bytes / 1e6 - out.optimizer));
    CHECK(out.stepSeconds == Approx(out.compute + out.optimizer + out.exposedOffload));
  }
  SECTION("on a calibrated machine nothing hides it: the file's worker copies on its cores") {
    Cluster calibrated = cluster(R"(, "disk_bandwidth": 1e15)");
    calibrated.overlapsCompute = false;
    epl::ir::Prediction out = epl::ir::predict(*m, calibrated);
    CHECK(out.exposedOffload == Approx(bytes / 1e15));
  }
  SECTION("a fast disk: the update hides it") {
    epl::ir::Prediction out = epl::ir::predict(*m, cluster(R"(, "disk_bandwidth": 1e15)"));
    CHECK(out.offload == Approx(bytes / 1e15));
    CHECK(out.exposedOffload == 0);
    CHECK(out.stepSeconds == Approx(out.compute + out.optimizer));
  }
  SECTION("the host link where it is slower than the disk") {
    epl::ir::Prediction out = epl::ir::predict(
        *m,
        cluster(R"(, "disk_bandwidth": 1e9, "host_link": {"bandwidth": 1e7, "latency": 1e-6})"));
    CHECK(out.offload == Approx(bytes / 1e7));
  }
  SECTION("no disk bandwidth: the traffic's bytes, not its time") {
    epl::ir::Prediction out = epl::ir::predict(*m, cluster(""));
    CHECK(out.offloadBytes == bytes);
    CHECK_FALSE(out.diskCosted);
    CHECK(out.offload == 0);
    CHECK(out.stepSeconds == Approx(out.compute + out.optimizer));
  }
  SECTION("the node's ranks share its disks") {
    auto two = epl::testing::planned("offload.epl", text, 2);
    REQUIRE(two);
    double mine = 2.0 * static_cast<double>(two->programs[0].offloadedBytes);
    epl::ir::Prediction out = epl::ir::predict(*two, cluster(R"(, "disk_bandwidth": 1e6)"));
    CHECK(out.offload == Approx(mine / (1e6 / 2)));
  }
}

TEST_CASE("a calibrated machine has no host link, and the built-in clusters have PCIe's") {
  std::string error;
  CHECK_FALSE(epl::ir::parseCluster(
      R"({"devices_per_node": 2, "device": {"memory_bytes": 1e12, "memory_bandwidth": 1e9,
          "peak_flops": {"f32": 1e9}}, "intra_node": {"bandwidth": 1e6, "latency": 1e-3},
          "host_link": {"bandwidth": 1e9, "latency": 1e-6},
          "calibration": {"cores": 2, "gemm_flops": {"1": 1e9}, "memory_bandwidth": {"1": 1e9}}})",
      "here.json", error));
  CHECK_THAT(error, Catch::Contains("has no `host_link`"));
  CHECK_FALSE(epl::ir::parseCluster(
      R"({"devices_per_node": 2, "device": {"memory_bytes": 1e12, "memory_bandwidth": 1e9,
          "peak_flops": {"f32": 1e9}}, "intra_node": {"bandwidth": 1e6, "latency": 1e-3},
          "disk_bandwidth": -1})",
      "c.json", error));
  CHECK_THAT(error, Catch::Contains("`disk_bandwidth` must be a positive number"));
  auto a100 = epl::ir::loadCluster("dgx-a100", error);
  REQUIRE(a100);
  CHECK(a100->hostLink.bandwidth == 32e9);
  CHECK(a100->diskBandwidth == 0);
}

TEST_CASE("the step's clearing of gradients and loads of micro-batches cost their bytes") {
  // Products free; memory at 1 GB/s (efficiency 0.5).
  Cluster c = parsed(R"({"devices_per_node": 8, "device": {"memory_bytes": 1e12,
      "memory_bandwidth": 2e9, "memory_efficiency": 0.5, "peak_flops": {"f32": 1e30}},
      "intra_node": {"bandwidth": 1e9, "latency": 1e-6}})");
  auto m = epl::testing::planned("two.epl", epl::testing::kTwoStages, 2);
  REQUIRE(m);
  const epl::ir::Program& first = m->programs[0];
  REQUIRE(first.inputBytes > 0);
  epl::ir::Prediction p = epl::ir::predict(*m, c, true);
  REQUIRE(p.ops.size() >= 2);
  CHECK(p.ops[0].name == "zero-grads");
  CHECK(p.ops[0].seconds == Approx(static_cast<double>(first.gradBytes) / 1e9));
  CHECK(p.ops[1].name == "load");
  CHECK(p.ops[1].runs == 4);
  // Each micro-batch's inputs read from the host's copy and written into the arena.
  CHECK(p.ops[1].seconds == Approx(2.0 * static_cast<double>(first.inputBytes) / 1e9));
}

TEST_CASE("a conv2d the CPU runs through oneDNN costs the calibration's rate for its shape, "
          "its whole call") {
  // 16 -> 16 channels on 14 x 14, 64 images: the kernel's 16 groups of 4 images. The first
  // convolution's input is the data (its backward gives the weights' gradient alone).
  const char* script = R"(
model net(x: f32[B, 16, 14, 14], y: i32[B]) {
  h = conv2d(conv2d(x, 16, 3, padding = 1), 16, 3, padding = 1)
  return cross_entropy(linear(flatten(h), 10), y)
}
train net {
  data = synthetic(samples = 64)
  batch = 64
}
)";
  auto m = epl::testing::planned("conv.epl", script, 1);
  REQUIRE(m);
  // Rates on a grid of one image a call (co 16, sides 14 and 28, C K K 144): each pass its
  // own, 2x on the larger side. The group's 4 images of 14 x 14 make 784 values a call,
  // the grid's 28 x 28.
  auto cluster = [](const std::string& rows) {
    return parsed(R"({"devices_per_node": 1, "device": {"memory_bytes": 1e12,
          "memory_bandwidth": 1e9, "peak_flops": {"f32": 1e9}},
          "intra_node": {"bandwidth": 1e9, "latency": 1e-6},
          "calibration": {"cores": 1, "gemm_flops": {"1": 1e9},
            "memory_bandwidth": {"1": 1e9}, "conv_by_shape": {"1": [)" +
                  rows + "]}}}")
        .forRanks(1);
  };
  Cluster grid = cluster("[16, 16, 14, 3, 1e9, 2e9, 3e9], [16, 16, 28, 3, 2e9, 4e9, 6e9]");
  auto secondsOf = [&](const Cluster& c) {
    std::map<std::string, double> byName;
    for (const auto& op : epl::ir::predict(*m, c, true).ops)
      byName[op.name] = op.seconds;
    return byName;
  };
  std::map<std::string, double> seconds = secondsOf(grid);
  double flops = 2.0 * 64 * 196 * 16 * 144; // a forward's product
  CHECK(seconds.at("fwd conv2d") == Approx(flops / 2e9));
  CHECK(seconds.at("fwd conv2d.1") == Approx(flops / 2e9));
  CHECK(seconds.at("bwd conv2d.1") == Approx(2 * flops / 4e9)); // x's gradient and w's
  CHECK(seconds.at("bwd conv2d") == Approx(flops / 6e9));       // w's alone
  // Without the grid (a calibration of an earlier version, or a CPU whose convolution is
  // im2col's): its im2col products and bytes, longer here.
  CHECK(secondsOf(cluster("")).at("fwd conv2d.1") > flops / 1e9);
  // A row's mistakes are named with the field.
  std::string error;
  CHECK_FALSE(epl::ir::parseCluster(
      R"({"devices_per_node": 1, "device": {"memory_bytes": 1, "memory_bandwidth": 1,
          "peak_flops": {"f32": 1}}, "intra_node": {"bandwidth": 1, "latency": 1},
          "calibration": {"cores": 1, "gemm_flops": {"1": 1}, "memory_bandwidth": {"1": 1},
            "conv_by_shape": {"1": [[16, 16, 14, 3, 1e9, 2e9]]}}})",
      "here.json", error));
  CHECK(error == "here.json: calibration.conv_by_shape: `1`: must map thread counts to "
                 "[channels, out_channels, side, kernel, forward, backward, weights FLOP/s] "
                 "rows of positive numbers");
}
