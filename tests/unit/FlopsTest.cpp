// The op table's FLOPs (ir::opFlops) against closed forms, and a planned step's
// (Module::stepFlops) against Megatron-LM's per-iteration formula.
#include "Planned.h"

#include "ir/Module.h"

#include <catch2/catch.hpp>

using epl::ir::OpKind;
using epl::ir::Sizes;

namespace {

double forward(OpKind k, std::vector<Sizes> in, std::vector<Sizes> params, Sizes out,
               const epl::ir::Attrs& attrs = {}) {
  epl::ir::Flops f = epl::ir::opFlops(k, in, params, out, attrs);
  CHECK(f.backward == 2 * f.forward); // the input's and the weights' gradients
  return f.forward;
}

// A GPT of `layers` blocks of width h over sequences of s, vocabulary v, batch b.
std::string gpt(int layers, int h, int s, int v, int b, const std::string& policy,
                const std::string& split = "") {
  return "import \"std/nn.epl\"\n"
         "model gpt(tokens: i32[B, " +
         std::to_string(s) + "]) {\n  x = embedding(tokens, " + std::to_string(v) + ", " +
         std::to_string(h) + ") + positions(" + std::to_string(s) + ", " + std::to_string(h) +
         ")\n  " + split + "x = repeat(" + std::to_string(layers) +
         ") transformer_block(x, 4)\n  loss = cross_entropy(linear(layer_norm(x), " +
         std::to_string(v) + "), next(tokens))\n  " + (split.empty() ? "" : "}\n  ") +
         "return loss\n}\npolicy { " + policy +
         " }\ntrain gpt {\n  data = synthetic(samples = 64)\n  batch = " + std::to_string(b) +
         "\n}\n";
}

double stepTotal(const epl::ir::Module& m) {
  double total = 0;
  for (const epl::ir::Program& p : m.programs)
    total += m.stepFlops(p).total();
  return total;
}

} // namespace

TEST_CASE("a transformer layer's forward is 24 b s h^2 + 4 b s^2 h FLOPs") {
  const int64_t b = 4, s = 32, h = 64;
  double attention = forward(OpKind::Attention, {{b, s, h}}, {{3 * h, h}, {3 * h}, {h, h}, {h}},
                             {b, s, h}, {{"heads", int64_t{4}}});
  double mlp = forward(OpKind::Mlp, {{b, s, h}}, {{4 * h, h}, {4 * h}, {h, 4 * h}, {h}}, {b, s, h});
  double bsh = static_cast<double>(b * s * h);
  CHECK(attention + mlp == 24 * bsh * h + 4 * bsh * s);
}

TEST_CASE("the FLOPs of linear, conv2d and the experts are their products' closed forms") {
  CHECK(forward(OpKind::Linear, {{6, 5, 7}}, {{3, 7}, {3}}, {6, 5, 3}) == 2.0 * 30 * 7 * 3);
  // [B, C, H, W] = [2, 3, 9, 9] by 4 kernels of 3 x 3, stride 2: 4 x 4 outputs.
  CHECK(forward(OpKind::Conv2d, {{2, 3, 9, 9}}, {{4, 3, 3, 3}, {4}}, {2, 4, 4, 4}) ==
        2.0 * 2 * 4 * 16 * 3 * 9);
  // Rows [B, R k, D] = [2, 6, 8] through experts W1 [E, F, D] = [4, 16, 8]: every row two
  // products of D x F.
  CHECK(forward(OpKind::MoeExperts, {{2, 6, 8}, {4}}, {{4, 16, 8}, {4, 16}, {4, 8, 16}, {4, 8}},
                {2, 6, 8}) == 4.0 * 12 * 8 * 16);
  // Elementwise work has no products.
  CHECK(forward(OpKind::Gelu, {{4, 8}}, {}, {4, 8}) == 0);
  CHECK(forward(OpKind::LayerNorm, {{4, 8}}, {{8}, {8}}, {4, 8}) == 0);
}

TEST_CASE("a planned GPT step is Megatron-LM's 72 (96 recomputed) B s l h^2 (1 + s/6h + V/(12 "
          "or 16) l h)") {
  const double l = 2, h = 64, s = 16, v = 96, b = 8;
  const double base = b * s * l * h * h;
  auto m = epl::testing::planned("gpt.epl", gpt(2, 64, 16, 96, 8, "recompute = none"), 1);
  REQUIRE(m);
  CHECK(stepTotal(*m) == Approx(72 * base * (1 + s / (6 * h) + v / (12 * l * h))).epsilon(1e-12));
  CHECK(3 * m->forwardFlopsPerSample() * b == Approx(stepTotal(*m)).epsilon(1e-12));
  auto every = epl::testing::planned("gpt.epl", gpt(2, 64, 16, 96, 8, "recompute = every"), 1);
  REQUIRE(every);
  CHECK(stepTotal(*every) ==
        Approx(96 * base * (1 + s / (6 * h) + v / (16 * l * h))).epsilon(1e-12));
  // The model's FLOPs do not count what is recomputed.
  CHECK(every->forwardFlopsPerSample() == m->forwardFlopsPerSample());
}

TEST_CASE("a backward's products are each forward product's two transposes") {
  // attention over [2, 8, 16] with 4 heads of 4: the projections, then per sample and head
  // the scores and their product with V.
  epl::ir::Attrs heads{{"heads", int64_t{4}}};
  auto forward =
      epl::ir::opProducts(OpKind::Attention, {{2, 8, 16}}, {{48, 16}}, {2, 8, 16}, heads, false);
  REQUIRE(forward.size() == 4);
  CHECK(forward[2].m == 8);
  CHECK(forward[2].n == 8);
  CHECK(forward[2].k == 4);
  CHECK(forward[2].count == 8);
  auto backward =
      epl::ir::opProducts(OpKind::Attention, {{2, 8, 16}}, {{48, 16}}, {2, 8, 16}, heads, true);
  REQUIRE(backward.size() == 8);
  double f = 0, b = 0;
  for (const auto& p : forward)
    f += p.flops();
  for (const auto& p : backward)
    b += p.flops();
  CHECK(b == 2 * f);
  // Each in the layout its kernel calls it with. The qkv projection, x [16, 16] by W^T
  // (W [48, 16]): the input's gradient dY [16, 48] by W [48, 16], the weights' dY^T [48, 16]
  // by x [16, 16], a sum over the rows.
  using epl::ir::GemmLayout;
  CHECK(forward[0].layout == GemmLayout::ABt);
  CHECK(backward[0].m == 16);
  CHECK(backward[0].n == 16);
  CHECK(backward[0].k == 48);
  CHECK(backward[0].layout == GemmLayout::AB);
  CHECK(backward[1].m == 48);
  CHECK(backward[1].n == 16);
  CHECK(backward[1].k == 16);
  CHECK(backward[1].layout == GemmLayout::AtB);
  // P V, P [8, 8] by V [8, 4] (V not transposed): dP = dO V^T, [8, 4] by [4, 8]; dV = P^T dO,
  // [8, 8] by [8, 4].
  CHECK(forward[3].layout == GemmLayout::AB);
  CHECK((backward[6].m == 8 && backward[6].n == 8 && backward[6].k == 4));
  CHECK(backward[6].layout == GemmLayout::ABt);
  CHECK((backward[7].m == 8 && backward[7].n == 4 && backward[7].k == 8));
  CHECK(backward[7].layout == GemmLayout::AtB);
}

TEST_CASE("conv2d's products are those of its kernel's groups of images") {
  // 6 images of 3 x 10 x 10 through 8 kernels of 3 x 3 (padding 1): each group's columns
  // [27, G 100] under W [8, 27]. 27 x 100 floats an image: all 6 fit one group.
  auto p = epl::ir::opProducts(OpKind::Conv2d, {{6, 3, 10, 10}}, {{8, 3, 3, 3}, {8}},
                               {6, 8, 10, 10}, {}, false);
  REQUIRE(p.size() == 1);
  CHECK(p[0].m == 8);
  CHECK(p[0].n == 600);
  CHECK(p[0].k == 27);
  CHECK(p[0].count == 1);
  CHECK(p[0].layout == epl::ir::GemmLayout::AB);
  // Larger images: convGroup's budget of columns cuts the batch (and the count is a share).
  int64_t g = epl::ir::convGroup(27, 128 * 128, 600);
  REQUIRE(g < 600);
  auto big = epl::ir::opProducts(OpKind::Conv2d, {{600, 3, 128, 128}}, {{8, 3, 3, 3}, {8}},
                                 {600, 8, 128, 128}, {}, false);
  CHECK(big[0].n == static_cast<double>(g * 128 * 128));
  CHECK(big[0].count == Approx(600.0 / static_cast<double>(g)));
  CHECK(big[0].flops() == Approx(2.0 * 8 * 27 * 128 * 128 * 600));
}

TEST_CASE("oneDNN's convolution plans its groups, lanes and workspace from the shapes alone") {
  using epl::ir::convDirectPlan;
  // The CNN example's third convolution: 64 images of 32 x 14 x 14 through 64 kernels of 3 x 3.
  auto cnn = convDirectPlan(64, 32, 14, 14, 64, 3, 196, true);
  CHECK(cnn.images == 4);
  CHECK(cnn.groups == 16);
  CHECK(cnn.lanes == 16);
  CHECK(cnn.taken);
  // Channels counted padded to 16: 4 images of 32 x 196 in, 64 x 196 out; weights 64 x 32 x 9.
  CHECK(cnn.in == 4 * 32 * 196);
  CHECK(cnn.out == 4 * 64 * 196);
  CHECK(cnn.weights == 64 * 32 * 9);
  CHECK(cnn.floats() == cnn.weights + 16 * cnn.laneFloats);
  // A padded channel (3 -> 16), and a batch that leaves a last group of one image.
  auto odd = convDirectPlan(17, 3, 8, 8, 10, 3, 64, false);
  CHECK(odd.images == 2);
  CHECK(odd.groups == 9);
  CHECK(odd.in == 2 * 16 * 64);
  // Large images: fewer lanes fit the budget than there are groups, each lane runs several.
  auto wide = convDirectPlan(16, 1, 128, 128, 2, 3, 128 * 128, true);
  CHECK(wide.groups == 16);
  CHECK(wide.lanes == 15);
  CHECK(wide.taken);
  // Larger still: fewer than 4 lanes fit, and im2col runs instead.
  auto huge = convDirectPlan(32, 64, 224, 224, 64, 3, 224 * 224, false);
  CHECK(huge.lanes < 4);
  CHECK_FALSE(huge.taken);
}

TEST_CASE("a first layer that reads the data computes its weight gradient alone") {
  // x [8, 12] -> linear 16 -> relu -> linear 4: the first backward skips dx, as its kernel
  // does; the second computes both.
  auto m = epl::testing::planned("first.epl", R"(
model net(x: f32[B, 12], y: i32[B]) {
  return cross_entropy(linear(relu(linear(x, 16)), 4), y)
}
train net {
  data = synthetic(samples = 8)
  batch = 8
}
)",
                                 1);
  REQUIRE(m);
  epl::ir::Module::StepFlops f = m->stepFlops(m->programs[0]);
  double first = 2.0 * 8 * 12 * 16, second = 2.0 * 8 * 16 * 4;
  CHECK(f.forward == first + second);
  CHECK(f.backward == first + 2 * second);
}

TEST_CASE("grouped-query attention projects k and v to kv_heads heads") {
  // attention over [2, 8, 16] with 4 heads of 4 and 2 k/v heads: Wqkv [16 + 2 x 8, 16].
  epl::ir::Attrs grouped{{"heads", int64_t{4}}, {"kv_heads", int64_t{2}}};
  auto whole =
      epl::ir::opProducts(OpKind::Attention, {{2, 8, 16}}, {{32, 16}}, {2, 8, 16}, grouped, false);
  REQUIRE(whole.size() == 4);
  CHECK(whole[0].n == 32); // x [16, 16] by [16, 32]
  CHECK(whole[1].k == 16); // ctx [16, 16] by Wp^T [16, 16]
  CHECK(whole[2].count == 8);
  // A rank of split(2): Wqkv [16, 16], its 2 query heads' rows and their k/v head's.
  auto half =
      epl::ir::opProducts(OpKind::Attention, {{2, 8, 16}}, {{16, 16}}, {2, 8, 16}, grouped, false);
  CHECK(half[0].n == 16);
  CHECK(half[1].k == 8);
  CHECK(half[2].count == 4);
  // Against 4 k/v heads: the k and v projections are half as wide, the rest the same.
  epl::ir::Attrs full{{"heads", int64_t{4}}};
  auto mha =
      epl::ir::opProducts(OpKind::Attention, {{2, 8, 16}}, {{48, 16}}, {2, 8, 16}, full, false);
  CHECK(mha[0].flops() - whole[0].flops() == 2 * 16 * 16 * 16);
  for (size_t k = 1; k < 4; ++k)
    CHECK(mha[k].flops() == whole[k].flops());
}

TEST_CASE("data-parallel and split ranks share the step's FLOPs without counting any twice") {
  auto one = epl::testing::planned("gpt.epl", gpt(2, 64, 16, 96, 8, "recompute = none"), 1);
  auto data = epl::testing::planned("gpt.epl", gpt(2, 64, 16, 96, 8, "recompute = none"), 2);
  auto split = epl::testing::planned(
      "gpt.epl", gpt(2, 64, 16, 96, 8, "recompute = none", "split(2) {\n  "), 2);
  REQUIRE(one);
  REQUIRE(data);
  REQUIRE(split);
  REQUIRE(data->programs.size() == 2);
  REQUIRE(split->programs.size() == 2);
  CHECK(stepTotal(*data) == Approx(stepTotal(*one)).epsilon(1e-12));
  CHECK(stepTotal(*split) == Approx(stepTotal(*one)).epsilon(1e-12));
  for (const epl::ir::Program& p : split->programs)
    CHECK(split->stepFlops(p).total() == Approx(stepTotal(*one) / 2).epsilon(1e-12));
}
