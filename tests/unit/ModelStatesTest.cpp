// Model states per device from first principles (Adam, Psi parameters, N data-parallel
// devices). EPL's amp keeps no half copy of the weights (docs/architecture.md, "Mixed
// precision"): the f32 weights are the master copy, so mixed-precision Adam holds what f32
// Adam holds, 16 Psi (4 weights + 4 gradients + 8 moments); ZeRO-1 8 Psi + 8 Psi / N;
// ZeRO-2 4 Psi + 12 Psi / N; ZeRO-3 16 Psi / N. (The ZeRO paper's 4 Psi + 12 Psi / N and
// 2 Psi + 14 Psi / N count a persistent fp16 copy of the weights and fp16 gradients.)
#include "interp/Init.h"
#include "interp/Trainer.h"
#include "lib/Epl.h"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>

namespace {

constexpr int64_t kPsi = 1024 * 1024; // one 1024x1024 linear without bias

// The one-linear model under `policy` and `optimizer`, planned at -np `np`.
std::optional<epl::ir::Module> planNet(const std::string& policy, const std::string& optimizer,
                                       int np, bool deviceMemoryIsHost = true) {
  std::string text = fmt::format(R"(
model net(x: f32[B, 1024], y: i32[B]) {{
  return mse(linear(x, 1024, bias = false), x)
}}
policy {{ {} }}
train net {{
  data = synthetic(samples = 64)
  batch = 64
  optimizer = {}
}}
)",
                                 policy, optimizer);
  epl::Session session;
  epl::PlanOptions options;
  options.np = np;
  options.deviceMemoryIsHost = deviceMemoryIsHost;
  auto m = epl::planText("states.epl", text, session, options);
  if (!m)
    for (const auto& d : session.diags.all())
      FAIL(d.message);
  return m;
}

// A script planned at -np `np`; a diagnostic fails the test.
epl::ir::Module planScript(const std::string& text, int np) {
  epl::Session session;
  epl::PlanOptions options;
  options.np = np;
  auto m = epl::planText("states.epl", text, session, options);
  if (!m)
    for (const auto& d : session.diags.all())
      FAIL(d.message);
  REQUIRE(m);
  return *m;
}

int64_t modelStates(const std::string& policy, const std::string& optimizer, int np) {
  auto m = planNet(policy, optimizer, np);
  if (!m) return -1;
  REQUIRE(m->mesh.stages.size() == 1);
  return m->mesh.stages[0].modelStateBytes();
}

} // namespace

TEST_CASE("mixed-precision Adam model states follow the ZeRO stages") {
  for (int n : {1, 2, 4, 8}) {
    INFO("N = " << n);
    CHECK(modelStates("amp = bf16", "adam(lr = 1e-3)", n) == 16 * kPsi);
    CHECK(modelStates("amp = bf16 zero = 1", "adam(lr = 1e-3)", n) == 8 * kPsi + 8 * kPsi / n);
    CHECK(modelStates("amp = fp16 zero = 2", "adamw(lr = 1e-3)", n) == 4 * kPsi + 12 * kPsi / n);
    CHECK(modelStates("amp = bf16 zero = 3", "adamw(lr = 1e-3)", n) == 16 * kPsi / n);
  }
}

TEST_CASE("fp32 and SGD model states") {
  CHECK(modelStates("amp = none", "adam(lr = 1e-3)", 1) == 16 * kPsi); // 4 + 4 + 8
  CHECK(modelStates("amp = none", "sgd(lr = 0.1, momentum = 0.9)", 1) == 12 * kPsi);
  CHECK(modelStates("amp = none", "sgd(lr = 0.1)", 1) == 8 * kPsi);
  CHECK(modelStates("amp = none zero = 1", "sgd(lr = 0.1, momentum = 0.9)", 4) == 8 * kPsi + kPsi);
}

TEST_CASE("offloading the optimizer leaves parameters and gradients on the device") {
  CHECK(modelStates("amp = bf16 offload = optimizer", "adam(lr = 1e-3)", 2) == 8 * kPsi);
  CHECK(modelStates("amp = bf16 zero = 3 offload = params", "adam(lr = 1e-3)", 4) == 4 * kPsi / 4);
}

// What a rank's program holds (the ledger `epl run` allocates): offloaded to disk, the
// optimizer states leave memory for three staging buffers of a chunk of each state (at most
// 1 MiB, no larger than the largest parameter); to cpu, they stay (the CPU device's memory
// is the host's).
TEST_CASE("offloading the optimizer to disk leaves staging buffers in the rank's ledger") {
  auto program = [](const std::string& policy, const std::string& optimizer, int np) {
    auto m = planNet(policy, optimizer, np);
    REQUIRE(m);
    for (const epl::ir::Program& p : m->programs) { // the ranks hold alike
      CHECK(p.stagingBytes == m->programs[0].stagingBytes);
      CHECK(p.offloadedBytes == m->programs[0].offloadedBytes);
    }
    return m->programs.at(0);
  };
  epl::ir::Program disk = program("offload = optimizer offload_to = disk", "adam(lr = 1e-3)", 1);
  CHECK(disk.optimizerBytes == 0);
  CHECK(disk.offloadedBytes == 8 * kPsi);
  CHECK(disk.stagingBytes == 3 * 2 * (int64_t{1} << 20));
  CHECK(disk.peakBytes() ==
        disk.arenaBytes + 4 * kPsi + 4 * kPsi + disk.stagingBytes + disk.inputBytes);
  CHECK(disk.inputBytes == 4 * 64 * 1024 + 4 * 64); // the host's copy of x and y
  // ZeRO stage 1 over 4 ranks: a quarter of the states on each rank's disk.
  epl::ir::Program zero =
      program("zero = 1 offload = optimizer offload_to = disk", "sgd(lr = 0.1, momentum = 0.9)", 4);
  CHECK(zero.offloadedBytes == kPsi);
  CHECK(zero.stagingBytes == 3 * (int64_t{1} << 20));
  epl::ir::Program cpu = program("offload = optimizer offload_to = cpu", "adam(lr = 1e-3)", 1);
  CHECK(cpu.optimizerBytes == 8 * kPsi);
  CHECK(cpu.offloadedBytes == 0);
  CHECK(cpu.stagingBytes == 0);
  // On devices with memory of their own (a GPU), `offload_to = cpu` moves them to the
  // host's memory, streamed through the same staging buffers as a file's.
  auto gpu = planNet("offload = optimizer offload_to = cpu", "adam(lr = 1e-3)", 1, false);
  REQUIRE(gpu);
  CHECK(gpu->offloadsToHostMemory());
  CHECK(gpu->programs[0].optimizerBytes == 0);
  CHECK(gpu->programs[0].offloadedBytes == 8 * kPsi);
  CHECK(gpu->programs[0].stagingBytes == disk.stagingBytes);
  CHECK(std::string(gpu->offloadPlace()) == "in host memory");
  // Nothing to offload: SGD without momentum keeps no states.
  CHECK(program("offload = optimizer offload_to = disk", "sgd(lr = 0.1)", 1).stagingBytes == 0);
}

// ZeRO stage 2 in a purely data-parallel plan: each rank keeps its slice of the gradients,
// every micro-batch reduce-scatters the buckets into it (each waited for in its micro-batch),
// and the buckets' gradients sit in the arena until then.
TEST_CASE("ZeRO stage 2 keeps a slice of the gradients and reduces every micro-batch") {
  auto m = planNet("zero = 2 micro_batches = 2", "adam(lr = 1e-3)", 4);
  REQUIRE(m);
  REQUIRE(m->zeroShardsGradients());
  REQUIRE(m->buckets.size() == 1);
  const epl::ir::Program& p = m->programs.at(0);
  CHECK(p.gradBytes == kPsi); // 4 Psi bytes over 4 ranks
  CHECK(p.optimizerBytes == 2 * kPsi);
  // The ring reduce-scatter's window: 4 segments of 1 MiB (each rank's block is 1 MiB).
  CHECK(p.commBytes == 4 * kPsi);
  REQUIRE(p.bucketOffset.size() == 1);
  CHECK(p.bucketOffset[0] + 4 * kPsi <= p.arenaBytes);
  std::vector<int> started(2, 0), waited(2, 0);
  for (const epl::ir::Instr& in : p.step) {
    if (in.kind == epl::ir::InstrKind::ReduceStart) ++started.at(in.micro);
    if (in.kind == epl::ir::InstrKind::ReduceWait) {
      CHECK(started.at(in.micro) == 1);
      ++waited.at(in.micro);
    }
    if (in.kind == epl::ir::InstrKind::Load && in.micro == 1) CHECK(waited[0] == 1);
  }
  CHECK(started == std::vector<int>{1, 1});
  CHECK(waited == std::vector<int>{1, 1});
  // Stage 1 all-reduces whole gradients once, after the last micro-batch.
  auto one = planNet("zero = 1 micro_batches = 2", "adam(lr = 1e-3)", 4);
  REQUIRE(one);
  CHECK_FALSE(one->zeroShardsGradients());
  CHECK(one->programs.at(0).gradBytes == 4 * kPsi);
  CHECK(one->programs.at(0).bucketOffset.empty());
  CHECK(one->programs.at(0).commBytes == 4 * kPsi); // the all-reduce's window alike
  // bf16 on the wire: 4 segments of 512 K elements, and the whole bucket encoded.
  auto bf16 = planNet("zero = 1 comm_dtype = bf16", "adam(lr = 1e-3)", 4);
  REQUIRE(bf16);
  CHECK(bf16->programs.at(0).commBytes == 4 * kPsi / 2 + 2 * kPsi);
  // One rank has nothing to partition.
  auto single = planNet("zero = 2", "adam(lr = 1e-3)", 1);
  REQUIRE(single);
  CHECK_FALSE(single->zeroShardsGradients());
  CHECK(single->programs.at(0).commBytes == 0);
}

// ZeRO stage 3: each rank keeps its slice of the parameters; every micro-batch gathers
// each bucket whole before the first op of its forward, and again of its backward, that
// reads it, one gather in flight ahead of the ops, into blocks of the arena.
TEST_CASE("ZeRO stage 3 keeps a slice of the parameters and gathers each bucket before use") {
  using epl::ir::InstrKind;
  std::string text = R"(
model net(x: f32[B, 256]) {
  h = relu(linear(x, 256, bias = false))
  h = relu(linear(h, 256, bias = false))
  return mse(linear(h, 256, bias = false), x)
}
policy { zero = 3 micro_batches = 2 bucket_mb = 256KB }
train net {
  data = synthetic(samples = 64)
  batch = 64
  optimizer = adam(lr = 1e-3)
}
)";
  auto plan = [&](const std::string& from, const std::string& to) {
    epl::Session session;
    epl::PlanOptions options;
    options.np = 4;
    std::string t = text;
    t.replace(t.find(from), from.size(), to);
    auto m = epl::planText("zero3.epl", t, session, options);
    for (const auto& d : session.diags.all())
      FAIL(d.message);
    return m;
  };
  auto m = plan("zero = 3", "zero = 3");
  REQUIRE(m);
  REQUIRE(m->zeroShardsParams());
  REQUIRE(m->buckets.size() == 3); // one 256 x 256 weight (262 KB) each
  const epl::ir::Program& p = m->programs.at(0);
  constexpr int64_t kWeight = 4 * 256 * 256;
  CHECK(p.paramBytes == 3 * kWeight / 4);
  CHECK(p.gradBytes == 3 * kWeight / 4);
  REQUIRE(p.gatherOffset.size() == 6);
  // The backward keeps the forward's block of the head (bucket 0: its last forward reader
  // and first backward one run back to back), and has no block of its own for it.
  for (int b = 0; b < 3; ++b) {
    INFO("bucket " << b);
    CHECK(p.keepsForwardGather(b) == (b == 0));
    for (int use : {0, 1}) {
      int64_t at = p.gatherOffset[2 * b + use];
      CHECK((at < 0) == (use == 1 && b == 0));
      if (at >= 0) CHECK(at + kWeight <= p.arenaBytes);
    }
  }
  std::vector<int> bucketOf(m->params.size(), -1);
  for (size_t b = 0; b < m->buckets.size(); ++b)
    for (int q = m->buckets[b].firstParam; q < m->buckets[b].endParam; ++q)
      bucketOf[q] = static_cast<int>(b);
  // (micro-batch, use, bucket) -> 1 started, 2 arrived
  auto check = [&](const std::vector<epl::ir::Instr>& list, int micros, int uses) {
    std::map<std::tuple<int, int, int>, int> state;
    int inFlight = 0, most = 0, overlapped = 0, ran = 0, ranAtStart = 0;
    for (const epl::ir::Instr& in : list) {
      if (in.kind == InstrKind::GatherStart) {
        CHECK(state[{in.micro, in.use, in.bucket}]++ == 0);
        most = std::max(most, ++inFlight);
        ranAtStart = ran;
      } else if (in.kind == InstrKind::GatherWait) {
        CHECK(state[{in.micro, in.use, in.bucket}]++ == 1);
        --inFlight;
        overlapped += ran > ranAtStart; // ops ran while it travelled
      } else if (in.kind == InstrKind::Run) {
        ++ran;
        const epl::ir::Op& op = m->ops[in.op];
        if (op.phase == epl::ir::Phase::Optimizer) continue;
        for (int q : op.params) {
          int b = bucketOf[q];
          int use = op.phase == epl::ir::Phase::Forward || p.keepsForwardGather(b) ? 0 : 1;
          CHECK(state[{in.micro, use, b}] == 2);
        }
      }
    }
    // Three buckets gathered for each use, but the head's for the backward.
    CHECK(state.size() == static_cast<size_t>(micros * uses * 3 - micros * (uses - 1)));
    // One gather in flight at a time, each but the first of a forward while the previous
    // bucket's ops run (the backward's first runs beside the kept head's).
    CHECK(most == 1);
    CHECK(overlapped == micros * uses * 2);
  };
  check(p.step, 2, 2);
  check(p.eval, 1, 1);
  // Stage 2 holds the parameters whole and gathers nothing.
  auto two = plan("zero = 3", "zero = 2");
  REQUIRE(two);
  CHECK_FALSE(two->zeroShardsParams());
  CHECK(two->programs.at(0).paramBytes == 3 * kWeight);
  CHECK(two->programs.at(0).gatherOffset.empty());
  for (const epl::ir::Instr& in : two->programs.at(0).step)
    CHECK(in.kind != InstrKind::GatherStart);
}

// `offload = params` with `offload_to = disk` keeps ZeRO-3's parameter slices in the file
// with the optimizer states: nothing of the parameters stays in memory between gathers.
// Where stage 3 does not apply, `epl run` warns, saying what it needs.
TEST_CASE("offload = params keeps the parameter slices on disk where ZeRO stage 3 applies") {
  auto plan = [](int np, std::string& warnings) {
    epl::Session session;
    epl::PlanOptions options;
    options.np = np;
    auto m = epl::planText("offload.epl", R"(
model net(x: f32[B, 1024]) {
  return mse(linear(x, 1024, bias = false), x)
}
policy { zero = 3 offload = params offload_to = disk }
train net {
  data = synthetic(samples = 64)
  batch = 64
  optimizer = adam(lr = 1e-3)
}
)",
                           session, options);
    REQUIRE(m);
    epl::Diagnostics diags(session.sources);
    epl::interp::warnUnappliedPolicies(*m, diags);
    for (const auto& d : diags.all())
      warnings += d.message + "\n";
    return m;
  };
  std::string warnings;
  auto four = plan(4, warnings);
  CHECK(warnings.empty());
  REQUIRE(four->offloadsParams());
  const epl::ir::Program& p = four->programs.at(0);
  CHECK(p.paramBytes == 0);
  CHECK(p.optimizerBytes == 0);
  CHECK(p.offloadedBytes == 3 * kPsi); // the slice (4 Psi / 4) and Adam's two states of it
  // The gathers read each rank's part of the one bucket (4 Psi bytes / 4 ranks) ahead into
  // one more buffer, beside the optimizer's 3 buffers x 3 blocks x 1 MiB.
  CHECK(p.partStagingBytes == kPsi);
  CHECK(p.stagingBytes == 3 * 3 * (int64_t{1} << 20) + kPsi);
  auto one = plan(1, warnings);
  CHECK_FALSE(one->offloadsParams());
  CHECK(one->programs.at(0).paramBytes == 4 * kPsi);
  CHECK(warnings.find("`offload` is not applied") != std::string::npos);
}

TEST_CASE("each rank holds its own stages' parameters, and its pieces of those cut by a split") {
  // Two stages of one 64x64 linear each (no bias), the second split 2 ways by columns.
  std::string text = R"(
model net(x: f32[B, 64], y: f32[B, 64]) {
  replicate { h = linear(x, 64, bias = false) }
  split(2) { h = linear(h, 64, bias = false) }
  return mse(h, y)
}
policy { micro_batches = 2 }
train net {
  data = synthetic(samples = 16)
  batch = 8
  optimizer = adam(lr = 1e-3)
}
)";
  epl::ir::Module m = planScript(text, 4); // two ranks a stage
  REQUIRE(m.programs.size() == 4);
  REQUIRE(m.params.size() == 2);
  const int64_t whole = 4 * 64 * 64;
  for (const epl::ir::Program& p : m.programs) {
    INFO("rank " << p.rank << ", stage " << p.stage);
    epl::ir::Module::ParamLayout l = m.paramLayout(p);
    int mine = p.stage, other = 1 - p.stage;
    CHECK(m.holdsParam(p, mine));
    CHECK_FALSE(m.holdsParam(p, other));
    CHECK(l.offset[mine] == 0);
    CHECK(l.offset[other] == -1);
    int64_t bytes = p.stage == 0 ? whole : whole / 2; // the split stage's ranks: a half each
    CHECK(l.bytes[mine] == bytes);
    CHECK(l.total == bytes);
    // The memory plan counts what the executor lays out: no other stage's parameters.
    CHECK(p.paramBytes == bytes);
    CHECK(p.gradBytes == bytes);
    CHECK(p.optimizerBytes == 2 * bytes);
  }
}

TEST_CASE("ZeRO over split regions: the stage's parameters over every rank, pieces over copies") {
  // One stage: a 64x64 linear outside the split region, a 64x128 one split 2 ways by
  // columns inside, in 2 copies at -np 4 (3 at -np 6); at -np 2 one copy holds the pieces.
  auto plan = [](int np) {
    std::string text = R"(
model net(x: f32[B, 64], y: f32[B, 128]) {
  replicate {
    h = linear(x, 64, bias = false)
    split(2) { h = linear(h, 128, bias = false) }
  }
  return mse(h, y)
}
policy { zero = 2 }
train net {
  data = synthetic(samples = 24)
  batch = 12
  optimizer = adam(lr = 1e-3)
}
)";
    return planScript(text, np);
  };
  const int64_t outside = 4 * 64 * 64, piece = 4 * 64 * 128 / 2;
  auto slice = [](int64_t bytes, int n) { return ((bytes + n - 1) / n + 63) / 64 * 64; };
  for (int np : {4, 6}) {
    INFO("-np " << np);
    epl::ir::Module m = plan(np);
    REQUIRE(m.zeroApplies());
    REQUIRE(m.zeroShardsGradients());
    CHECK(m.reducedOverPieces(1));
    CHECK_FALSE(m.reducedOverPieces(0));
    for (const epl::ir::Program& p : m.programs) {
      INFO("rank " << p.rank);
      std::vector<epl::ir::Module::ZeroSlice> z = m.zeroSlices(p);
      REQUIRE(z.size() == 2);
      CHECK_FALSE(z[0].pieces);
      CHECK(z[0].ranks == np);
      CHECK(z[0].rank == p.rank);
      CHECK(z[0].bytes == slice(outside, np));
      CHECK(z[1].pieces);
      CHECK(z[1].ranks == np / 2);
      CHECK(z[1].rank == p.rank / 2);
      CHECK(z[1].bytes == slice(piece, np / 2));
      // The domains' padded slices do not overlap.
      CHECK(z[0].base + z[0].ranks * z[0].bytes <= z[1].base);
      // Adam's two states and the gradients of the two slices.
      CHECK(p.optimizerBytes == 2 * (z[0].bytes + z[1].bytes));
      CHECK(p.gradBytes == z[0].bytes + z[1].bytes);
    }
  }
  // One copy of the split group: its pieces are not shared, so ZeRO does not apply.
  epl::ir::Module one = plan(2);
  CHECK_FALSE(one.splitPiecesShared());
  CHECK_FALSE(one.zeroApplies());
  CHECK_FALSE(one.zeroShardsGradients());
}

TEST_CASE("a tied head's weight is the embedding's: counted, laid out and updated once") {
  // A 64 x 32 embedding and a head that ties to it, split 2 ways: both cut the vocabulary.
  std::string text = R"(
model lm(tokens: i32[B, 16]) {
  split(2) {
    x = embedding(tokens, 64, 32)
    loss = cross_entropy(linear(x, 64, bias = false, tie = embedding), next(tokens))
  }
  return loss
}
train lm {
  data = synthetic(samples = 16)
  batch = 8
  optimizer = adam(lr = 1e-3)
}
)";
  epl::ir::Module m = planScript(text, 2);
  REQUIRE(m.params.size() == 1);
  CHECK(m.params[0].name == "embedding.weight");
  CHECK(m.params[0].shardDim == 0);
  int users = 0, steps = 0;
  for (const epl::ir::Op& op : m.ops) {
    if (op.phase == epl::ir::Phase::Forward && op.params == std::vector<int>{0}) ++users;
    if (op.kind == epl::ir::OpKind::OptimizerStep) ++steps;
  }
  CHECK(users == 2);
  CHECK(steps == 1);
  const epl::ir::StagePlan& st = m.mesh.stages.at(0);
  CHECK(st.paramCount == 64 * 32);
  CHECK(st.rankParamCount == 64 * 32 / 2);
  const int64_t half = 4 * 64 * 32 / 2;
  for (const epl::ir::Program& p : m.programs) {
    INFO("rank " << p.rank);
    CHECK(m.paramLayout(p).total == half);
    CHECK(p.paramBytes == half);
    CHECK(p.gradBytes == half);
    CHECK(p.optimizerBytes == 2 * half);
  }
}

TEST_CASE("a weight tied across stages has a copy in each, summed over both stages' ranks") {
  // The embedding in stage 0, the head tied to it in stage 1; two copies of the pipeline.
  std::string text = R"(
model lm(tokens: i32[B, 16]) {
  replicate { x = embedding(tokens, 64, 32) }
  replicate {
    loss = cross_entropy(linear(layer_norm(x), 64, bias = false, tie = embedding), next(tokens))
  }
  return loss
}
policy { micro_batches = 2 }
train lm {
  data = synthetic(samples = 16)
  batch = 8
  optimizer = adam(lr = 1e-3)
}
)";
  epl::ir::Module m = planScript(text, 4);
  REQUIRE(m.params.size() == 3); // the matrix, the norm's weight and bias
  const epl::ir::Param& w = m.params[0];
  CHECK(w.name == "embedding.weight");
  CHECK(w.copies == std::vector<int>{1});
  const int64_t matrix = 64 * 32;
  CHECK(m.mesh.stages[0].paramCount == matrix); // counted once, where it was made
  CHECK(m.mesh.stages[1].paramCount == 64);
  CHECK(m.mesh.stages[1].rankParamCount == matrix + 64); // but held in both
  CHECK(m.tiedRanks(0) == std::vector<int>{0, 1, 2, 3});
  int steps = 0;
  for (const epl::ir::Op& op : m.ops)
    if (op.kind == epl::ir::OpKind::OptimizerStep && op.params == std::vector<int>{0}) ++steps;
  CHECK(steps == 2); // each stage updates its copy
  int tiedBuckets = 0;
  for (const epl::ir::GradBucket& b : m.buckets)
    if (b.tied) {
      ++tiedBuckets;
      CHECK(b.firstParam == 0);
      CHECK(b.endParam == 1);
      CHECK(b.ranks == 4);
    } else {
      CHECK(b.firstParam > 0); // the matrix is in no data-parallel bucket
    }
  CHECK(tiedBuckets == 2);
  for (const epl::ir::Program& p : m.programs) {
    INFO("rank " << p.rank << ", stage " << p.stage);
    CHECK(m.holdsParam(p, 0));
    CHECK(m.holdsCopy(p, 0) == (p.stage == 1));
    CHECK(m.paramLayout(p).bytes[0] == 4 * matrix);
  }
}

TEST_CASE("an embedding's `std` scales its initial values, the default drawing N(0, 1)") {
  auto planWith = [](const std::string& call) {
    return planScript(fmt::format(R"(
model lm(tokens: i32[B, 16]) {{
  x = {}
  return cross_entropy(linear(x, 256), next(tokens))
}}
train lm {{
  data = synthetic(samples = 8)
  batch = 8
}}
)",
                                  call),
                      1);
  };
  auto stdOf = [](const std::vector<float>& v) {
    double sum = 0, squares = 0;
    for (float x : v)
      sum += x, squares += static_cast<double>(x) * x;
    double mean = sum / static_cast<double>(v.size());
    return std::sqrt(squares / static_cast<double>(v.size()) - mean * mean);
  };
  epl::ir::Module plain = planWith("embedding(tokens, 256, 64)");
  epl::ir::Module small = planWith("embedding(tokens, 256, 64, std = 0.02)");
  REQUIRE(small.params[0].name == "embedding.weight");
  CHECK(small.params[0].initStd == 0.02);
  std::vector<float> one = epl::interp::initialValues(plain, 0, 7);
  std::vector<float> scaled = epl::interp::initialValues(small, 0, 7);
  REQUIRE(one.size() == 256 * 64);
  CHECK(stdOf(one) == Approx(1).epsilon(0.03)); // 16,384 draws: a standard error of 0.6%
  for (size_t i = 0; i < one.size(); ++i)       // the same draws, scaled (each rounded once)
    REQUIRE(scaled[i] == Approx(one[i] * 0.02).epsilon(1e-6));
}
