// Parameter initialisation (Init.h says which rule each layer gets and why).
#include "interp/Init.h"

#include "support/Random.h"

#include <algorithm>
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

std::vector<float> initialValues(const ir::Module& m, int p, uint64_t seed) {
  const ir::Param& prm = m.params[p];
  std::vector<float> v(*ir::numElements(prm.type.shape, {}));
  Rng rng(seed ^ hashString(prm.name));
  switch (prm.init) {
  case ir::ParamInit::Normal:
    for (float& x : v)
      x = static_cast<float>(rng.normal() * prm.initStd);
    break;
  case ir::ParamInit::One:
  case ir::ParamInit::Zero:
    std::fill(v.begin(), v.end(), prm.init == ir::ParamInit::One ? 1.f : 0.f);
    break;
  case ir::ParamInit::Uniform: {
    double bound = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(prm.fanIn, 1)));
    for (float& x : v)
      x = static_cast<float>((2 * rng.uniform() - 1) * bound);
    break;
  }
  }
  return v;
}

} // namespace epl::interp
