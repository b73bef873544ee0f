// autodiff: the backward graph and the optimizer step, as IR.
//
//   1. The model's output must be a scalar float: the loss.
//   2. A tensor needs a gradient when it depends on a parameter through differentiable
//      ops (model inputs and integer tensors never do).
//   3. Walking the forward ops backwards, each op whose output has a gradient gets one
//      backward op (inputs and outputs in backend::KernelCall's order). The forward op
//      gains the tensors its backward reads (ir::gradInfo's saved list) as extra outputs.
//      A tensor read by several ops gets one gradient buffer: the first backward op to
//      reach it writes it, later ones add into it.
//   4. Parameter gradients live across micro-batches, so every write to them adds; the
//      step starts by zeroing them. A weight two layers share (linear's `tie`) has one
//      gradient, which both layers' backward ops add into.
//   5. The backward of a send/recv between stages is the transfer of the gradient back:
//      from the stage that received the activation to the one that sent it, which owns
//      the op (ops belong to the stage that receives what they move).
//   6. After the backward: a grad-norm op when `clip_grad_norm` is set (or amp = fp16
//      scales the loss), then one optimizer-step op per parameter (and per copy of a
//      weight tied across stages, each in its stage).
#include "passes/Passes.h"

#include <fmt/format.h>

namespace epl::passes {

namespace {

class Autodiff : public Pass {
public:
  const char* name() const override { return "autodiff"; }

  bool run(ir::Module& m, PassContext& ctx) override {
    if (!m.train.present || m.lossGrad >= 0) return false;
    if (!checkLoss(m, ctx)) return true;
    m_ = &m;
    markNeedsGrad();
    grad_.assign(m.tensors.size(), -1);
    int loss = m.outputs[0];
    m.lossGrad = grad_[loss] =
        m.addTensor(m.tensors[loss].name + ".grad", m.tensors[loss].type, -1);
    int forwardOps = static_cast<int>(m.ops.size());
    for (int i = forwardOps; i-- > 0;)
      if (m.ops[i].phase == ir::Phase::Forward) differentiate(i);
    if (!checkTrained(m, ctx)) return true;
    addOptimizer();
    return true;
  }

private:
  static bool checkLoss(const ir::Module& m, PassContext& ctx) {
    const ir::TensorType& t = m.tensors[m.outputs.at(0)].type;
    if (m.outputs.size() == 1 && t.shape.empty() && !ir::isIntegral(t.dtype)) return true;
    ctx.diags
        .error(m.loc,
               fmt::format("`{}` must return one scalar loss to be trained, but it returns `{}`",
                           m.modelName, t.str()))
        .length(static_cast<uint32_t>(m.modelName.size()))
        .help("end the model with a loss such as `cross_entropy(logits, labels)` or `mse(…)`");
    return false;
  }

  // The parameters the loss reaches get a gradient. None: an error, since a step would
  // train nothing (and a pipeline's stages would reduce and update nothing). Some not: a
  // warning at each statement whose layers' results never reach the loss, since their
  // parameters keep their initial values (as PyTorch leaves a parameter whose .grad stays
  // None: no update, no weight decay).
  static bool checkTrained(const ir::Module& m, PassContext& ctx) {
    bool any = false;
    std::vector<SourceLoc> where; // the statements of untrained layers, once each
    auto same = [](const SourceLoc& a, const SourceLoc& b) {
      return a.file == b.file && a.line == b.line && a.col == b.col;
    };
    for (const ir::Param& p : m.params) {
      if (!p.trainable) continue;
      if (p.grad >= 0) {
        any = true;
        continue;
      }
      const SourceLoc& site = m.ops[p.op].site;
      if (std::none_of(where.begin(), where.end(),
                       [&](const SourceLoc& w) { return same(w, site); }))
        where.push_back(site);
    }
    if (!any) {
      if (m.params.empty()) return true; // nothing to train, and nothing that could be
      int producer = m.tensors[m.outputs.at(0)].producer;
      ctx.diags
          .error(producer >= 0 ? m.ops[producer].site : m.loc,
                 fmt::format("`{}`'s loss depends on none of its parameters: training would "
                             "change nothing",
                             m.modelName))
          .help("compute the loss from the model's layers");
      return false;
    }
    for (const SourceLoc& at : where)
      ctx.diags
          .warning(at, "this statement's layers do not reach the loss: their parameters "
                       "get no gradient and keep their initial values")
          .help("use the result on the way to the loss, or remove the statement");
    return true;
  }

  void markNeedsGrad() {
    needs_.assign(m_->tensors.size(), false);
    for (const ir::Op& op : m_->ops) {
      if (op.phase != ir::Phase::Forward ||
          !ir::gradInfo(op.kind, types(op), op.attrs).differentiable)
        continue;
      bool any = !op.params.empty();
      for (int t : op.inputs)
        any = any || needs_[t];
      for (int t : op.outputs)
        needs_[t] = any && !ir::isIntegral(m_->tensors[t].type.dtype);
    }
  }

  std::vector<ir::TensorType> types(const ir::Op& op) const {
    std::vector<ir::TensorType> in;
    for (int t : op.inputs)
      in.push_back(m_->tensors[t].type);
    return in;
  }

  // The gradient buffer of tensor t for a new contribution: (id, adds into it).
  std::pair<int, bool> gradOf(int t) {
    if (!needs_[t]) return {-1, false};
    if (grad_[t] >= 0) return {grad_[t], true};
    grad_[t] = m_->addTensor(m_->tensors[t].name + ".grad", m_->tensors[t].type, -1);
    m_->tensors[grad_[t]].layout = m_->tensors[t].layout; // each device's piece, as the value's
    return {grad_[t], false};
  }

  void differentiate(int i) {
    ir::Op fwd = m_->ops[i]; // copy: addTensor/ops.push_back may move storage
    int y = fwd.outputs[0];
    ir::GradInfo info = ir::gradInfo(fwd.kind, types(fwd), fwd.attrs);
    if (!info.differentiable) return;
    // The forward's kernel writes what it saves for the backward (KernelCall's arity), even
    // for an op no loss reads (checkTrained warns): there nothing reads them.
    std::vector<int> saved;
    for (size_t k = 0; k < info.saved.size(); ++k) {
      int t = m_->addTensor(fmt::format("{}.saved{}", m_->tensors[y].name, k), info.saved[k], i);
      m_->tensors[t].layout = savedLayout(fwd, k);
      m_->ops[i].outputs.push_back(t);
      saved.push_back(t);
    }
    if (grad_[y] < 0) return;
    ir::Op bwd;
    bwd.kind = fwd.kind;
    bwd.name = fwd.name;
    bwd.attrs = fwd.attrs;
    bwd.scope = fwd.scope;
    bwd.stage = fwd.stage;
    bwd.phase = ir::Phase::Backward;
    bwd.loc = fwd.loc;
    bwd.site = fwd.site;
    bwd.forward = i;
    bwd.params = fwd.params;
    if (fwd.kind == ir::OpKind::SendRecv) {
      int64_t from = ir::intAttr(fwd.attrs, "from_stage"), to = ir::intAttr(fwd.attrs, "to_stage");
      bwd.stage = static_cast<int>(from);
      bwd.attrs["from_stage"] = to;
      bwd.attrs["to_stage"] = from;
    }
    bwd.inputs.push_back(grad_[y]);
    for (int t : fwd.inputs)
      bwd.inputs.push_back(info.needsInputs ? t : -1);
    bwd.inputs.push_back(info.needsOutput ? y : -1);
    bwd.inputs.insert(bwd.inputs.end(), saved.begin(), saved.end());
    for (int t : fwd.inputs) {
      auto [g, adds] = gradOf(t);
      bwd.outputs.push_back(g);
      bwd.accumulate.push_back(adds);
    }
    int id = static_cast<int>(m_->ops.size());
    for (int t : bwd.outputs)
      if (t >= 0 && m_->tensors[t].producer < 0) m_->tensors[t].producer = id;
    for (int p : fwd.params) { // parameter gradients have no producer: every op adds
      ir::Param& param = m_->params[p];
      if (param.grad < 0) { // a tied weight's second layer adds into the same gradient
        param.grad = m_->addTensor(param.name + ".grad", param.type, -1);
        m_->tensors[param.grad].layout = param.shardDim >= 0
                                             ? ir::Layout{ir::LayoutKind::Sharded, param.shardDim}
                                             : ir::Layout{ir::LayoutKind::Replicated, -1};
      }
      bwd.outputs.push_back(param.grad);
      bwd.accumulate.push_back(true);
    }
    m_->ops.push_back(std::move(bwd));
  }

  // How a device holds what op `fwd` saves for its backward (ir::gradInfo's list): split
  // attention keeps its heads' qkv and context (cut along the width) and log-sum-exps (cut
  // along heads), a split mlp its hidden slice; otherwise rows as the op's output has them.
  ir::Layout savedLayout(const ir::Op& fwd, size_t k) const {
    auto cut = [](int dim) { return ir::Layout{ir::LayoutKind::Sharded, dim}; };
    if (fwd.splitForm == ir::SplitForm::Heads) return k == 2 ? cut(1) : cut(2);
    if (fwd.splitForm == ir::SplitForm::Hidden) {
      int rank = static_cast<int>(m_->tensors[fwd.inputs[0]].type.shape.size());
      return cut(rank - 1);
    }
    ir::Layout l = m_->tensors[fwd.outputs[0]].layout;
    if (l.kind == ir::LayoutKind::Partial) l = ir::Layout{ir::LayoutKind::Replicated, -1};
    return l;
  }

  void addOptimizer() {
    ir::Module& m = *m_;
    std::vector<int> grads;
    for (const ir::Param& p : m.params)
      if (p.grad >= 0) grads.push_back(p.grad);
    // amp = fp16 reads the norm for overflows (an infinite or NaN gradient skips the step).
    if (m.train.clipGradNorm > 0 || m.scalesLoss()) {
      ir::Op norm = trainingOp(ir::OpKind::GradNorm, "grad_norm");
      norm.inputs = grads;
      m.gradNorm = m.addTensor("grad_norm", ir::TensorType{ir::DType::F32, {}},
                               static_cast<int>(m.ops.size()));
      norm.outputs = {m.gradNorm};
      m.ops.push_back(std::move(norm));
    }
    for (size_t p = 0; p < m.params.size(); ++p) {
      if (m.params[p].grad < 0 || !m.params[p].trainable) continue;
      ir::Op step = trainingOp(ir::OpKind::OptimizerStep, m.train.optimizer.kind);
      step.inputs = {m.params[p].grad};
      if (m.gradNorm >= 0) step.inputs.push_back(m.gradNorm);
      step.params = {static_cast<int>(p)};
      step.stage = m.ops[m.params[p].op].stage;
      step.site = m.ops[m.params[p].op].site;
      for (int copy : m.params[p].copies) { // a tied weight's copy in another stage, alike
        ir::Op again = step;
        again.stage = copy;
        m.ops.push_back(std::move(again));
      }
      m.ops.push_back(std::move(step));
    }
  }

  ir::Op trainingOp(ir::OpKind kind, std::string name) const {
    ir::Op op;
    op.kind = kind;
    op.name = std::move(name);
    op.phase = ir::Phase::Optimizer;
    op.stage = 0;
    op.loc = op.site =
        m_->train.keyLocs.count("optimizer") ? m_->train.keyLocs.at("optimizer") : m_->loc;
    return op;
  }

  ir::Module* m_ = nullptr;
  std::vector<bool> needs_;
  std::vector<int> grad_;
};

} // namespace

std::unique_ptr<Pass> createAutodiffPass() {
  return std::make_unique<Autodiff>();
}

} // namespace epl::passes
