// A def's optional tensor parameter (`mask: i32[B, T] = none`): left out, or given as
// `none`, the body's op leaves its optional input out; given a tensor, the op reads it.
#include "Planned.h"

#include <catch2/catch.hpp>

namespace {

const char* kDefScript = R"(
def block(x: f32[B, T, D], heads: int, causal: bool = true, mask: i32[B, T] = none)
    -> f32[B, T, D] {
  return x + attention(layer_norm(x), heads, causal = causal, mask = mask)
}
model net(tokens: i32[B, 16], mask: i32[B, 16]) {
  x = embedding(tokens, 64, 32)
  x = block(x, 4)
  x = block(x, 4, causal = false, mask = mask)
  x = block(x, 4, mask = none)
  return cross_entropy(linear(x, 64), tokens)
}
train net {
  data = synthetic(samples = 16)
  batch = 8
}
)";

} // namespace

TEST_CASE("a def's optional tensor parameter is left out, given, or given as none") {
  auto m = epl::testing::planned("optional.epl", kDefScript, 1);
  REQUIRE(m);
  std::vector<std::pair<size_t, bool>> attention; // inputs, causal
  for (const epl::ir::Op& op : m->ops)
    if (op.kind == epl::ir::OpKind::Attention && op.phase == epl::ir::Phase::Forward)
      attention.push_back({op.inputs.size(), std::get<bool>(op.attrs.at("causal"))});
  REQUIRE(attention.size() == 3);
  CHECK(attention[0] == std::make_pair(size_t{1}, true));
  CHECK(attention[1] == std::make_pair(size_t{2}, false));
  CHECK(attention[2] == std::make_pair(size_t{1}, true));
}
