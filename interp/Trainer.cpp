// The training loop (Trainer.h): every rank runs it, each step through its Executor.
#include "interp/Trainer.h"

#include "backend/Device.h"
#include "backend/comm/Comm.h"
#include "interp/Checkpoint.h"
#include "interp/DeviceChoice.h"
#include "interp/Executor.h"
#include "interp/Init.h"
#include "interp/LrSchedule.h"
#include "interp/Progress.h"
#include "interp/StopSignals.h"
#include "interp/TensorBoardLog.h"
#include "interp/Trace.h"
#include "interp/checkpoint/AtomicFile.h"
#include "interp/checkpoint/FolderLock.h"
#include "interp/data/Dataset.h"
#include "ir/PipelineSchedule.h"
#include "ir/Predict.h"
#include "support/Assert.h"
#include "support/Text.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <malloc.h>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unistd.h>

namespace epl::interp {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Whether an op only moves, shifts or picks out the elements of its first input (so the
// values an integer input may take are those its output's readers accept).
bool movesElements(ir::OpKind k) {
  using K = ir::OpKind;
  return k == K::Next || k == K::Reshape || k == K::Flatten || k == K::Transpose ||
         k == K::Select || k == K::Narrow || ir::opInfo(k).split == ir::SplitRule::Communication;
}

// How many values the layers reading integer tensor t accept: the smallest embedding vocab
// or cross-entropy class count among them, through the ops that only move, shift or pick
// out its elements (bridges, `next`, reshapes, `select`); 0 when none of them says.
int64_t accepted(const ir::Module& m, int t) {
  int64_t n = 0;
  auto take = [&](int64_t v) { n = n == 0 ? v : std::min(n, v); };
  for (const ir::Op& op : m.ops) {
    if (op.phase != ir::Phase::Forward) continue;
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      if (op.inputs[k] != t) continue;
      if (op.kind == ir::OpKind::Embedding && k == 0) take(ir::intAttr(op.attrs, "vocab"));
      if (op.kind == ir::OpKind::CrossEntropy && k == 1)
        take(m.tensors[op.inputs[0]].type.shape.back().coef);
      if (movesElements(op.kind) && k == 0)
        if (int64_t v = accepted(m, op.outputs[0]); v > 0) take(v);
    }
  }
  return n;
}

// Elements of one sample of model input t (its dims after the batch's).
int64_t sampleElements(const ir::Module& m, int t) {
  int64_t n = 1;
  for (size_t d = 1; d < m.tensors[t].type.shape.size(); ++d)
    n *= *m.tensors[t].type.shape[d].eval(m.bindings);
  return n;
}

std::vector<data::InputSpec> inputSpecs(const ir::Module& m) {
  std::vector<data::InputSpec> out;
  for (int t : m.inputs) {
    const ir::Tensor& x = m.tensors[t];
    data::InputSpec s{x.name, x.type.dtype, {}, 0};
    for (size_t d = 1; d < x.type.shape.size(); ++d)
      s.sampleShape.push_back(*x.type.shape[d].eval(m.bindings));
    if (ir::isIntegral(x.type.dtype)) s.accepts = accepted(m, t); // a walk over the ops
    out.push_back(s);
  }
  return out;
}

OptimizerSettings optimizerSettings(const ir::TrainConfig& t) {
  const ir::CallSpec& c = t.optimizer;
  auto num = [&](const char* k, double d) {
    auto it = c.numbers.find(k);
    return static_cast<float>(it == c.numbers.end() ? d : it->second);
  };
  OptimizerSettings s;
  ir::Optimizer kind = ir::optimizerOf(c);
  s.kind = kind == ir::Optimizer::Sgd    ? backend::OptimizerKind::Sgd
           : kind == ir::Optimizer::Adam ? backend::OptimizerKind::Adam
                                         : backend::OptimizerKind::AdamW;
  s.beta1 = num("beta1", 0.9);
  s.beta2 = num("beta2", 0.999);
  s.eps = num("eps", 1e-8);
  // torch.optim's defaults: AdamW decays by 0.01, Adam and SGD not at all.
  s.weightDecay = num("weight_decay", kind == ir::Optimizer::AdamW ? 0.01 : 0.0);
  s.momentum = num("momentum", 0);
  s.clipGradNorm = t.clipGradNorm;
  return s;
}

std::string resolve(const std::string& base, const std::string& path) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return (fs::path(base) / path).lexically_normal().string();
}

// Reads samples `ids` of `split` into micro-batch `micro`'s staging buffers.
void fill(Executor& ex, const data::Dataset& ds, data::Split split, const std::vector<int64_t>& ids,
          int micro) {
  HostBatch& b = ex.staging(micro);
  std::vector<void*> ptrs;
  for (auto& in : b.inputs)
    ptrs.push_back(in.data());
  ds.read(split, ids, ptrs, ex.readsNextTokens() ? b.nextTargets() : nullptr);
}

struct Evaluation {
  double loss = 0;
  double accuracy = -1; // -1 when the loss is not a cross-entropy
  int64_t samples = 0;
};

// Loss (and accuracy for a cross-entropy) over the first `limit` validation samples. Each
// round takes the next localBatch x readers samples, one slice per reader, as a training
// micro-batch does; the ranks' sums meet at the end. A cross-entropy is scored per row on
// the host, so a last, partial slice (padded by repeating the last sample) counts its real
// rows only.
Evaluation evaluate(Executor& ex, const data::Dataset& ds, int64_t limit,
                    const std::function<void(int64_t, int64_t)>& progress = {}) {
  backend::Comm& comm = ex.comm();
  int64_t n = std::min(ds.size(data::Split::Validation), limit), batch = ex.localBatch();
  int64_t ranks = ex.readers(), round = batch * ranks;
  int64_t classes = ex.classes();
  // lossSum, rowsSeen, correct of this rank
  double sums[3] = {0, 0, 0};
  std::vector<float> logits;
  std::vector<int32_t> targets;
  for (int64_t start = 0; start < n; start += round) {
    if (progress) progress(start, n);
    int64_t first = start + ex.reader() * batch;
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < batch; ++i)
      ids.push_back(std::min(first + i, n - 1));
    fill(ex, ds, data::Split::Validation, ids, 0);
    int64_t valid = std::clamp<int64_t>(n - first, 0, batch);
    if (classes == 0) {
      double l = ex.runEval(nullptr, nullptr);
      if (!ex.holdsLoss()) continue; // a pipeline stage before the loss's
      // A padded batch's mean is not its rows' mean; count it only when it is all there is.
      if (valid == batch || (valid > 0 && first == 0)) {
        sums[0] += l * static_cast<double>(valid);
        sums[1] += static_cast<double>(valid);
      }
      continue;
    }
    ex.runEval(&logits, &targets);
    if (!ex.holdsLoss()) continue;
    int64_t rowsPerSample = static_cast<int64_t>(targets.size()) / batch;
    for (int64_t r = 0; r < valid * rowsPerSample; ++r) {
      if (targets[r] == ex.ignoredClass()) continue; // counts nothing, as in training
      const float* row = logits.data() + r * classes;
      float top = row[0];
      int64_t arg = 0;
      for (int64_t c = 1; c < classes; ++c)
        if (row[c] > top) top = row[c], arg = c;
      double sum = 0;
      for (int64_t c = 0; c < classes; ++c)
        sum += std::exp(static_cast<double>(row[c]) - top);
      sums[0] += std::log(sum) + top - row[targets[r]];
      sums[2] += arg == targets[r];
      sums[1] += 1;
    }
  }
  std::vector<double> all(3 * static_cast<size_t>(comm.size()));
  comm.allGather(sums, all.data(), sizeof sums, "the evaluation's sums");
  double lossSum = 0, rowsSeen = 0, correct = 0;
  for (int r = 0; r < comm.size(); ++r) {
    lossSum += all[3 * r];
    rowsSeen += all[3 * r + 1];
    correct += all[3 * r + 2];
  }
  Evaluation e;
  e.samples = n;
  e.loss = rowsSeen > 0 ? lossSum / rowsSeen : 0;
  if (classes > 0 && rowsSeen > 0) e.accuracy = correct / rowsSeen;
  return e;
}

// The metrics file's first line of a run: what ran, how, and where it resumed.
std::string runHeader(const ir::Module& m, const RunOptions& o, int ranks, int64_t start) {
  std::string text;
  std::ifstream in(o.script, std::ios::binary);
  text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  auto call = [](const ir::CallSpec& c) {
    nlohmann::json j{{"kind", c.kind}};
    for (const auto& [k, v] : c.numbers)
      j[k] = v;
    for (const auto& [k, v] : c.strings)
      j[k] = v;
    return j;
  };
  const ir::Policy& p = m.policy;
  nlohmann::json run{
      {"script", o.script},
      {"script_fnv1a", fmt::format("{:016x}", hashString(text))},
      {"epl", o.version},
      {"np", ranks},
      {"started", std::chrono::duration<double>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count()},
      {"model", m.modelName},
      {"params", m.mesh.stages.empty() ? 0 : [&] {
         int64_t n = 0;
         for (const auto& st : m.mesh.stages)
           n += st.paramCount;
         return n;
       }()},
      {"train",
       {{"data", call(m.train.data)},
        {"batch", m.train.batch},
        {"steps", m.train.steps},
        {"optimizer", call(m.train.optimizer)},
        {"lr_schedule", call(m.train.lrSchedule)},
        {"clip_grad_norm", m.train.clipGradNorm},
        {"seed", m.train.seed}}},
      {"policy",
       {{"micro_batches", p.microBatches},
        {"chunks", p.chunks},
        {"sequence_parallel", p.sequenceParallel},
        {"bucket_bytes", p.bucketBytes},
        {"overlap_comm", p.overlapComm}}}};
  if (start > 0) run["resumed_at_step"] = start;
  return nlohmann::json{{"run", run}}.dump();
}

// What the progress bar and the metrics show of step `step` (0-based) of a run that
// started at `start`; the caller adds the timings.
StepReport stepReport(const StepResult& r, int64_t step, int64_t start, int64_t steps, double lr) {
  StepReport rep;
  rep.step = step + 1;
  rep.steps = steps;
  rep.firstStep = start;
  rep.loss = r.loss;
  rep.lr = lr;
  rep.gradNorm = r.gradNorm;
  rep.memoryBytes = residentBytes();
  rep.reduceWaitSeconds = r.reduceWaitSeconds;
  rep.reduceSpanSeconds = r.reduceSpanSeconds;
  rep.reduceBytes = r.reduceBytes;
  rep.moeAux = r.moeAux;
  rep.moeDropped = r.moeDropped;
  rep.lossScale = r.lossScale;
  rep.skipped = r.skipped;
  return rep;
}

// Writes lines to another stream after a prefix ("rank 2: "): the log of a rank other than
// 0 under --log-all.
class PrefixBuf : public std::streambuf {
public:
  PrefixBuf(std::ostream& to, std::string prefix) : to_(to), prefix_(std::move(prefix)) {}

protected:
  int overflow(int c) override {
    if (c == EOF) return 0;
    if (atLineStart_) to_ << prefix_;
    to_.put(static_cast<char>(c));
    atLineStart_ = c == '\n';
    if (atLineStart_) to_.flush();
    return c;
  }

private:
  std::ostream& to_;
  std::string prefix_;
  bool atLineStart_ = true;
};

std::string evalText(const Evaluation& e) {
  std::string s = fmt::format("loss {:.4f}", e.loss);
  if (e.accuracy >= 0) s += fmt::format(", accuracy {:.2f}%", 100 * e.accuracy);
  return s;
}

SourceLoc keyLoc(const ir::Module& m, const std::string& key) {
  auto it = m.train.keyLocs.find(key);
  return it == m.train.keyLocs.end() ? m.loc : it->second;
}

// A checkpoint problem, at the script's setting it concerns.
void report(Diagnostics& diags, const ir::Module& m, const checkpoint::CheckpointError& e) {
  auto d = diags.error(keyLoc(m, e.key), e.what());
  if (!e.help.empty()) d.help(e.help);
}

void report(Diagnostics& diags, const ir::Module& m, const CheckpointWarning& w) {
  auto d = diags.warning(keyLoc(m, w.key), w.message);
  if (!w.note.empty()) d.note(w.note);
  if (!w.help.empty()) d.help(w.help);
}

constexpr const char* kStopNotice = "\nstopping after this step; a second signal stops at once\n";
constexpr const char* kStopNoticeSaving =
    "\nstopping after this step, with a checkpoint; a second signal stops at once\n";

// The signal a rank received (the lowest rank's), agreed by all so that every rank stops
// after the same step; 0 when none did.
int agreeOnStop(backend::Comm& comm, int mine) {
  std::vector<char> all(static_cast<size_t>(comm.size()));
  char me = static_cast<char>(mine);
  comm.allGather(&me, all.data(), 1, "whether a rank was asked to stop");
  for (char sig : all)
    if (sig != 0) return sig;
  return 0;
}

// What rank 0 says when a signal stopped the run after `step`, and how to go on.
std::string stopText(int sig, int64_t step, int64_t steps, const std::string& saved,
                     const RunOptions& o, int ranks) {
  std::string what = sig == SIGUSR1 ? "stopped on request (SIGUSR1)"
                                    : fmt::format("interrupted by {}", signalName(sig));
  if (saved.empty())
    return fmt::format("{} after step {} of {}; nothing was saved: the train block has no "
                       "`checkpoint = {{ dir = … }}`\n",
                       what, step, steps);
  return fmt::format("{} after step {} of {}; checkpoint: {}\nto continue: epl run {}{} --resume "
                     "(with this run's other options)\n",
                     what, step, steps, saved, o.script.empty() ? "SCRIPT" : o.script,
                     ranks > 1 ? fmt::format(" -np {}", ranks) : "");
}

struct Start {
  int64_t step = 0;
  std::string folder; // the checkpoint resumed from; empty for a fresh start
};

// A checkpoint must leave steps to train: one past `steps` (or at a --stop-after) was
// written by a longer run.
void checkStepsLeft(const ir::Module& m, const RunOptions& o, const Start& s, Diagnostics& mine) {
  if (s.step > m.train.steps)
    mine.error(
            keyLoc(m, m.train.keyLocs.count("steps") ? "steps" : "checkpoint"),
            fmt::format("`{}` is at step {}, past `steps` ({})", s.folder, s.step, m.train.steps))
        .help(fmt::format("raise `--steps` (or `steps` in the script) above {} to train on from it",
                          s.step));
  else if (o.stopAfter > 0 && o.stopAfter <= s.step)
    mine.error(SourceLoc{}, fmt::format("--stop-after {} is not after step {}, where `{}` resumes",
                                        o.stopAfter, s.step, s.folder))
        .help(fmt::format("pass a --stop-after above {}", s.step));
}

// The lines that open a run: the model, where it runs, the data, the batch and the memory
// plan, and the gradient reduction.
void describeRun(std::ostream& out, const ir::Module& m, const Executor& ex,
                 const std::string& device, backend::Comm& comm, const data::Dataset& ds,
                 const ir::Program& prog) {
  int ranks = comm.size();
  int64_t params = 0;
  for (int p = 0; p < static_cast<int>(m.params.size()); ++p)
    params += ex.paramElements(p);
  int stages = prog.stages;
  if (ranks == 1)
    out << fmt::format("model `{}`: {} params on 1 device ({})\n", m.modelName, withCommas(params),
                       device);
  else if (stages > 1) {
    std::vector<int> groups;
    for (int s = 0; s < stages; ++s)
      groups.push_back(m.mesh.stages[s].group);
    bool ones = std::all_of(groups.begin(), groups.end(), [](int g) { return g == 1; });
    out << fmt::format(
        "model `{}`: {} params in {} pipeline stages{}, {}{} ({}, {} comm)\n", m.modelName,
        withCommas(params), stages,
        m.mesh.chunks == 1 ? "" : fmt::format(" of {} model chunks each", m.mesh.chunks),
        ones ? "one rank each" : fmt::format("{} ranks", fmt::join(groups, " + ")),
        m.mesh.dataParallel > 1 ? fmt::format(", x {} data-parallel copies", m.mesh.dataParallel)
                                : "",
        device, comm.name());
  } else if (prog.splitWidth > 1)
    out << fmt::format(
        "model `{}`: {} params on {} ranks, {}: each holds 1/{} of the split "
        "layers{} ({} each, {} comm)\n",
        m.modelName, withCommas(params), ranks,
        ranks == prog.splitWidth ? std::string("one split group")
                                 : fmt::format("{} data-parallel copies of a split group of {}",
                                               ranks / prog.splitWidth, prog.splitWidth),
        prog.splitWidth, m.policy.sequenceParallel ? " and of the sequence between them" : "",
        device, comm.name());
  else
    out << fmt::format("model `{}`: {} params on {} data-parallel ranks ({} each, {} comm)\n",
                       m.modelName, withCommas(params), ranks, device, comm.name());
  out << fmt::format("data: {}\n", ds.describe());
  out << fmt::format(
      "batch {} = {} micro-batch{} x {}{} samples; memory plan {} per rank "
      "(activations {}{}, params {}, grads {}, optimizer {}{})\n",
      m.train.batch, m.policy.microBatches, m.policy.microBatches == 1 ? "" : "es",
      prog.readers > 1 ? fmt::format("{} {} x ", prog.readers,
                                     stages == 1                     ? "ranks"
                                     : prog.readers == m.reduceRanks ? "copies"
                                                                     : "ranks of stage 0")
                       : "",
      ex.localBatch(), formatBytes(prog.peakBytes()),
      formatBytes(prog.slots == 1 ? prog.arenaBytes : prog.activationBytes()),
      prog.largestWorkspace() > 0
          ? fmt::format(" with kernel workspaces up to {}", formatBytes(prog.largestWorkspace()))
          : "",
      formatBytes(prog.paramBytes), formatBytes(prog.gradBytes), formatBytes(prog.optimizerBytes),
      (prog.stagingBytes > 0 ? fmt::format(", staging {}", formatBytes(prog.stagingBytes)) : "") +
          (prog.commBytes > 0 ? fmt::format(", comm buffers {}", formatBytes(prog.commBytes))
                              : "") +
          (prog.inputBytes > 0 ? fmt::format(", host inputs {}", formatBytes(prog.inputBytes))
                               : ""));
  if (m.ampApplies())
    out << fmt::format("mixed precision: activations and their gradients stored in {}, the "
                       "weights and their gradients in fp32{}\n",
                       m.policy.amp == ir::Amp::Bf16 ? "bf16" : "fp16",
                       m.scalesLoss() ? fmt::format("; loss scale {:g}, dynamic", ex.lossScale())
                                      : "");
  if (!ex.offloadDir().empty())
    out << fmt::format("{}: in {} ({}{}), streamed through {} of "
                       "staging buffers in each step\n",
                       m.offloadsParams()
                           ? "the parameters' ZeRO slice and the optimizer states (each gather's "
                             "part of the parameters read from it ahead of the gather)"
                           : "optimizer states",
                       m.offloadsToHostMemory() ? "host memory (page-locked on a GPU)"
                                                : "a file in " + ex.offloadDir(),
                       formatBytes(prog.offloadedBytes), ranks > 1 ? " on rank 0" : "",
                       formatBytes(prog.stagingBytes));
  if (stages > 1) {
    std::vector<std::string> slots;
    for (const ir::Program& p : m.programs)
      if (p.dataRank == 0) // the other ranks of a stage run the same program
        slots.push_back(fmt::format(
            "stage {} {} x {}{}", p.stage, p.slots, formatBytes(p.slotStride()),
            p.sharedBytes > 0 ? fmt::format(" + {} shared", formatBytes(p.sharedBytes)) : ""));
    out << fmt::format("pipeline: {}; activations in flight: {}\n",
                       ir::scheduleName(m.policy.schedule), fmt::join(slots, ", "));
  }
  // A weight tied across stages: one line each (its buckets, one a stage, are apart).
  std::vector<ir::GradBucket> plain;
  std::set<int> tied;
  for (const ir::GradBucket& b : m.buckets)
    b.tied ? void(tied.insert(b.firstParam)) : plain.push_back(b);
  for (int q : tied) {
    std::vector<int> stages = m.stagesHolding(q);
    out << fmt::format("tied weight @{}: a copy in stages {}, its gradients summed over their {} "
                       "ranks after the backward{}\n",
                       m.params[q].name, fmt::join(stages, " and "), m.tiedRanks(q).size(),
                       m.zeroShardsGradients()
                           ? " (of the slices each stage reduce-scattered in every micro-batch)"
                           : "");
  }
  if (plain.empty()) return;
  bool alike = std::all_of(plain.begin(), plain.end(),
                           [&](const ir::GradBucket& b) { return b.ranks == plain[0].ranks; });
  bool scatter = m.zeroShardsGradients();
  out << fmt::format("gradients: {} bucket{} {} over {}{} in {}{}\n", plain.size(),
                     plain.size() == 1 ? "" : "s",
                     scatter ? "reduce-scattered in every micro-batch" : "summed",
                     alike                 ? fmt::format("{} ranks", plain[0].ranks)
                     : prog.splitWidth > 1 ? fmt::format("{} ranks, or {} for the split layers' "
                                                         "pieces",
                                                         m.mesh.np, m.mesh.np / prog.splitWidth)
                                           : "each stage's ranks",
                     stages > 1 ? " (a stage's ranks in every copy)" : "",
                     m.policy.commDtype == ir::DType::F32    ? "fp32"
                     : m.policy.commDtype == ir::DType::BF16 ? "bf16"
                                                             : "fp16",
                     m.policy.overlapComm ? ", overlapping the backward" : ", after the backward");
  // With split regions, their pieces are partitioned over the copies of the split group.
  std::vector<std::string> shares;
  if (ex.zeroRanks() > 0) shares.push_back(fmt::format("1/{}", ex.zeroRanks()));
  if (ex.zeroRanks(true) > 0)
    shares.push_back(fmt::format("of the split layers' pieces 1/{}", ex.zeroRanks(true)));
  std::string share = fmt::format("{}", fmt::join(shares, ", "));
  if (ex.zeroApplied() && m.zeroShardsParams())
    out << fmt::format("parameters, gradients and optimizer states: each rank holds {} (ZeRO "
                       "stage 3) and updates its slice; each bucket's parameters are gathered "
                       "before its forward and its backward in every micro-batch, and freed "
                       "after\n",
                       share);
  else if (ex.zeroApplied())
    out << fmt::format("{}: each rank holds {} (ZeRO stage {}) and updates its "
                       "slice of the parameters; the slices are all-gathered after each step\n",
                       scatter ? "optimizer states and gradients" : "optimizer states", share,
                       scatter ? 2 : 1);
}

// Rank 0 writes the checkpoints: it locks their folder for the whole run, which also shows
// now, not at the first save, whether it can write there.
std::unique_ptr<checkpoint::FolderLock> lockFolder(const ir::Module& m, const std::string& dir,
                                                   Diagnostics& mine) {
  try {
    return std::make_unique<checkpoint::FolderLock>(dir);
  } catch (const checkpoint::CheckpointError& e) {
    report(mine, m, e);
    return nullptr;
  }
}

// Rank 0's start: the newest checkpoint of `dir` on --resume, else the initial weights
// (and, with --save-initial, their checkpoint). Errors go to `mine`, warnings to `diags`.
Start startOnRank0(Executor& ex, const ir::Module& m, const RunOptions& o, const std::string& dir,
                   std::ostream& out, Diagnostics& mine, Diagnostics& diags) {
  Start s;
  try {
    auto latest = dir.empty() ? std::nullopt : latestCheckpoint(dir);
    if (latest && !o.resume) {
      mine.error(keyLoc(m, "checkpoint"),
                 fmt::format("`{}` already holds checkpoints (the newest is `{}`)", dir,
                             fs::path(*latest).filename().string()))
          .help("pass --resume to continue from it, or choose another `dir`");
      return s;
    }
    if (o.resume && dir.empty()) {
      mine.error(m.loc, "--resume needs `checkpoint = { dir = … }` in the train block");
      return s;
    }
    if (latest) {
      LoadedCheckpoint c = loadCheckpoint(ex, *latest, LoadPurpose::Resume);
      // Said now, before the steps, rather than when the run ends.
      Diagnostics now(diags.sources());
      for (const CheckpointWarning& w : c.warnings)
        report(now, m, w);
      now.print(std::cerr, isatty(2) != 0);
      s = {c.state.step, *latest};
      checkStepsLeft(m, o, s, mine);
      if (!mine.hasErrors()) out << fmt::format("resumed from {} (step {})\n", *latest, s.step);
      return s;
    }
    for (size_t p = 0; p < m.params.size(); ++p)
      ex.writeParam(static_cast<int>(p),
                    initialValues(m, static_cast<int>(p), m.train.seed).data());
    if (o.resume) out << fmt::format("no checkpoint in {} yet: starting at step 0\n", dir);
    if (o.saveInitial && !dir.empty())
      saveCheckpoint(ex, dir, {0, static_cast<uint64_t>(m.train.seed), m.train.steps}, 0);
  } catch (const checkpoint::CheckpointError& e) {
    report(mine, m, e);
  }
  return s;
}

// Of the global batch `ids`, how many targets the loss has and how many of them are not
// `ignored`, and how many of each of `ex`'s micro-batches (Executor::setKeptTargets): read
// from the data, so that every rank knows the whole batch's count before its step, without
// communication, and its micro-batches' without reading their targets back.
void setKeptTargets(Executor& ex, const ir::Module& m, const data::Dataset& ds,
                    const std::vector<int64_t>& ids, int64_t ignored) {
  ir::Module::DataSource src = m.dataSource(m.ops[m.tensors[m.outputs[0]].producer].inputs[1]);
  EPL_ASSERT(src.input >= 0, "an ignored class's targets come from the data (Elaborator)");
  std::vector<std::vector<int32_t>> inputs;
  std::vector<void*> ptrs;
  for (int in : m.inputs) { // every step: the sizes alone, not inputSpecs' walk over the ops
    inputs.emplace_back(ids.size() * static_cast<size_t>(sampleElements(m, in))); // f32 or i32
    ptrs.push_back(inputs.back().data());
  }
  std::vector<int32_t> next(src.next ? inputs[src.input].size() : 0);
  ds.read(data::Split::Train, ids, ptrs, src.next ? next.data() : nullptr);
  const std::vector<int32_t>& t = src.next ? next : inputs[src.input];
  int64_t total = static_cast<int64_t>(t.size());
  int64_t perSample = total / static_cast<int64_t>(ids.size());
  std::vector<int64_t> mine;
  for (int mb = 0; mb < ex.microBatches(); ++mb)
    mine.push_back(ir::keptTargets(t.data() + ex.firstSample(mb) * perSample,
                                   ex.localBatch() * perSample, ignored));
  ex.setKeptTargets(ir::keptTargets(t.data(), total, ignored), total, std::move(mine));
}

// ZeRO stage 3 with `offload = params` reads each gather's part of the parameters from disk
// ahead of it: a batch_norm's running statistics, which its forward updates, would be read
// before they were written back (Executor::keepRunningStats keeps them in memory alone).
bool checkBatchNorms(const ir::Module& m, Diagnostics& diags) {
  if (!m.zeroShardsParams() || !m.offloadsParams()) return true;
  for (const ir::Op& op : m.ops) {
    if (op.kind != ir::OpKind::BatchNorm || op.phase != ir::Phase::Forward) continue;
    auto offload = m.policy.keyLocs.find("offload");
    auto d = diags.error(op.site, "`batch_norm` keeps running statistics, which ZeRO stage 3 "
                                  "with `offload = params` does not keep yet");
    d.length(static_cast<uint32_t>(op.name.size()));
    if (offload != m.policy.keyLocs.end()) d.noteAt(offload->second, "offloaded here");
    d.help("use `offload = optimizer`, or `zero = 2` or less");
    return false;
  }
  return true;
}

// Token ids and labels must fit the layers that read them, or kernels would read past
// their tables.
bool checkDataFitsModel(const ir::Module& m, const data::Dataset& ds, Diagnostics& diags) {
  auto isInput = [&](int t) { return m.tensors[t].producer < 0; };
  for (const ir::Op& op : m.ops) {
    if (op.phase != ir::Phase::Forward) continue;
    if (op.kind == ir::OpKind::Next && (!isInput(op.inputs[0]) || !ds.hasNextTokens())) {
      diags
          .error(op.site, isInput(op.inputs[0])
                              ? "`next(…)` needs token data: `tokens(…)`, `text(…)` or synthetic"
                              : "`next(…)` reads the targets the data gives for a model input, "
                                "but its argument is computed")
          .length(4)
          .help("pass a token input of the model, e.g. `next(tokens)`");
      return false;
    }
    // The largest value the data puts in model input t: per input where the data knows.
    auto largest = [&](int t, int64_t whole) {
      auto at = std::find(m.inputs.begin(), m.inputs.end(), t);
      int64_t mine = at == m.inputs.end() ? -1 : ds.maxValue(at - m.inputs.begin());
      return mine >= 0 ? mine : whole;
    };
    int64_t limit = -1, found = -1;
    if (op.kind == ir::OpKind::Embedding && isInput(op.inputs[0])) {
      limit = ir::intAttr(op.attrs, "vocab");
      found = largest(op.inputs[0], ds.maxToken());
    } else if (op.kind == ir::OpKind::CrossEntropy && isInput(op.inputs[1])) {
      limit = m.tensors[op.inputs[0]].type.shape.back().coef;
      found = largest(op.inputs[1], ds.maxLabel());
    }
    if (limit < 0 || found < limit) continue;
    diags
        .error(keyLoc(m, "data"),
               fmt::format("the data holds id {}, but `{}` at line {} has only {} classes", found,
                           op.name, op.site.line, limit))
        .help(fmt::format("make the layer's width at least {}", found + 1));
    return false;
  }
  return true;
}

} // namespace

void warnUnappliedPolicies(const ir::Module& m, Diagnostics& diags) {
  const ir::Policy& p = m.policy;
  auto warn = [&](const char* key, bool set, const std::string& what) {
    auto it = p.keyLocs.find(key);
    if (!set || it == p.keyLocs.end()) return;
    diags.warning(it->second, fmt::format("`{}` is not applied by this version's runtime", key))
        .length(static_cast<uint32_t>(std::string(key).size()))
        .note(what);
  };
  bool params = p.offload == ir::Offload::Params;
  bool cpu = p.offloadTo == ir::OffloadTarget::Cpu;
  warn("offload",
       params && (!cpu || !m.deviceMemoryIsHost) && m.optimizerStates() > 0 && !m.offloadsParams(),
       "the parameters and optimizer states stay in memory: offloading the parameters needs "
       "ZeRO stage 3 to apply to the plan (over data-parallel ranks or a pipeline's copies, "
       "without split regions), so that each rank holds a slice of them");
  auto to = p.keyLocs.find("offload_to");
  if (to == p.keyLocs.end()) to = p.keyLocs.find("offload");
  bool moves = p.offload == ir::Offload::Optimizer || (params && (cpu || m.optimizerStates() == 0));
  if (moves && !m.offloadApplies() && to != p.keyLocs.end())
    diags
        .warning(to->second,
                 m.optimizerStates() == 0
                     ? "`offload = optimizer` moves nothing: this optimizer keeps no states"
                     : "`offload_to = cpu` moves nothing on the cpu device, whose memory is the "
                       "host's")
        .length(static_cast<uint32_t>(to->first.size()))
        .note("the optimizer states stay in memory")
        .help("`offload_to = disk` keeps them in a file (--offload-dir chooses its folder)");
  // One rank has nothing to partition.
  bool one = m.mesh.np == 1;
  auto idle = std::find_if(m.programs.begin(), m.programs.end(),
                           [](const ir::Program& r) { return r.params.empty(); });
  warn("zero", p.zero != ir::ZeroStage::None && !one && !m.zeroApplies(),
       idle != m.programs.end() && m.optimizerStates() > 0
           ? fmt::format("pipeline stage {} updates no parameter (its layers do not reach the "
                         "loss), and ZeRO partitions every stage's: every rank holds all "
                         "optimizer states",
                         idle->stage)
       : m.splitPiecesShared()
           ? "ZeRO partitions the optimizer states over the ranks that share parameters "
             "(data-parallel ranks, pipeline stages' copies, split groups' copies), and here "
             "each rank's are its own: every rank holds all of them"
           : "ZeRO partitions a split region's pieces over the copies of its split group, and "
             "here there is one: every rank holds all optimizer states (with -np twice this, "
             "each would hold half)");
  auto noBackward = std::find_if(m.buckets.begin(), m.buckets.end(), [&](const ir::GradBucket& b) {
    return m.ops[b.readyOp].phase != ir::Phase::Backward;
  });
  warn("zero",
       p.zero >= ir::ZeroStage::Gradients && !one && m.zeroApplies() && !m.zeroShardsGradients(),
       noBackward != m.buckets.end()
           ? fmt::format("stage 1 (the optimizer states) is applied; stage 2's gradient "
                         "partition needs every pipeline stage to run a backward op, and stage "
                         "{} runs none (its layers do not reach the loss), so here every rank "
                         "holds all gradients",
                         noBackward->stage)
           : "stage 1 (the optimizer states) is applied; stage 2's gradient partition runs in "
             "data-parallel plans, split groups' copies and pipelines' copies whose every stage "
             "has several ranks, so here every rank holds all gradients");
  warn("zero",
       p.zero == ir::ZeroStage::Parameters && !one && m.zeroShardsGradients() &&
           !m.zeroShardsParams(),
       "stages 1 and 2 are applied; stage 3's parameter partition needs every parameter to "
       "have a gradient, so here every rank holds all parameters");
}

bool checkRunnable(const ir::Module& m, Diagnostics& diags) {
  if (!m.programs.empty()) return true;
  if (!m.train.present) {
    diags.error(m.loc, fmt::format("`epl run` needs a `train {} {{ … }}` block", m.modelName))
        .length(static_cast<uint32_t>(m.modelName.size()));
    return false;
  }
  diags
      .error(m.loc, fmt::format("`epl run` runs one device, data parallelism, pipelines (of "
                                "any group sizes, and data-parallel copies of them), and "
                                "split linear, conv2d, mlp, attention, embedding and "
                                "cross_entropy layers so far; this plan has {}",
                                m.runRefusal()))
      .length(static_cast<uint32_t>(m.modelName.size()))
      .help("use -np 1, or leave that layer out of `split`");
  return false;
}

namespace {

// The schedule's bubble in the simulation's unit costs, or the classic formula where the
// schedule is not simulated (as the plan prints it).
std::string theoreticalBubble(const ir::Module& m) {
  ir::PipelineShape shape{m.mesh.depth(), static_cast<int>(m.policy.microBatches), m.mesh.chunks};
  if (ir::scheduleRequirement(m.policy.schedule, shape).empty() &&
      int64_t{shape.stages} * shape.micros <= 1'000'000) { // the plan's limit too
    ir::ScheduleSimulation sim = ir::simulateSchedule(m.policy.schedule, shape);
    if (!sim.deadlocked) return fmt::format("{:.1f}% in unit costs", 100 * sim.bubble);
  }
  return fmt::format("{:.1f}% by (p - 1) / (m + p - 1)", 100 * ir::classicBubble(shape));
}

// Collective: rank 0 gathers every rank's trace, writes it, and prints the measured bubble
// of a pipeline beside its schedule's. A trace it cannot write costs a warning, not the run.
void finishTrace(const TraceRecorder& trace, const ir::Module& m, const ir::Program& prog,
                 backend::Comm& comm, const std::string& path, std::ostream& out,
                 Diagnostics& diags) {
  std::vector<RankTrace> ranks = gatherTraces(trace, prog.stage, comm);
  if (comm.rank() != 0) return;
  if (auto failure = writeChromeTrace(path, ranks)) {
    diags.warning(SourceLoc{}, *failure).note("the run's training is not affected");
    return;
  }
  size_t events = 0;
  for (const RankTrace& r : ranks)
    events += r.events.size();
  out << fmt::format("trace: {} ({} events of {} rank{}, the first {} steps at most)\n", path,
                     events, ranks.size(), ranks.size() == 1 ? "" : "s", TraceRecorder::kMaxSteps);
  std::string picture = traceSvgPath(path);
  if (auto failure = writeTraceSvg(picture, ranks))
    diags.warning(SourceLoc{}, *failure).note("the run's training is not affected");
  else
    out << fmt::format("trace picture: {} (the last traced step)\n", picture);
  if (prog.stages < 2) return;
  int steps = 0;
  double bubble = measuredBubble(ranks, &steps);
  out << fmt::format("bubble: measured {:.1f}% over {} step{} (schedule: {})\n", 100 * bubble,
                     steps, steps == 1 ? "" : "s", theoreticalBubble(m));
}

// After the first step, every rank's measured memory beside its plan: one figure, or per
// pipeline stage the range over its ranks. `what` says what was measured: on the host, the
// process's peak above what it held before the run's buffers, less the pages of files it
// read in; on a GPU, the device's peak (Device::peakBytes). Collective; rank 0 prints.
std::string memoryReport(const ir::Module& m, int64_t measured, const char* what,
                         backend::Comm& comm) {
  std::vector<int64_t> all(m.programs.size());
  comm.allGather(&measured, all.data(), sizeof measured, "the memory measured after step 1");
  auto percent = [](int64_t measured, int64_t planned) {
    return 100.0 * static_cast<double>(measured - planned) /
           static_cast<double>(std::max<int64_t>(planned, 1));
  };
  if (all.size() == 1) {
    int64_t planned = m.programs[0].peakBytes();
    return fmt::format("memory after the first step: planned {}, measured {} ({:+.1f}%; {})",
                       formatBytes(planned), formatBytes(measured), percent(measured, planned),
                       what);
  }
  std::vector<std::string> stages;
  int count = static_cast<int>(m.mesh.stages.size());
  for (int s = 0; s < count; ++s) {
    std::vector<int64_t> planned, measures;
    std::vector<double> off;
    for (const ir::Program& p : m.programs) {
      if (p.stage != s) continue;
      planned.push_back(p.peakBytes());
      measures.push_back(all[p.rank]);
      off.push_back(percent(all[p.rank], p.peakBytes()));
    }
    if (planned.empty()) continue;
    // Lowest to highest, one figure when they agree.
    auto span = [](auto values, auto text) {
      auto [low, high] = std::minmax_element(values.begin(), values.end());
      return *low == *high ? text(*low) : fmt::format("{} to {}", text(*low), text(*high));
    };
    auto bytes = [](int64_t v) { return formatBytes(v); };
    auto signedPercent = [](double v) { return fmt::format("{:+.1f}%", v); };
    size_t ranks = planned.size();
    stages.push_back(fmt::format("{}{} rank{}: planned {}, measured {} ({})",
                                 count > 1 ? fmt::format("stage {}, ", s) : "", ranks,
                                 ranks == 1 ? "" : "s", span(planned, bytes), span(measures, bytes),
                                 span(off, signedPercent)));
  }
  return fmt::format("memory after the first step ({}): {}", what, fmt::join(stages, "; "));
}

// Collective, for a pipeline: rank 0 prints each stage's peak of micro-batches in flight
// by the runtime's account (replica 0's ranks) beside the plan's slots.
void reportActivations(const Executor& ex, const ir::Module& m, backend::Comm& comm,
                       std::ostream& out) {
  const ir::Program& mine = m.programs[comm.rank()];
  if (mine.stages < 2) return;
  int64_t peak = ex.peakInFlight();
  std::vector<int64_t> all(m.programs.size());
  comm.allGather(&peak, all.data(), sizeof peak, "the activations in flight");
  if (comm.rank() != 0) return;
  std::vector<std::string> stages;
  for (int s = 0; s < mine.stages; ++s) {
    const ir::Program& p = m.programs[m.mesh.rank(0, s, 0)];
    int64_t measured = all[p.rank];
    stages.push_back(fmt::format("stage {} measured {} micro-batch{} ({}), planned {} ({})", s,
                                 measured, measured == 1 ? "" : "es",
                                 formatBytes(measured * p.slotStride() + p.sharedBytes), p.slots,
                                 formatBytes(p.activationBytes())));
  }
  out << fmt::format("activations: {}\n", fmt::join(stages, "; "));
}

// One rank's `epl run`, in its parts: open what the run needs (the ranks agree on every
// fallible part), the steps, and the summary.
class TrainingRun {
public:
  TrainingRun(const ir::Module& m, const RunOptions& o, Diagnostics& diags, backend::Comm& comm)
      : m_(m), o_(o), diags_(diags), comm_(comm), rank_(comm.rank()), ranks_(comm.size()),
        mine_(diags.sources()),
        // From here a signal ends the run after a step, with a checkpoint. With several
        // ranks the launcher, not each rank, says that it was seen.
        stopSignals_(ranks_ > 1                      ? ""
                     : m.train.checkpointDir.empty() ? kStopNotice
                                                     : kStopNoticeSaving),
        prefixed_(*o.out, fmt::format("rank {}: ", rank_)), others_(&prefixed_), quiet_(nullptr),
        // Rank 0 speaks; the others only under --log-all, each line after its rank.
        out_(rank_ == 0 ? *o.out
             : o.logAll ? others_
                        : quiet_),
        steps_(m.train.steps), end_(o.stopAfter > 0 ? std::min(steps_, o.stopAfter) : steps_) {}

  // The data, the metrics, TensorBoard and trace files, the device, the executor and the first
  // step's weights (a checkpoint or fresh ones): an exit code when the run ends here.
  std::optional<int> open();
  int64_t start() const { return start_; }
  int64_t end() const { return end_; }
  // One training step with its evaluation, checkpoint and stop check: an exit code when
  // the run ends there.
  std::optional<int> step(int64_t step);
  // The trace, the activations, the summary and the final evaluation.
  int finish();
  void drawLossCurves();

private:
  bool agree(bool ok, const char* what);
  bool writeCheckpoint(int64_t stepsDone, std::string& where);
  void checkMetrics();
  bool evaluatesAfter(int64_t step) const;

  const ir::Module& m_;
  const RunOptions& o_;
  Diagnostics& diags_;
  backend::Comm& comm_;
  int rank_, ranks_;
  Diagnostics mine_; // this rank's errors until the ranks agree
  StopSignals stopSignals_;
  PrefixBuf prefixed_;
  std::ostream others_, quiet_;
  std::ostream& out_;
  std::unique_ptr<data::Dataset> ds_;
  MetricsFile metrics_;
  TensorBoardLog events_;
  std::string ckptDir_;
  std::unique_ptr<backend::Device> device_;
  // On GPUs, the executor's communicator (backend::makeDeviceComm); else it uses comm_.
  std::unique_ptr<backend::Comm> deviceComm_;
  int64_t baseline_ = 0;     // resident bytes before the run's buffers
  int64_t baselineFile_ = 0; // of which pages of files
  int64_t earlierPeak_ = 0;  // the process's peak before them (reading the data set)
  std::unique_ptr<Executor> ex_;
  std::unique_ptr<checkpoint::FolderLock> lock_;
  std::unique_ptr<data::Sampler> sampler_;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<TraceRecorder> trace_;
  int64_t steps_, end_, start_ = 0, samples_ = 0;
  Clock::time_point began_;
  double lastLoss_ = 0;
  std::vector<double> stepSeconds_; // this run's steps, for the prediction's comparison
  void comparePrediction(Progress& progress);
};

// After the fourth step: the median of steps 2 to 4 beside the step `epl plan --cluster`
// predicts, on the cluster of `--cluster`, else on the CPU this machine's (`here`; when it
// is not calibrated, how to calibrate it), else on a GPU the built-in cluster of its kind,
// costing attention as this device's kernel runs it (the built-in ones cost every head's
// scores).
void TrainingRun::comparePrediction(Progress& progress) {
  constexpr size_t kSteps = 4;
  if (rank_ != 0 || stepSeconds_.size() != kSteps) return;
  std::vector<double> warm(stepSeconds_.begin() + 1, stepSeconds_.end());
  std::sort(warm.begin(), warm.end());
  double measured = warm[warm.size() / 2];
  if (measured <= 0) return;
  std::string line = fmt::format("step time: measured {:.4g} s (median of steps {} to {})",
                                 measured, start_ + 2, start_ + kSteps);
  bool cpu = device_->name().rfind("cpu", 0) == 0;
  std::string error, where;
  std::optional<ir::Cluster> cluster;
  if (!o_.cluster.empty() || cpu) {
    std::string name = o_.cluster.empty() ? "here" : o_.cluster;
    cluster = ir::loadCluster(name, error);
    if (cluster)
      where = name == "here" ? "on this machine (`epl calibrate`)" : "on " + cluster->name;
  } else if (std::optional<std::string> kind = ir::builtinClusterForGpu(device_->name())) {
    cluster = ir::loadCluster(*kind, error);
    int64_t tiles = device_->attentionTilesUpTo();
    cluster->device.attention =
        tiles > 0 ? ir::ClusterDevice::Attention::Tiles : ir::ClusterDevice::Attention::Scores;
    cluster->device.tilesUpTo = tiles == backend::Device::kEveryWidth ? 0 : tiles;
    cluster->device.headProductsF32 = true; // either path widens amp's half q, k and v
    where = fmt::format("on {}'s model of the {}", cluster->name, cluster->devicesName());
  } else {
    progress.line(line + "; EPL has no model of this GPU to compare with: `--cluster FILE` "
                         "gives one (docs/cluster.md)");
    return;
  }
  if (!cluster) { // not calibrated (how to be is the error), or the file changed since
    progress.line(fmt::format("{}; {}", line, error));
    return;
  }
  if (std::string few = cluster->tooFew(m_.mesh.np); !few.empty()) {
    progress.line(fmt::format("{}; not predicted on {}: {}", line, cluster->name, few));
    return;
  }
  ir::Prediction p = ir::predict(m_, cluster->forRanks(m_.mesh.np, o_.threads));
  if (p.stepSeconds <= 0) return;
  progress.line(fmt::format("{}, predicted {:.4g} s {}: predicted / measured {:.2f}", line,
                            p.stepSeconds, where, p.stepSeconds / measured));
}

// Fallible work every rank does: errors go to `mine_`, then the ranks agree. A failing rank
// reports when it is rank 0, or when rank 0 succeeded (then the error is its own and is
// named by its rank; what rank 0 shares with others is not).
bool TrainingRun::agree(bool ok, const char* what) {
  std::vector<char> flags(static_cast<size_t>(ranks_));
  char me = ok ? 1 : 0;
  comm_.allGather(&me, flags.data(), 1, what);
  int failed = static_cast<int>(std::count(flags.begin(), flags.end(), 0));
  if (!ok && (rank_ == 0 || flags[0]))
    diags_.append(mine_,
                  ranks_ > 1 && (rank_ != 0 || failed == 1) ? fmt::format("rank {}: ", rank_) : "");
  return failed == 0;
}

std::optional<int> TrainingRun::open() {
  const ir::Module& m = m_;
  try {
    ds_ = data::openDataset(m.train.data, inputSpecs(m), m.train.seed, o_.baseDir);
  } catch (const data::DataError& e) {
    mine_.error(keyLoc(m, "data"), e.what());
  }
  if (!agree(ds_ && checkDataFitsModel(m, *ds_, mine_), "opening the data")) return 1;
  if (!agree(checkBatchNorms(m, mine_), "checking the model")) return 1;
  // Rank 0 writes the metrics; a path it cannot write is found now, not after the run.
  if (rank_ == 0 && !o_.metricsPath.empty())
    if (auto problem = metrics_.open(o_.metricsPath))
      mine_.error(SourceLoc{}, problem->message).help(problem->help);
  if (!agree(!mine_.hasErrors(), "opening the metrics file")) return 1;
  // And the TensorBoard events, into a folder it creates now if need be.
  if (rank_ == 0 && !o_.tensorboardDir.empty())
    if (auto problem = events_.open(o_.tensorboardDir))
      mine_.error(SourceLoc{}, problem->message).help(problem->help);
  if (!agree(!mine_.hasErrors(), "opening the TensorBoard events")) return 1;
  // The trace is written at the end, by rank 0; its path is checked now all the same.
  if (rank_ == 0 && !o_.tracePath.empty() && !std::ofstream(o_.tracePath)) {
    std::string why = std::strerror(errno);
    why[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(why[0])));
    mine_.error(SourceLoc{}, fmt::format("cannot write the trace file `{}`: {}", o_.tracePath, why))
        .help("create its folder, or pass --trace another path");
  }
  if (!agree(!mine_.hasErrors(), "opening the trace file")) return 1;
  ckptDir_ = resolve(o_.baseDir, m.train.checkpointDir);
  std::string deviceNote;
  device_ = openDevice(m, {o_.device, localRank(), o_.threads}, &deviceNote, mine_);
  if (!agree(device_ != nullptr, "opening the device")) return 1;
  if (!deviceNote.empty()) out_ << deviceNote << "\n";
  // Collectives on GPU memory: NCCL, or MPI staged through the host (docs/gpu.md).
  std::string commNote;
  try {
    deviceComm_ = backend::makeDeviceComm(comm_, *device_, &commNote);
  } catch (const backend::CommError& e) {
    mine_.error(SourceLoc{}, e.what()).help("pass --device cpu");
  }
  if (!agree(!mine_.hasErrors(), "starting the GPUs' communicator")) return 1;
  if (!commNote.empty()) out_ << commNote << "\n";
  // What the process holds before the run's buffers exist (code, libraries, the data
  // set): the measured memory of the step is the peak above it. The peak restarts here:
  // reading the data set may have peaked higher (a gzip file inflates into a buffer that
  // doubles), which is not the step's.
  earlierPeak_ = peakResidentBytes();
  restartPeakResident();
  baseline_ = residentBytes();
  baselineFile_ = fileResidentBytes();
  OptimizerSettings settings = optimizerSettings(m.train);
  settings.offloadDir = o_.offloadDir;
  try {
    ex_ = std::make_unique<Executor>(m, *device_, deviceComm_ ? *deviceComm_ : comm_, settings);
  } catch (const OffloadError& e) {
    auto at = m.policy.keyLocs.find("offload_to");
    mine_.error(at == m.policy.keyLocs.end() ? m.loc : at->second, e.what())
        .length(10) // offload_to
        .help("pass --offload-dir a folder on a disk with room for them");
  }
  if (!agree(ex_ != nullptr, "opening the offloaded optimizer states")) return 1;
  // Rank 0 locks the checkpoint folder, reads the checkpoint or initialises, then every
  // rank gets its weights and optimizer states: replicas start bit-identical, and a
  // checkpoint needs to be readable by rank 0 alone.
  if (rank_ == 0 && !ckptDir_.empty()) lock_ = lockFolder(m, ckptDir_, mine_);
  Start from;
  if (rank_ == 0 && !mine_.hasErrors())
    from = startOnRank0(*ex_, m, o_, ckptDir_, out_, mine_, diags_);
  if (!agree(!mine_.hasErrors(), "loading the checkpoint")) return 1;
  start_ = from.step;
  if (ranks_ > 1) {
    comm_.broadcast(&start_, sizeof start_, 0, "the first step");
    ex_->broadcastState(0);
  }
  // The initial values or the checkpoint came through host arrays that the memory plan does
  // not count. Once they are freed, glibc keeps blocks of their size resident, because it
  // raised its mmap threshold to the largest block freed. Give them back before the steps.
  malloc_trim(0);
  if (start_ == steps_) {
    out_ << fmt::format("nothing to train: {} is at step {} of {}\n", from.folder, start_, steps_);
    return 0;
  }
  describeRun(out_, m, *ex_, device_->name(), ex_->comm(), *ds_, m.programs[rank_]);
  sampler_ = std::make_unique<data::Sampler>(ds_->size(data::Split::Train),
                                             static_cast<uint64_t>(m.train.seed));
  progress_ = std::make_unique<Progress>(out_, rank_ == 0 && o_.terminal, m.train.logEvery);
  if (!o_.resume) metrics_.startAfresh();
  if (rank_ == 0) metrics_.header(runHeader(m, o_, ranks_, start_));
  if (rank_ == 0) events_.start(start_ + 1);
  if (!o_.tracePath.empty()) {
    trace_ = std::make_unique<TraceRecorder>();
    comm_.barrier("starting the trace"); // every rank's clock starts together
    trace_->restart();
    ex_->setTrace(trace_.get());
  }
  began_ = Clock::now();
  return std::nullopt;
}

// Losing the metrics is no reason to lose the training: the run goes on, and says so.
void TrainingRun::checkMetrics() {
  if (auto failure = metrics_.failure())
    diags_.warning(SourceLoc{}, *failure).note("the run goes on without writing more metrics");
  if (auto failure = events_.failure())
    diags_.warning(SourceLoc{}, *failure)
        .note("the run goes on without writing more TensorBoard events");
}

// Written once, by rank 0 (the replicas are identical), and agreed on by every rank.
bool TrainingRun::writeCheckpoint(int64_t stepsDone, std::string& where) {
  ex_->gatherShards(); // each split group gathers the pieces of its sharded parameters
  ex_->gatherStages(); // and a pipeline's rank 0 gets the other stages' weights and states
  if (rank_ == 0) {
    try {
      where = saveCheckpoint(*ex_, ckptDir_,
                             {stepsDone, static_cast<uint64_t>(m_.train.seed), m_.train.steps},
                             m_.train.checkpointKeep);
    } catch (const checkpoint::CheckpointError& e) {
      progress_->finish();
      report(mine_, m_, e);
    }
  }
  ex_->dropGathered();
  return agree(!mine_.hasErrors(), "writing the checkpoint");
}

bool TrainingRun::evaluatesAfter(int64_t step) const {
  const ir::CallSpec& eval = m_.train.eval;
  return eval.kind != "" && eval.numbers.count("every") &&
         (step + 1) % static_cast<int64_t>(eval.numbers.at("every")) == 0;
}

std::optional<int> TrainingRun::step(int64_t step) {
  const ir::Module& m = m_;
  Executor& ex = *ex_;
  Progress& progress = *progress_;
  auto stepBegan = Clock::now();
  bool traced = trace_ && trace_->wants();
  double readBegan = traced ? trace_->nowUs() : 0;
  std::vector<int64_t> ids = sampler_->globalBatch(step, m.train.batch);
  for (int mb = 0; mb < ex.microBatches(); ++mb) {
    auto first = ids.begin() + ex.firstSample(mb);
    fill(ex, *ds_, data::Split::Train, {first, first + ex.localBatch()}, mb);
  }
  if (ex.ignoredClass() >= 0) setKeptTargets(ex, m, *ds_, ids, ex.ignoredClass());
  if (traced) trace_->readBatch(step, readBegan, trace_->nowUs());
  double lr = learningRate(m.train.lrSchedule, m.train.optimizer.numbers.at("lr"), step, steps_);
  StepResult r = ex.runStep(step, static_cast<float>(lr), static_cast<uint64_t>(m.train.seed));
  if (!std::isfinite(r.loss)) {
    // Every rank sees the same (summed) loss and stops here; rank 0 says why.
    progress.finish();
    if (rank_ == 0)
      diags_
          .error(keyLoc(m, "optimizer"),
                 fmt::format("the loss is {} at step {}", std::isnan(r.loss) ? "NaN" : "infinite",
                             step + 1))
          .note(fmt::format("steps 1 to {} were finite; no checkpoint was written after step {}",
                            step, step))
          .help(m.scalesLoss() ? "fp16 ends at 65504: `amp = bf16` has fp32's range; or lower "
                                 "the learning rate, or set `clip_grad_norm`"
                               : "lower the learning rate, or set `clip_grad_norm`");
    return 1;
  }
  lastLoss_ = r.loss;
  samples_ += m.train.batch;
  StepReport rep = stepReport(r, step, start_, steps_, lr);
  rep.samplesPerSecond = samples_ / seconds(began_);
  rep.tokensPerSecond = rep.samplesPerSecond * static_cast<double>(m.tokensPerSample());
  rep.elapsedSeconds = seconds(began_);
  rep.stepSeconds = seconds(stepBegan);
  stepSeconds_.push_back(rep.stepSeconds);
  progress.step(rep);
  comparePrediction(progress);
  metrics_.step(rep);
  events_.step(rep);
  checkMetrics();
  if (step == start_) {
    // The code the first step runs pages in, about 0.6 MB of kernels and libraries, is no
    // buffer of the plan: the file pages that came in since the baseline do not count. They
    // are still resident at the end of the step, which is the peak's or after it.
    int64_t files = fileResidentBytes() - baselineFile_;
    std::optional<int64_t> onDevice = device_->peakBytes();
    std::string memory =
        onDevice ? memoryReport(m, *onDevice,
                                "the device memory the run's buffers and scratch held at "
                                "their peak",
                                comm_)
                 : memoryReport(m, peakResidentBytes() - baseline_ - files,
                                "the process's peak above what it held before the run's "
                                "buffers, less the code it paged in",
                                comm_);
    if (rank_ == 0) progress.line(memory);
  }
  if (evaluatesAfter(step)) {
    int64_t batches = static_cast<int64_t>(
        m.train.eval.numbers.count("batches") ? m.train.eval.numbers.at("batches") : 10);
    // `batches` of the global micro-batch: the same samples at any -np.
    Evaluation e = evaluate(ex, *ds_, batches * ex.localBatch() * ex.readers());
    progress.line(
        fmt::format("step {}: validation {} ({} samples)", step + 1, evalText(e), e.samples));
    metrics_.eval(step + 1, e.loss, e.accuracy, e.samples, false);
    events_.eval(step + 1, e.loss, e.accuracy, false);
    checkMetrics();
  }
  bool last = step + 1 == end_;
  bool saved = false;
  std::string where;
  if (!ckptDir_.empty() &&
      ((m.train.checkpointEvery > 0 && (step + 1) % m.train.checkpointEvery == 0) || last)) {
    if (!writeCheckpoint(step + 1, where)) return 1;
    saved = true;
    if (rank_ == 0 && (!o_.terminal || last)) progress.line(fmt::format("checkpoint: {}", where));
  }
  if (int sig = agreeOnStop(comm_, stopSignals_.received())) {
    progress.finish();
    if (!ckptDir_.empty() && !saved && !writeCheckpoint(step + 1, where)) return 1;
    out_ << stopText(sig, step + 1, steps_, where, o_, ranks_);
    return sig == SIGUSR1 ? 0 : 128 + sig;
  }
  return std::nullopt;
}

int TrainingRun::finish() {
  const ir::Program& prog = m_.programs[rank_];
  progress_->finish();
  double took = seconds(began_);
  if (trace_) {
    ex_->setTrace(nullptr);
    finishTrace(*trace_, m_, prog, comm_, o_.tracePath, out_, diags_);
  }
  reportActivations(*ex_, m_, comm_, out_);
  if (end_ < steps_) {
    out_ << fmt::format("stopped after step {} of {} (--stop-after)\n", end_, steps_);
    drawLossCurves();
    return 0;
  }
  out_ << fmt::format("trained {} step{} in {} ({:.0f} samples/s); last loss {:.4f}\n",
                      end_ - start_, end_ - start_ == 1 ? "" : "s", formatDuration(took),
                      took > 0 ? samples_ / took : 0.0, lastLoss_);
  int64_t finalBatches = m_.train.finalEvalBatches, split = ds_->size(data::Split::Validation);
  if (split > 0 && finalBatches != 0) {
    // `final = n`: n batches of the global micro-batch, the same samples at any -np.
    int64_t limit = finalBatches < 0
                        ? split
                        : std::min(split, finalBatches * ex_->localBatch() * ex_->readers());
    out_ << fmt::format("validation: evaluating {} samples{}\n", withCommas(limit),
                        finalBatches < 0 ? " (the whole split; `eval = { final = n }` takes n "
                                           "batches, `final = false` none)"
                                         : "");
    Evaluation e = evaluate(*ex_, *ds_, limit, [&](int64_t done, int64_t total) {
      progress_->evaluating(done, total);
    });
    progress_->finish();
    out_ << fmt::format("validation ({} samples): {}\n", withCommas(e.samples), evalText(e));
    metrics_.eval(steps_, e.loss, e.accuracy, e.samples, true);
    events_.eval(steps_, e.loss, e.accuracy, true);
    checkMetrics();
  }
  std::optional<int64_t> onDevice = device_->peakBytes();
  out_ << fmt::format(
      "memory: planned {} for tensors; {} {}{}\n", formatBytes(prog.peakBytes()),
      onDevice ? "peak on the device" : "peak resident",
      formatBytes(onDevice ? *onDevice : std::max(earlierPeak_, peakResidentBytes())),
      ranks_ > 1 ? " (rank 0)" : "");
  drawLossCurves();
  return 0;
}

// Rank 0 draws the metrics file's loss curves beside it. Losing the picture is no reason
// to fail a run that trained: a warning says why.
void TrainingRun::drawLossCurves() {
  // A metrics file that could not be written (a warning said so) has nothing to draw.
  if (rank_ != 0 || o_.metricsPath.empty() || metrics_.failed()) return;
  try {
    out_ << fmt::format("loss curves: {}\n", writeLossCurves(o_.metricsPath));
  } catch (const std::exception& e) {
    diags_.warning(SourceLoc{}, fmt::format("no loss curves: {}", e.what()));
  }
}

} // namespace

int train(const ir::Module& m, const RunOptions& o, Diagnostics& diags) {
  std::unique_ptr<backend::Comm> self;
  backend::Comm* commp = o.comm;
  if (!commp) {
    self = backend::makeSelfComm();
    commp = self.get();
  }
  backend::Comm& comm = *commp;
  // Every rank planned the same script and meets these alike: rank 0 says so.
  Diagnostics mine(diags.sources());
  Diagnostics& shared = comm.rank() == 0 ? diags : mine;
  if (!checkRunnable(m, shared)) return 1;
  if (static_cast<int>(m.programs.size()) != comm.size()) {
    shared.error(m.loc, fmt::format("this job has {} ranks, and the plan is for -np {}",
                                    comm.size(), m.programs.size()));
    return 1;
  }
  comm.setTimeout(m.policy.commTimeoutSeconds);
  TrainingRun run(m, o, diags, comm);
  if (auto exit = run.open()) return *exit;
  for (int64_t step = run.start(); step < run.end(); ++step)
    if (auto exit = run.step(step)) return *exit;
  return run.finish();
}

int sample(const ir::Module& m, const SampleOptions& o, Diagnostics& diags) {
  if (m.programs.empty() || m.inputs.size() != 1 ||
      !ir::isIntegral(m.tensors[m.inputs[0]].type.dtype)) {
    diags.error(m.loc, "`epl sample` needs a model with one token input, `tokens: i32[B, seq]`");
    return 1;
  }
  std::string deviceNote;
  auto device = openDevice(m, {o.device, localRank(), o.threads}, &deviceNote, diags);
  if (!device) return 1;
  auto comm = backend::makeSelfComm();
  Executor ex(m, *device, *comm, optimizerSettings(m.train));
  std::string where =
      resolve(o.baseDir, o.checkpoint.empty() ? m.train.checkpointDir : o.checkpoint);
  try {
    auto folder = fs::exists(fs::path(where) / "manifest.json") ? std::optional<std::string>(where)
                                                                : latestCheckpoint(where);
    if (!folder) {
      diags
          .error(keyLoc(m, "checkpoint"),
                 fmt::format("no checkpoint in `{}` to sample from", where))
          .help("train first with `epl run`, or pass --checkpoint DIR");
      return 1;
    }
    for (const CheckpointWarning& w : loadCheckpoint(ex, *folder, LoadPurpose::Weights).warnings)
      report(diags, m, w);
  } catch (const checkpoint::CheckpointError& e) {
    report(diags, m, e);
    return 1;
  }
  int64_t seq = *m.tensors[m.inputs[0]].type.shape.back().eval(m.bindings), vocab = ex.classes();
  std::vector<int32_t> ctx;
  for (unsigned char c : o.prompt)
    ctx.push_back(c);
  if (ctx.empty()) ctx.push_back('\n');
  Rng rng(o.seed);
  std::ostream& out = *o.out;
  out << o.prompt;
  for (int64_t n = 0; n < o.length; ++n) {
    int64_t len = std::min<int64_t>(static_cast<int64_t>(ctx.size()), seq);
    HostBatch& b = ex.staging(0);
    std::vector<int32_t> window(seq, 0);
    std::copy(ctx.end() - len, ctx.end(), window.begin());
    std::memcpy(b.inputs[0].data(), window.data(), 4 * seq);
    std::fill(b.nextTargets(), b.nextTargets() + b.nextCount(), 0);
    std::vector<float> logits = ex.forwardLogits();
    const float* row = logits.data() + (len - 1) * vocab;
    float top = *std::max_element(row, row + vocab);
    std::vector<double> p(vocab);
    double sum = 0;
    for (int64_t c = 0; c < vocab; ++c)
      sum += p[c] = std::exp((row[c] - top) / std::max(o.temperature, 1e-6));
    double u = rng.uniform() * sum;
    int64_t pick = 0;
    while (pick + 1 < vocab && (u -= p[pick]) > 0)
      ++pick;
    ctx.push_back(static_cast<int32_t>(pick));
    out << static_cast<char>(pick) << std::flush;
  }
  out << "\n";
  return 0;
}

} // namespace epl::interp
