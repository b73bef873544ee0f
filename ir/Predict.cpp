// The cost model (ir/Predict.h, docs/cluster.md).
#include "ir/Predict.h"

#include "ir/PipelineSchedule.h"

#include "support/Assert.h"
#include "support/Text.h"

#include <algorithm>
#include <fmt/format.h>
#include <map>

namespace epl::ir {

double ringAllReduceSeconds(double bytes, int n, const Link& link) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / link.bandwidth + 2.0 * (n - 1) * link.latency;
}

double ringHalfSeconds(double bytes, int n, const Link& link) {
  if (n <= 1) return 0;
  return static_cast<double>(n - 1) / n * bytes / link.bandwidth + (n - 1) * link.latency;
}

namespace {

// One rank's step, costed.
struct RankCost {
  double compute = 0;        // forward, recomputed and backward ops, all micro-batches
  double read = 0;           // of compute: the step's batch read into the host's staging
  double reduction = 0;      // gradient buckets, and ZeRO-3's gathers for the backward
  double forwardGathers = 0; // ZeRO-3's gathers for the forward
  double split = 0;          // split regions' collectives
  double transfers = 0;      // sends to other stages
  double optimizer = 0;
  // Offloaded states (Prediction::offload): the optimizer's stream and the gathers' parts,
  // in bytes read and written, then their seconds and what is not hidden.
  double offloadStream = 0, offloadGathers = 0;
  double offload = 0, exposedOffload = 0;
  double backward = 0; // the part of `compute` the reduction can overlap
  double flops = 0;
  // Each compute op's (op, part) cost a run and its runs in the step: seconds, FLOPs, runs.
  struct Run {
    double seconds = 0, flops = 0;
    int runs = 0;
  };
  std::map<std::pair<int, BackwardPart>, Run> byRun;
  std::vector<const Instr*> firstRuns; // each (op, part)'s first instruction, in step order
};

// The link of a group of n ranks spread evenly over the plan's np (data-parallel groups
// are the outermost dimension): inside a node when that spread fits one.
const Link& spreadLink(const Cluster& c, int np, int n) {
  int span = n <= 1 ? 1 : np - np / n + 1;
  return span <= c.devicesPerNode ? c.intraNode : c.interNode;
}

// The FLOP/s of a run of `in` (a Run of a conv2d, its recompute or its backward) on a
// calibrated CPU that timed its own convolution by shape (ClusterDevice::convGrids), where
// its kernel runs oneDNN's direct convolution (ir::convDirectPlan, as the kernel decides);
// 0 otherwise: its im2col products and bytes cost it. The grid's time is the whole call's,
// its tensors read, reordered and written; `inputGradient`: the backward gives x's too.
double directConvRate(const Module& m, const Program& p, const ClusterDevice& d, const Instr& in,
                      bool inputGradient) {
  if (d.convGrids[0].empty()) return 0;
  std::optional<Module::ConvShape> g = m.convShape(p, in.op);
  if (!g) return 0;
  bool backward = m.ops[in.op].phase == Phase::Backward;
  ConvDirectPlan plan = convDirectPlan(g->b, g->c, g->h, g->w, g->co, g->k, g->plane(), backward);
  if (!plan.taken) return 0;
  // The grid's calls take one image each: a call of a group of `images` images makes as
  // many output values as one image of that many times the plane (a small image's rate is
  // its calls' overhead, which a group shares).
  using Pass = ClusterDevice::ConvPass;
  Pass pass = !backward ? Pass::Forward : inputGradient ? Pass::Backward : Pass::Weights;
  return d.convRate(pass, static_cast<double>(g->co), static_cast<double>(plan.images * g->plane()),
                    static_cast<double>(g->ckk()));
}

// The memory traffic of attention's scores in one run of `in` (a Run of an attention op or
// its backward) where the device's kernel holds them in memory (ClusterDevice::Attention):
// the forward writes the scores, the softmax reads them and writes the probabilities, the
// product with V reads them (4 passes); the backward recomputes the probabilities (3),
// reads them for dV (1), writes dP (1), turns it into dS (3) and reads dS for dQ and dK
// (2). A weight-gradient part (zero-bubble schedules) touches none of them.
double attentionScoreBytes(const Module& m, const Program& p, const ClusterDevice& d,
                           const Instr& in, DType compute) {
  bool tiles = d.attention == ClusterDevice::Attention::Tiles;
  if (tiles && d.tilesUpTo == 0) return 0;
  const Op& o = m.ops[in.op];
  bool backward = o.phase == Phase::Backward;
  int forward = backward ? o.forward : in.op;
  if (m.ops[forward].kind != OpKind::Attention || in.part == BackwardPart::Params) return 0;
  // attentionProducts: the projections, then each head's scores Q K^T, [T, E] by [E, T].
  std::vector<Product> products = m.runProducts(p, forward, false);
  EPL_ASSERT(products.size() == 4, "attention has four products");
  const Product& scores = products[2];
  if (tiles && scores.k <= static_cast<double>(d.tilesUpTo)) return 0; // heads that narrow tile
  double passes = backward ? 10 : 4;
  // EPL's kernels hold the scores in f32 under amp too (their products' f32 operands).
  DType held = d.headProductsF32 ? DType::F32 : compute;
  return passes * scores.m * scores.n * scores.count * static_cast<double>(dtypeBytes(held));
}

// Program p's step on device d (one kind of a mixed cluster's devices).
RankCost costRank(const Module& m, const Program& p, const Cluster& c, const ClusterDevice& d) {
  RankCost r;
  DType compute = m.ampApplies() ? m.ampDtype() : DType::F32;
  bool tf32 = m.policy.matmul == Matmul::Tf32; // f32 products on tensor cores
  // A rank whose whole memory plan fits its share of the cache moves its bytes there.
  bool cached = d.cacheBytes > 0 && static_cast<double>(p.peakBytes()) <= d.cacheBytes;
  double memory =
      (!cached                     ? d.memoryBandwidth
       : d.bandwidthBySize.empty() ? d.cacheBandwidth
                                   : d.bandwidthFor(static_cast<double>(p.peakBytes()))) *
      d.memoryEfficiency;
  int np = m.mesh.np;
  bool scatter = m.zeroShardsGradients();
  // An op runs once a micro-batch, alike each time: its seconds and FLOPs by (op, part).
  auto& byRun = r.byRun;
  // On a calibrated machine (EPL's CPU device, whose measured step includes it): reading the
  // step's samples from the data into the host's staging before the instructions run
  // (`read` in the trace): its bytes written, and as many again for the samples' reads (an
  // image's pixels are a byte each, but each sample lies at a place of its own), at the
  // memory's rate (the data is no part of the plan, nor in cache).
  if (c.calibration && p.inputBytes > 0) {
    r.read = 2.0 * static_cast<double>(p.inputBytes) / (d.memoryBandwidth * d.memoryEfficiency);
    r.compute += r.read;
  }
  // Every micro-batch runs the same ops and sends the same tensors: each (op, part)'s
  // entry of byRun, each bucket's reduction ranks and each transfer's bytes, once.
  std::vector<RankCost::Run*> runOf(3 * m.ops.size(), nullptr);
  std::map<std::pair<int, bool>, int> ranksOf;                // by (bucket, tie)
  std::map<std::pair<int, int>, int64_t> transferBytesOf;     // by (tensor, rows)
  auto once = [](auto& known, const auto& key, auto&& work) { // known[key], worked out once
    auto at = known.find(key);
    if (at == known.end()) at = known.emplace(key, work()).first;
    return at->second;
  };
  for (const Instr& in : p.step) {
    if (in.kind == InstrKind::Run) {
      const Op& o = m.ops[in.op];
      if (o.phase == Phase::Optimizer) continue;
      if (opInfo(o.kind).split == SplitRule::Communication) continue; // below, by traffic
      RankCost::Run*& known = runOf[3 * static_cast<size_t>(in.op) + static_cast<size_t>(in.part)];
      if (known) {
        r.compute += known->seconds;
        r.flops += known->flops;
        if (o.phase != Phase::Forward) r.backward += known->seconds;
        ++known->runs;
        continue;
      }
      // Its products at the device's rates plus its bytes at the memory's (a sum: the
      // kernels run their products and elementwise passes one after the other).
      double bytes = 0;
      for (const std::vector<int>* list : {&o.inputs, &o.outputs})
        for (int t : *list)
          if (t >= 0) bytes += static_cast<double>(m.bytesOn(p, t));
      for (int q : o.params) {
        double n = 1;
        for (int64_t x : m.localParamShape(p, q))
          n *= static_cast<double>(x);
        bytes += 4 * n;
      }
      // Its kernel's scratch (im2col columns, mlp's hidden rows…), written and read back.
      bytes += 2.0 * static_cast<double>(m.workspaceBytes(p, in.op));
      // On a calibrated machine (EPL's CPU device), amp's f32 copies, written (the kernel
      // reads them back from cache, right after): not of the inputs its products read in
      // bf16 as they are (a CPU with bf16 kernels). A GPU's model follows the fused kernels
      // it was fitted to, which make no copies.
      double staged =
          c.calibration ? static_cast<double>(m.ampStagedBytes(p, in.op, d.readsHalf(compute))) : 0;
      bytes += staged;
      bytes += attentionScoreBytes(m, p, d, in, compute);
      // Each product at the rate of its shape; a split backward's part makes half of them.
      bool backward = o.phase == Phase::Backward;
      double flops = 0, products = 0;
      std::vector<Product> runs =
          backward ? m.backwardProducts(p, in.op) : m.runProducts(p, in.op, false);
      for (const Product& x : runs) {
        flops += x.flops();
        products += x.flops() /
                    d.matmulRate(x, x.perHead && d.headProductsF32 ? DType::F32 : compute, tf32);
      }
      if (backward && in.part != BackwardPart::Whole) flops /= 2, products /= 2;
      double t = products + bytes / memory;
      // A backward's first product is of the input's gradient; without it one is left.
      if (double rate = directConvRate(m, p, d, in, !backward || runs.size() > 1); rate > 0)
        t = flops / rate + staged / memory;
      known = &(byRun[{in.op, in.part}] = {t, flops, 1});
      r.firstRuns.push_back(&in);
      r.compute += t;
      r.flops += flops;
      if (o.phase != Phase::Forward) r.backward += t;
    } else if (in.kind == InstrKind::ZeroGrads || in.kind == InstrKind::Load) {
      // Not ops, but the step's work all the same, in line with them: clearing the rank's
      // gradients (their bytes written), and copying a micro-batch from the host's staging
      // into the model's inputs (read and written).
      std::pair<int, BackwardPart> key{-1 - static_cast<int>(in.kind), BackwardPart::Whole};
      auto cached = byRun.find(key);
      if (cached != byRun.end()) {
        r.compute += cached->second.seconds;
        ++cached->second.runs;
        continue;
      }
      double bytes = in.kind == InstrKind::ZeroGrads
                         ? static_cast<double>(p.gradBytes)
                         : 2.0 * static_cast<double>(p.inputBytes) / std::max(p.microBatches, 1);
      byRun[key] = {bytes / memory, 0, 1};
      r.firstRuns.push_back(&in);
      r.compute += bytes / memory;
    } else if (in.kind == InstrKind::ReduceStart) {
      // A tied weight's sum over its stages (`tie`): the whole bucket in f32.
      const GradBucket& b = m.buckets[in.bucket];
      int ranks = once(ranksOf, std::make_pair(in.bucket, in.tie),
                       [&] { return m.reductionRanks(p, b, in.tie); });
      const Link& link = spreadLink(c, np, ranks);
      double bytes = static_cast<double>(in.tie ? b.bytes : m.wireBytes(b));
      r.reduction += scatter && !in.tie ? ringHalfSeconds(bytes, ranks, link)
                                        : ringAllReduceSeconds(bytes, ranks, link);
    } else if (in.kind == InstrKind::GatherStart) {
      const GradBucket& b = m.buckets[in.bucket];
      (in.use == 0 ? r.forwardGathers : r.reduction) +=
          ringHalfSeconds(static_cast<double>(b.bytes), b.ranks, spreadLink(c, np, b.ranks));
      // With the parameters on disk, the rank's part of the bucket is read first.
      if (m.offloadsParams()) r.offloadGathers += static_cast<double>(b.bytes) / b.ranks;
    } else if (in.kind == InstrKind::Send) {
      const Link& link = m.mesh.replicaSize > c.devicesPerNode ? c.interNode : c.intraNode;
      int64_t bytes = once(transferBytesOf, std::make_pair(in.tensor, in.rows),
                           [&] { return m.transferBytes(p, in); });
      r.transfers += link.sendSeconds(static_cast<double>(bytes));
    }
  }
  if (p.splitWidth > 1) {
    Module::SplitTraffic t = m.splitTraffic(p);
    int collectives = 0;
    for (int k = 0; k < 2; ++k)
      collectives += t.allReduces[k] + t.allGathers[k] + t.reduceScatters[k] + t.allToAlls[k];
    const Link& link = p.splitWidth <= c.devicesPerNode ? c.intraNode : c.interNode;
    r.split = p.microBatches * (static_cast<double>(t.ringSendBytes) / link.bandwidth +
                                collectives * 2.0 * (p.splitWidth - 1) * link.latency);
  }
  // The optimizer reads and writes each parameter, its gradient and its states once. Its
  // kernel streams (a few FLOPs a byte), so on a calibrated machine its bytes move at the
  // rate of a working set their size, which stays in cache from step to step where it fits.
  // There it reads them all and writes the parameters and states back over the lines it has
  // just read, where the curve's y = a + b moves 16 bytes for the 12 it counts (y's lines
  // are read before they are written).
  double updated = static_cast<double>(p.paramBytes + p.gradBytes + p.optimizerBytes);
  if (d.bandwidthBySize.empty()) {
    r.optimizer = 2.0 * updated / memory;
  } else {
    double moved = updated + static_cast<double>(p.paramBytes + p.optimizerBytes);
    r.optimizer = moved * 12 / 16 / (d.bandwidthFor(updated) * d.memoryEfficiency);
  }
  // ZeRO stages 1 and 2: then every rank's updated slice of the parameters goes to every
  // rank of its domain (Executor::gatherParams), an all-gather in f32 after the update.
  if (m.zeroApplies() && !m.zeroShardsParams())
    for (const Module::ZeroSlice& z : m.zeroSlices(p))
      r.optimizer += ringHalfSeconds(static_cast<double>(z.bytes) * z.ranks, z.ranks,
                                     spreadLink(c, np, z.ranks));
  // Offloaded states: the update reads each chunk of the file (or of host memory) and
  // writes it back, one chunk read ahead and one written behind the one it updates, so the
  // update hides the traffic up to its own time; each gather's part is read a gather ahead,
  // behind the compute. Over the rank's share of the node's disks, or over the host link
  // where that is slower (states in host memory: the host link alone).
  if (p.offloadedBytes > 0) {
    r.offloadStream = 2.0 * static_cast<double>(p.offloadedBytes);
    int sharing = std::max(1, std::min(np, c.devicesPerNode));
    double disk = m.offloadsToHostMemory() ? 0 : c.diskBandwidth / sharing; // in host memory
    auto seconds = [&](double bytes) {
      double t = disk > 0 ? bytes / disk : 0;
      if (c.hostLink.bandwidth > 0) t = std::max(t, bytes / c.hostLink.bandwidth);
      return t;
    };
    double stream = seconds(r.offloadStream), gathers = seconds(r.offloadGathers);
    r.offload = stream + gathers;
    // On a calibrated machine the file's worker copies on the cores the update and the
    // compute use (Cluster::overlapsCompute): nothing hides it.
    r.exposedOffload = !c.overlapsCompute ? r.offload
                                          : std::max(0.0, stream - r.optimizer) +
                                                std::max(0.0, gathers - r.compute);
  }
  return r;
}

// The ranks program p stands for: its own, or in a cost-only plan its stage's in every
// replica.
std::vector<int> ranksOf(const Module& m, const Program& p) {
  if (!m.costOnly) return {p.rank};
  return m.mesh.stageRanks(p.stage);
}

// The kinds of device (Cluster::groups) program p's ranks sit on: one, but in a mixed cluster.
std::vector<int> kindsOf(const Module& m, const Program& p, const Cluster& c) {
  std::vector<int> kinds;
  for (int r : ranksOf(m, p))
    if (std::find(kinds.begin(), kinds.end(), c.groupOf(r)) == kinds.end())
      kinds.push_back(c.groupOf(r));
  return kinds;
}

} // namespace

Prediction predictMemory(const Module& m, const Cluster& c) {
  Prediction out;
  out.cluster = c.name;
  out.device = c.devicesName();
  out.deviceBytes = c.device.memoryBytes;
  double room = -1;
  for (const Program& p : m.programs)
    for (int g : kindsOf(m, p, c)) {
      const ClusterDevice& d = c.groupDevice(g);
      double peak = static_cast<double>(p.peakBytes());
      if (room < 0 || peak / d.memoryBytes > room) {
        room = peak / d.memoryBytes;
        out.peakBytes = peak;
        out.deviceBytes = d.memoryBytes;
        out.memoryDevice = d.name;
      }
    }
  return out;
}

bool overMemory(const Module& m, const Program& p, const Cluster& c) {
  for (int g : kindsOf(m, p, c)) {
    double room = c.groupDevice(g).memoryBytes; // 0: not known, as Candidate::fits reads it
    if (room > 0 && static_cast<double>(p.peakBytes()) > room) return true;
  }
  return false;
}

Prediction predict(const Module& m, const Cluster& c, bool ops) {
  // Each program on each kind of device its ranks sit on: the slowest kind sets the pace, as
  // the others wait for it at every collective.
  Prediction out = predictMemory(m, c);
  std::vector<RankCost> ranks;
  std::vector<size_t> programOf;
  for (size_t i = 0; i < m.programs.size(); ++i)
    for (int g : kindsOf(m, m.programs[i], c)) {
      ranks.push_back(costRank(m, m.programs[i], c, c.groupDevice(g)));
      programOf.push_back(i);
    }
  if (ranks.empty()) return out;
  int stages = m.programs[0].stages;
  int micros = std::max(m.programs[0].microBatches, 1);
  // The busiest rank of each stage, a micro-batch: its compute, split collectives and
  // transfers, which run in line with it.
  std::vector<double> perMicro(static_cast<size_t>(stages), 0);
  const RankCost* busiest = &ranks[0];
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankCost& k = ranks[r];
    double work = (k.compute + k.split + k.transfers) / micros;
    int s = m.programs[programOf[r]].stage;
    perMicro[static_cast<size_t>(s)] = std::max(perMicro[static_cast<size_t>(s)], work);
    if (k.compute + k.split > busiest->compute + busiest->split) busiest = &k;
    out.splitCommunication = std::max(out.splitCommunication, k.split);
    out.stageTransfers = std::max(out.stageTransfers, k.transfers);
    out.optimizer = std::max(out.optimizer, k.optimizer);
    out.offload = std::max(out.offload, k.offload);
    out.exposedOffload = std::max(out.exposedOffload, k.exposedOffload);
    out.offloadBytes = std::max(out.offloadBytes, k.offloadStream + k.offloadGathers);
  }
  out.diskCosted = out.offloadBytes == 0 || c.diskBandwidth > 0 || m.offloadsToHostMemory();
  double slowest = *std::max_element(perMicro.begin(), perMicro.end());
  double pipeline = micros * slowest;
  if (stages > 1) {
    out.stageCompute = perMicro;
    // The schedule's idle share, simulated with unit costs (F = 1, B = 2).
    PipelineShape shape{m.mesh.depth(), micros, m.mesh.chunks};
    double idle = classicBubble(shape);
    if (scheduleRequirement(m.policy.schedule, shape).empty()) {
      ScheduleSimulation sim = simulateSchedule(m.policy.schedule, shape);
      if (!sim.deadlocked) idle = sim.bubble;
    }
    double span = pipeline / std::max(1 - idle, 1e-9);
    if (c.coreShare < 1 && span > pipeline) {
      // Ranks sharing cores: in the warm-up and cool-down, where the schedule leaves ranks
      // waiting (its bubble), fewer compete for the cores and those that run get a whole
      // core, not their share: the bubble shrinks by the share.
      span = pipeline + (span - pipeline) * c.coreShare;
      out.sharedCores = true;
    }
    out.bubble = std::max(0.0, span - pipeline);
    pipeline = span;
  }
  out.compute = busiest->compute;
  out.opsRank = ranksOf(m, m.programs[programOf[static_cast<size_t>(busiest - ranks.data())]])[0];
  if (ops && busiest->read > 0) out.ops.push_back({"read", busiest->read, 0, 1});
  if (ops)
    for (const Instr* in : busiest->firstRuns) {
      bool op = in->kind == InstrKind::Run;
      const RankCost::Run& run = busiest->byRun.at(
          {op ? in->op : -1 - static_cast<int>(in->kind), op ? in->part : BackwardPart::Whole});
      std::string name = op ? m.runName(*in) : in->kind == InstrKind::Load ? "load" : "zero-grads";
      out.ops.push_back({name, run.seconds * run.runs, run.flops * run.runs, run.runs});
    }
  // The gradient reduction: overlapped with the backward (each bucket as soon as its
  // gradients are final), or after it.
  // ZeRO-3's gathers for the forward start a block ahead, so the forward hides what it can
  // of them. Neither hides where collectives take the compute's cores (overlapsCompute).
  double reduction = 0, hidden = 0, gathers = 0, forward = 0;
  for (const RankCost& k : ranks) {
    reduction = std::max(reduction, k.reduction);
    gathers = std::max(gathers, k.forwardGathers);
    if (!c.overlapsCompute) continue;
    hidden = std::max(hidden, m.policy.overlapComm ? k.backward : 0.0);
    forward = std::max(forward, k.compute - k.backward);
  }
  out.gradientReduction = reduction + gathers;
  out.exposedReduction = std::max(0.0, reduction - hidden) + std::max(0.0, gathers - forward);
  out.stepSeconds = pipeline + out.exposedReduction + out.optimizer + out.exposedOffload;
  double batch = static_cast<double>(m.train.batch);
  out.samplesPerSecond = batch / out.stepSeconds;
  out.tokensPerSecond = out.samplesPerSecond * static_cast<double>(m.tokensPerSample());
  double hardware = 0;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (r == 0 || programOf[r] != programOf[r - 1]) // a program's FLOPs once, on any device
      hardware += ranks[r].flops * m.ranksLike(m.programs[programOf[r]]);
  double np = static_cast<double>(m.mesh.np);
  out.tflopsPerDevice = hardware / np / out.stepSeconds / 1e12;
  DType compute = m.ampApplies() ? m.ampDtype() : DType::F32;
  double model = 3 * m.forwardFlopsPerSample() * batch;
  double peaks = 0;
  for (int r = 0; r < m.mesh.np; ++r)
    peaks += c.deviceOf(r).peak(compute, m.policy.matmul == Matmul::Tf32);
  out.mfu = model / out.stepSeconds / peaks;
  return out;
}

void printPrediction(const Module& m, const Prediction& p, std::ostream& out) {
  out << fmt::format("\npredicted on {} ({}; docs/cluster.md has the model):\n", p.cluster,
                     p.device);
  if (p.stepSeconds <= 0) {
    out << "  nothing to predict: the plan has no rank programs (a `train` block runs them)\n";
    return;
  }
  std::string rate =
      p.tokensPerSecond > 0
          ? fmt::format("{} tokens/s", withCommas(static_cast<int64_t>(p.tokensPerSecond)))
          : fmt::format("{:.4g} samples/s", p.samplesPerSecond);
  out << fmt::format("  step {}: {}, {:.1f} TFLOP/s per device, MFU {:.1f}%\n",
                     formatSeconds(p.stepSeconds), rate, p.tflopsPerDevice, 100 * p.mfu);
  std::vector<std::string> parts;
  if (p.stageCompute.empty()) {
    parts.push_back(fmt::format("compute {}", formatSeconds(p.compute)));
  } else {
    std::vector<std::string> stages;
    for (double s : p.stageCompute)
      stages.push_back(formatSeconds(s));
    parts.push_back(fmt::format("stages a micro-batch {} x {} micro-batches",
                                fmt::join(stages, " / "), m.policy.microBatches));
    parts.push_back(fmt::format("bubble {}", formatSeconds(p.bubble)));
    if (p.sharedCores)
      parts.push_back("the ranks share the cores: a shorter bubble, the ranks that run in its "
                      "warm-up and cool-down competing with fewer");
  }
  if (p.splitCommunication > 0)
    parts.push_back(fmt::format("split collectives {}", formatSeconds(p.splitCommunication)));
  if (p.stageTransfers > 0)
    parts.push_back(fmt::format("stage transfers {}", formatSeconds(p.stageTransfers)));
  if (p.gradientReduction > 0)
    parts.push_back(fmt::format("gradient reduction {} ({} not hidden by the backward)",
                                formatSeconds(p.gradientReduction),
                                formatSeconds(p.exposedReduction)));
  parts.push_back(fmt::format("optimizer {}", formatSeconds(p.optimizer)));
  if (p.offloadBytes > 0)
    parts.push_back(
        p.diskCosted || p.offload > 0
            ? fmt::format("offload traffic {} a rank ({}, {} not hidden by the update{})",
                          formatBytes(p.offloadBytes), formatSeconds(p.offload),
                          formatSeconds(p.exposedOffload),
                          p.diskCosted ? ""
                                       : "; the host link alone: the cluster gives no "
                                         "`disk_bandwidth`")
            : fmt::format("offload traffic {} a rank, not costed: the cluster gives no "
                          "`disk_bandwidth`",
                          formatBytes(p.offloadBytes)));
  out << fmt::format("  parts: {}\n", fmt::join(parts, "; "));
  if (p.peakBytes > p.deviceBytes && p.device == p.memoryDevice)
    out << fmt::format(
        "  the largest rank's memory plan ({}) is more than the device's memory ({})\n",
        formatBytes(p.peakBytes), formatBytes(p.deviceBytes));
  else if (p.peakBytes > p.deviceBytes)
    out << fmt::format("  a rank's memory plan ({}) is more than its device's memory ({}, {})\n",
                       formatBytes(p.peakBytes), formatBytes(p.deviceBytes), p.memoryDevice);
}

} // namespace epl::ir
