// Parameter initialisation (Init.h says which rule each layer gets and why).
#include "interp/Init.h"

#include "support/Random.h"

#include <cmath>

namespace epl::interp {

uint64_t Rng::next() {
  uint64_t z = splitmix64(state_); // the generator: splitmix64 of a golden-ratio counter
  state_ += 0x9e3779b97f4a7c15ull;
  return z;
}

double Rng::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

double Rng::normal() {
  double u1 = uniform(), u2 = uniform();
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t hashString(const std::string& s) {
  uint64_t h = 1469598103934665603ull; // FNV-1a
  for (unsigned char c : s)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

namespace {

std::string suffix(const std::string& name) {
  size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// The input width a weight (or its bias) sees: every dim after the output dim, except for
// moe's per-expert weights [E, out, in], whose first dim counts experts.
int64_t fanIn(const ir::Module& m, const ir::Op& op, const std::string& weight) {
  for (int q : op.params) {
    const ir::Param& w = m.params[q];
    if (suffix(w.name) != weight) continue;
    const ir::Shape& s = w.type.shape;
    if (op.kind == ir::OpKind::MoeExperts && s.size() == 3) return s[2].coef;
    int64_t n = 1;
    for (size_t d = 1; d < s.size(); ++d)
      n *= s[d].coef;
    return n;
  }
  return 1;
}

} // namespace

std::vector<float> initialValues(const ir::Module& m, int p, uint64_t seed) {
  const ir::Param& prm = m.params[p];
  const ir::Op& op = m.ops[prm.op];
  std::vector<float> v(*ir::numElements(prm.type.shape, {}));
  Rng rng(seed ^ hashString(prm.name));
  std::string s = suffix(prm.name);
  switch (op.kind) {
  case ir::OpKind::Embedding:
  case ir::OpKind::Positions:
    for (float& x : v)
      x = static_cast<float>(rng.normal());
    return v;
  case ir::OpKind::LayerNorm:
  case ir::OpKind::RmsNorm:
    for (float& x : v)
      x = s == "weight" ? 1.f : 0.f;
    return v;
  default:
    break;
  }
  // A bias shares its weight's bound: `fc1_bias` goes with `fc1_weight`, `bias` with
  // `weight`.
  std::string weight = s;
  if (s.size() >= 4 && s.compare(s.size() - 4, 4, "bias") == 0)
    weight = s.substr(0, s.size() - 4) + "weight";
  double bound = 1.0 / std::sqrt(static_cast<double>(fanIn(m, op, weight)));
  for (float& x : v)
    x = static_cast<float>((2 * rng.uniform() - 1) * bound);
  return v;
}

} // namespace epl::interp
