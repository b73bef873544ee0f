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

std::vector<int> Mesh::stageReplicaRanks(int stage, int local) const {
  std::vector<int> out;
  for (int r = 0; r < dataParallel; ++r)
    out.push_back(rank(r, stage, local));
  return out;
}

std::vector<int> Mesh::pipelineRanks(int replica, int local) const {
  std::vector<int> out;
  for (size_t s = 0; s < stages.size(); ++s)
    out.push_back(rank(replica, static_cast<int>(s), local));
  return out;
}

std::string Mesh::pipelineRefusal() const {
  for (size_t s = 0; s < stages.size(); ++s) {
    if (stages[s].splitWidth != 1)
      return fmt::format("a split of width {} in stage {}", stages[s].splitWidth, s);
    if (stages[s].group != 1) return fmt::format("{} devices in stage {}", stages[s].group, s);
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
