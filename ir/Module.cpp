// Module helpers: adding tensors and scopes, scope queries, byte counts.
#include "ir/Module.h"

#include "support/Assert.h"
#include "support/Checked.h"

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

std::optional<int64_t> Module::bytesOf(int t) const {
  auto n = numElements(tensors[t].type.shape, bindings);
  if (!n) return std::nullopt;
  return checkedMul(*n, dtypeBytes(tensors[t].type.dtype));
}

std::map<std::string, int64_t> Module::bindingsOn(const Program& p) const {
  std::map<std::string, int64_t> out = bindings;
  if (p.localBatch > 0) out[batchSymbol] = p.localBatch;
  return out;
}

int64_t Module::bytesOn(const Program& p, int t) const {
  auto n = numElements(tensors[t].type.shape, bindingsOn(p));
  auto bytes = n ? checkedMul(*n, dtypeBytes(tensors[t].type.dtype)) : std::nullopt;
  EPL_ASSERT(bytes.has_value(), "a tensor of a rank program has an unbound dim");
  return *bytes;
}

int64_t Module::transferBytes(const Program& p, const Instr& in) const {
  int64_t whole = bytesOn(p, in.tensor);
  return in.rows < 0 ? whole : whole / p.localBatch * in.rows;
}

int Module::lossRanks() const {
  int n = 0;
  for (size_t r = 0; r < programs.size(); ++r)
    n += programs[r].lossRank == static_cast<int>(r);
  return n;
}

Module::SlotUse Module::slotUse(const Program& p) const {
  SlotUse u;
  u.first.assign(static_cast<size_t>(p.microBatches), -1);
  u.last.assign(static_cast<size_t>(p.microBatches), -1);
  for (size_t i = 0; i < p.step.size(); ++i) {
    const Instr& in = p.step[i];
    bool uses = in.kind == InstrKind::Load || in.kind == InstrKind::SeedGrad ||
                in.kind == InstrKind::Send || in.kind == InstrKind::Recv ||
                (in.kind == InstrKind::Run && ops[in.op].phase != Phase::Optimizer);
    if (!uses) continue;
    if (u.first[in.micro] < 0) u.first[in.micro] = static_cast<int>(i);
    u.last[in.micro] = static_cast<int>(i);
  }
  return u;
}

int Module::addTensor(std::string name, TensorType type, int producer) {
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
  for (size_t s = 0; s < stages.size(); ++s) {
    if (stages[s].splitWidth != 1)
      return fmt::format("a split of width {} in stage {}", stages[s].splitWidth, s);
  }
  return "";
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
