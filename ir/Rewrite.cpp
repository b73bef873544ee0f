#include "ir/Rewrite.h"

#include "support/Assert.h"

#include <algorithm>

namespace epl::ir {

void insertOps(Module& m, std::vector<std::pair<int, Op>> ops) {
  if (ops.empty()) return;
  std::stable_sort(ops.begin(), ops.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  int old = static_cast<int>(m.ops.size());
  std::vector<int> moved(static_cast<size_t>(old), -1);
  std::vector<Op> out;
  out.reserve(m.ops.size() + ops.size());
  std::vector<int> added; // the new ops' places in `out`
  size_t next = 0;
  for (int i = 0; i <= old; ++i) {
    for (; next < ops.size() && ops[next].first <= i; ++next) {
      EPL_ASSERT(ops[next].first >= 0, "an op is inserted at a position of the list");
      added.push_back(static_cast<int>(out.size()));
      out.push_back(std::move(ops[next].second));
    }
    if (i < old) {
      moved[i] = static_cast<int>(out.size());
      out.push_back(std::move(m.ops[i]));
    }
  }
  auto remap = [&](int& id) {
    if (id >= 0) id = moved.at(id);
  };
  for (Tensor& t : m.tensors)
    remap(t.producer);
  for (Op& op : out)
    remap(op.forward);
  for (Param& p : m.params)
    remap(p.op);
  for (Bridge& b : m.bridges)
    remap(b.op);
  for (int at : added)
    for (int t : out[at].outputs) {
      if (t < 0) continue;
      EPL_ASSERT(m.tensors[t].producer < 0, "an inserted op's outputs are new tensors");
      m.tensors[t].producer = at;
    }
  m.ops = std::move(out);
}

} // namespace epl::ir
