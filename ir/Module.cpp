// Module helpers: adding tensors and scopes, scope queries, byte counts.
#include "ir/Module.h"

#include "support/Assert.h"
#include "support/Checked.h"

#include <algorithm>
#include <fmt/format.h>

namespace epl::ir {

std::string Layout::str() const {
  switch (kind) {
  case LayoutKind::DataParallel:
    return "data-parallel";
  case LayoutKind::Replicated:
    return "replicated";
  case LayoutKind::Sharded:
    return "sharded(" + std::to_string(dim) + ")";
  case LayoutKind::Partial:
    return "partial";
  }
  return "?";
}

bool reduceScattersBackward(const Op& op) {
  auto it = op.attrs.find("backward");
  return op.kind == OpKind::AllGather && it != op.attrs.end() &&
         std::get<std::string>(it->second) == "reduce-scatter";
}

TransferForm transferForm(const Op& op, const Op& fwd) {
  bool backward = op.phase == Phase::Backward;
  OpKind kind = fwd.kind;
  if ((!backward && kind == OpKind::ReduceScatter) || (backward && reduceScattersBackward(fwd)))
    return TransferForm::Scatter;
  if ((!backward && kind == OpKind::AllReduce) || (backward && kind == OpKind::Identity))
    return TransferForm::Reduce;
  if ((!backward && kind == OpKind::AllGather) ||
      (backward && (kind == OpKind::Slice || kind == OpKind::ReduceScatter)))
    return TransferForm::Gather;
  if ((!backward && kind == OpKind::Slice) || (backward && kind == OpKind::AllGather))
    return TransferForm::Slice;
  return TransferForm::Pass; // a forward identity, or the backward of an all-reduce
}

int transferDim(const Op& op) {
  auto it = op.attrs.find("dim");
  if (it == op.attrs.end()) return 0;
  const std::string& s = std::get<std::string>(it->second);
  return s == "batch" ? 0 : std::stoi(s.substr(4));
}

const char* splitFormName(SplitForm f) {
  switch (f) {
  case SplitForm::None:
    return "";
  case SplitForm::Column:
    return "column";
  case SplitForm::Row:
    return "row";
  case SplitForm::Heads:
    return "heads";
  case SplitForm::Hidden:
    return "hidden";
  case SplitForm::Experts:
    return "experts";
  case SplitForm::Vocab:
    return "vocab";
  }
  return "";
}

std::optional<int64_t> Module::bytesOf(int t) const {
  auto n = numElements(tensors[t].type.shape, bindings);
  if (!n) return std::nullopt;
  return checkedMul(*n, dtypeBytes(storedDtype(t)));
}

std::map<std::string, int64_t> Module::bindingsOn(const Program& p) const {
  std::map<std::string, int64_t> out = bindings;
  if (p.localBatch > 0) out[batchSymbol] = p.localBatch;
  return out;
}

std::vector<int64_t> Module::localShape(const Program& p, int t) const {
  const Tensor& x = tensors[t];
  auto b = bindingsOn(p);
  if (p.splitWidth > 1 && x.layout.kind != LayoutKind::DataParallel && p.wholeBatch > 0)
    b[batchSymbol] = p.wholeBatch;
  std::vector<int64_t> out;
  for (const Dim& d : x.type.shape) {
    auto v = d.eval(b);
    EPL_ASSERT(v.has_value(), "a tensor of a rank program has an unbound dim");
    out.push_back(*v);
  }
  if (x.layout.kind == LayoutKind::Sharded && p.splitWidth > 1) {
    EPL_ASSERT(x.layout.dim >= 0 && x.layout.dim < static_cast<int>(out.size()) &&
                   out[x.layout.dim] % p.splitWidth == 0,
               "split-layout checked that the width divides a cut dim");
    out[x.layout.dim] /= p.splitWidth;
  }
  return out;
}

std::vector<int64_t> Module::localParamShape(const Program& p, int q) const {
  const Param& prm = params[q];
  std::vector<int64_t> out;
  for (const Dim& d : prm.type.shape)
    out.push_back(d.coef);
  // The rank's stage blocks: its position's, one a model chunk under `interleaved`.
  bool mine = prm.op >= 0 && holdsParam(p, q); // its stage's, or a tied weight's copy
  if (prm.shardDim >= 0 && p.splitWidth > 1 && mine) out[prm.shardDim] /= p.splitWidth;
  return out;
}

int64_t Module::bytesOn(const Program& p, int t) const {
  std::optional<int64_t> n = 1;
  for (int64_t d : localShape(p, t))
    n = n ? checkedMul(*n, d) : std::nullopt;
  auto bytes = n ? checkedMul(*n, dtypeBytes(storedDtype(t))) : std::nullopt;
  EPL_ASSERT(bytes.has_value(), "a tensor of a rank program has more than 2^63 - 1 bytes");
  return *bytes;
}

std::optional<Module::SplitCollective> Module::splitCollective(const Program& p, int i) const {
  const Op& op = ops[i];
  bool backward = op.phase == Phase::Backward;
  OpKind kind = backward ? ops[op.forward].kind : op.kind;
  if (p.splitWidth == 1 || (backward && op.outputs[0] < 0)) return std::nullopt;
  // Forward: all-reduce the partial sums, reduce-scatter them, or gather the pieces of the
  // input. Backward: sum the identity's partial gradients, gather the slices' (and the
  // reduce-scatters') gradient pieces, or reduce-scatter a sequence gather's partial ones.
  using C = CollectiveKind;
  if (!backward && vocabLoss(p, op)) return SplitCollective{C::AllGather, 4 * vocabFigures(p, op)};
  if (!backward && kind == OpKind::AllReduce)
    return SplitCollective{C::AllReduce, bytesOn(p, op.outputs[0])};
  if (!backward && kind == OpKind::ReduceScatter)
    return SplitCollective{C::ReduceScatter, bytesOn(p, op.inputs[0])};
  if (!backward && kind == OpKind::AllGather)
    return SplitCollective{C::AllGather, bytesOn(p, op.inputs[0])};
  if (backward && kind == OpKind::Identity)
    return SplitCollective{C::AllReduce, bytesOn(p, op.inputs[0])};
  if (backward && (kind == OpKind::Slice || kind == OpKind::ReduceScatter))
    return SplitCollective{C::AllGather, bytesOn(p, op.inputs[0])};
  if (backward && kind == OpKind::AllGather && reduceScattersBackward(ops[op.forward]))
    return SplitCollective{C::ReduceScatter, bytesOn(p, op.inputs[0])};
  // Split experts' exchanges, either way: the rows this rank's tokens dispatched (what it
  // sends or gets back; how many of them leave depends on the routing).
  if (kind == OpKind::AllToAll)
    return SplitCollective{C::AllToAll,
                           std::min(bytesOn(p, op.inputs[0]), bytesOn(p, op.outputs[0]))};
  return std::nullopt;
}

int64_t Module::transferBytes(const Program& p, const Instr& in) const {
  int64_t whole = bytesOn(p, in.tensor);
  return in.rows < 0 ? whole : whole / localShape(p, in.tensor).at(0) * in.rows;
}

Module::ReceivePlan Module::receivePlan(const Program& p, const std::vector<Instr>& list,
                                        int ring) const {
  ReceivePlan out;
  out.offset.assign(list.size(), -1);
  out.postedAfter.assign(list.size(), -1);
  std::vector<int> receives;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == InstrKind::Recv) receives.push_back(static_cast<int>(i));
  auto aligned = [&](int i) { return (transferBytes(p, list[i]) + 63) / 64 * 64; };
  size_t n = ring > 0 ? static_cast<size_t>(ring) : receives.size();
  if (n >= receives.size()) { // a buffer each, posted at the start
    for (int i : receives) {
      out.offset[i] = out.bytes;
      out.bytes += aligned(i);
    }
    return out;
  }
  std::vector<int64_t> size(n, 0);
  for (size_t k = 0; k < receives.size(); ++k)
    size[k % n] = std::max(size[k % n], aligned(receives[k]));
  std::vector<int64_t> base(n, 0);
  for (size_t b = 0; b < n; ++b) {
    base[b] = out.bytes;
    out.bytes += size[b];
  }
  for (size_t k = 0; k < receives.size(); ++k) {
    out.offset[receives[k]] = base[k % n];
    if (k >= n) out.postedAfter[receives[k]] = receives[k - n];
  }
  return out;
}

int Module::ranksLike(const Program& p) const {
  if (!costOnly) return 1;
  return mesh.dataParallel * mesh.stages.at(static_cast<size_t>(p.stage)).group;
}

int Module::lossRanks() const {
  int n = 0;
  for (size_t r = 0; r < programs.size(); ++r)
    n += programs[r].lossRank == static_cast<int>(r);
  return n;
}

Module::DataSource Module::dataSource(int t) const {
  DataSource s;
  for (;;) {
    auto at = std::find(inputs.begin(), inputs.end(), t);
    if (at != inputs.end()) {
      s.input = static_cast<int>(at - inputs.begin());
      return s;
    }
    int producer = tensors[t].producer;
    if (producer < 0) return {};
    const Op& op = ops[producer];
    bool moves = op.kind == OpKind::Reshape || op.kind == OpKind::Flatten ||
                 op.kind == OpKind::Transpose || opInfo(op.kind).split == SplitRule::Communication;
    if (op.kind == OpKind::Next && !s.next)
      s.next = true;
    else if (!moves)
      return {};
    t = op.inputs[0];
  }
}

Module::SlotUse Module::slotUse(const Program& p) const {
  SlotUse u;
  u.first.assign(static_cast<size_t>(p.microBatches), -1);
  u.last.assign(static_cast<size_t>(p.microBatches), -1);
  bool scatters = zeroShardsGradients();
  for (size_t i = 0; i < p.step.size(); ++i) {
    const Instr& in = p.step[i];
    // ZeRO stage 2: a bucket in flight reads the micro-batch's slot; stage 3: so does a
    // gather of parameters.
    bool uses = in.kind == InstrKind::Load || in.kind == InstrKind::SeedGrad ||
                in.kind == InstrKind::Send || in.kind == InstrKind::Recv ||
                (in.kind == InstrKind::Run && ops[in.op].phase != Phase::Optimizer) ||
                (scatters && !in.tie &&
                 (in.kind == InstrKind::ReduceStart || in.kind == InstrKind::ReduceWait)) ||
                in.kind == InstrKind::GatherStart || in.kind == InstrKind::GatherWait;
    if (!uses) continue;
    if (u.first[in.micro] < 0) u.first[in.micro] = static_cast<int>(i);
    u.last[in.micro] = static_cast<int>(i);
  }
  return u;
}

int Module::addTensor(std::string name, TensorType type, int producer) {
  if (!stored.empty()) stored.push_back(type.dtype);
  tensors.push_back(Tensor{std::move(name), std::move(type), producer, Layout{}});
  return static_cast<int>(tensors.size()) - 1;
}

int Module::addScope(Scope s) {
  EPL_ASSERT(s.parent >= 0 && s.parent < static_cast<int>(scopes.size()),
             "scope parent out of range");
  scopes.push_back(s);
  return static_cast<int>(scopes.size()) - 1;
}

std::vector<int> Mesh::stageRanks(int stage) const {
  std::vector<int> out;
  for (int r = 0; r < dataParallel; ++r)
    for (int local = 0; local < stages[stage].group; ++local)
      out.push_back(rank(r, stage, local));
  return out;
}

std::vector<int> Mesh::replicaRanks(int replica) const {
  std::vector<int> out;
  for (int k = 0; k < replicaSize; ++k)
    out.push_back(replica * replicaSize + k);
  return out;
}

std::string Mesh::pipelineRefusal() const {
  // Model chunks on one rank share its split group: their blocks need one split width.
  for (size_t s = 0; s < stages.size(); ++s) {
    const StagePlan& host = stages[s % depth()];
    if (stages[s].splitWidth != host.splitWidth)
      return fmt::format("model chunks of split widths {} (stage {}) and {} (stage {}) on the same "
                         "devices",
                         host.splitWidth, s % depth(), stages[s].splitWidth, s);
  }
  return "";
}

Module::SplitTraffic Module::splitTraffic(const Program& p) const {
  SplitTraffic t;
  int w = p.splitWidth;
  for (const Instr& in : p.step) {
    if (in.kind != InstrKind::Run || in.micro != 0) continue;
    auto c = splitCollective(p, in.op);
    if (!c) continue;
    int k = ops[in.op].phase == Phase::Forward ? 0 : 1; // recomputations run in the backward
    if (c->kind == CollectiveKind::AllReduce) {
      ++t.allReduces[k];
      t.allReduceBytes[k] += c->bytes;
      t.ringSendBytes += 2 * c->bytes * (w - 1) / w;
    } else if (c->kind == CollectiveKind::AllToAll) {
      ++t.allToAlls[k];
      t.allToAllBytes[k] += c->bytes;
      t.ringSendBytes += c->bytes * (w - 1) / w; // tokens spread evenly over the experts
    } else if (c->kind == CollectiveKind::ReduceScatter) {
      ++t.reduceScatters[k];
      t.reduceScatterBytes[k] += c->bytes;
      t.ringSendBytes += c->bytes * (w - 1) / w;
    } else {
      ++t.allGathers[k];
      t.allGatherBytes[k] += c->bytes * w;
      t.ringSendBytes += c->bytes * (w - 1);
    }
  }
  return t;
}

void Mesh::placeBatch(Program& p) const {
  int group = stages[p.stage].group, copies = group / p.splitWidth;
  p.readsWhole = microBatch > 0 && microBatch % group != 0;
  EPL_ASSERT(!p.readsWhole || microBatch % copies == 0,
             "mesh-assignment divides a micro-batch over a stage's devices or its copies");
  p.wholeBatch = microBatch / copies;
  p.localBatch = p.readsWhole ? p.wholeBatch : microBatch / group;
  int share = p.readsWhole ? p.splitWidth : 1;
  p.readers = p.dataRanks / share;
  p.reader = p.dataRank / share;
}

std::string Module::runRefusal() const {
  if (mesh.stages.size() > 1) {
    std::string why = mesh.pipelineRefusal();
    if (!why.empty()) return fmt::format("{} pipeline stages and {}", mesh.stages.size(), why);
  }
  return "";
}

int Module::optimizerStates() const {
  const CallSpec& opt = train.optimizer;
  if (optimizerOf(opt) != Optimizer::Sgd) return 2;
  return opt.numbers.count("momentum") && opt.numbers.at("momentum") > 0 ? 1 : 0;
}

bool Module::offloadApplies() const {
  bool off =
      (policy.offloadTo == OffloadTarget::Disk || !deviceMemoryIsHost) && optimizerStates() > 0;
  return off && (policy.offload == Offload::Optimizer ||
                 (policy.offload == Offload::Params && zeroShardsParams()));
}

bool Module::offloadsParams() const {
  return policy.offload == Offload::Params && offloadApplies();
}

bool Module::ampApplies() const {
  return policy.amp != Amp::None && train.present;
}

bool Module::splitPiecesShared() const {
  for (const StagePlan& st : mesh.stages)
    if (st.splitWidth > 1 && mesh.dataParallel * st.group / st.splitWidth < 2) return false;
  return true;
}

bool Module::reducedOverPieces(int q) const {
  const Param& prm = params[q];
  return prm.op >= 0 && mesh.stages.size() > static_cast<size_t>(ops[prm.op].stage) &&
         mesh.stages[ops[prm.op].stage].splitWidth > 1 && splitScopeOf(ops[prm.op].scope) >= 0 &&
         !prm.sumOverSplit;
}

bool Module::zeroApplies() const {
  if (policy.zero == ZeroStage::None || programs.empty()) return false;
  if (optimizerStates() == 0 || !splitPiecesShared()) return false;
  // Each rank's parameters lie side by side in its layout (model chunks' too), so a domain
  // is one block even where the parameters it updates are not consecutive.
  for (const Program& p : programs)
    if (p.dataRanks < 2 || p.params.empty()) return false;
  return true;
}

int64_t Module::vocabFigures(const Program& p, const Op& op) const {
  int64_t rows = 1;
  for (int64_t x : localShape(p, op.inputs[1]))
    rows *= x;
  return rows + 1;
}

int64_t Module::workspaceBytes(const Program& p, int op) const {
  const Op& o = ops[op];
  if (o.phase == Phase::Optimizer) return 0;
  const Op& fwd = o.phase == Phase::Backward ? ops[o.forward] : o;
  bool backward = o.phase == Phase::Backward;
  if (opInfo(fwd.kind).split == SplitRule::Communication) return transferScratchBytes(p, o, fwd);
  if (!backward && vocabLoss(p, fwd)) // this rank's figures, then every slice's side by side
    return 4 * vocabFigures(p, fwd) * (p.splitWidth + 1);
  if (!backward && opInfo(fwd.kind).halfOutputByRows) {
    // amp: a block of its half output's rows in f32 (ir::halfOutputRows).
    if (stored.empty() || o.outputs.empty() || o.outputs[0] < 0 ||
        !isHalf(storedDtype(o.outputs[0])))
      return 0;
    std::vector<int64_t> y = localShape(p, o.outputs[0]);
    int64_t cols = y.empty() ? 1 : y.back(), rows = 1;
    for (size_t k = 0; k + 1 < y.size(); ++k)
      rows *= y[k];
    return 4 * halfOutputRows(rows, cols) * cols;
  }
  if (fwd.kind == OpKind::MoeExperts) { // an expert's block of gelu(h), and of dL/dh
    if (fwd.inputs.empty() || fwd.params.empty()) return 0;
    std::vector<int64_t> rows = localShape(p, fwd.inputs[0]);    // [M, D]
    std::vector<int64_t> w1 = localParamShape(p, fwd.params[0]); // [El, F, D]
    if (rows.size() != 2 || w1.size() != 3) return 0;
    return 4 * rows[0] * w1[1] * (backward ? 2 : 1); // at most every row in one block
  }
  bool kind =
      fwd.kind == OpKind::Mlp || fwd.kind == OpKind::Attention || fwd.kind == OpKind::Conv2d;
  if (!kind || fwd.inputs.empty() || fwd.params.empty()) return 0;
  std::vector<int64_t> x = localShape(p, fwd.inputs[0]);
  if (x.empty()) return 0;
  if (fwd.kind == OpKind::Conv2d) { // im2col of a group of images: col and tmp; col, dY, dcol
    std::optional<ConvShape> g = convShape(p, op);
    if (!g) return 0;
    int64_t images = convGroup(g->ckk(), g->plane(), g->b) * g->plane();
    int64_t im2col = 4 * images * (backward ? 2 * g->ckk() + g->co : g->ckk() + g->co);
    // The CPU's oneDNN convolution takes its own layout of the same workspace (convDirectPlan).
    ConvDirectPlan direct =
        convDirectPlan(g->b, g->c, g->h, g->w, g->co, g->k, g->plane(), backward);
    return direct.taken ? std::max(im2col, 4 * direct.floats()) : im2col;
  }
  int64_t rows = 1;
  for (size_t k = 0; k + 1 < x.size(); ++k)
    rows *= x[k];
  int64_t first = localParamShape(p, fwd.params[0]).at(0); // W1 [F, D] or Wqkv [d + 2 kvd, D]
  if (fwd.kind == OpKind::Mlp) return 4 * rows * first * (backward ? 2 : 1);
  // d from Wp [D, d]. Under amp, the products that read half precision as it is take the
  // context (forward) and dqkv (backward) rounded to it, in an array of half values after
  // the rest (backend/cpu/Attention.cpp).
  int64_t d = localParamShape(p, fwd.params[fwd.params.size() == 4 ? 2 : 1]).at(1);
  auto halves = [&](int64_t n) { return stored.empty() ? 0 : 4 * ((n + 1) / 2); };
  if (!backward) return halves(rows * d);
  // dctx [rows, d] and dqkv [rows, d + 2 kvd].
  return 4 * rows * (d + first) + halves(rows * first);
}

// A split region's transfer on a device (Executor::transfer), in f32: a reduce-scatter's
// whole partial tensor laid out piece after piece and its result; an all-gather's pieces
// side by side, unless they land joined (a cut of dim 0), and the joined tensor where it
// is added into the result; a slice added into, its piece. The experts' exchange: the rows
// it packs to send (at most the source's), those it receives (at most the result's), and
// the result to add.
int64_t Module::transferScratchBytes(const Program& p, const Op& o, const Op& fwd) const {
  bool backward = o.phase == Phase::Backward;
  if (o.inputs.empty() || o.outputs.empty() || o.outputs[0] < 0) return 0;
  bool add = backward && !o.accumulate.empty() && o.accumulate[0];
  std::vector<int64_t> to = localShape(p, o.outputs[0]);
  int64_t src = 1, dst = 1, rows = 1;
  for (int64_t d : localShape(p, o.inputs[0]))
    src *= d;
  for (int64_t d : to)
    dst *= d;
  if (fwd.kind == OpKind::AllToAll) return 4 * (src + dst + (add ? dst : 0));
  for (int d = 0; d < transferDim(fwd) && d < static_cast<int>(to.size()); ++d)
    rows *= to[d];
  switch (transferForm(o, fwd)) {
  case TransferForm::Scatter:
    return 4 * (src + dst);
  case TransferForm::Gather:
    return 4 * dst * ((add ? 1 : 0) + (rows == 1 ? 0 : 1));
  case TransferForm::Slice:
    return add ? 4 * dst : 0;
  case TransferForm::Reduce:
  case TransferForm::Pass:
    return 0;
  }
  return 0;
}

Module::StepFlops Module::stepFlops(const Program& p) const {
  StepFlops f;
  std::map<int, double> byOp; // an op runs once a micro-batch, alike each time
  for (const Instr& in : p.step) {
    if (in.kind != InstrKind::Run) continue;
    const Op& o = ops[in.op];
    if (o.phase == Phase::Optimizer) continue;
    const Op& fwd = o.phase == Phase::Backward ? ops[o.forward] : o;
    if (!opInfo(fwd.kind).products) continue;
    // By op: its forward's FLOPs, or its backward's (backwardProducts).
    auto cached = byOp.find(in.op);
    if (cached == byOp.end()) {
      double flops = 0;
      for (const Product& x :
           o.phase == Phase::Backward ? backwardProducts(p, in.op) : runProducts(p, in.op, false))
        flops += x.flops();
      cached = byOp.emplace(in.op, flops).first;
    }
    double run = cached->second;
    if (o.phase == Phase::Forward)
      f.forward += run;
    else if (o.phase == Phase::Recompute)
      f.recompute += run;
    else
      f.backward += in.part == BackwardPart::Whole ? run : run / 2;
  }
  return f;
}

std::optional<Module::ConvShape> Module::convShape(const Program& p, int op) const {
  const Op& o = ops[op];
  const Op& fwd = o.phase == Phase::Backward ? ops[o.forward] : o;
  if (fwd.kind != OpKind::Conv2d || fwd.inputs.empty() || fwd.params.empty()) return std::nullopt;
  std::vector<int64_t> x = localShape(p, fwd.inputs[0]);
  std::vector<int64_t> w = localParamShape(p, fwd.params[0]); // [Co, C, K, K]
  if (x.size() != 4 || w.size() != 4) return std::nullopt;
  int64_t stride = intAttr(fwd.attrs, "stride"), pad = intAttr(fwd.attrs, "padding");
  int64_t ho = (x[2] + 2 * pad - w[2]) / stride + 1, wo = (x[3] + 2 * pad - w[3]) / stride + 1;
  return ConvShape{x[0], x[1], x[2], x[3], w[0], w[2], ho, wo};
}

std::vector<Product> Module::backwardProducts(const Program& p, int op) const {
  const Op& o = ops[op];
  std::vector<Product> out = runProducts(p, o.forward, true);
  // Every op with products takes its first one of input 0 (linear, mlp, attention's qkv
  // projection, conv2d's columns, moe's router and experts).
  if (!out.empty() && (o.outputs.empty() || o.outputs[0] < 0)) out.erase(out.begin());
  return out;
}

std::vector<Product> Module::runProducts(const Program& p, int op, bool backward) const {
  const Op& o = ops[op];
  if (!opInfo(o.kind).products || o.outputs.empty()) return {};
  std::vector<Sizes> inputs, weights;
  for (int t : o.inputs)
    inputs.push_back(localShape(p, t));
  for (int q : o.params)
    weights.push_back(localParamShape(p, q));
  return opProducts(o.kind, inputs, weights, localShape(p, o.outputs[0]), o.attrs, backward);
}

std::string Module::runName(const Instr& in) const {
  const Op& op = ops[in.op];
  if (op.phase == Phase::Forward) return "fwd " + op.name;
  if (op.phase == Phase::Recompute) return "recompute " + op.name;
  if (op.phase == Phase::Optimizer) return "optimizer " + op.name;
  const char* part = in.part == BackwardPart::Inputs   ? "bwd-inputs"
                     : in.part == BackwardPart::Params ? "bwd-params"
                                                       : "bwd";
  return std::string(part) + " " + ops[op.forward].name;
}

Flops Module::runFlops(const Program& p, int op) const {
  double forward = 0;
  for (const Product& x : runProducts(p, op, false))
    forward += x.flops();
  return Flops{forward, 2 * forward};
}

const Program* Module::firstProgramOf(int stage) const {
  for (const Program& p : programs)
    if (p.stage == stage) return &p;
  return nullptr;
}

int64_t Module::tokensPerSample() const {
  const std::string& kind = train.data.kind;
  if ((kind != "tokens" && kind != "text") || inputs.empty()) return 0;
  const Shape& s = tensors[inputs[0]].type.shape;
  return s.size() == 2 && s[1].isConstant() ? s[1].coef : 0;
}

double Module::forwardFlopsPerSample() const {
  auto b = bindings.find(batchSymbol);
  if (b == bindings.end() || b->second <= 0) return 0;
  auto sizes = [&](const Shape& s) {
    Sizes out;
    for (const Dim& d : s)
      out.push_back(d.eval(bindings).value_or(0));
    return out;
  };
  double total = 0;
  for (const Op& o : ops) {
    if (o.phase != Phase::Forward || !opInfo(o.kind).products) continue;
    std::vector<Sizes> inputs, weights;
    for (int t : o.inputs)
      inputs.push_back(sizes(tensors[t].type.shape));
    for (int q : o.params)
      weights.push_back(sizes(params[q].type.shape));
    total += opFlops(o.kind, inputs, weights, sizes(tensors[o.outputs.at(0)].type.shape), o.attrs)
                 .forward;
  }
  return total / static_cast<double>(b->second);
}

int64_t Module::ampStagingBytes(const Program& p, int op) const {
  const Op& o = ops[op];
  const Op& fwd = o.phase == Phase::Backward ? ops[o.forward] : o;
  if (stored.empty() || o.phase == Phase::Optimizer || halfAsStored(fwd.kind)) return 0;
  auto padded = [](int64_t floats) { return (floats + 15) / 16 * 16; };
  // The call's layout and the rule of backend/HalfStaging.h (stagingFloats): the weights it
  // casts, and where every input its products read is of the half type or a cast weight
  // (directInputs), those go as they are and the weights take half a copy's room.
  bool backward = o.phase == Phase::Backward;
  DType half = castsWeights(fwd.kind) && !o.params.empty() ? ampDtype() : DType::F32;
  std::vector<CallInput> in = callInputs(o);
  uint64_t direct = isHalf(half) ? productInputs(o.kind, o.attrs, backward) : 0;
  for (size_t i = 0; i < in.size(); ++i)
    if ((direct >> i & 1) && in[i].tensor >= 0 && storedDtype(in[i].tensor) != half) direct = 0;
  int64_t floats = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    bool asIs = direct >> i & 1;
    if (in[i].param >= 0 && isHalf(half)) {
      int64_t n = 1;
      for (int64_t d : localParamShape(p, in[i].param))
        n *= d;
      floats += padded(asIs ? (n + 1) / 2 : n);
    } else if (in[i].tensor >= 0 && isHalf(storedDtype(in[i].tensor)) && !asIs) {
      floats += padded(bytesOn(p, in[i].tensor) / 2);
    }
  }
  // A forward that writes its output a block of rows at a time makes no copy of it (its
  // block is its workspace's, workspaceBytes).
  bool byRows = o.phase != Phase::Backward && opInfo(fwd.kind).halfOutputByRows;
  for (size_t i = 0; i < o.outputs.size(); ++i) {
    int t = o.outputs[i];
    if (t >= 0 && isHalf(storedDtype(t)) && !(byRows && i == 0))
      floats += padded(bytesOn(p, t) / 2);
  }
  return 4 * floats;
}

std::vector<Module::CallInput> Module::callInputs(const Op& o) const {
  std::vector<CallInput> in;
  auto params = [&] {
    for (int q : o.params)
      in.push_back({-1, q, -1});
  };
  if (o.phase != Phase::Backward) {
    for (int t : o.inputs)
      in.push_back({t, -1, t});
    params();
    return in;
  }
  // The output's gradient and the forward's inputs, the parameters, then the output and
  // the saved tensors.
  const Op& fwd = ops[o.forward];
  size_t n = fwd.inputs.size();
  in.push_back({o.inputs[0], -1, o.inputs[0]});
  for (size_t k = 0; k < n; ++k)
    in.push_back({o.inputs[1 + k], -1, fwd.inputs[k]});
  params();
  in.push_back({o.inputs[1 + n], -1, fwd.outputs[0]});
  for (size_t k = n + 2; k < o.inputs.size(); ++k)
    in.push_back({o.inputs[k], -1, o.inputs[k]});
  return in;
}

int64_t Module::ampStagedBytes(const Program& p, int op, bool direct) const {
  const Op& o = ops[op];
  const Op& fwd = o.phase == Phase::Backward ? ops[o.forward] : o;
  bool asIs = direct && (fwd.kind == OpKind::Linear || fwd.kind == OpKind::Mlp ||
                         fwd.kind == OpKind::Attention);
  if (!asIs || stored.empty() || o.phase == Phase::Optimizer) return ampStagingBytes(p, op);
  int64_t bytes = 0;
  bool byRows = o.phase != Phase::Backward && opInfo(fwd.kind).halfOutputByRows; // workspaceBytes
  for (size_t i = 0; i < o.outputs.size(); ++i) {
    int t = o.outputs[i];
    if (t >= 0 && isHalf(storedDtype(t)) && !(byRows && i == 0)) bytes += 2 * bytesOn(p, t);
  }
  for (int q : o.params) {
    int64_t n = 1;
    for (int64_t d : localParamShape(p, q))
      n *= d;
    bytes += 2 * n;
  }
  return bytes;
}

bool Module::zeroShardsGradients() const {
  if (policy.zero < ZeroStage::Gradients || optimizerStates() == 0 || buckets.empty() ||
      !splitPiecesShared())
    return false;
  if (mesh.stages.size() > 1) {
    // A pipeline's copies: every stage's parameters summed over several ranks (data-parallel
    // pass: a bucket per stage at least).
    if (mesh.np <= mesh.depth() || !mesh.pipelineRefusal().empty()) return false;
    // A stage whose parameters all lack a gradient (its layers do not reach the loss) has
    // buckets of zeros but updates nothing, where ZeRO stage 1 does not apply (zeroApplies);
    // one that runs no backward op at all (a tied weight's copy that reaches no loss, whose
    // bucket is ready after a forward op) has none whose writes would fill its bucket in
    // the arena.
    std::vector<bool> reduced(mesh.stages.size(), false);
    for (const GradBucket& b : buckets) { // a tied weight's is summed over other stages' too
      bool trained = false;
      for (int q = b.firstParam; q < b.endParam && !trained; ++q)
        trained = params[q].grad >= 0;
      if (trained && ops[b.readyOp].phase == Phase::Backward &&
          (!b.tied || mesh.stageRanks(b.stage).size() > 1))
        reduced[b.stage] = true;
    }
    return std::all_of(reduced.begin(), reduced.end(), [](bool r) { return r; });
  }
  // Some parameter has a gradient (each is in a bucket then, in one domain's block).
  return mesh.np >= 2 &&
         std::any_of(params.begin(), params.end(), [](const Param& q) { return q.grad >= 0; });
}

bool Module::zeroShardsParams() const {
  return policy.zero == ZeroStage::Parameters && zeroShardsGradients() &&
         std::all_of(params.begin(), params.end(), [](const Param& q) { return q.grad >= 0; });
}

bool Module::holdsParam(const Program& p, int q) const {
  int op = params[q].op;
  if (op < 0 || ops[op].stage % mesh.depth() == p.stage) return true;
  for (int s : params[q].copies)
    if (s % mesh.depth() == p.stage) return true;
  return false;
}

bool Module::holdsCopy(const Program& p, int q) const {
  int op = params[q].op;
  return op >= 0 && ops[op].stage % mesh.depth() != p.stage && holdsParam(p, q);
}

std::vector<int> Module::stagesHolding(int q) const {
  std::vector<int> stages{ops[params[q].op].stage};
  stages.insert(stages.end(), params[q].copies.begin(), params[q].copies.end());
  return stages;
}

std::vector<int> Module::tiedRanks(int q, int splitRank) const {
  std::vector<int> out;
  bool pieces = reducedOverPieces(q);
  for (int s : stagesHolding(q)) {
    const StagePlan& st = mesh.stages[s];
    for (int r = 0; r < mesh.dataParallel; ++r)
      for (int local = 0; local < st.group; ++local)
        if (!pieces || local % st.splitWidth == splitRank) out.push_back(mesh.rank(r, s, local));
  }
  std::sort(out.begin(), out.end());
  return out;
}

Module::ParamLayout Module::paramLayout(const Program& p) const {
  ParamLayout l;
  l.offset.assign(params.size(), -1);
  l.bytes.assign(params.size(), 0);
  auto place = [&](bool pieces) { // the held parameters of one domain, in parameter order
    for (size_t q = 0; q < params.size(); ++q) {
      int k = static_cast<int>(q);
      if (!holdsParam(p, k) || reducedOverPieces(k) != pieces) continue;
      l.offset[q] = l.total;
      l.bytes[q] = 4;
      for (int64_t d : localParamShape(p, k))
        l.bytes[q] *= d;
      l.total = l.end(k);
    }
  };
  place(false);
  int64_t end = l.total;
  place(true);
  bool updates =
      std::any_of(p.params.begin(), p.params.end(), [&](int q) { return !reducedOverPieces(q); });
  if (!updates || l.total == end) return l;
  // With split pieces after them: ZeRO's slices of the first domain (the layout's start),
  // padded to equal sizes (Module::zeroSlices), end before the second domain begins.
  int n = std::max(p.dataRanks, 1);
  int64_t padded = n * (((end + n - 1) / n + 63) / 64 * 64);
  for (size_t q = 0; q < params.size(); ++q)
    if (l.offset[q] >= end) l.offset[q] += padded - end;
  l.total += padded - end;
  return l;
}

std::vector<Module::ZeroSlice> Module::zeroSlices(const Program& p) const {
  ParamLayout at = paramLayout(p);
  std::vector<ZeroSlice> out;
  for (bool pieces : {false, true}) {
    // A domain where the rank updates some parameter: every parameter of it that the rank
    // holds, those without a gradient too (a layer no loss reads, batch_norm's running
    // statistics), as the gradient buckets that stage 2 reduce-scatters span them.
    if (std::none_of(p.params.begin(), p.params.end(),
                     [&](int q) { return reducedOverPieces(q) == pieces; }))
      continue;
    int64_t first = -1, last = -1;
    for (size_t q = 0; q < params.size(); ++q)
      if (at.holds(static_cast<int>(q)) && reducedOverPieces(static_cast<int>(q)) == pieces) {
        first = first < 0 ? at.offset[q] : std::min(first, at.offset[q]);
        last = std::max(last, at.end(static_cast<int>(q)));
      }
    ZeroSlice z;
    z.base = first;
    z.pieces = pieces;
    z.ranks = p.dataRanks;
    z.rank = p.dataRank;
    if (pieces) { // the ranks of p's stage holding the same pieces: a copy's in each replica
      int copies = mesh.stages.at(static_cast<size_t>(p.stage)).group / p.splitWidth;
      z.ranks = mesh.dataParallel * copies;
      z.rank = p.replica * copies + p.local / p.splitWidth;
    }
    z.bytes = ((last - first + z.ranks - 1) / z.ranks + 63) / 64 * 64;
    out.push_back(z);
  }
  return out;
}

std::vector<std::vector<Module::SlicePiece>> Module::bucketPieces(const Program& p) const {
  ParamLayout at = paramLayout(p);
  std::vector<ZeroSlice> domains = zeroSlices(p);
  std::vector<std::vector<SlicePiece>> out(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (!holdsBucket(p, buckets[b])) continue; // another stage's
    int64_t first = at.spanBegin(buckets[b].firstParam), last = at.spanEnd(buckets[b].endParam);
    for (const ZeroSlice& z : domains) {
      if (z.pieces != buckets[b].pieces) continue;
      for (int k = 0; k < z.ranks; ++k) {
        int64_t begin = std::max(first, z.base + k * z.bytes);
        int64_t end = std::min(last, z.base + (k + 1) * z.bytes);
        if (begin < end) out[b].push_back({k, begin, end});
      }
    }
  }
  return out;
}

int Module::reductionRanks(const Program& p, const GradBucket& b, bool tie) const {
  if (!b.tied || tie || !zeroShardsGradients()) return b.ranks;
  for (const ZeroSlice& z : zeroSlices(p))
    if (z.pieces == b.pieces) return z.ranks;
  return b.ranks;
}

int64_t Module::tieBytes(const Program& p) const {
  if (!zeroShardsGradients()) return 0;
  ParamLayout at = paramLayout(p);
  int64_t bytes = 0;
  for (const GradBucket& b : buckets)
    if (b.tied && b.stage % mesh.depth() == p.stage) // each stage holding it has such a bucket
      bytes += at.spanEnd(b.endParam) - at.spanBegin(b.firstParam);
  return bytes;
}

std::vector<int> Module::paramBuckets(const Program& p) const {
  std::vector<int> out(params.size(), -1);
  for (size_t b = 0; b < buckets.size(); ++b)
    if (holdsBucket(p, buckets[b]))
      for (int q = buckets[b].firstParam; q < buckets[b].endParam; ++q)
        out[q] = static_cast<int>(b);
  return out;
}

int Module::stageScopeOf(int scope) const {
  for (int s = scope; s > 0; s = scopes[s].parent)
    if (scopes[s].kind == ScopeKind::Stage) return s;
  return -1;
}

int Module::splitScopeOf(int scope) const {
  for (int s = scope; s > 0; s = scopes[s].parent) {
    if (scopes[s].kind == ScopeKind::Split) return s;
    if (scopes[s].kind == ScopeKind::Stage && scopes[s].isSplitStage) return s;
  }
  return -1;
}

} // namespace epl::ir
