// Checks that ids are in range, each tensor has one producer that runs before its uses,
// types agree with the op table, and plan data (stages, layouts) is consistent.
#include "ir/Verifier.h"

#include <algorithm>
#include <fmt/format.h>

namespace epl::ir {

namespace {

// Backward and optimizer ops: ids in range, a tensor is redefined only to accumulate.
void checkTrainingOp(const Module& m, size_t i, std::vector<bool>& defined,
                     std::vector<std::string>& errs) {
  const Op& op = m.ops[i];
  auto bad = [&](std::string what) {
    errs.push_back(fmt::format("op {} `{}` ({}): {}", i, op.name,
                               op.phase == Phase::Backward    ? "backward"
                               : op.phase == Phase::Recompute ? "recompute"
                                                              : "optimizer",
                               what));
  };
  int nt = static_cast<int>(m.tensors.size());
  for (int t : op.inputs) {
    if (t < -1 || t >= nt) return bad("input id out of range");
    if (t >= 0 && !defined[t])
      bad(fmt::format("uses tensor `{}` before it is defined", m.tensors[t].name));
  }
  if (op.phase == Phase::Backward && op.accumulate.size() != op.outputs.size())
    return bad("one accumulate flag per output");
  for (size_t k = 0; k < op.outputs.size(); ++k) {
    int t = op.outputs[k];
    if (t < -1 || t >= nt) return bad("output id out of range");
    if (t < 0) continue;
    bool adds = op.phase == Phase::Backward && op.accumulate[k];
    bool param = m.tensors[t].producer < 0;
    if (adds && !defined[t] && !param)
      bad(fmt::format("adds into `{}` before it is written", m.tensors[t].name));
    if (!adds && defined[t]) bad(fmt::format("tensor `{}` defined twice", m.tensors[t].name));
    defined[t] = true;
  }
  if (inBackwardPass(op.phase) && (op.forward < 0 || op.forward >= static_cast<int>(i) ||
                                   m.ops[op.forward].phase != Phase::Forward))
    bad("does not name an earlier forward op");
  if (op.phase == Phase::Recompute && op.forward >= 0 && op.forward < static_cast<int>(i) &&
      (m.ops[op.forward].kind != op.kind || m.ops[op.forward].outputs.size() != op.outputs.size()))
    bad("is not the forward op it repeats");
  if (m.planned && (op.stage < 0 || op.stage >= static_cast<int>(m.mesh.stages.size())))
    bad("no stage after planning");
}

void checkOp(const Module& m, size_t i, std::vector<bool>& defined,
             std::vector<std::string>& errs) {
  const Op& op = m.ops[i];
  if (op.phase != Phase::Forward) return checkTrainingOp(m, i, defined, errs);
  auto bad = [&](std::string what) {
    errs.push_back(fmt::format("op {} `{}`: {}", i, op.name, what));
  };
  int nt = static_cast<int>(m.tensors.size());
  for (int t : op.inputs) {
    if (t < 0 || t >= nt) return bad("input id out of range");
    if (!defined[t]) bad(fmt::format("uses tensor `{}` before it is defined", m.tensors[t].name));
  }
  for (int t : op.outputs) {
    if (t < 0 || t >= nt) return bad("output id out of range");
    if (m.tensors[t].producer != static_cast<int>(i)) bad("output's producer is another op");
    if (defined[t]) bad(fmt::format("tensor `{}` defined twice", m.tensors[t].name));
    defined[t] = true;
  }
  for (int p : op.params) {
    if (p < 0 || p >= static_cast<int>(m.params.size())) return bad("param id out of range");
    int owner = m.params[p].op; // the op that made it, or an earlier one this op ties to
    if (owner != static_cast<int>(i) &&
        (owner < 0 || owner > static_cast<int>(i) ||
         std::count(m.ops[owner].params.begin(), m.ops[owner].params.end(), p) == 0))
      bad("param belongs to another op");
  }
  if (op.scope < 0 || op.scope >= static_cast<int>(m.scopes.size()))
    return bad("scope out of range");
  if (m.planned && (op.stage < 0 || op.stage >= static_cast<int>(m.mesh.stages.size())))
    bad("no stage after planning");
  std::vector<TensorType> in, out;
  for (int t : op.inputs)
    in.push_back(m.tensors[t].type);
  int want = opInfo(op.kind).tensorInputs(op.attrs);
  if (static_cast<int>(in.size()) != want)
    return bad(fmt::format("has {} inputs, the op table says {}", in.size(), want));
  std::string err = inferTypes(op.kind, in, op.attrs, out);
  if (!err.empty()) return bad("does not type-check: " + err);
  // Autodiff appends the tensors the backward reads after the op's own outputs.
  if (out.size() > op.outputs.size()) return bad("output count differs from the op table");
  for (size_t k = 0; k < out.size(); ++k)
    if (!(out[k] == m.tensors[op.outputs[k]].type))
      bad(fmt::format("output type {} differs from inferred {}",
                      m.tensors[op.outputs[k]].type.str(), out[k].str()));
}

} // namespace

std::vector<std::string> verify(const Module& m) {
  std::vector<std::string> errs;
  std::vector<bool> defined(m.tensors.size(), false);
  for (int t : m.inputs) {
    if (t < 0 || t >= static_cast<int>(m.tensors.size())) {
      errs.push_back("model input id out of range");
      continue;
    }
    defined[t] = true;
  }
  if (m.lossGrad >= 0) defined[m.lossGrad] = true; // seeded by the step, not by an op
  for (size_t s = 1; s < m.scopes.size(); ++s)
    if (m.scopes[s].parent < 0 || m.scopes[s].parent >= static_cast<int>(s))
      errs.push_back(fmt::format("scope {} has a bad parent", s));
  for (size_t i = 0; i < m.ops.size(); ++i)
    checkOp(m, i, defined, errs);
  for (int t : m.outputs)
    if (t < 0 || t >= static_cast<int>(m.tensors.size()) || !defined[t])
      errs.push_back("model output is not defined");
  if (m.planned) {
    // The first depth() blocks own contiguous groups; a later chunk's block shares the
    // group of block k mod depth().
    int sum = 0, depth = m.mesh.depth();
    if (m.mesh.chunks < 1 || depth * m.mesh.chunks != static_cast<int>(m.mesh.stages.size()))
      errs.push_back("the stage blocks are not chunks x pipeline ranks");
    for (size_t s = 0; s < m.mesh.stages.size(); ++s) {
      const StagePlan& st = m.mesh.stages[s];
      if (st.group % st.splitWidth != 0)
        errs.push_back("stage group not a multiple of its split width");
      if (depth > 0 && static_cast<int>(s) >= depth) {
        const StagePlan& host = m.mesh.stages[s % depth];
        if (st.firstLocalRank != host.firstLocalRank || st.group != host.group)
          errs.push_back("a chunk's stage block does not share its stage's group");
        continue;
      }
      if (st.firstLocalRank != sum) errs.push_back("stage groups are not contiguous");
      sum += st.group;
    }
    if (sum != m.mesh.replicaSize)
      errs.push_back("replica size differs from the sum of stage groups");
    if (m.mesh.replicaSize * m.mesh.dataParallel != m.mesh.np)
      errs.push_back("mesh does not cover -np");
  }
  return errs;
}

} // namespace epl::ir
