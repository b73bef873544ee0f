// Seeded parameter initialisation, as PyTorch's layers initialise themselves by default.
#pragma once
#include "ir/Module.h"

#include <cstdint>
#include <vector>

namespace epl::interp {

// The initial values of parameter p (f32, row-major), by its ParamInit (each layer's
// ParamSpec in ir/ops/ says which). Each parameter draws from its own stream, seeded by
// (seed, parameter name), so adding a layer does not change the others.
//   linear, conv2d, attention and mlp projections, moe router and experts: weight and
//     bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = the weight's input width
//     (torch.nn.Linear / Conv2d: kaiming_uniform_ with a = sqrt(5), and their bias rule);
//   embedding, positions: N(0, std), std 1 unless the call says (torch.nn.Embedding);
//   layer_norm, rms_norm: weight 1, bias 0.
std::vector<float> initialValues(const ir::Module& m, int p, uint64_t seed);

// A small counter-based generator (splitmix64): the same numbers on every machine.
class Rng {
public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform(); // [0, 1)
  double normal();  // N(0, 1), Box-Muller

private:
  uint64_t state_;
};

uint64_t hashString(const std::string& s);

} // namespace epl::interp
